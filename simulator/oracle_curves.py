"""Window miss curves: how many first tokens of one window's arrivals are late on n fixed replicas.

The clairvoyant oracle and its lower bound (``oracle_bound``) reason per window of ``WINDOW_S``
seconds: ``m_w(n)`` is the number of window ``w``'s arrivals whose TTFT exceeds the SLO when served
by ``n`` replicas that are Ready throughout. Misses are counted among requests that get a first token
(as ``results.summarize`` defines ``ttft_p95``): prompts the engine rejects (longer than the context)
never spend the miss budget.

Two versions, for two jobs:

- **optimistic** (``start="empty"``, the bound's): only the window's own arrivals, on replicas empty
  at its start, so no work carried over from earlier windows delays them. With prefix blocks
  (Mooncake) an empty start would also mean a *cold* prefix cache, which is pessimistic; the bound's
  windows instead replay ``strip_cacheable`` prompts: each prompt without the longest prefix any
  prefix cache could hold for it, so its prefill is the least any replica could do.
- **warm** (``start="warm"``, the feasible schedule's): the previous window's arrivals are replayed
  first on the same fleet and not counted, so queues and prefix caches are what a steady fleet would
  carry in. Closer to what a full run shows; the schedule is still simulated in full and repaired.

Only the fleet sizes that matter are simulated: from the work model's estimate up until the misses
reach the window's floor (requests late even alone on an idle replica, ``lone_misses``), then down
until the misses exceed the largest budget asked about. ``m_w`` should not increase with ``n``; the
raw simulations are kept and callers enforce the direction they need (``monotone``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from simulator.workload import Workload, select_window

WINDOW_S = 60.0
DOWN_STOP_SHARE = 0.5
"""A window's scan stops once half its requests are late: no budget worth spending goes there."""
NEAR_FLOOR_SHARE = 0.005
"""Scanning up stops within this share of the window's requests above its floor (above the largest fleet
simulated, the bound takes the floor and a plan the last value, so stopping early is safe for both)."""


@dataclass(frozen=True)
class Windows:
    """The run cut into windows: ``edges`` (K + 1 times), each request's window, eligible counts."""

    edges: np.ndarray
    index: np.ndarray
    eligible: np.ndarray

    @property
    def count(self) -> int:
        return int(self.edges.size - 1)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.edges)


@dataclass
class MissCurves:
    """Simulated misses per window and fleet size: ``raw[w]`` maps n -> late first tokens.

    ``floor[w]``: misses no fleet avoids (late even alone on an idle replica); ``eligible[w]``:
    requests that get a first token at all.
    """

    windows: Windows
    raw: list[dict[int, int]]
    floor: np.ndarray
    simulations: int = 0
    tail: dict[int, float] = field(default_factory=dict)
    """Last window only: seconds its replay ran past the last arrival, per fleet size (the backlog a
    lean last window leaves runs on, and every pod is held until it is done)."""

    def tail_costs(self, n_max: int) -> np.ndarray:
        """Replica-seconds of that tail for n in 0..n_max. A size not simulated takes the next smaller
        one's tail; below the smallest, the same work done by fewer replicas: the smallest's replica-time
        from the window's start, spread over n (a tail only grows as the fleet shrinks)."""
        out = np.zeros(n_max + 1)
        if not self.tail:
            return out
        ns = sorted(self.tail)
        length = float(self.windows.lengths[-1])
        for n in range(1, n_max + 1):
            below = [m for m in ns if m <= n]
            if below:
                out[n] = n * self.tail[below[-1]]
            else:
                out[n] = max(ns[0] * (length + self.tail[ns[0]]) - n * length, n * self.tail[ns[0]])
        out[0] = out[1] if n_max >= 1 else 0.0
        return out

    @property
    def n_max(self) -> int:
        """The largest fleet simulated in any window."""
        return max((max(r) for r in self.raw if r), default=0)

    def table(self, n_max: int, optimistic: bool) -> np.ndarray:
        """``m[w, n]`` for n in 0..n_max, made monotone in the direction the caller needs.

        ``optimistic`` (the bound): below the smallest simulated n, the misses there (more replicas
        never hurt, so fewer cannot do better); between, the running minimum from below; above the
        largest simulated n, the floor (nothing more is known); never under the floor. Otherwise (a
        plan): the running maximum from above, and above the largest simulated n, the misses there.
        """
        k = self.windows.count
        out = np.zeros((k, n_max + 1), dtype=np.int64)
        for w in range(k):
            out[w] = monotone(self.raw[w], n_max, int(self.windows.eligible[w]), int(self.floor[w]), optimistic)
        return out


