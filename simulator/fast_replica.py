"""The replica model of ``scheduler``/``replica``, compiled (numba): the same vLLM v1 step rules, line for line.

``fast_engine`` runs a fixed fleet with these functions instead of the ``Replica`` objects; the
Python classes stay the reference (and serve every hook of the autoscaling layer, the prefix cache,
the random router). Each function here names the method it mirrors; the arithmetic is written in the
same order, so results are bit-identical (``tests/test_fast_engine.py`` compares them on workloads
with chunked prefill, preemption and 429s; NOTE: ``numpy``'s ``sum`` of floats is pairwise, so the
one float sum of the step model uses ``pairwise_sum``, numpy's own algorithm).

State lives in a few arrays (no Python object per request or replica): per replica ``S[r]`` (rows
``ID, NTOK, COMP, LEFT, NEW`` as in ``scheduler``), ``lefts[r, :n]`` (stored LEFT values, sorted), the
integer fields ``iv[r, ...]`` and float fields ``fv[r, ...]`` named below; each replica's ``waiting`` deque
is a linked list through the requests (``Log.nextw``), since a request waits in at most one queue.
Prefix caching is modelled as far as a workload without prefix blocks needs it: a preempted request's
own full blocks stay cached (``park``) and are re-hit on its resume (``PrefixCache.park``/``resume_tokens``).
The admission gate on the whole sequence and the null block (vLLM 0.32, see ``scheduler``) are in ``cfg``.
Left out here (the Python engine does them): trace prefix blocks, vLLM's metric counters and histograms.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, TypeVar, cast

import numba
import numpy as np

from simulator import numba_cache
from simulator.kv_cache import whole_cached_tokens
from simulator.results import FINISHED
from simulator.step_jitter import JITTERED_RUN_STEPS, STREAM_STRIDE

numba_cache.guard()  # before any cached function loads: stale inlined code would run otherwise

ID, NTOK, COMP, LEFT, NEW = range(5)
# integer fields of iv[r]
(N, SHIFT, COMP_SUM, NEW_SUM, FRESH, N_RUNNING, ADM_CACHED, WTOK, OUTST, RUN_K, RUN_DONE, RUN_FIN, VERSION,
 ALL_DEC, FAST, RUN_ON, BUSY, WHEAD, WTAIL, WLEN, PKV, FKV, HCACHED, HFULL, STEPS, N_INT) = range(26)
# PKV: the KV blocks preempted requests left cached (``PrefixCache.park``; each one's in ``Log.park``);
# FKV: the full blocks finished requests freed behind them in the free queue (``PrefixCache.retire``; those
# freed after a parked request and before the next newer one are in ``Log.fill`` of that request);
# HCACHED: the cached tokens of the waiting head that ``head_tokens`` last looked at; HFULL: the tokens of
# that head the admission gate must fit (``SchedulerState._head_full``); STEPS: steps started (the jitter's counter)
# float fields of fv[r]
CLOCK, BUSY_UNTIL, RUN_START, RUN_FIRST, RUN_GROWTH, STEP_S, ADM_ATTN, N_FLOAT = range(8)
# the step-time model's coefficients (LinearStepTime, in its field order)
OVERHEAD, FLOOR, INTERCEPT, PER_TOKEN, PER_SEQ, PER_CONTEXT, PREFILL_ATTN, PER_PREFILL_SEQ = range(8)
NONE = -1.0  # "no next event" (the Python methods return None); event times are >= 0
PARKED = -2  # ``head_plain``: the waiting head has blocks parked (``resume_tokens`` answers)

_Kernel = TypeVar("_Kernel", bound=Callable[..., object])


def njit(**options: object) -> Callable[[_Kernel], _Kernel]:
    """``numba.njit(**options)``, typed for mypy: numba ships no annotations, and its dispatcher is called
    with the arguments and returns what the Python function it compiles declares. The one place the
    compiled modules (this one, ``fast_engine``) take the decorator from."""
    return cast("Callable[[_Kernel], _Kernel]", numba.njit(**options))


_whole_cached_tokens = njit(cache=True, inline="always")(whole_cached_tokens)


class Log(NamedTuple):
    """Per-request columns (``results.RequestLog``'s, plus what the model reads)."""

    arrival: np.ndarray
    inp: np.ndarray
    tok: np.ndarray  # prompt + (capped) output
    first_tok: np.ndarray
    finish: np.ndarray
    first_sched: np.ndarray
    gen: np.ndarray
    preempt: np.ndarray
    repl: np.ndarray
    status: np.ndarray
    nextw: np.ndarray  # the next request in the same waiting queue
    park: np.ndarray  # KV blocks a preempted request left cached and not evicted (0: none)
    fill: np.ndarray  # of a preempted request: retired blocks freed after its parking, before a newer one's
    off: np.ndarray  # (1,): the request id of row 0 (a streamed run keeps a window of requests, not all)


class Fleet(NamedTuple):
    """Every replica's state, the profile's limits and model: ``cfg = (block_size, blocks, budget, max_seqs,
    full_cap)`` with ``blocks`` the usable KV blocks (``num_gpu_blocks - 1``: vLLM's null block) and
    ``full_cap`` the admission gate's token cap (``SchedulerState._full_cap``: max_model_len, or 0 when off)."""

    S: np.ndarray
    lefts: np.ndarray
    iv: np.ndarray  # the integer fields
    fv: np.ndarray
    cfg: np.ndarray
    model: np.ndarray
    jitter: np.ndarray  # the profile's step_jitter quantiles (decode steps); empty: no jitter
    pjitter: np.ndarray  # its prefill_step_jitter (steps with a prefill chunk)
    jdur: np.ndarray  # (replicas, JITTERED_RUN_STEPS): a jittered decode run's step durations (``JitteredRun``)
    jend: np.ndarray  # their running sums: the run's step ends after its start


class Itl(NamedTuple):
    """``results.LatencyHistogram``: runs buffered, binned in bulk (``bin_runs``) into ``counts``."""

    edges: np.ndarray
    bounds: np.ndarray
    counts: np.ndarray
    runs: np.ndarray  # (cap, 4): first, step, k, weight
    nruns: np.ndarray  # (1,)


def new_fleet(replicas: int, profile: object, now: float = 0.0) -> Fleet:
    """``replicas`` fresh replicas of ``profile`` (``SchedulerState.__init__``)."""
    p: object = profile
    seqs = p.max_num_seqs  # type: ignore[attr-defined]
    st = p.step_time  # type: ignore[attr-defined]
    iv = np.zeros((replicas, N_INT), np.int64)
    iv[:, ALL_DEC] = iv[:, FAST] = 1
    iv[:, WHEAD] = iv[:, WTAIL] = -1
    fv = np.zeros((replicas, N_FLOAT), np.float64)
    fv[:, CLOCK] = now
    model = np.array([st.overhead_s, st.floor_s, st.intercept_s, st.per_token_s, st.per_seq_s,
                      st.per_context_token_s, st.prefill_attention_s, st.per_prefill_seq_s], np.float64)
    cfg = np.array([p.block_size, p.usable_blocks, p.max_num_batched_tokens, seqs, p.admission_cap],  # type: ignore[attr-defined]
                   np.int64)
    jitter = np.array(p.step_jitter, np.float64).reshape(-1)  # type: ignore[attr-defined]
    pjitter = np.array(p.prefill_step_jitter, np.float64).reshape(-1)  # type: ignore[attr-defined]
    run_buffer = np.zeros((replicas, JITTERED_RUN_STEPS if jitter.size else 0), np.float64)
    return Fleet(np.zeros((replicas, 5, seqs), np.int64), np.zeros((replicas, seqs), np.int64), iv, fv, cfg, model,
                 jitter, pjitter, run_buffer, run_buffer.copy())


# ----- small helpers --------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def step_time(m: np.ndarray, tokens: int, seqs: int, decode_context: float, prefill_attention: float,
              prefill_seqs: int) -> float:
    """``LinearStepTime.step_time``."""
    linear = max(m[FLOOR], m[INTERCEPT] + m[PER_TOKEN] * tokens)
    return (m[OVERHEAD] + linear + m[PER_SEQ] * seqs + m[PER_CONTEXT] * decode_context
            + m[PREFILL_ATTN] * prefill_attention + m[PER_PREFILL_SEQ] * prefill_seqs)


