"""Window miss curves: windows, monotone fill-in in both directions, the scan, prefix stripping."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from simulator.oracle_curves import make_windows, monotone, scan_window, strip_cacheable, window_curves
from simulator.workload import Workload


@dataclass
class Ctx:
    max_model_len: int = 10_000


def test_windows_cover_every_arrival_and_count_only_servable_requests() -> None:
    w = Workload(np.array([0.0, 10.0, 59.9, 60.0, 130.0]), np.array([5, 5, 5, 5, 5]), np.array([1, 1, 1, 1, 1]))
    win = make_windows(w, 60.0, rejected=np.array([False, True, False, False, False]))
    assert list(win.edges) == [0.0, 60.0, 120.0, 180.0]
    assert list(win.index) == [0, 0, 0, 1, 2]
    assert list(win.eligible) == [2, 1, 1]
    with pytest.raises(ValueError, match="window_s=0"):
        make_windows(w, 0)


def test_sparse_points_fill_optimistically_or_pessimistically() -> None:
    raw = {3: 100, 5: 20, 8: 0}
    assert list(monotone(raw, 10, 500, 0, optimistic=True)) == [500, 100, 100, 100, 20, 20, 0, 0, 0, 0, 0]
    assert list(monotone(raw, 10, 500, 0, optimistic=False)) == [500, 500, 500, 100, 100, 20, 20, 20, 0, 0, 0]
    # an anomaly (more replicas, more misses) cannot raise the optimistic curve, nor lower the plan's
    odd = {2: 50, 3: 70, 4: 0}
    assert list(monotone(odd, 5, 90, 0, optimistic=True)) == [90, 50, 50, 50, 0, 0]
    assert list(monotone(odd, 5, 90, 0, optimistic=False)) == [90, 90, 70, 70, 0, 0]
    # above the largest size simulated: the floor for the bound, the last value for a plan
    assert list(monotone({2: 30}, 4, 60, 5, optimistic=True)) == [60, 30, 30, 5, 5]
    assert list(monotone({2: 30}, 4, 60, 5, optimistic=False)) == [60, 60, 30, 30, 30]


def test_scan_finds_the_threshold_and_stops_below_the_budget() -> None:
    calls: list[int] = []

    def misses(n: int) -> int:
        calls.append(n)
        return max(0, 1000 - 40 * n)

    raw = scan_window(misses, 5, 0, 500, 100)
    assert raw[25] == 0 and raw[24] > 0           # the smallest fleet with nobody late, by bisection
    assert min(raw) <= 12 and raw[min(raw)] > 500  # down until the budget is exceeded
    assert len(calls) == len(set(calls))          # no size simulated twice
    plateau = scan_window(lambda n: 300 if n >= 4 else 900, 2, 0, 1000, 100)
    assert max(plateau) < 10                      # misses that more replicas do not remove: stop early


def test_window_curves_on_a_fake_engine_are_monotone_and_count_the_window_only() -> None:
    # each replica serves one request per second; a window's requests arrive together at its start
    arrival = np.repeat([0.0, 60.0, 120.0], [4, 8, 2])
    w = Workload(arrival, np.full(14, 10), np.full(14, 2))

    class Backend:
        def __init__(self, part: Workload) -> None:
            self.part, self.n = part, 0

        def add_replica(self, now: float) -> int:
            self.n += 1
            return self.n

        def run(self):  # FIFO over n replicas, 1 s each
            free = np.zeros(self.n)
            ttft = np.empty(len(self.part))
            for i, a in enumerate(self.part.arrival_s):
                j = int(np.argmin(free))
                start = max(free[j], a)
                free[j] = start + 1.0
                ttft[i] = start + 1.0 - a

            class Out:
                ttft_s = ttft

            return Out()

    curves = window_curves(w, Backend, 2.0, np.array([1, 1, 1]), 100, start="empty")
    # window 1: 8 at once; on n replicas the first 2n finish within 2 s
    assert curves.raw[1][1] == 6 and curves.raw[1][4] == 0
    table = curves.table(5, optimistic=True)
    assert (np.diff(table, axis=1) <= 0).all()
    warm = window_curves(w, Backend, 2.0, np.array([1, 1, 1]), 100, start="warm")
    assert warm.raw[1][2] >= curves.raw[1][2]  # window 0's requests replayed first, not counted


def test_strip_cacheable_cuts_only_prefixes_any_cache_could_hold() -> None:
    # request 0 carries blocks 1,2 in window 0; request 1 (window 1) shares them and adds 3;
    # request 2 (window 1, later) shares 1,2,3: block 3 was first carried inside its window
    ids = np.array([1, 2, 1, 2, 3, 1, 2, 3])
    offs = np.array([0, 2, 5, 8])
    w = Workload(np.array([5.0, 70.0, 80.0]), np.array([1024, 1536, 1600]), np.array([10, 10, 10]),
                 block_ids=ids, block_offsets=offs, block_tokens=512)
    got = strip_cacheable(w, Ctx(), 2.0, np.array([0.0, 60.0, 120.0]))
    assert list(got.input_tokens) == [1024, 1536 - 1024, 1600 - 1024]
    assert list(got.blocks(1)) == [3] and list(got.blocks(2)) == [3]  # left to the in-window cache
    assert list(got.blocks(0)) == [1, 2]


def test_strip_cacheable_drops_rejected_prompts_and_keeps_their_output_caps() -> None:
    w = Workload(np.array([0.0, 1.0]), np.array([9_990, 20_000]), np.array([100, 5]))
    got = strip_cacheable(w, Ctx(), 2.0, np.array([0.0, 60.0]))
    assert len(got) == 1 and list(got.output_tokens) == [10]  # the engine caps output to the context
