"""The feasible clairvoyant schedule: a fleet path made into pods with their known cold starts, then
simulated and repaired until it meets the SLO.

1. ``place_pods``: a fleet size per window (from ``oracle_dp.budget_path`` on *warm* miss curves)
   becomes pods, one per run of windows at each replica level (level j is on while the path is
   >= j). The k-th pod created gets the k-th draw of the run's cold-start stream (the draw any policy's
   k-th pod gets); each pod is created exactly that draw before its run starts, so it is Ready on
   the window boundary. A gap in a level is bridged when it is shorter than the draw of the pod
   that would restart it (stopping and restarting would hold the GPU longer than keeping it).
   Pods wanted before their draw could elapse come from the shared warm fleet while it lasts, else
   they are created at 0 and are Ready one draw later, like any policy's.
2. ``repair``: simulate the pods in full; where a window's arrivals were later than its curve
   predicted (work carried in from a leaner window before it), raise that window's curve to what the
   run showed and solve again. A run that meets the SLO with misses to spare lets the next solve
   spend part of the spare. A bounded number of full runs; the cheapest run that meets the SLO wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.oracle import PodPlan
from simulator.oracle_dp import Path, budget_path


def level_runs(path: np.ndarray, edges: np.ndarray) -> list[list[list[float]]]:
    """Per replica level (1..max), its runs of windows as [start, end] times; the last window's runs
    never end (the run's tail drains, as every policy's fleet does)."""
    k = path.size
    levels: list[list[list[float]]] = []
    for level in range(1, int(path.max(initial=0)) + 1):
        on = path >= level
        runs: list[list[float]] = []
        w = 0
        while w < k:
            if not on[w]:
                w += 1
                continue
            first = w
            while w < k and on[w]:
                w += 1
            runs.append([float(edges[first]), math.inf if w == k else float(edges[w])])
        levels.append(runs)
    return levels


@dataclass
class _Pod:
    level: int
    start: float
    end: float
    draw: float = 0.0
    warm: bool = False


def _assign(pods: list[_Pod], draws: np.ndarray, warm_limit: int) -> None:
    """Warm pods first (those wanted at 0, lowest levels first, then any wanted before their draw
    allows); the rest take draws in the order they are created, iterated to a fixed point."""
    for p in pods:
        p.warm = False
    warm = 0
    for p in sorted((p for p in pods if p.start <= 0.0), key=lambda p: p.level):
        if warm < warm_limit:
            p.warm, warm = True, warm + 1
    cold = [p for p in pods if not p.warm]
    order = sorted(range(len(cold)), key=lambda i: (cold[i].start, cold[i].level))
    for _ in range(10):
        for k, i in enumerate(order):
            cold[i].draw = float(draws[k % draws.size])
        created = [max(0.0, p.start - p.draw) for p in cold]
        new = sorted(range(len(cold)), key=lambda i: (created[i], cold[i].start, cold[i].level))
        if new == order:
            break
        order = new
    for p in sorted(cold, key=lambda p: p.start):  # a pod that cannot be Ready in time: warm if any are left
        if warm < warm_limit and p.start - p.draw < 0.0:
            p.warm, warm = True, warm + 1


def place_pods(path: np.ndarray, edges: np.ndarray, draws: np.ndarray, warm_limit: int) -> list[PodPlan]:
    """Pods for a fleet path (see the module docstring), gaps bridged by each pod's own known draw."""
    levels = level_runs(path, edges)
    for _ in range(50):
        pods = [_Pod(j, s, e) for j, runs in enumerate(levels) for s, e in runs]
        _assign(pods, draws, warm_limit)
        merged = False
        by_start = {(p.level, p.start): p for p in pods}
        for j, runs in enumerate(levels):
            keep = [runs[0]] if runs else []
            for s, e in runs[1:]:
                nxt = by_start[(j, s)]
                if not nxt.warm and s - keep[-1][1] <= nxt.draw:
                    keep[-1][1] = e
                    merged = True
                else:
                    keep.append([s, e])
            levels[j] = keep
        if not merged:
            break
    pods = [_Pod(j, s, e) for j, runs in enumerate(levels) for s, e in runs]
    _assign(pods, draws, warm_limit)
    plans = []
    for p in pods:
        if p.warm:
            plans.append(PodPlan(0.0, 0.0, p.end, 0.0, warm=True))
        elif p.start - p.draw >= 0.0:
            plans.append(PodPlan(p.start - p.draw, p.start, p.end, p.draw))
        elif p.draw < p.end:
            plans.append(PodPlan(0.0, p.draw, p.end, p.draw))
    return plans


