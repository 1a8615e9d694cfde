"""The oracle's program: the budgeted DP is exact, rounding goes the right way, cold-start floors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from simulator.oracle_dp import budget_path, cold_start_floor, conjugate, golden_max

# 3 windows of 60 s; misses on 0, 1, 2, 3 replicas
MISSES = np.array([[50, 10, 0, 0],
                   [80, 30, 5, 0],
                   [40, 0, 0, 0]])
LENGTHS = np.array([60.0, 60.0, 60.0])


def brute_force(budget: float, start: int, add_cost: float, lo: int = 0) -> tuple[float, tuple[int, ...]]:
    best = (np.inf, ())
    for path in itertools.product(range(MISSES.shape[1]), repeat=3):
        if min(path) < lo or sum(MISSES[w, n] for w, n in enumerate(path)) > budget:
            continue
        adds = sum(max(0, b - a) for a, b in zip((start, *path[:-1]), path, strict=True))
        cost = float(np.dot(LENGTHS, path)) + add_cost * adds
        best = min(best, (cost, path))
    return best


@pytest.mark.parametrize(("budget", "start", "add_cost"), [
    (0, 1, 100.0), (10, 1, 100.0), (15, 2, 0.0), (40, 3, 500.0), (45, 0, 30.0), (200, 1, 10.0)],
    ids=["none-late", "ten", "fifteen-warm2", "forty-warm3", "cold-start-zero", "generous"])
def test_budget_path_is_exact_on_a_hand_checkable_instance(budget: float, start: int, add_cost: float) -> None:
    cost, path = brute_force(budget, start, add_cost)
    got = budget_path(MISSES, LENGTHS, budget, start, add_cost, units=1000)
    assert got is not None
    assert got.cost == pytest.approx(cost)
    assert got.misses <= budget
    assert tuple(got.replicas) == path or got.cost == pytest.approx(cost)


def test_hand_solution_with_a_budget_of_ten() -> None:
    # 0 late: (2, 3, 1) costs 360 s + one add at 100 s; 10 late: (1, 3, 1) -> 300 s + 200 s of adds,
    # or (2, 2, 1): 5 late, 300 s + 100 s: the cheapest
    got = budget_path(MISSES, LENGTHS, 10, 1, 100.0, units=1000)
    assert got is not None and tuple(got.replicas) == (2, 2, 1)
    assert (got.cost, got.misses, got.adds) == (400.0, 5, 1)


def test_rounding_up_is_feasible_and_rounding_down_is_optimistic() -> None:
    rng = np.random.default_rng(0)
    misses = np.sort(rng.integers(0, 400, (8, 6)), axis=1)[:, ::-1]
    misses[:, -1] = 0  # enough replicas: nobody late
    lengths = np.full(8, 60.0)
    exact = budget_path(misses, lengths, 500, 2, 50.0, units=10_000)
    up = budget_path(misses, lengths, 500, 2, 50.0, units=7, round_up=True)
    down = budget_path(misses, lengths, 500, 2, 50.0, units=7, round_up=False)
    assert exact is not None and up is not None and down is not None
    assert up.misses <= 500
    assert down.cost <= exact.cost <= up.cost


def test_per_window_limits_and_no_path() -> None:
    got = budget_path(MISSES, LENGTHS, 0, 1, 0.0, cap=np.array([3, 2, 3]))
    assert got is None  # window 1 needs 3 replicas to have no late first token
    got = budget_path(MISSES, LENGTHS, 200, 1, 0.0, lo=np.array([0, 2, 0]))
    assert got is not None and got.replicas[1] >= 2
    with pytest.raises(ValueError, match="budget=-1"):
        budget_path(MISSES, LENGTHS, -1, 1, 0.0)
    with pytest.raises(ValueError, match="start=9"):
        budget_path(MISSES, LENGTHS, 1, 9, 0.0)
    with pytest.raises(ValueError, match="add_cost=nan"):
        budget_path(MISSES, LENGTHS, 1, 1, float("nan"))


def test_cold_start_floor_without_and_with_cancelled_pods() -> None:
    draws = np.array([100.0, 10.0, 10.0, 500.0])
    assert list(cold_start_floor(draws, 2, None)) == [0.0, 100.0, 110.0]
    # cancelling the 100 s pod after one tick: 1 + 10 for one pod, 1 + 10 + 10 for two
    assert list(cold_start_floor(draws, 2, 1.0)) == [0.0, 11.0, 21.0]
    # cancelling costs more than it saves: the plain sums
    assert list(cold_start_floor(draws, 2, 200.0)) == [0.0, 100.0, 110.0]
    with pytest.raises(ValueError, match="r_max=5"):
        cold_start_floor(draws, 5, None)


def test_conjugate_is_fenchel_young_tight() -> None:
    floor = np.array([0.0, 11.0, 21.0, 40.0])
    for mu in (0.0, 5.0, 10.5, 30.0):
        star = conjugate(floor, mu)
        assert all(floor[r] >= mu * r - star - 1e-9 for r in range(floor.size))
    assert conjugate(floor, 10.5) == pytest.approx(max(10.5 * r - floor[r] for r in range(4)))


def test_golden_max_finds_a_concave_maximum() -> None:
    x, fx = golden_max(lambda m: -(m - 3.2) ** 2, 0.0, 10.0, evals=30)
    assert x == pytest.approx(3.2, abs=0.01) and fx == pytest.approx(0.0, abs=1e-3)


@pytest.mark.parametrize("draws", [(10.0, 300.0), (300.0, 10.0, 10.0), (50.0,)], ids=["cheap-first", "dear-first",
                                                                                    "one-then-mean"])
def test_budget_path_with_each_adds_own_cost_is_exact(draws: tuple[float, ...]) -> None:
    def add_costs(adds: int) -> float:
        known = list(draws[:adds])
        return sum(known) + max(adds - len(draws), 0) * float(np.mean(draws))

    for budget, start in ((0, 0), (10, 1), (45, 0), (90, 1)):
        best = np.inf
        for path in itertools.product(range(MISSES.shape[1]), repeat=3):
            if sum(MISSES[w, n] for w, n in enumerate(path)) > budget:
                continue
            adds = sum(max(0, b - a) for a, b in zip((start, *path[:-1]), path, strict=True))
            best = min(best, float(np.dot(LENGTHS, path)) + add_costs(adds))
        got = budget_path(MISSES, LENGTHS, budget, start, np.array(draws), units=1000)
        assert got is not None and got.cost == pytest.approx(best), (budget, start)


def test_extra_cost_of_a_lean_last_window_moves_the_path() -> None:
    plain = budget_path(MISSES, LENGTHS, 45, 1, 0.0, units=1000)
    assert plain is not None and plain.replicas[-1] == 1
    # one replica at the end leaves a backlog that holds it 500 s longer; two drain at once
    extra = np.zeros_like(MISSES, dtype=float)
    extra[-1] = [1000.0, 500.0, 0.0, 0.0]  # none or one replica at the end: a backlog to drain
    got = budget_path(MISSES, LENGTHS, 45, 1, 0.0, units=1000, extra=extra)
    assert got is not None and got.replicas[-1] == 2
    assert got.cost == pytest.approx(float(np.dot(LENGTHS, got.replicas)))
