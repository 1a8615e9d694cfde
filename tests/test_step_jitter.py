"""Step jitter: the draw, the table, the profile field, both engines, and calibration's measurement of it."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaler.profiles import PerformanceProfile, get_profile, load_profile, save_profile
from scaler.step_time import check_jitter_table, table_mean
from simulator import calibrate
from simulator import fast_replica as fr
from simulator.engine import simulate
from simulator.step_jitter import JITTER_POINTS, jitter_factor, jitter_factors, jitter_table, without_jitter
from simulator.step_log import SECONDS, write_steps
from simulator.synthetic import builtin
from simulator.workload import Workload
from tests.test_fast_engine import assert_same
from tests.test_replica import tiny_profile
from tests.test_step_log import _steps

SKEWED = jitter_table(np.exp(np.random.default_rng(7).normal(0.0, 0.3, 20_000)))
"""Lognormal ratios, sigma 0.3: median 0.96 of the mean, p90 1.40 (a noisy CPU host's decode steps, a bit wider)."""
NARROW = jitter_table(np.exp(np.random.default_rng(8).normal(0.0, 0.1, 20_000)))


def quantile_of(table: tuple[float, ...], p: float) -> float:
    return float(np.interp(p, np.linspace(0.0, 1.0, len(table)), table))


@settings(max_examples=200, deadline=None)
@given(stream=st.integers(0, 2**20), step=st.integers(0, 2**32 - 1), k=st.integers(1, 40))
def test_the_draw_is_the_same_in_python_vectorised_and_compiled(stream: int, step: int, k: int) -> None:
    """Bit for bit: both engines must take every step by the same factor."""
    table = np.array(SKEWED)
    one = [jitter_factor(SKEWED, stream, step + i) for i in range(k)]
    assert jitter_factors(SKEWED, stream, step, k).tolist() == one
    assert [fr.jitter_factor(table, stream, step + i) for i in range(k)] == one
    assert all(SKEWED[0] <= f <= SKEWED[-1] for f in one)


def test_many_draws_have_the_tables_mean_and_median_and_replicas_draw_apart() -> None:
    draws = jitter_factors(SKEWED, 3, 0, 200_000)
    assert draws.mean() == pytest.approx(1.0, abs=0.004)
    assert np.median(draws) == pytest.approx(quantile_of(SKEWED, 0.5), abs=0.004)
    assert np.quantile(draws, 0.9) == pytest.approx(quantile_of(SKEWED, 0.9), abs=0.01)
    other = jitter_factors(SKEWED, 4, 0, 200_000)
    assert abs(np.corrcoef(draws, other)[0, 1]) < 0.01  # another replica's steps are not the same noise
    assert abs(np.corrcoef(draws[:-1], draws[1:])[0, 1]) < 0.01  # nor is the next step


def test_the_table_from_measured_ratios_has_mean_one_and_keeps_their_shape() -> None:
    ratios = 1.07 * np.exp(np.random.default_rng(1).normal(0.0, 0.2, 5000))  # a model 7 % fast on the mean
    table = jitter_table(ratios)
    assert len(table) == JITTER_POINTS and table_mean(table) == pytest.approx(1.0, abs=1e-12)
    assert list(table) == sorted(table)
    assert quantile_of(table, 0.5) == pytest.approx(float(np.median(ratios) / ratios.mean()), rel=0.01)
    assert check_jitter_table(list(table)) == table
    stalled = np.append(ratios, 50.0)  # one host stall, 50x the model: the table's ends stay inside the body
    assert quantile_of(jitter_table(stalled), 0.5) == pytest.approx(quantile_of(table, 0.5), rel=1e-3)
    with pytest.raises(ValueError, match=r"need at least 2 finite ratios > 0, got 3 \(1 not finite or <= 0\)"):
        jitter_table(np.array([1.0, np.nan, 2.0]))


@pytest.mark.parametrize(("table", "message"), [
    ("1,2", r"step_jitter='1,2': must be a list of numbers"),
    ([0.5, "x"], r"step_jitter\[1\]='x': must be a finite number > 0"),
    ([0.5, float("nan")], r"step_jitter\[1\]=nan: must be a finite number > 0"),
    ([0.0, 2.0], r"step_jitter\[0\]=0.0: must be a finite number > 0"),
    ([True, 1.0], r"step_jitter\[0\]=True"),
    ([1.0], r"1 value; need at least 2 quantiles"),
    ([1.5, 0.5], r"step_jitter\[1\]=0.5 < step_jitter\[0\]=1.5: quantiles must not decrease"),
    ([1.0, 1.2], r"its mean is 1.1; must be 1 \(within 1e-6\)"),
])
def test_a_bad_table_is_refused_naming_the_entry_and_what_is_allowed(table: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_jitter_table(table)


def test_the_profile_carries_the_table_through_yaml_and_names_a_bad_one(tmp_path: Path) -> None:
    profile = replace(get_profile("h100-llama3-8b"), step_jitter=list(SKEWED))  # a list is stored as a tuple
    assert profile.step_jitter == SKEWED
    save_profile(profile, tmp_path / "p.yaml")
    assert load_profile(tmp_path / "p.yaml") == profile
    assert "step_jitter" not in get_profile("h100-llama3-8b").to_dict()  # built-ins: no per-step measurement
    plain = without_jitter(replace(profile, prefill_step_jitter=NARROW))
    assert (plain.step_jitter, plain.prefill_step_jitter) == ((), ())
    assert plain == get_profile("h100-llama3-8b")
    data = profile.to_dict()
    data["step_jitter"] = [0.9, 1.3]
    with pytest.raises(ValueError, match=r"p.yaml.step_jitter: its mean is 1.1"):
        PerformanceProfile.from_dict(data, where=str(tmp_path / "p.yaml"))


@pytest.mark.parametrize(("spec", "replicas"), [
    (dict(name="poisson", rate=30.0, duration=60.0), 2),
    (dict(name="gamma", rate=50.0, duration=60.0, cv=4.0), 3),
], ids=["poisson", "bursty"])
def test_both_engines_agree_bit_for_bit_with_jitter(spec: dict[str, Any], replicas: int) -> None:
    params = dict(spec)
    w = builtin(params.pop("name"), seed=3, **params)
    assert_same(w, replace(get_profile("h100-llama3-8b"), step_jitter=SKEWED, prefill_step_jitter=NARROW), replicas)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_both_engines_agree_with_jitter_through_preemption_and_chunked_prefill(data: st.DataObject) -> None:
    """Tiny KV caches and budgets: jittered decode runs cut by arrivals and by the cache, preemptions."""
    n = data.draw(st.integers(1, 80))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    w = Workload(np.sort(rng.uniform(0, data.draw(st.floats(0.5, 20.0)), n)), rng.integers(1, 5000, n),
                 rng.integers(1, 2500, n))  # outputs past JITTERED_RUN_STEPS: long runs are planned in parts
    profile = tiny_profile(gib=data.draw(st.floats(15.5, 18.0)), seqs=data.draw(st.integers(1, 16)),
                           budget=data.draw(st.integers(16, 1024)))
    tables = [() if data.draw(st.booleans()) else jitter_table(np.exp(rng.normal(0.0, data.draw(st.floats(0.01, 0.6)),
                                                                                2000))) for _ in range(2)]
    profile = replace(profile, step_jitter=tables[0], prefill_step_jitter=tables[1])
    assert_same(w, profile, data.draw(st.integers(1, 3)),
                router=data.draw(st.sampled_from(["least-tokens", "round-robin"])))


def test_a_table_of_ones_changes_nothing() -> None:
    """The jittered runs' summed times against the closed form: the same schedule to float rounding."""
    w = builtin("gamma", seed=5, rate=60.0, duration=60.0, cv=3.0)
    plain = get_profile("h100-llama3-8b")
    for engine in ("python", "compiled"):
        a = simulate(w, plain, replicas=3, engine=engine)
        b = simulate(w, replace(plain, step_jitter=(1.0, 1.0)), replicas=3, engine=engine)
        assert np.array_equal(a.log.replica, b.log.replica)
        for col in ("first_token_s", "finish_s", "first_scheduled_s"):
            assert np.allclose(getattr(a.log, col), getattr(b.log, col), rtol=0, atol=1e-9, equal_nan=True), col


def test_jitter_moves_the_median_step_and_the_tail_but_not_the_mean() -> None:
    """What it is for: deterministic steps put the inter-token median at the mean step; real steps' median is
    below their mean, and their scatter lengthens the tails."""
    plain = get_profile("h100-llama3-8b")
    jittered = replace(plain, step_jitter=SKEWED)
    lone = Workload(np.array([0.0]), np.array([500]), np.array([3000]))  # ~3000 nearly equal decode steps
    a, b = simulate(lone, plain).summary(), simulate(lone, jittered).summary()
    assert b["itl_p50"] / a["itl_p50"] == pytest.approx(quantile_of(SKEWED, 0.5), abs=0.015)
    assert b["itl_p99"] / a["itl_p99"] == pytest.approx(quantile_of(SKEWED, 0.99), rel=0.03)
    assert b["e2e_mean"] == pytest.approx(a["e2e_mean"], rel=0.01)  # 3000 draws of mean 1
    w = builtin("poisson", seed=2, rate=8.0, duration=120.0)
    a, b = simulate(w, plain).summary(), simulate(w, jittered).summary()
    assert b["itl_p50"] < 0.985 * a["itl_p50"]
    assert b["output_tokens_per_s"] == pytest.approx(a["output_tokens_per_s"], rel=0.01)
    assert b["e2e_mean"] == pytest.approx(a["e2e_mean"], rel=0.03)
    assert b["itl_p99"] > a["itl_p99"]


def test_prefill_steps_draw_from_their_own_table() -> None:
    """A lone request: its prefill is one chunked step sequence, its decode the rest. Each table moves only its
    own steps."""
    plain = get_profile("h100-llama3-8b")
    lone = Workload(np.array([0.0]), np.array([6000]), np.array([2000]))  # one prefill step (budget 8192), decodes
    base = simulate(lone, plain)
    ttft = float(base.log.first_token_s[0])
    decode_only = simulate(lone, replace(plain, step_jitter=SKEWED))
    assert float(decode_only.log.first_token_s[0]) == ttft
    assert decode_only.summary()["itl_p50"] < 0.97 * base.summary()["itl_p50"]
    prefill_only = simulate(lone, replace(plain, prefill_step_jitter=SKEWED))
    assert float(prefill_only.log.first_token_s[0]) != pytest.approx(ttft, rel=1e-3)
    assert prefill_only.summary()["itl_p50"] == base.summary()["itl_p50"]


def test_calibration_on_timed_steps_measures_their_scatter(tmp_path: Path) -> None:
    """Steps 20 % lognormal around a known model: the profile's table has their median and p90, mean 1."""
    from tests.test_calibrate import _fake_replay, _truth, _workload

    replay = tmp_path / "replay"
    _fake_replay(replay, _truth(), _workload(1, n=40))
    steps = _steps(3000, seed=4, noise=0.0)
    noise = np.exp(np.random.default_rng(5).normal(0.0, 0.2, steps.shape[0]))
    steps[:, SECONDS] *= noise
    timed = tmp_path / "timed"
    shutil.copytree(replay, timed)
    write_steps(timed / "steps.csv", steps)
    profile = calibrate.fit(calibrate.load_replay(timed), max_num_seqs=8, max_num_batched_tokens=512)
    prefill = steps[:, 4] > 0
    for table, mine in ((profile.step_jitter, noise[~prefill]), (profile.prefill_step_jitter, noise[prefill])):
        assert len(table) == JITTER_POINTS and table_mean(table) == pytest.approx(1.0, abs=1e-9)
        assert quantile_of(table, 0.5) == pytest.approx(float(np.median(mine) / mine.mean()), rel=0.03)
        assert quantile_of(table, 0.9) == pytest.approx(float(np.quantile(mine, 0.9) / mine.mean()), rel=0.03)
    assert f"decode step jitter over {int((~prefill).sum())} steps: real / modelled p10" in profile.source
    assert f"prefill step jitter over {int(prefill.sum())} steps" in profile.source
    out = tmp_path / "calibrated.yaml"
    save_profile(profile, out)
    again = load_profile(out)  # what `simulate --profile` reads back
    assert (again.step_jitter, again.prefill_step_jitter) == (profile.step_jitter, profile.prefill_step_jitter)
    few = steps[~prefill | (np.cumsum(prefill) <= 20)]  # 20 prefill steps: too few for a table of their own
    write_steps(timed / "steps.csv", few)
    sparse = calibrate.fit(calibrate.load_replay(timed), max_num_seqs=8, max_num_batched_tokens=512)
    assert sparse.prefill_step_jitter == () and len(sparse.step_jitter) == JITTER_POINTS
    assert "prefill steps: 20 timed, too few for a jitter table (need 30)" in sparse.source