@dataclass
class Attempt:
    """One full simulation of a planned path: its result and whether it met the target."""

    path: Path
    result: Any
    meets: bool
    late: int
    plans: list[PodPlan] = field(default_factory=list)


@dataclass
class Repair:
    """Inputs of ``repair``: curves (``table[w, n]``, pessimistic), window lengths and edges, the
    request -> window map, the warm fleet, min replicas, per-window caps, known draws, nominal add cost."""

    table: np.ndarray
    lengths: np.ndarray
    edges: np.ndarray
    window_of: np.ndarray
    start: int
    min_replicas: int
    cap: np.ndarray
    draws: np.ndarray
    add_cost: float | np.ndarray
    extra: np.ndarray | None = None
    """Seconds more per (window, fleet size): the last window's tail (``oracle_dp.budget_path``)."""
    attempts: list[Attempt] = field(default_factory=list)


def late_by_window(result: Any, window_of: np.ndarray, k: int, slo_ttft_s: float) -> np.ndarray:
    """Late first tokens per arrival window of one simulated run."""
    ttft = np.asarray(result.ttft_s, dtype=float)
    late = np.isfinite(ttft) & (ttft > slo_ttft_s)
    return np.bincount(window_of[late], minlength=k)


def correct(table: np.ndarray, replicas: np.ndarray, shown: np.ndarray) -> None:
    """Raise each window's curve, at the fleet it ran with and below, to the misses the full run showed
    there (work carried in from leaner or congested windows before it). Never lowered: a window that did
    better than its replay did so in that run's company, not in every path's."""
    for w, n in enumerate(np.asarray(replicas, dtype=np.int64)):
        table[w, : n + 1] = np.maximum(table[w, : n + 1], shown[w])


def repair(spec: Repair, budget: int, simulate: Callable[[list[PodPlan]], Any],
           judge: Callable[[Any], tuple[bool, int, int]], slo_ttft_s: float, runs: int,
           spend: float = 0.92) -> Attempt | None:
    """Solve, simulate, correct, repeat (``runs`` full simulations at most); the cheapest attempt that
    met the target, or None. ``judge(result) -> (meets, late, allowed late)``.

    Until a run meets the target, each solve uses the curves as every run so far corrected them
    (``correct``). After one does, the search descends from the best run: each window may keep its
    fleet or move it by one replica (trading replicas between windows), and the budget is what the
    best run left, scaled by how far its misses were from the curves' prediction. A step that fails
    only corrects the curves; the search ends after two steps without a cheaper run that meets the
    target, or when the solve returns a path already simulated.
    """
    target = spend * budget
    seen: set[tuple[int, ...]] = set()
    best: Attempt | None = None
    k = spec.table.shape[0]
    lo: int | np.ndarray = spec.min_replicas
    cap = spec.cap
    done = stale = 0
    for _ in range(4 * runs):
        if done >= runs or stale >= 2:
            break
        path = budget_path(spec.table, spec.lengths, target, spec.start, spec.add_cost, lo=lo, cap=cap,
                           extra=spec.extra)
        if path is None:
            break
        key = tuple(int(n) for n in path.replicas)
        if key in seen:
            if best is not None and key == tuple(int(n) for n in best.path.replicas):
                break  # the descent has nowhere left to go
            target *= 0.95
            continue
        seen.add(key)
        plans = place_pods(path.replicas, spec.edges, spec.draws, spec.start)
        result = simulate(plans)
        done += 1
        meets, late, allowed = judge(result)
        attempt = Attempt(path, result, meets, late, plans)
        spec.attempts.append(attempt)
        correct(spec.table, path.replicas, late_by_window(result, spec.window_of, k, slo_ttft_s))
        if spec.extra is not None:  # the run's own tail past the last arrival, for its last fleet and below
            n_last = int(path.replicas[-1])
            tail = max(0.0, float(result.summary.get("duration_s") or 0.0) - float(spec.edges[-2] + spec.lengths[-1]))
            spec.extra[-1, : n_last + 1] = np.maximum(spec.extra[-1, : n_last + 1], n_last * tail)
        stale += best is not None
        if meets and (best is None or result.summary["gpu_hours"] < best.result.summary["gpu_hours"]):
            best, stale = attempt, 0
            predicted = float(spec.table[np.arange(k), path.replicas].sum())
            # spend what is left as the curves count it, but a run far under budget says little about scale
            target = min(0.97 * allowed * max(predicted, 1.0) / max(late, 0.25 * allowed, 1.0), 1.5 * budget)
            lo = np.maximum(path.replicas - 1, spec.min_replicas)
            cap = np.minimum(path.replicas + 1, spec.cap)
    return best
