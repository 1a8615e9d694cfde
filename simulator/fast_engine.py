"""``engine.simulate`` for a fixed fleet, compiled: the same event loop over ``fast_replica``'s step rules.

What it covers: a fixed fleet serving from time 0 (``simulate``), routed least-tokens (``router.py``) or
round-robin, with or without the gateway's 429 limit, on a workload without prefix blocks. Anything
else (prefix caching, the random router, the autoscaling layer's hooks) runs in ``engine.Engine``,
the reference; ``supports`` says which. Both give bit-identical results for the same inputs
(``tests/test_fast_engine.py``), so callers never need to know which one ran.

Why compiled: the Python engine spends ~10 us per event in interpreter overhead (attribute reads,
tiny numpy calls), with 2-3 replica events per request whatever the batching (profile in
``docs/simulator.md``); numba (a plain ``pip install``, a wheel) runs the same code at C speed. The
loop runs in chunks of arrivals, so a progress callback sees the run advance and buffers grow on
demand; memory is the per-request columns (no Python object per request).

Events are ordered as in ``engine``: (time, priority, sequence), replica steps before timers before
arrivals; the KV-usage sampler is the one timer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from simulator import fast_replica as fr
from simulator.fast_replica import BUSY, VERSION, WTOK, Fleet, Itl, Log, njit
from simulator.results import REJECTED, LatencyHistogram, RequestLog, SimulationResult

_STEP, _TIMER, _ARRIVAL = 0, 1, 2
NXT, SEQ, TURN, OVERLOAD, NKV, NREQ, FINAL = range(7)  # fields of the loop's integer state
NOW, LAST = range(2)
DONE, MORE, GROW = 0, 1, 2  # why run_loop returned
FAST_ROUTERS = ("auto", "prefix", "least-tokens", "round-robin")


class Heap(NamedTuple):
    """The event heap: ``t[i]`` and ``m[i] = (priority, sequence, replica, version)``, ``size[0]`` of them."""

    t: np.ndarray
    m: np.ndarray
    size: np.ndarray


def supports(workload: Any, router: str) -> bool:
    """Whether the compiled loop can run this fixed-fleet simulation (else ``engine.Engine`` does)."""
    return workload.block_ids is None and router in FAST_ROUTERS


@njit(cache=True, inline="always")
def _less(hp: Heap, i: int, j: int) -> bool:
    if hp.t[i] != hp.t[j]:
        return hp.t[i] < hp.t[j]
    if hp.m[i, 0] != hp.m[j, 0]:
        return hp.m[i, 0] < hp.m[j, 0]
    return hp.m[i, 1] < hp.m[j, 1]


@njit(cache=True, inline="always")
def _swap(hp: Heap, i: int, j: int) -> None:
    hp.t[i], hp.t[j] = hp.t[j], hp.t[i]
    for c in range(4):
        hp.m[i, c], hp.m[j, c] = hp.m[j, c], hp.m[i, c]


@njit(cache=True)
def _push(hp: Heap, t: float, prio: int, seq: int, a: int, b: int) -> None:
    i = hp.size[0]
    hp.size[0] = i + 1
    hp.t[i] = t
    hp.m[i, 0], hp.m[i, 1], hp.m[i, 2], hp.m[i, 3] = prio, seq, a, b
    while i > 0:
        parent = (i - 1) // 2
        if not _less(hp, i, parent):
            break
        _swap(hp, i, parent)
        i = parent


@njit(cache=True)
def _pop(hp: Heap) -> None:
    """Drop the smallest event (read it at index 0 first)."""
    last = hp.size[0] - 1
    hp.size[0] = last
    if last == 0:
        return
    _swap(hp, 0, last)
    i = 0
    while True:
        c = 2 * i + 1
        if c >= last:
            break
        if c + 1 < last and _less(hp, c + 1, c):
            c += 1
        if not _less(hp, c, i):
            break
        _swap(hp, c, i)
        i = c


@njit(cache=True)
def run_loop(q: Fleet, L: Log, h: Itl, hp: Heap, G: np.ndarray, Gf: np.ndarray, kv: np.ndarray,
             stop: float, kv_period: float, limit: float, round_robin: bool, nxt_stop: int) -> int:
    """``Engine.run``'s loop until every request is resolved (DONE), ``nxt_stop`` arrivals (MORE) or a full
    buffer (GROW: the caller enlarges the heap or the KV samples and calls again). ``G[NREQ]`` requests are
    loaded; unless ``G[FINAL]``, more follow (a streamed run), so reaching ``G[NREQ]`` is MORE, not the end."""
    n_req = G[NREQ]
    final = G[FINAL] != 0
    R = q.iv.shape[0]
    blocks = q.cfg[1]
    while True:
        if hp.size[0] + 2 >= hp.t.size or G[NKV] >= kv.shape[0]:
            return GROW
        nxt = G[NXT]
        if nxt >= nxt_stop and (nxt < n_req or not final):
            return MORE
        t_arr = L.arrival[nxt - L.off[0]] if nxt < n_req else math.inf
        if hp.size[0] and (hp.t[0] < t_arr or (hp.t[0] == t_arr and hp.m[0, 0] < _ARRIVAL)):
            t, prio, a, b = hp.t[0], hp.m[0, 0], hp.m[0, 2], hp.m[0, 3]
            _pop(hp)
            if t > stop:
                Gf[NOW] = stop
                return DONE
            Gf[NOW] = t
            if prio == _STEP:
                if q.iv[a, VERSION] != b:
                    continue
                Gf[LAST] = t
                t_next = fr.on_event(q, L, h, a, t)
                if t_next != fr.NONE:
                    q.iv[a, VERSION] += 1
                    G[SEQ] += 1
                    _push(hp, t_next, _STEP, G[SEQ], a, q.iv[a, VERSION])
            else:  # the KV-usage sampler (Engine._sample_kv): each replica's usage as a scrape reads it
                row = G[NKV]
                kv[row, 0] = t
                for r in range(R):
                    fr.sync(q, L, h, r, t)
                    kv[row, 1 + r] = fr.used_blocks(q, r) / blocks
                G[NKV] = row + 1
                G[SEQ] += 1
                _push(hp, t + kv_period, _TIMER, G[SEQ], 0, 0)
                if nxt >= n_req:
                    busy = False
                    for r in range(R):
                        if q.iv[r, BUSY]:
                            busy = True
                            break
                    if not busy:
                        return DONE
        elif nxt < n_req:
            if t_arr > stop:
                Gf[NOW] = stop
                return DONE
            Gf[NOW] = Gf[LAST] = t_arr
            G[NXT] = nxt + 1
            if L.status[nxt - L.off[0]] == REJECTED:  # longer than max_model_len: rejected at arrival
                continue
            if limit > 0.0:
                waiting = 0
                for r in range(R):
                    waiting += q.iv[r, WTOK]
                if waiting + L.inp[nxt - L.off[0]] > limit * max(1, R):
                    L.status[nxt - L.off[0]] = REJECTED  # 429: the queue is at its limit
                    G[OVERLOAD] += 1
                    continue
            if round_robin:
                G[TURN] += 1
                rep = (G[TURN] - 1) % R
            else:  # least tokens as the gateway sees them (router.py), the first of equals
                rep = 0
                best = fr.gateway_tokens(q, 0, t_arr) if R > 1 else 0
                for r in range(1, R):
                    load = fr.gateway_tokens(q, r, t_arr)
                    if load < best:
                        rep, best = r, load
            t_next = fr.enqueue(q, L, h, rep, nxt, t_arr)
            if t_next != fr.NONE:
                q.iv[rep, VERSION] += 1
                G[SEQ] += 1
                _push(hp, t_next, _STEP, G[SEQ], rep, q.iv[rep, VERSION])
        else:
            return DONE


def loop_buffers(replicas: int) -> tuple[LatencyHistogram, Itl, Heap, np.ndarray, np.ndarray, np.ndarray]:
    """A fresh loop's state: ITL histogram (and its compiled view), event heap with the KV sampler's first
    tick at time 0 (``Engine.every(kv_sample_s, _sample_kv)``), integer and float state, KV samples."""
    itl = LatencyHistogram()
    bounds = np.concatenate(([-np.inf], itl.edges, [np.inf]))
    h = Itl(itl.edges, bounds, itl.counts, np.zeros((1 << 16, 4), np.float64), np.zeros(1, np.int64))
    hp = Heap(np.zeros(1024, np.float64), np.zeros((1024, 4), np.int64), np.zeros(1, np.int64))
    G = np.zeros(7, np.int64)
    G[SEQ] = 1
    _push(hp, 0.0, _TIMER, 1, 0, 0)
    return itl, h, hp, G, np.zeros(2, np.float64), np.zeros((1024, 1 + replicas), np.float64)


def grown(hp: Heap, kv: np.ndarray, G: np.ndarray) -> tuple[Heap, np.ndarray]:
    """The heap and KV-sample buffers after ``run_loop`` returned GROW: whichever was full, doubled."""
    if hp.size[0] + 2 >= hp.t.size:
        hp = Heap(np.resize(hp.t, 2 * hp.t.size), np.resize(hp.m, (2 * hp.t.size, 4)), hp.size)
    if G[NKV] >= kv.shape[0]:
        kv = np.concatenate((kv, np.zeros_like(kv)))
    return hp, kv


def simulate_fixed(workload: Any, profile: Any, replicas: int, router: str = "auto",
                   progress: Callable[[int], None] | None = None, waiting_tokens_limit: float | None = None,
                   kv_sample_s: float = 10.0, horizon_s: float = 86_400.0, chunk: int = 1 << 16) -> SimulationResult:
    """What ``engine.simulate`` returns for these inputs (``supports`` must hold)."""
    if not supports(workload, router):
        raise ValueError(f"fast_engine: router={router!r} with prefix blocks={workload.block_ids is not None}: "
                         f"needs one of {list(FAST_ROUTERS)} and no prefix blocks (use engine.simulate)")
    started = time.perf_counter()
    inp = workload.input_tokens
    out = np.minimum(workload.output_tokens, np.maximum(profile.max_model_len - inp, 1))
    log = RequestLog(workload.arrival_s, inp, out)
    log.status[inp >= profile.max_model_len] = REJECTED
    n_req = len(log)
    L = Log(log.arrival_s, log.input_tokens, log.input_tokens + log.output_tokens, log.first_token_s, log.finish_s,
            log.first_scheduled_s, log.generated, log.preemptions, log.replica, log.status,
            np.full(n_req, -1, np.int64), np.zeros(n_req, np.int64), np.zeros(n_req, np.int64), np.zeros(1, np.int64))
    q = fr.new_fleet(replicas, profile)
    itl, h, hp, G, Gf, kv = loop_buffers(replicas)
    G[NREQ], G[FINAL] = n_req, 1
    last_arrival = float(workload.arrival_s[-1]) if n_req else 0.0
    stop = last_arrival + horizon_s
    limit = float(waiting_tokens_limit) if waiting_tokens_limit is not None else 0.0
    target = min(chunk, n_req)
    while True:
        why = run_loop(q, L, h, hp, G, Gf, kv, stop, float(kv_sample_s), limit, router == "round-robin", target)
        if why == GROW:
            hp, kv = grown(hp, kv, G)
            continue
        if progress is not None:
            progress(int(G[NXT]))
        if why == DONE:
            break
        target = min(target + chunk, n_req)
    fr.bin_runs(h)
    end = float(Gf[LAST])
    samples = kv[: G[NKV]]
    kv_usage = np.array([(row[0], float(np.mean(row[1:])), float(np.max(row[1:])), replicas) for row in samples],
                        dtype=np.float64).reshape(-1, 4)
    live = sum((end - 0.0) * profile.tensor_parallel for _ in range(replicas))
    return SimulationResult(
        log=log, itl=itl, end_s=end, gpu_seconds=sum([0.0 + live]), wall_seconds=time.perf_counter() - started,
        kv_usage=kv_usage, preemptions=int(log.preemptions.sum()), profile=profile.name,
        extra={"prefix_cache_hit_rate": None, "overload_rejected": int(G[OVERLOAD])})
