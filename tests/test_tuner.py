"""``simulator.tuner``: the search space, the constrained choice, robustness selection and determinism."""

from __future__ import annotations

import json
from typing import Any

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.profiles import get_profile
from simulator.manifests import DEFAULT_SETTINGS, Settings
from simulator.synthetic import load_workload
from simulator.tuner import (
    Candidate,
    Run,
    TuneInputs,
    _pick,
    _shortlist,
    beats,
    default_point,
    pareto_front,
    search_space,
    suggest,
    tune,
)

TINY = "builtin:poisson?rate=3&duration=400"


def run(gpu: float, att: float, window: str = "search", seed: int = 0) -> Run:
    return Run(window, seed, {"gpu_hours": gpu, "slo_attainment": att})


def candidate(trial: int, gpu: float, att: float, runs: list[tuple[float, float]] = (), **kw: Any) -> Candidate:
    c = Candidate(Settings(target_utilization=0.5 + trial / 100, **kw), trial, run(gpu, att))
    c.runs = [run(g, a, "holdout", k) for k, (g, a) in enumerate(runs)]
    return c


@pytest.mark.parametrize(("a", "b", "expected"), [
    ((1.0, 0.995), (2.0, 0.999), True),     # both meet: fewer GPU-hours wins
    ((2.0, 0.995), (1.0, 0.999), False),
    ((5.0, 0.995), (1.0, 0.5), True),       # only a meets
    ((1.0, 0.5), (5.0, 0.995), False),      # only b meets
    ((1.0, 0.9), (1.0, 0.8), True),         # both miss: more attainment wins
    ((1.0, 0.8), (1.0, 0.8), False),
], ids=["cheaper", "dearer", "a-meets", "b-meets", "both-miss-better", "both-miss-tie"])
def test_beats(a: tuple[float, float], b: tuple[float, float], expected: bool) -> None:
    assert beats(run(*a), run(*b), 0.99) is expected


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 1)), min_size=1, max_size=30))
def test_pareto_front_is_exactly_the_undominated_points(points: list[tuple[float, float]]) -> None:
    front = pareto_front(points)
    def dominated(k: int) -> bool:
        g, a = points[k]
        return any((g2 <= g and a2 >= a) and (g2 < g or a2 > a) for g2, a2 in points)
    undominated = {points[k] for k in range(len(points)) if not dominated(k)}
    assert {points[k] for k in front} == undominated
    assert [points[k][0] for k in front] == sorted(points[k][0] for k in front)


def test_shortlist_prefers_cheap_feasible_then_high_attainment_and_drops_duplicates() -> None:
    found = [candidate(0, 3.0, 0.995), candidate(1, 1.0, 0.90), candidate(2, 2.0, 0.999), candidate(3, 1.5, 0.95)]
    found.append(Candidate(found[2].settings, 4, run(2.5, 0.999)))  # the same settings again
    assert [c.trial for c in _shortlist(found, 0.99, 3)] == [2, 0, 3]


def test_pick_takes_the_cheapest_that_holds_up_not_the_search_winner() -> None:
    lucky = candidate(0, 1.0, 0.999, runs=[(1.0, 0.999), (1.0, 0.93)])   # fails one re-run
    steady = candidate(1, 2.0, 0.995, runs=[(2.0, 0.995), (2.1, 0.994)])
    dear = candidate(2, 3.0, 0.999, runs=[(3.0, 0.999), (3.0, 0.999)])
    assert _pick([lucky, steady, dear], 0.99) is steady
    assert steady.spread(0.99)["holdout"]["gpu_hours"] == {"min": 2.0, "mean": 2.05, "max": 2.1}
    # none holds up: the best worst run
    assert _pick([lucky, candidate(3, 1.0, 0.99, runs=[(1.0, 0.95)])], 0.99).trial == 3


def test_search_space_covers_the_defaults_and_scales_the_measured_lead_time() -> None:
    space = search_space()
    assert Settings(**default_point(space)) == DEFAULT_SETTINGS
    # the look-ahead is a multiple of the measured cold start, never seconds (leadTime: auto survives tuning)
    assert space["lead_time_scale"] == (0.0, 3.0, 0.05) and "lead_time_s" not in space
    point = suggest(optuna.trial.FixedTrial(default_point(space)), space)
    assert point == DEFAULT_SETTINGS


@pytest.mark.parametrize(("kwargs", "match"), [({"target": 0.0}, "target=0.0"), ({"holdout": 0.9}, "holdout=0.9")])
def test_bad_inputs_name_the_field(kwargs: dict[str, Any], match: str) -> None:
    w = load_workload(TINY, None, seed=0)
    with pytest.raises(ValueError, match=match):
        TuneInputs(w, get_profile("a100-llama3-8b"), **kwargs)


def test_bad_search_sizes_name_the_argument() -> None:
    inputs = TuneInputs(load_workload(TINY, None, seed=0), get_profile("a100-llama3-8b"))
    with pytest.raises(ValueError, match="trials=0"):
        tune(inputs, trials=0)
    with pytest.raises(ValueError, match="nope"):
        tune(inputs, trials=1, baselines=["nope"])


@pytest.mark.slow
def test_same_seed_same_recommendation_on_one_or_two_processes() -> None:
    inputs = TuneInputs(load_workload(TINY, None, seed=0), get_profile("a100-llama3-8b"), target=0.95, seed=3)
    one = tune(inputs, trials=3, jobs=1, top=2, seeds=2, baselines=["waiting-requests"])
    two = tune(inputs, trials=3, jobs=2, top=2, seeds=2, baselines=["waiting-requests"])
    assert json.dumps(one.to_json(), sort_keys=True) == json.dumps(two.to_json(), sort_keys=True)
    assert one.trials[0].settings == DEFAULT_SETTINGS  # the defaults are always trial 0
    assert len(one.trials) == 3 and len(one.robust) == 2
    assert {(r.window, r.seed) for r in one.best.runs} == {("search", 3), ("search", 4), ("holdout", 3),
                                                          ("holdout", 4)}
    assert set(one.details) == {"recommended", "waiting-requests"}
    evidence = one.to_json()["evidence"]
    assert evidence["holdout_window_s"][0] == pytest.approx(inputs.split_s)
    assert 0 < inputs.split_s < evidence["holdout_window_s"][1]
    assert "waiting-requests" in evidence["beats"]
