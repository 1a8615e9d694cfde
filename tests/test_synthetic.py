"""Synthetic workloads: rates, burstiness and lengths as asked, reproducible seeds, precise spec errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.readers import TraceFormatError
from simulator.synthetic import (
    BUILTINS,
    SpecError,
    arrivals,
    builtin,
    from_spec,
    list_builtins,
    load_workload,
    lognormal_lengths,
    parse_spec,
)
from tests.conftest import TRACES, require


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_generates_a_valid_reproducible_workload(name: str) -> None:
    a, b, c = builtin(name, seed=1), builtin(name, seed=1), builtin(name, seed=2)
    assert len(a) > 100 and a.arrival_s[0] >= 0 and (np.diff(a.arrival_s) >= 0).all()
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.output_tokens, b.output_tokens)
    assert not np.array_equal(a.input_tokens[:50], c.input_tokens[:50])
    assert a.name == f"builtin:{name}" and a.meta["format"] == "builtin"


def test_list_builtins_starts_with_default_and_documents_params() -> None:
    names = [b.name for b in list_builtins()]
    assert names[0] == "default" and {"poisson", "gamma", "steps", "pulses", "diurnal"} <= set(names)
    for b in list_builtins():
        assert b.description and all(p.help for p in b.all_params())


def test_default_is_a_bursty_half_hour_chat_workload() -> None:
    w = builtin("default", seed=0)
    assert 1790 < w.duration_s < 1800
    assert w.input_tokens.mean() == pytest.approx(1155, rel=0.03)
    assert w.output_tokens.mean() == pytest.approx(211, rel=0.05)
    assert np.median(w.input_tokens) == pytest.approx(1020, rel=0.03)
    per_min = np.bincount((w.arrival_s // 60).astype(int), minlength=30)
    assert per_min.max() > 2.5 * per_min.min()  # a trough and a peak
    assert per_min.max() / 60 > 40  # several 8B replicas' worth at peak (one H100 serves roughly 10-15 req/s)
    gaps = np.diff(w.arrival_s[(w.arrival_s > 800) & (w.arrival_s < 1000)])
    assert gaps.std() / gaps.mean() > 1.5  # bursty, not Poisson


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_arrivals_have_the_asked_rate_and_cv(cv: float) -> None:
    w = builtin("gamma", seed=3, rate=20, cv=cv, duration=2000)
    gaps = np.diff(w.arrival_s)
    assert len(w) / 2000 == pytest.approx(20, rel=0.05 * max(cv, 1))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_poisson_count_is_rate_times_duration() -> None:
    w = builtin("poisson", seed=5, rate=50, duration=400)
    assert len(w) == pytest.approx(20_000, abs=4 * math.sqrt(20_000))


def test_steps_follow_their_rates() -> None:
    w = from_spec("builtin:steps?rates=2,20,5&step_s=200", seed=1)
    counts = np.bincount((w.arrival_s // 200).astype(int), minlength=3)
    np.testing.assert_allclose(counts / 200, [2, 20, 5], rtol=0.2)
    repeated = from_spec("builtin:steps?rates=1,10&step_s=100&duration=400", seed=1)
    np.testing.assert_allclose(np.bincount((repeated.arrival_s // 100).astype(int)) / 100, [1, 10, 1, 10], rtol=0.4)


def test_pulses_concentrate_load_in_their_windows() -> None:
    w = from_spec("builtin:pulses?base=1&peak=30&period_s=100&width_s=10&duration=1000", seed=2)
    in_pulse = (w.arrival_s % 100) < 10
    assert in_pulse.sum() / 100 == pytest.approx(30, rel=0.1)  # 10 pulses x 10 s
    assert (~in_pulse).sum() / 900 == pytest.approx(1, rel=0.25)


def test_diurnal_starts_at_trough_and_peaks_mid_cycle() -> None:
    w = from_spec("builtin:diurnal?rate=20&amplitude=0.8&duration=3600", seed=4)
    per_10min = np.bincount((w.arrival_s // 600).astype(int), minlength=6)
    assert per_10min[0] < per_10min[2] and per_10min[5] < per_10min[3]
    assert len(w) / 3600 == pytest.approx(20, rel=0.05)


def test_lengths_resampled_from_a_trace_keep_arrivals() -> None:
    path = TRACES / "arxiv_summarization_lengths.csv"
    require(path.is_file(), f"the shared trace {path}")
    plain = builtin("gamma", seed=9, rate=5, duration=600)
    resampled = builtin("gamma", seed=9, rate=5, duration=600, lengths=str(path))
    assert np.array_equal(plain.arrival_s, resampled.arrival_s)
    assert resampled.input_tokens.mean() == pytest.approx(2588, rel=0.1) and resampled.input_tokens.max() <= 4054


def test_lognormal_lengths_hit_mean_and_median() -> None:
    x = lognormal_lengths(200_000, 1155.0, 1020.0, 1 << 20, np.random.default_rng(0))
    assert x.mean() == pytest.approx(1155, rel=0.01) and np.median(x) == pytest.approx(1020, rel=0.01)
    assert (lognormal_lengths(10, 50.0, 50.0, 100, np.random.default_rng(0)) == 50).all()
    assert lognormal_lengths(1000, 5000.0, 100.0, 300, np.random.default_rng(0)).max() == 300


def test_arrivals_skip_zero_rate_stretches() -> None:
    t = arrivals(lambda x: np.where((x > 10) & (x < 20), 0.0, 5.0), 30.0, 1.0, np.random.default_rng(0))
    assert not ((t > 10.01) & (t < 19.99)).any() and t.max() < 30.0


@pytest.mark.parametrize(("spec", "fragment"), [
    ("builtin:nope", "unknown; allowed: default"),
    ("builtin:gamma?rate=-1", "rate='-1': expected a number > 0"),
    ("builtin:gamma?cv=abc&foo=1", "foo is not a parameter of gamma"),
    ("builtin:gamma?rate", "key=value"),
    ("builtin:gamma?rate=1&rate=2", "given twice"),
    ("builtin:poisson?cv=2", "cv is not a parameter of poisson"),
    ("builtin:gamma?in_median=5000", "in_median=5000.0: expected <= in_mean"),
    ("builtin:steps?rates=1,x", "rates='1,x': expected comma-separated numbers"),
    ("builtin:gamma?rate=1000000&duration=31536000", "at most"),
    ("builtin:gamma?in_max=2.5", "in_max='2.5': expected an integer"),
], ids=["name", "negative", "unknown-key", "no-value", "twice", "poisson-cv", "median", "list", "too-many", "int"])
def test_spec_errors_name_key_value_and_allowed(spec: str, fragment: str) -> None:
    with pytest.raises(SpecError, match="workload spec") as err:
        from_spec(spec)
    assert fragment in str(err.value)


def test_spec_error_collects_every_problem() -> None:
    with pytest.raises(SpecError) as err:
        from_spec("builtin:gamma?rate=0&cv=-2&bogus=1")
    assert len(err.value.problems) == 3


def test_parse_spec_and_load_workload() -> None:
    want = ("gamma", {"rate": "8", "cv": "3", "duration": "600"})
    assert parse_spec("builtin:gamma?rate=8&cv=3&duration=600") == want
    assert parse_spec("builtin:default") == ("default", {})
    assert len(load_workload(None, seed=0)) == len(builtin("default", seed=0))
    assert load_workload("builtin:poisson?rate=2&duration=100", seed=1).name.startswith("builtin:poisson")
    with pytest.raises(TraceFormatError):
        load_workload("/nonexistent.csv")
    with pytest.raises(SpecError, match="format"):
        load_workload("builtin:default", fmt="azure")


def test_bad_lengths_file_is_a_trace_format_error() -> None:
    with pytest.raises(TraceFormatError):
        builtin("poisson", lengths="/nonexistent/lengths.csv")


@settings(max_examples=200, deadline=None)
@given(spec=st.text(max_size=60))
def test_any_spec_string_gives_a_workload_or_a_value_error(spec: str) -> None:
    try:
        w = from_spec("builtin:" + spec.replace("duration", "d"))
    except ValueError:
        return
    assert np.isfinite(w.arrival_s).all()


@settings(max_examples=25, deadline=None)
@given(rate=st.floats(0.1, 50), cv=st.floats(0.2, 5), duration=st.floats(1, 120), seed=st.integers(0, 1000))
def test_gamma_arrivals_stay_in_range(rate: float, cv: float, duration: float, seed: int) -> None:
    try:
        w = builtin("gamma", seed=seed, rate=rate, cv=cv, duration=duration)
    except SpecError as exc:
        assert "no requests" in str(exc) or "expected" in str(exc)
        return
    assert (w.arrival_s >= 0).all() and w.duration_s < duration


def test_long_share_replaces_that_share_with_long_prompts_and_keeps_the_rest() -> None:
    chat = builtin("gamma", seed=4, rate=20, duration=600)
    mixed = builtin("gamma", seed=4, rate=20, duration=600, long_share=0.1, long_in_min=20000, long_in_max=30000)
    assert (mixed.arrival_s == chat.arrival_s).all()
    long = mixed.input_tokens >= 20000
    assert 0.08 < long.mean() < 0.12 and mixed.input_tokens[long].max() <= 30000
    assert (mixed.input_tokens[~long] == chat.input_tokens[~long]).all()
    with pytest.raises(SpecError, match="long_in_min=9: expected <= long_in_max=8"):
        builtin("gamma", long_share=0.1, long_in_min=9, long_in_max=8)