_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_STRIDE = np.uint64(STREAM_STRIDE)


@njit(cache=True)
def jitter_factor(table: np.ndarray, stream: int, step: int) -> float:
    """``step_jitter.jitter_factor``: the same integers and float operations, so both engines agree bit for bit."""
    z = np.uint64(stream) * _STRIDE + np.uint64(step) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    u = float(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)
    pos = u * (table.shape[0] - 1)
    i = min(int(pos), table.shape[0] - 2)
    frac = pos - i
    return table[i] + (table[i + 1] - table[i]) * frac


@njit(cache=True, inline="always")
def jittered(q: Fleet, r: int, seconds: float, table: np.ndarray) -> float:
    """``SchedulerState._jitter_factor`` applied: ``seconds`` times the factor of replica ``r``'s next step."""
    if table.shape[0] == 0:
        return seconds
    f = jitter_factor(table, r, q.iv[r, STEPS])
    q.iv[r, STEPS] += 1
    return seconds * f


@njit(cache=True)
def _pairwise_block(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of at most 128 values: sequential below 8, else 8 accumulators."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - (n % 8):
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True)
def pairwise_sum(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's float sum of ``a[lo:lo + n]``, bit for bit: halves (a multiple of 8 on the left) summed
    pairwise down to blocks of 128. Written with an explicit stack: numba's cache breaks on recursion."""
    if n <= 128:
        return _pairwise_block(a, lo, n)
    los, ns, done = np.empty(64, np.int64), np.empty(64, np.int64), np.empty(64, np.bool_)
    vals = np.empty(64, np.float64)
    top, nv = 1, 0
    los[0], ns[0], done[0] = lo, n, False
    while top:
        top -= 1
        lo_, n_ = los[top], ns[top]
        if n_ <= 128:
            vals[nv] = _pairwise_block(a, lo_, n_)
            nv += 1
        elif done[top]:
            nv -= 1
            vals[nv - 1] = vals[nv - 1] + vals[nv]  # left + right
        else:
            n2 = n_ // 2
            n2 -= n2 % 8
            done[top] = True
            los[top + 1], ns[top + 1], done[top + 1] = lo_ + n2, n_ - n2, False  # right, evaluated second
            los[top + 2], ns[top + 2], done[top + 2] = lo_, n2, False  # left, first
            top += 3
    return vals[0]


@njit(cache=True, inline="always")
def run_total(first: float, growth: float, k: int) -> float:
    """``DecodeRun.total``."""
    return k * first + growth * k * (k - 1) / 2.0


@njit(cache=True)
def steps_within(first: float, growth: float, elapsed_s: float) -> int:
    """``DecodeRun.steps_within``."""
    if elapsed_s < first:
        return 0
    if growth <= 0.0:
        k = int(elapsed_s // first)
    else:
        b = first - growth / 2.0
        k = int((-b + math.sqrt(b * b + 2.0 * growth * elapsed_s)) / growth)
    while k > 0 and run_total(first, growth, k) > elapsed_s:
        k -= 1
    while run_total(first, growth, k + 1) <= elapsed_s:
        k += 1
    return k


@njit(cache=True, inline="always")
def run_time(q: Fleet, r: int, k: int) -> float:
    """Seconds the first ``k`` steps of replica ``r``'s decode run take (``DecodeRun``/``JitteredRun.total``)."""
    if q.jitter.shape[0]:
        return q.jend[r, k - 1] if k > 0 else 0.0
    return run_total(q.fv[r, RUN_FIRST], q.fv[r, RUN_GROWTH], k)


@njit(cache=True, inline="always")
def run_steps_within(q: Fleet, r: int, elapsed_s: float) -> int:
    """Whole steps of replica ``r``'s decode run over by ``elapsed_s`` after its start (``steps_within``): at most
    the run's planned steps when jittered, which every caller caps at ``RUN_K`` or less anyway."""
    if q.jitter.shape[0]:
        return int(np.searchsorted(q.jend[r, :q.iv[r, RUN_K]], elapsed_s, side="right"))
    return steps_within(q.fv[r, RUN_FIRST], q.fv[r, RUN_GROWTH], elapsed_s)


@njit(cache=True)
def bin_runs(h: Itl) -> None:
    """``LatencyHistogram._flush`` of the buffered runs (exact: every weight is a whole number)."""
    m = h.nruns[0]
    h.nruns[0] = 0
    edges, bounds, counts = h.edges, h.bounds, h.counts
    for r in range(m):
        f, st, k, w = h.runs[r, 0], h.runs[r, 1], h.runs[r, 2], h.runs[r, 3]
        lo = np.searchsorted(edges, f, side="right")
        hi = np.searchsorted(edges, f + st * (k - 1), side="right")
        if lo == hi:
            counts[lo] += k * w
            continue
        for b in range(lo, hi + 1):
            below_hi = min(max(math.ceil((bounds[b + 1] - f) / st), 0.0), k)
            below_lo = min(max(math.ceil((bounds[b] - f) / st), 0.0), k)
            counts[b] += (below_hi - below_lo) * w


@njit(cache=True, inline="always")
def add_run(h: Itl, first: float, step: float, k: int, weight: float) -> None:
    """``LatencyHistogram.add_arithmetic`` (and ``add``: ``step=0, k=1``)."""
    i = h.nruns[0]
    if i == h.runs.shape[0]:
        bin_runs(h)
        i = 0
    h.runs[i, 0], h.runs[i, 1], h.runs[i, 2], h.runs[i, 3] = first, step, float(k), weight
    h.nruns[0] = i + 1


# ----- SchedulerState -------------------------------------------------------------------------------------
@njit(cache=True)
def write_shift(q: Fleet, r: int) -> None:
    """``SchedulerState._write_shift``."""
    sh = q.iv[r, SHIFT]
    if sh:
        n = q.iv[r, N]
        for j in range(n):
            q.S[r, NTOK, j] += sh
            q.S[r, COMP, j] += sh
            q.S[r, LEFT, j] += sh
            q.lefts[r, j] += sh
        q.iv[r, SHIFT] = 0


@njit(cache=True)
def reset_lefts(q: Fleet, r: int) -> None:
    """``SchedulerState._reset_lefts``."""
    n = q.iv[r, N]
    q.lefts[r, :n] = np.sort(q.S[r, LEFT, :n])
    if not n:
        q.iv[r, SHIFT] = 0


@njit(cache=True, inline="always")
def insort(q: Fleet, r: int, n: int, value: int) -> None:
    """``bisect.insort`` into ``lefts[r, :n]``."""
    a = q.lefts[r]
    j = n
    while j > 0 and a[j - 1] > value:
        a[j] = a[j - 1]
        j -= 1
    a[j] = value


@njit(cache=True)
def used_blocks(q: Fleet, r: int) -> int:
    """``SchedulerState.used_blocks`` (no prefix cache: nothing shared)."""
    n, bs, sh, S = q.iv[r, N], q.cfg[0], q.iv[r, SHIFT], q.S[r]
    total = 0
    if q.iv[r, RUN_ON]:
        for j in range(n):
            total += (S[COMP, j] + (bs + sh)) // bs
    else:
        for j in range(n):
            total += (S[COMP, j] + S[NEW, j] + (bs - 1 + sh)) // bs
    return total


@njit(cache=True, inline="always")
def used_bound(q: Fleet, r: int) -> float:
    """``SchedulerState._used_bound``."""
    return (q.iv[r, COMP_SUM] + q.iv[r, NEW_SUM]) / q.cfg[0] + q.iv[r, N]


@njit(cache=True, inline="always")
def head_tokens(q: Fleet, L: Log, r: int, budget: int, now: float) -> int:
    """``SchedulerState._head_tokens``: the scheduled tokens of the waiting head (its cached ones in
    ``iv[r, HCACHED]``), or -1."""
    nt = head_plain(q, L, r, budget, now)
    if nt == PARKED:
        nt = resume_tokens(q, L, r, budget)
    return nt


@njit(cache=True)
def head_plain(q: Fleet, L: Log, r: int, budget: int, now: float) -> int:
    """``head_tokens`` without a call (so it stays small): PARKED when the head has blocks parked."""
    if q.iv[r, WLEN] == 0 or budget <= 0 or q.iv[r, N] >= q.cfg[3]:
        return -1
    rid = q.iv[r, WHEAD]
    if L.arrival[rid - L.off[0]] > now:
        return -1
    ntok = L.inp[rid - L.off[0]] + L.gen[rid - L.off[0]]
    q.iv[r, HFULL] = ntok if ntok < q.cfg[4] else q.cfg[4]
    if q.iv[r, PKV] and L.park[rid - L.off[0]]:  # (PKV first: most steps have nothing parked)
        return PARKED
    q.iv[r, HCACHED] = 0
    return ntok if ntok < budget else budget


@njit(cache=True)
def resume_tokens(q: Fleet, L: Log, r: int, budget: int) -> int:
    """``head_tokens`` of a preempted head with blocks parked: ``PrefixCache.resume_tokens`` after a trim."""
    rid = q.iv[r, WHEAD]
    ntok = L.inp[rid - L.off[0]] + L.gen[rid - L.off[0]]
    trim_cache(q, L, r)
    cached = _whole_cached_tokens(L.park[rid - L.off[0]], q.cfg[0], ntok)
    q.iv[r, HCACHED] = cached
    return min(ntok - cached, budget)


@njit(cache=True, inline="always")
def head_blocks(q: Fleet, r: int, nt: int) -> tuple[int, int]:
    """``SchedulerState._head_blocks`` (no prefix cache: nothing shared): (gate, alloc) blocks of the head."""
    bs = q.cfg[0]
    alloc = -(-(q.iv[r, HCACHED] + nt) // bs)
    full = -(-q.iv[r, HFULL] // bs)
    return (full if full > alloc else alloc), alloc


@njit(cache=True)
def trim_cache(q: Fleet, L: Log, r: int) -> None:
    """``SchedulerState._trim_cache``: evict parked blocks that no longer fit beside the blocks held.

    ``PrefixCache.trim`` evicts the least recently freed first, a parked request's blocks from their tail,
    until ``room`` are left. Parked requests wait at the head of ``waiting`` (a preemption puts a request
    there), the most recently preempted first, each with the retired blocks freed after it (``Log.fill``), so
    walking it from the head and letting each keep what room is left, its retired blocks first, does the
    same without a list of its own (retired blocks older than every parked one are taken before any: not
    tracked).
    """
    iv = q.iv
    if not (iv[r, PKV] and iv[r, PKV] + iv[r, FKV] + used_bound(q, r) > q.cfg[1]):
        return
    room = q.cfg[1] - used_blocks(q, r)
    if iv[r, PKV] + iv[r, FKV] <= room:
        return
    keep = max(room, 0)
    parked = filled = 0
    rid = iv[r, WHEAD]
    while rid != -1 and L.preempt[rid - L.off[0]] > 0:  # the preempted requests at the head of waiting
        i = rid - L.off[0]
        if L.fill[i] > keep:
            L.fill[i] = keep
        keep -= L.fill[i]
        filled += L.fill[i]
        kv = L.park[i]
        if kv > keep:
            L.park[i] = kv = keep
        keep -= kv
        parked += kv
        rid = L.nextw[i]
    iv[r, PKV], iv[r, FKV] = parked, filled


@njit(cache=True, inline="always")
def park(q: Fleet, L: Log, r: int, rid: int, kv: int) -> None:
    """``PrefixCache.park``: preempted ``rid``'s ``kv`` own full blocks stay cached (it waits at the head)."""
    if kv > 0:
        q.iv[r, PKV] += kv - L.park[rid - L.off[0]]
        L.park[rid - L.off[0]] = kv


@njit(cache=True)
def unfill(q: Fleet, L: Log, r: int, rid: int) -> None:
    """``rid`` left the parked run of ``waiting``: the retired blocks freed after it now follow the next older
    parked request (``PrefixCache`` keeps them in place), or, with none, are older than every parked one."""
    i = rid - L.off[0]
    nxt = q.iv[r, WHEAD]
    if nxt != -1 and L.preempt[nxt - L.off[0]] > 0:
        L.fill[nxt - L.off[0]] += L.fill[i]
    else:
        q.iv[r, FKV] -= L.fill[i]
    L.fill[i] = 0


@njit(cache=True, inline="always")
def retire(q: Fleet, L: Log, r: int, kv: int) -> None:
    """``PrefixCache.retire``: a finished request's ``kv`` full blocks join the free queue's tail, behind the
    newest parked request (tracked only while one is parked: older ones are taken before any parked)."""
    if kv > 0:
        L.fill[q.iv[r, WHEAD] - L.off[0]] += kv
        q.iv[r, FKV] += kv


@njit(cache=True, inline="always")
def unpark(q: Fleet, L: Log, r: int, rid: int) -> None:
    """``PrefixCache.unpark``: ``rid`` is admitted again: its parked blocks are held again (or useless)."""
    q.iv[r, PKV] -= L.park[rid - L.off[0]]
    L.park[rid - L.off[0]] = 0


@njit(cache=True, inline="always")
def wait_append(q: Fleet, L: Log, r: int, rid: int) -> None:
    L.nextw[rid - L.off[0]] = -1
    if q.iv[r, WLEN] == 0:
        q.iv[r, WHEAD] = rid
    else:
        L.nextw[q.iv[r, WTAIL] - L.off[0]] = rid
    q.iv[r, WTAIL] = rid
    q.iv[r, WLEN] += 1


@njit(cache=True, inline="always")
def wait_appendleft(q: Fleet, L: Log, r: int, rid: int) -> None:
    if q.iv[r, WLEN] == 0:
        L.nextw[rid - L.off[0]] = -1
        q.iv[r, WTAIL] = rid
    else:
        L.nextw[rid - L.off[0]] = q.iv[r, WHEAD]
    q.iv[r, WHEAD] = rid
    q.iv[r, WLEN] += 1


@njit(cache=True, inline="always")
def wait_popleft(q: Fleet, L: Log, r: int) -> int:
    rid = q.iv[r, WHEAD]
    q.iv[r, WHEAD] = L.nextw[rid - L.off[0]]
    q.iv[r, WLEN] -= 1
    if q.iv[r, WLEN] == 0:
        q.iv[r, WHEAD] = q.iv[r, WTAIL] = -1
    return rid


@njit(cache=True)
def start_step(q: Fleet, L: Log, r: int) -> float:
    """``SchedulerState._start_step``: one general step; its end, or NONE when there is nothing to run."""
    iv, fv, S = q.iv, q.fv, q.S[r]
    blocks, budget = q.cfg[1], q.cfg[2]
    n = iv[r, N]
    iv[r, RUN_ON] = 0
    iv[r, N_RUNNING] = n
    fv[r, ADM_ATTN] = 0.0
    iv[r, ADM_CACHED] = 0
    preempted = False
    have_free, free = False, 0
    fast = iv[r, ALL_DEC] == 1 and n <= budget
    iv[r, FAST] = fast
    if fast:
        for j in range(n):
            S[NEW, j] = 1
        iv[r, NEW_SUM] = n
    else:
        write_shift(q, r)
        cum = 0
        for j in range(n):
            need = S[NTOK, j] - S[COMP, j]
            before = cum
            cum += need
            S[NEW, j] = min(max(budget - before, 0), need)
        iv[r, NEW_SUM] = min(cum, budget)
    if used_bound(q, r) > blocks:
        have_free, free = True, blocks - used_blocks(q, r)
        if free < 0:
            iv[r, FAST] = 0
            free, preempted = schedule_with_preemption(q, L, r)
            iv[r, N_RUNNING] = iv[r, N]
    if not preempted:
        admit(q, L, r, budget - iv[r, NEW_SUM], have_free, free)
    if iv[r, PKV]:  # (a call costs: skip it when nothing is parked)
        trim_cache(q, L, r)
    n = iv[r, N]
    if n == 0:
        iv[r, BUSY] = 0
        if preempted:
            fv[r, STEP_S] = jittered(q, r, step_time(q.model, 0, 0, 0.0, 0.0, 0), q.jitter)
            fv[r, BUSY_UNTIL] = fv[r, CLOCK] + fv[r, STEP_S]
            iv[r, BUSY] = 1
            return fv[r, BUSY_UNTIL]
        return NONE
    n0 = iv[r, N_RUNNING]
    n_partial = 0
    if iv[r, FAST]:
        context = float(iv[r, COMP_SUM] - iv[r, ADM_CACHED] + n0)
    else:
        decodes = ctx = 0
        attn = np.empty(n0, np.float64)
        for j in range(n0):
            new, comp = S[NEW, j], S[COMP, j]
            if new == 1 and S[NTOK, j] - comp == 1:
                decodes += 1
                ctx += comp
            elif new > 0:
                attn[n_partial] = new * (comp + new / 2.0)
                n_partial += 1
        context = float(ctx + decodes)
        fv[r, ADM_ATTN] += pairwise_sum(attn, 0, n_partial)
        n0 = n_partial + decodes
    admitted = n - iv[r, N_RUNNING]
    fv[r, STEP_S] = jittered(q, r, step_time(q.model, iv[r, NEW_SUM], n0 + admitted, context, fv[r, ADM_ATTN],
                                             n_partial + admitted), q.pjitter if n_partial + admitted else q.jitter)
    fv[r, BUSY_UNTIL] = fv[r, CLOCK] + fv[r, STEP_S]
    iv[r, BUSY] = 1
    return fv[r, BUSY_UNTIL]


@njit(cache=True)
def schedule_with_preemption(q: Fleet, L: Log, r: int) -> tuple[int, bool]:
    """``SchedulerState._schedule_with_preemption``: (free blocks left, whether anything was preempted)."""
    write_shift(q, r)
    iv, S = q.iv, q.S[r]
    bs, blocks, budget = q.cfg[0], q.cfg[1], q.cfg[2]
    n = iv[r, N]
    S[NEW, :n] = 0
    cum = np.empty(n, np.int64)
    nt = np.empty(n, np.int64)
    spent = np.empty(n, np.int64)
    c = s = 0
    for j in range(n):
        comp = S[COMP, j]
        need = S[NTOK, j] - comp
        c += need
        cum[j] = c
        nt[j] = min(max(budget - (c - need), 0), need)
        s += -(-(comp + nt[j]) // bs) + -comp // bs
        spent[j] = s
    stop = min(n, np.searchsorted(cum, budget, side="left") + 1)
    free0, freed, preempted, i = blocks - used_blocks(q, r), 0, False, 0
    while i < stop:
        j = np.searchsorted(spent, free0 + freed, side="right")
        if j >= stop:
            i = stop
            break
        while spent[j] > free0 + freed and iv[r, N] > j:
            freed += preempt(q, L, r, iv[r, N] - 1)
            preempted = True
        if iv[r, N] <= j:
            i = j
            break
        stop = min(stop, iv[r, N])
        i = j + 1
    total = 0
    for j in range(i):
        S[NEW, j] = nt[j]
        total += nt[j]
    iv[r, NEW_SUM] = total
    return free0 + freed - (spent[i - 1] if i else 0), preempted


@njit(cache=True)
def preempt(q: Fleet, L: Log, r: int, j: int) -> int:
    """``SchedulerState._preempt``: slot ``j`` (the tail) back to the waiting head; returns the blocks freed."""
    iv, S = q.iv, q.S[r]
    sh = iv[r, SHIFT]
    rid = S[ID, j]
    comp = S[COMP, j] + sh
    L.gen[rid - L.off[0]] = S[NTOK, j] + sh - L.inp[rid - L.off[0]]
    n = iv[r, N]
    value, a = S[LEFT, j], q.lefts[r]
    k = 0
    while a[k] != value:
        k += 1
    a[k: n - 1] = a[k + 1: n]
    L.preempt[rid - L.off[0]] += 1
    if L.first_tok[rid - L.off[0]] != L.first_tok[rid - L.off[0]]:
        iv[r, FRESH] -= 1
    wait_appendleft(q, L, r, rid)
    iv[r, WTOK] += S[NTOK, j] + sh
    iv[r, N] = n - 1
    iv[r, COMP_SUM] -= comp
    park(q, L, r, rid, comp // q.cfg[0])
    return -(-comp // q.cfg[0])


@njit(cache=True)
def admit(q: Fleet, L: Log, r: int, budget: int, have_free: bool, free: int) -> None:
    """``SchedulerState._admit``: waiting requests FCFS while seats, budget and blocks last."""
    iv, fv, S = q.iv, q.fv, q.S[r]
    blocks = q.cfg[1]
    now, sh = fv[r, CLOCK], iv[r, SHIFT]
    bound = used_bound(q, r)
    while True:
        nt = head_tokens(q, L, r, budget, now)
        if nt < 0:
            break
        cached = iv[r, HCACHED]
        gate, want = head_blocks(q, r, nt)
        if not have_free and bound + gate > blocks:
            have_free, free = True, blocks - used_blocks(q, r)
        if have_free:
            if gate > free:
                break
            free -= want
        bound += want
        rid = wait_popleft(q, L, r)
        ntok = L.inp[rid - L.off[0]] + L.gen[rid - L.off[0]]
        iv[r, WTOK] -= ntok
        if iv[r, PKV]:
            unpark(q, L, r, rid)
        if L.fill[rid - L.off[0]]:
            unfill(q, L, r, rid)
        left = ntok - L.tok[rid - L.off[0]] - sh
        n = iv[r, N]
        S[ID, n], S[NTOK, n], S[COMP, n], S[LEFT, n], S[NEW, n] = rid, ntok - sh, cached - sh, left, nt
        insort(q, r, n, left)
        iv[r, N] = n + 1
        iv[r, COMP_SUM] += cached
        iv[r, ADM_CACHED] += cached
        iv[r, NEW_SUM] += nt
        fv[r, ADM_ATTN] += nt * (cached + nt / 2.0)
        budget -= nt
        if L.first_sched[rid - L.off[0]] != L.first_sched[rid - L.off[0]]:
            L.first_sched[rid - L.off[0]] = now
        if L.first_tok[rid - L.off[0]] != L.first_tok[rid - L.off[0]]:
            iv[r, FRESH] += 1


@njit(cache=True)
def complete_step(q: Fleet, L: Log, h: Itl, r: int) -> None:
    """``SchedulerState._complete_step``: computed tokens, samples, first tokens, finishes."""
    iv, fv, S = q.iv, q.fv, q.S[r]
    n, n0 = iv[r, N], iv[r, N_RUNNING]
    end = fv[r, CLOCK] + fv[r, STEP_S]
    fast = iv[r, FAST] == 1
    prefilled = True
    if fast:
        iv[r, SHIFT] += 1
        decodes = n0
        count = n0
        for j in range(n0, n):
            rid, ntok, comp, left, new = S[ID, j], S[NTOK, j], S[COMP, j], S[LEFT, j], S[NEW, j]
            if comp + new == ntok:
                S[COMP, j], S[NEW, j] = ntok - 1, 0
                count += 1
                first_token(q, L, r, rid, end)
            else:
                S[NTOK, j], S[COMP, j], S[LEFT, j] = ntok - 1, comp + new - 1, left - 1
                prefilled = False
        if not prefilled:
            reset_lefts(q, r)
    else:
        decodes = count = 0
        for j in range(n):
            new = S[NEW, j]
            was_decode = j < n0 and new == 1 and S[NTOK, j] - S[COMP, j] == 1
            S[COMP, j] += new
            if new > 0 and S[COMP, j] == S[NTOK, j]:
                S[NTOK, j] += 1
                S[LEFT, j] += 1
                count += 1
                rid = S[ID, j]
                if L.first_tok[rid - L.off[0]] != L.first_tok[rid - L.off[0]]:
                    first_token(q, L, r, rid, end)
                elif was_decode:
                    decodes += 1
        reset_lefts(q, r)
    S[NEW, :n] = 0
    iv[r, COMP_SUM] += iv[r, NEW_SUM]
    iv[r, NEW_SUM] = 0
    iv[r, OUTST] += count
    if decodes:
        add_run(h, fv[r, STEP_S], 0.0, 1, float(decodes))
    finish_done(q, L, r, end)
    if not fast or not prefilled or iv[r, FRESH]:
        n = iv[r, N]
        ok = iv[r, FRESH] == 0
        if ok:
            for j in range(n):
                if S[NTOK, j] - S[COMP, j] != 1:
                    ok = False
                    break
        iv[r, ALL_DEC] = ok


@njit(cache=True, inline="always")
def first_token(q: Fleet, L: Log, r: int, rid: int, end: float) -> None:
    """``SchedulerState._first_tokens`` for one request (not a re-sample after a recompute)."""
    if L.first_tok[rid - L.off[0]] == L.first_tok[rid - L.off[0]]:
        return
    L.first_tok[rid - L.off[0]] = end
    q.iv[r, FRESH] -= 1


@njit(cache=True)
def finish_done(q: Fleet, L: Log, r: int, end: float) -> None:
    """``SchedulerState._finish_done``: retire the requests at their output length; compact the columns."""
    iv, S, a = q.iv, q.S[r], q.lefts[r]
    n, sh = iv[r, N], iv[r, SHIFT]
    if n == 0 or a[n - 1] + sh < 0:
        return
    k = 1
    while k < n and a[n - 1 - k] + sh == 0:
        k += 1
    prompt = output = 0
    m = 0
    for j in range(n):
        if S[LEFT, j] + sh == 0:  # exactly k columns (true LEFT <= 0)
            rid = S[ID, j]
            iv[r, COMP_SUM] -= S[COMP, j] + sh
            if iv[r, PKV]:
                retire(q, L, r, (S[COMP, j] + sh) // q.cfg[0])
            L.finish[rid - L.off[0]] = end
            L.status[rid - L.off[0]] = FINISHED
            L.gen[rid - L.off[0]] = L.tok[rid - L.off[0]] - L.inp[rid - L.off[0]]
            prompt += L.inp[rid - L.off[0]]
            output += L.tok[rid - L.off[0]] - L.inp[rid - L.off[0]]
            continue
        if m != j:
            S[:, m] = S[:, j]
        m += 1
    iv[r, OUTST] -= prompt + output
    iv[r, N] = n - k
    if n == k:
        iv[r, SHIFT] = 0


# ----- Replica -----------------------------------------------------------------------------------------
@njit(cache=True)
def enqueue(q: Fleet, L: Log, h: Itl, r: int, rid: int, now: float) -> float:
    """``Replica.enqueue``: the replica's next event time if it changed, else NONE."""
    iv, fv = q.iv, q.fv
    wait_append(q, L, r, rid)
    iv[r, WTOK] += L.inp[rid - L.off[0]] + L.gen[rid - L.off[0]]
    L.repl[rid - L.off[0]] = r
    iv[r, OUTST] += L.inp[rid - L.off[0]] + L.gen[rid - L.off[0]]
    if not iv[r, BUSY]:
        fv[r, CLOCK] = max(fv[r, CLOCK], now)
        return plan(q, L, h, r)
    if iv[r, RUN_ON] and now < fv[r, RUN_START]:
        if iv[r, RUN_K] > 0:
            iv[r, RUN_K] = 0
            fv[r, BUSY_UNTIL] = fv[r, RUN_START]
            return fv[r, BUSY_UNTIL]
        return NONE
    if iv[r, RUN_ON] and iv[r, RUN_K] - iv[r, RUN_DONE] > 1:
        done = run_steps_within(q, r, now - fv[r, RUN_START])
        if done + 1 < iv[r, RUN_K]:
            iv[r, RUN_K] = done + 1
            fv[r, BUSY_UNTIL] = fv[r, RUN_START] + run_time(q, r, iv[r, RUN_K])
            return fv[r, BUSY_UNTIL]
    return NONE


@njit(cache=True)
def on_event(q: Fleet, L: Log, h: Itl, r: int, now: float) -> float:
    """``Replica.on_event``."""
    if q.iv[r, RUN_ON]:
        apply_run(q, L, h, r, q.iv[r, RUN_K] - q.iv[r, RUN_DONE])
    q.iv[r, BUSY] = 0
    q.fv[r, CLOCK] = now
    return plan(q, L, h, r)


@njit(cache=True)
def gateway_tokens(q: Fleet, r: int, now: float) -> int:
    """``Replica.gateway_tokens``: prompt + streamed tokens held, a lazy decode run's steps over by ``now`` added."""
    iv, fv = q.iv, q.fv
    if not iv[r, RUN_ON] or now <= fv[r, RUN_START]:
        return iv[r, OUTST]
    done = min(run_steps_within(q, r, now - fv[r, RUN_START]), iv[r, RUN_K])
    return iv[r, OUTST] + iv[r, N] * max(done - iv[r, RUN_DONE], 0)


@njit(cache=True)
def sync(q: Fleet, L: Log, h: Itl, r: int, now: float) -> None:
    """``Replica.sync``: apply the decode-run steps already over at ``now``."""
    iv, fv = q.iv, q.fv
    if iv[r, RUN_ON] and iv[r, BUSY] and now < fv[r, BUSY_UNTIL]:
        done = min(run_steps_within(q, r, now - fv[r, RUN_START]), iv[r, RUN_K] - 1)
        if done > iv[r, RUN_DONE]:
            apply_run(q, L, h, r, done - iv[r, RUN_DONE])


@njit(cache=True)
def plan(q: Fleet, L: Log, h: Itl, r: int) -> float:
    """``Replica._plan``: a decode run when nothing else can change, else one general step (applied at once)."""
    end = plan_run(q, L, r)
    if end != NONE:
        return end
    end = start_step(q, L, r)
    if end == NONE or q.iv[r, N] == 0:
        return end
    complete_step(q, L, h, r)
    q.fv[r, CLOCK] = end
    after = plan_run(q, L, r)
    q.fv[r, BUSY_UNTIL] = end if after == NONE else after
    q.iv[r, BUSY] = 1
    return q.fv[r, BUSY_UNTIL]


@njit(cache=True)
def plan_run(q: Fleet, L: Log, r: int) -> float:
    """``Replica._plan_run``: start a decode run if nothing but finishes and the KV cache can change it."""
    iv, fv, S = q.iv, q.fv, q.S[r]
    bs, blocks, budget = q.cfg[0], q.cfg[1], q.cfg[2]
    n = iv[r, N]
    if not (n and iv[r, ALL_DEC] and n <= budget):
        return NONE
    sh = iv[r, SHIFT]
    if iv[r, WLEN]:
        nt = head_tokens(q, L, r, budget - n, fv[r, CLOCK])
        if nt >= 0:
            want = head_blocks(q, r, nt)[0]  # the admission gate
            if (iv[r, COMP_SUM] + n) / bs + n + want <= blocks:
                return NONE
            held = 0
            for j in range(n):
                held += (S[COMP, j] + (bs + sh)) // bs
            if want <= blocks - held:
                return NONE
    k = -(q.lefts[r, n - 1] + sh)
    iv[r, RUN_FIN] = k
    if (iv[r, COMP_SUM] + n * k) / bs + n > blocks:
        k = kv_run_length(q, r, k)
    if k <= 0:
        return NONE
    iv[r, NEW_SUM] = n
    st = q.model
    linear = st[INTERCEPT] + st[PER_TOKEN] * n
    first = (st[OVERHEAD] + (linear if linear > st[FLOOR] else st[FLOOR]) + st[PER_SEQ] * n
             + st[PER_CONTEXT] * float(iv[r, COMP_SUM] + n))
    growth = st[PER_CONTEXT] * n
    iv[r, RUN_ON] = 1
    fv[r, RUN_FIRST], fv[r, RUN_GROWTH] = first, growth
    if q.jitter.shape[0]:  # ``JitteredRun``: each step its own factor, the times summed
        k = min(k, q.jdur.shape[1])  # JITTERED_RUN_STEPS, read from the buffer so the two always agree
        end = 0.0
        for i in range(k):
            q.jdur[r, i] = (first + growth * float(i)) * jitter_factor(q.jitter, r, iv[r, STEPS] + i)
            end += q.jdur[r, i]
            q.jend[r, i] = end
    fv[r, RUN_START], iv[r, RUN_K], iv[r, RUN_DONE] = fv[r, CLOCK], k, 0
    if q.jitter.shape[0]:
        fv[r, BUSY_UNTIL] = fv[r, CLOCK] + q.jend[r, k - 1]
    else:
        fv[r, BUSY_UNTIL] = fv[r, CLOCK] + k * first + growth * k * (k - 1) / 2.0
    iv[r, BUSY] = 1
    return fv[r, BUSY_UNTIL]


@njit(cache=True)
def kv_run_length(q: Fleet, r: int, k_fin: int) -> int:
    """``Replica._kv_run_length``: steps (<= k_fin) whose blocks fit."""
    bs, n, S = q.cfg[0], q.iv[r, N], q.S[r]
    total = q.cfg[1]
    add = bs - 1 + q.iv[r, SHIFT]
    lo, hi = 0, k_fin + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        used = 0
        for j in range(n):
            used += (S[COMP, j] + add + mid) // bs
        if used <= total:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True)
def apply_run(q: Fleet, L: Log, h: Itl, r: int, j: int) -> None:
    """``Replica._apply_run``: ``j`` more steps of the decode run in progress."""
    iv, fv = q.iv, q.fv
    if not iv[r, RUN_ON]:
        return
    n = iv[r, N]
    if j > 0:
        if q.jitter.shape[0]:
            for i in range(iv[r, RUN_DONE], iv[r, RUN_DONE] + j):
                add_run(h, q.jdur[r, i], 0.0, 1, float(n))
        else:
            add_run(h, fv[r, RUN_FIRST] + fv[r, RUN_GROWTH] * iv[r, RUN_DONE], fv[r, RUN_GROWTH], j, float(n))
        iv[r, SHIFT] += j
        iv[r, COMP_SUM] += n * j
        iv[r, OUTST] += n * j
        iv[r, RUN_DONE] += j
    if iv[r, RUN_DONE] == iv[r, RUN_K]:
        iv[r, STEPS] += iv[r, RUN_K]
        iv[r, RUN_ON] = iv[r, BUSY] = 0
        iv[r, NEW_SUM] = 0
        if iv[r, PKV]:
            trim_cache(q, L, r)
        if iv[r, RUN_K] == iv[r, RUN_FIN]:
            finish_done(q, L, r, fv[r, RUN_START] + run_time(q, r, iv[r, RUN_K]))