def monotone(raw: dict[int, int], n_max: int, eligible: int, floor: int, optimistic: bool) -> np.ndarray:
    """One window's curve over 0..n_max from its simulated points (see ``MissCurves.table``).

    Between simulated sizes ``n1 < n < n2`` the true value lies in ``[m(n2), m(n1)]`` (non-increasing):
    the optimistic curve takes ``m(n2)`` (the floor above the largest), the pessimistic one ``m(n1)``.
    """
    points = dict(raw)
    points.setdefault(0, eligible)  # no replica serves the window: every first token is late
    ns = np.array(sorted(points))
    ms = np.array([points[n] for n in ns], dtype=np.int64)
    grid = np.arange(n_max + 1)
    if optimistic:
        above = np.searchsorted(ns, grid, side="left")
        values = np.where(above < ns.size, ms[np.minimum(above, ns.size - 1)], floor)
        return cast(np.ndarray, np.maximum(np.minimum.accumulate(values), floor))
    below = np.searchsorted(ns, grid, side="right") - 1
    values = ms[below]
    return np.maximum.accumulate(values[::-1])[::-1]


def make_windows(workload: Workload, window_s: float, rejected: np.ndarray | None = None,
                 end_s: float | None = None) -> Windows:
    """Windows of ``window_s`` covering every arrival up to ``end_s`` (default: the last);
    ``rejected`` marks requests never served."""
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s={window_s!r}: must be a finite number of seconds > 0")
    end = end_s if end_s is not None else (float(workload.arrival_s[-1]) if len(workload) else 0.0)
    k = max(1, math.floor(end / window_s) + 1)
    edges = np.arange(k + 1) * window_s
    index = np.minimum((np.asarray(workload.arrival_s) // window_s).astype(np.int64), k - 1)
    ok = np.ones(len(workload), dtype=bool) if rejected is None else ~rejected
    return Windows(edges, index, np.bincount(index[ok], minlength=k))


def too_long(workload: Workload, profile: Any) -> np.ndarray:
    """Requests the engine rejects at arrival (prompt >= the profile's context), for every schedule."""
    limit = getattr(profile, "max_model_len", None)
    if not isinstance(limit, int):
        return np.zeros(len(workload), dtype=bool)
    return np.asarray(workload.input_tokens) >= limit


def strip_cacheable(workload: Workload, profile: Any, slo_ttft_s: float, edges: np.ndarray) -> Workload:
    """The workload with each prompt cut by the prefix any replica's cache could hold at its window's start.

    A replica's prefix cache holds only blocks of prompts already prefilled (vLLM registers a prompt's
    blocks once it has computed them), and prefix hits are a *leading* run of blocks. For request ``i``
    in window ``[a_w, b_w)``: a block another request carried before ``a_w`` may be on every replica
    (the most any cache could hold then), and so may one first carried in ``[b_w, b_w + S)`` (it could
    register before ``i`` is admitted and still be on time). The leading run of such blocks is cut:
    ``min(run x block_tokens, prompt - 1)`` tokens (vLLM recomputes the last token). The rest of the
    prompt keeps its blocks, so hits on blocks first carried *inside* the window are simulated, with the
    prefix-aware router. Less prefill, less KV, shorter contexts than any schedule sees. Outputs keep
    the cap of the original prompt (the engine caps ``output`` to the context) and prompts the engine
    rejects are dropped (rejected under every schedule). Without blocks only the latter two apply.
    """
    reject = too_long(workload, profile)
    inp = np.asarray(workload.input_tokens, dtype=np.int64)
    out = np.asarray(workload.output_tokens, dtype=np.int64)
    limit = getattr(profile, "max_model_len", None)
    if isinstance(limit, int):
        out = np.minimum(out, np.maximum(limit - inp, 1))
    ids, offs = workload.block_ids, workload.block_offsets
    if ids is not None and offs is not None:
        lead = _cacheable_blocks(workload, slo_ttft_s, edges)
        cut = np.minimum(lead * workload.block_tokens, np.maximum(inp - 1, 0))
        counts = np.diff(offs)
        drop = np.where(cut >= inp - 1, counts, np.minimum(lead, counts))  # nothing left to hit: no blocks
        owner = np.repeat(np.arange(len(workload)), counts)
        keep_block = (np.arange(ids.size) - offs[owner]) >= drop[owner]
        ids = ids[keep_block]
        offs = np.r_[0, np.cumsum(counts - drop)]
        inp = inp - cut
    full = Workload(workload.arrival_s, inp, out, name=f"{workload.name}[cache-stripped]", block_ids=ids,
                    block_offsets=offs, origin_s=workload.origin_s, block_tokens=workload.block_tokens)
    return full.take(np.flatnonzero(~reject))


def _cacheable_blocks(workload: Workload, slo_ttft_s: float, edges: np.ndarray) -> np.ndarray:
    """Per request, the leading blocks any cache could hold at its window's start (``strip_cacheable``)."""
    ids, offs = workload.block_ids, workload.block_offsets
    assert ids is not None and offs is not None
    arrival = np.asarray(workload.arrival_s)
    counts = np.diff(offs)
    owner = np.repeat(np.arange(len(workload)), counts)
    # for each block id, the earliest and second-earliest arrival that carries it
    order = np.lexsort((arrival[owner], ids))
    sid, sarr, sown = ids[order], arrival[owner][order], owner[order]
    first_of = np.r_[True, sid[1:] != sid[:-1]] if sid.size else np.zeros(0, dtype=bool)
    start = np.flatnonzero(first_of)
    group = np.cumsum(first_of) - 1
    second = np.full(start.size, np.inf)
    has_two = np.r_[start[1:], sid.size] - start >= 2
    second[has_two] = sarr[start[has_two] + 1]
    # the earliest arrival of *another* request carrying this block
    other = np.where(sown == sown[start][group], second[group], sarr[start][group])
    window = np.clip(np.searchsorted(edges, sarr, side="right") - 1, 0, edges.size - 2)
    a_w, b_w = edges[window], edges[window + 1]
    usable_sorted = (other < a_w) | ((other >= b_w) & (other < b_w + slo_ttft_s))
    usable = np.empty(ids.size, dtype=bool)
    usable[order] = usable_sorted
    # leading run of usable blocks per request: position of the first unusable one
    pos = np.arange(ids.size) - offs[owner]
    first_bad = np.full(len(workload), np.iinfo(np.int64).max)
    np.minimum.at(first_bad, owner[~usable], pos[~usable])
    return cast(np.ndarray, np.minimum(first_bad, counts))


def fixed_fleet_ttft(make_backend: Callable[[Workload], Any], workload: Workload, replicas: int) -> np.ndarray:
    """TTFT of every request on ``replicas`` fixed replicas Ready at 0 (NaN: no first token)."""
    return fixed_fleet_run(make_backend, workload, replicas)[0]


def fixed_fleet_run(make_backend: Callable[[Workload], Any], workload: Workload, replicas: int,
                    ) -> tuple[np.ndarray, float]:
    """TTFT of every request on ``replicas`` fixed replicas Ready at 0, and when the run ended."""
    backend = make_backend(workload)
    for _ in range(replicas):
        backend.add_replica(0.0)
    outcome = backend.run()
    return np.asarray(outcome.ttft_s, dtype=float), float(getattr(outcome, "end_s", 0.0) or 0.0)


LONE_GAP_S = 60.0


def lone_misses(make_backend: Callable[[Workload], Any], workload: Workload, windows: Windows, slo_ttft_s: float,
                suspects: np.ndarray) -> np.ndarray:
    """Per window, requests late even alone on an idle replica (``suspects`` limits the search to the
    requests whose work model says they could be: the rest cannot be late alone).

    One replica, the suspects ``LONE_GAP_S`` apart with one output token each, so each normally finds
    the replica idle; one that did not (its predecessor's first token came later than the gap) is not
    counted, so the floor can only come out low, which is the safe side for the bound.
    """
    floor = np.zeros(windows.count, dtype=np.int64)
    idx = np.flatnonzero(suspects)
    if idx.size == 0:
        return floor
    alone = workload.take(idx, arrival_s=np.arange(idx.size) * LONE_GAP_S)
    alone = Workload(alone.arrival_s, alone.input_tokens, np.ones(idx.size, dtype=np.int64), name=alone.name,
                     block_ids=alone.block_ids, block_offsets=alone.block_offsets, block_tokens=alone.block_tokens)
    ttft = fixed_fleet_ttft(make_backend, alone, 1)
    idle = np.r_[True, np.nan_to_num(ttft[:-1], nan=np.inf) < LONE_GAP_S]
    late = idle & np.isfinite(ttft) & (ttft > slo_ttft_s)
    np.add.at(floor, windows.index[idx[late]], 1)
    return floor


def _plateau(up: list[int], raw: dict[int, int]) -> bool:
    """The last three sizes tried upward each cut the misses by less than 2 %: more will not reach the floor."""
    if len(up) < 3:
        return False
    a, b, c = (raw[n] for n in up[-3:])
    return b >= 0.98 * a and c >= 0.98 * b


def scan_window(misses_at: Callable[[int], int], start: int, floor: int, stop_above: int, n_cap: int,
                near: int = 0) -> dict[int, int]:
    """Simulate one window at the fleet sizes that matter; returns {n: misses}.

    Up from ``start`` (steps of ``n // 8``, at least 1) until the misses are within ``near`` of ``floor``,
    plateau (``_plateau``) or reach ``n_cap``; bisection for the smallest size doing as well; then down, one by one
    for two sizes and by ``n // 8`` after, until the misses exceed ``stop_above`` (or n = 1). Large
    fleets are sampled sparsely; ``monotone`` fills the sizes between soundly in either direction.
    """
    raw: dict[int, int] = {}

    def at(n: int) -> int:
        if n not in raw:
            raw[n] = misses_at(n)
        return raw[n]

    n = max(1, min(start, n_cap))
    up = [n]
    while not (at(n) <= floor + near or n >= n_cap or _plateau(up, raw)):
        n = min(n_cap, n + max(1, n // 8))
        up.append(n)
    hi, target = n, raw[n]
    lo = max([m for m in up if raw[m] > target], default=0)
    while hi - lo > 1:  # smallest size with misses <= target
        mid = (lo + hi) // 2
        if at(mid) <= target:
            hi = mid
        else:
            lo = mid
    n, steps = hi - 1, 0
    while n >= 1:
        if at(n) > stop_above:
            break
        steps += 1
        n -= 1 if steps < 2 else max(1, n // 8)
    return raw


def window_curves(workload: Workload, make_backend: Callable[[Workload], Any], slo_ttft_s: float,
                  estimate: np.ndarray, budget: int, *, start: str = "empty", window_s: float = WINDOW_S,
                  floor: np.ndarray | None = None, n_cap: int = 100, rejected: np.ndarray | None = None,
                  end_s: float | None = None, warmup: int = 1) -> MissCurves:
    """``m_w(n)`` for every window (see the module docstring); ``estimate[w]``: where to start scanning.

    ``budget``: the most misses any question will allow in total; a window's scan down stops once its
    misses exceed ``min(budget, DOWN_STOP_SHARE x its requests)``. ``warmup``: how many windows before
    it a warm start replays (a backlog can cascade over more than one).
    """
    if start not in ("empty", "warm"):
        raise ValueError(f"start={start!r}: allowed 'empty' or 'warm'")
    windows = make_windows(workload, window_s, rejected, end_s)
    floors = np.zeros(windows.count, dtype=np.int64) if floor is None else np.asarray(floor, dtype=np.int64)
    raw: list[dict[int, int]] = []
    tail: dict[int, float] = {}
    sims = 0
    edges = windows.edges
    last_arrival = float(workload.arrival_s[-1]) if len(workload) else 0.0
    for w in range(windows.count):
        lo = edges[max(w - warmup, 0)] if start == "warm" else edges[w]
        hi = edges[w + 1] if w + 1 < windows.count else math.inf
        part = select_window(workload, lo, hi)
        if len(part) == 0:
            raw.append({})
            continue
        counted = part.arrival_s >= edges[w] - lo

        def misses_at(n: int, part: Workload = part, counted: np.ndarray = counted, lo: float = lo,
                      last: bool = w == windows.count - 1) -> int:
            nonlocal sims
            sims += 1
            ttft, ended = fixed_fleet_run(make_backend, part, n)
            if last:
                tail[n] = max(0.0, lo + ended - last_arrival)
            ttft = ttft[counted]
            return int(np.sum(np.isfinite(ttft) & (ttft > slo_ttft_s)))

        stop = min(budget, int(DOWN_STOP_SHARE * windows.eligible[w]))
        near = int(NEAR_FLOOR_SHARE * windows.eligible[w])
        raw.append(scan_window(misses_at, int(estimate[w]), int(floors[w]), stop, n_cap, near))
    return MissCurves(windows, raw, floors, sims, tail)
