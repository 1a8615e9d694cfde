"""The oracle's program: fleet sizes per window that cost least while late first tokens stay in budget.

Given per-window miss curves ``m[w, n]`` (``oracle_curves``), window lengths ``L_w`` and a starting
fleet ``n0`` (the shared warm fleet, Ready at 0 for free), ``budget_path`` solves exactly

    minimise   sum_w L_w * n_w  +  cost of the adds, sum_w max(0, n_w - n_{w-1})     (n_{-1} = n0)
    subject to sum_w m[w, n_w] <= budget,   lo <= n_w <= cap_w

by dynamic programming over (window, n, misses used). Misses are counted in units of
``budget / units`` so the table stays small: rounded *up* the answer is feasible for the true misses
(a plan), rounded *down* its cost is no more than the true optimum (a bound). Dropping replicas is
free; the DP decides itself whether a lull is worth a later cold start. Adds cost ``add_cost`` each,
or, for a plan that knows its pods' cold starts, the k-th add costs the k-th draw.

``cold_start_floor`` is the least cold-start GPU time any schedule pays to bring ``R`` pods to Ready
from the run's draw stream, and ``conjugate`` its convex conjugate: the bound charges ``mu`` per
added replica and subtracts ``E*(mu)`` (weak duality), see ``oracle_bound``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np


@dataclass(frozen=True)
class Path:
    """One fleet size per window, its cost (replica-seconds plus add costs) and its (true) misses."""

    replicas: np.ndarray
    cost: float
    misses: int
    adds: int


def _add_prefix(add_cost: float | np.ndarray, most: int) -> tuple[np.ndarray, int]:
    """``P[j]``: what the first j adds cost, j in 0..most, and how many adds the DP must count apart (A):
    a scalar costs the same for every add (A = 0); an array's k-th entry is the k-th add's cost and the
    adds after it cost their mean."""
    costs = np.atleast_1d(np.asarray(add_cost, dtype=float))
    if costs.size == 0 or not (np.isfinite(costs).all() and (costs >= 0).all()):
        raise ValueError(f"add_cost={add_cost!r}: must be finite numbers of seconds >= 0")
    scalar = np.ndim(add_cost) == 0
    tail = float(costs[0] if scalar else costs.mean())
    apart = 0 if scalar else costs.size
    head = np.r_[0.0, np.cumsum(costs[:apart])]
    extra = np.arange(1, max(most - apart, 0) + 1) * tail + head[-1]
    return np.r_[head, extra], apart


def budget_path(misses: np.ndarray, lengths: np.ndarray, budget: float, start: int, add_cost: float | np.ndarray,
                *, units: int = 400, round_up: bool = True, lo: int | np.ndarray = 0,
                cap: np.ndarray | None = None, extra: np.ndarray | None = None) -> Path | None:
    """The cheapest path within ``budget`` (see the module docstring); None when no path fits.

    ``add_cost``: seconds per added replica, or the k-th add's cost for each k (a plan that knows its
    pods' cold starts; the DP then also tracks how many adds came before). ``lo`` and ``cap``: the
    least and most replicas, one for all windows or one per window. ``extra[w, n]``: seconds more for
    n replicas in window w (a plan's last window: the backlog it leaves holds every pod longer).
    """
    k, width = misses.shape
    if lengths.shape != (k,):
        raise ValueError(f"lengths has shape {lengths.shape}: need one length per window ({k})")
    if not (math.isfinite(budget) and budget >= 0):
        raise ValueError(f"budget={budget!r}: must be a finite number of misses >= 0")
    if not 0 <= start < width:
        raise ValueError(f"start={start!r}: must be a fleet size in 0..{width - 1}")
    prefix, apart = _add_prefix(add_cost, k * width)
    replica_cost = lengths[:, None] * np.arange(width)[None, :]
    if extra is not None:
        replica_cost = replica_cost + extra
    unit = max(1.0, budget / max(units, 1))
    cells = math.floor(budget / unit + 1e-9) + 1
    scaled = misses / unit
    used = np.ceil(scaled - 1e-9) if round_up else np.floor(scaled + 1e-9)
    used = np.minimum(used, cells).astype(np.int64)  # more than the budget: never fits
    # states s = a * width + n: n replicas after min(a, apart) adds; step[s, s'] the cost of s' -> s
    ns = np.arange(width)
    size = (apart + 1) * width
    step = np.full((size, size), np.inf)
    for a_prev in range(apart + 1):
        for n_prev in range(width):
            adds = np.maximum(ns - n_prev, 0)
            a_new = np.minimum(a_prev + adds, apart)
            step[a_new * width + ns, a_prev * width + n_prev] = prefix[a_prev + adds] - prefix[a_prev]
    lows = np.broadcast_to(np.asarray(lo, dtype=np.int64), (k,))
    n_of = np.tile(ns, apart + 1)
    value = np.full((size, cells), np.inf)
    value[start, 0] = 0.0
    back = np.zeros((k, size, cells), dtype=np.int32)
    for w in range(k):
        # best predecessor per (s, b): min over s' of value[s', b] + step[s, s']
        total = value[None, :, :] + step[:, :, None]
        back[w] = np.argmin(total, axis=1)
        best = np.take_along_axis(total, back[w][:, None, :], axis=1)[:, 0, :]
        new = np.full((size, cells), np.inf)
        ok = (n_of >= lows[w]) if cap is None else (n_of >= lows[w]) & (n_of <= cap[w])
        for state in np.flatnonzero(ok):
            u = int(used[w, n_of[state]])
            if u < cells:
                new[state, u:] = best[state, : cells - u] + replica_cost[w, n_of[state]]
        value = new
    s_end, b_end = np.unravel_index(int(np.argmin(value)), value.shape)
    if not math.isfinite(value[s_end, b_end]):
        return None
    path = np.zeros(k, dtype=np.int64)
    state, b = int(s_end), int(b_end)
    for w in range(k - 1, -1, -1):
        path[w] = n_of[state]
        b -= int(used[w, n_of[state]])  # the budget used before window w
        state = int(back[w, state, b])
    return _path(path, misses, replica_cost, start, prefix)


def _path(path: np.ndarray, misses: np.ndarray, replica_cost: np.ndarray, start: int, prefix: np.ndarray) -> Path:
    adds = int(np.maximum(np.diff(np.r_[start, path]), 0).sum())
    rows = np.arange(path.size)
    return Path(path, float(replica_cost[rows, path].sum() + prefix[adds]), int(misses[rows, path].sum()), adds)


def cold_start_floor(draws: np.ndarray, r_max: int, skip_cost_s: float | None) -> np.ndarray:
    """``E[R]`` for R in 0..r_max: the least cold-start GPU-seconds of R pods turning Ready.

    The k-th pod any schedule creates gets ``draws[k]``. If no pod is deleted before it is Ready
    (``skip_cost_s`` None), R Ready pods cost exactly the first R draws. A schedule may also delete a
    starting pod to move on to a later, shorter draw; such a pod held its GPU ``skip_cost_s`` at least
    (one tick), so R Ready pods out of the first L created cost at least ``(L - R) x skip_cost_s`` plus
    the R smallest of the first L draws, minimised over L (up to ``len(draws)``).
    """
    d = np.asarray(draws, dtype=float)
    if r_max > d.size:
        raise ValueError(f"r_max={r_max}: needs at least that many draws, got {d.size}")
    exact = np.r_[0.0, np.cumsum(d[:r_max])]
    if skip_cost_s is None:
        return cast(np.ndarray, exact)
    if not (math.isfinite(skip_cost_s) and skip_cost_s >= 0):
        raise ValueError(f"skip_cost_s={skip_cost_s!r}: must be a finite number of seconds >= 0")
    best = np.full(r_max + 1, np.inf)
    best[0] = 0.0
    kept = np.zeros(0)  # the smallest min(L, r_max) of the first L draws, sorted
    r = np.arange(r_max + 1)
    for length in range(1, d.size + 1):
        x = d[length - 1]
        if kept.size < r_max:
            kept = np.insert(kept, np.searchsorted(kept, x), x)
        elif x < kept[-1]:
            kept = np.insert(kept[:-1], np.searchsorted(kept[:-1], x), x)
        else:
            continue
        m = kept.size + 1
        best[:m] = np.minimum(best[:m], (length - r[:m]) * skip_cost_s + np.r_[0.0, np.cumsum(kept)])
        if kept.size == r_max and (length - r_max) * skip_cost_s >= best[-1]:
            break  # skipping more costs more than the whole floor of r_max pods
    return cast(np.ndarray, np.minimum(best, exact))


def conjugate(floor: np.ndarray, mu: float) -> float:
    """``E*(mu) = max_R (mu R - E[R])``: what charging ``mu`` per pod can overstate ``E``."""
    return float(np.max(mu * np.arange(floor.size) - floor))


def golden_max(f: Callable[[float], float], lo: float, hi: float, evals: int = 18) -> tuple[float, float]:
    """Maximise a concave ``f`` on [lo, hi] by golden-section search; returns (x, f(x)) of the best seen."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    seen = [(lo, f(lo)), (c, fc), (d, fd)]
    for _ in range(max(0, evals - 3)):
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
            seen.append((c, fc))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
            seen.append((d, fd))
    return max(seen, key=lambda p: p[1])
