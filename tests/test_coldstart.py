"""Cold-start specs: parsing, precise errors, and distributions that match their parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.coldstart import ColdStart, ColdStartError, as_cold_start, parse_cold_start


@pytest.mark.parametrize(
    ("spec", "kind", "params"),
    [
        ("fixed:120", "fixed", (120.0,)),
        ("uniform:60,240", "uniform", (60.0, 240.0)),
        ("lognormal:p50=120,p90=240", "lognormal", (120.0, 240.0)),
        ("lognormal: p90=240 , p50=120", "lognormal", (120.0, 240.0)),
        ("empirical:[90, 120,180]", "empirical", (90.0, 120.0, 180.0)),
        ("FIXED:5", "fixed", (5.0,)),
    ],
    ids=["fixed", "uniform", "lognormal", "lognormal-any-order", "empirical-list", "case"],
)
def test_parse_valid(spec: str, kind: str, params: tuple[float, ...]) -> None:
    cs = parse_cold_start(spec)
    assert (cs.kind, cs.params) == (kind, params)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("120", "KIND:PARAMS"),
        ("gamma:3", "allowed kinds are fixed, uniform, lognormal, empirical"),
        ("fixed:abc", "fixed='abc'"),
        ("fixed:-3", "> 0"),
        ("fixed:nan", "finite"),
        ("uniform:240,60", "high=60 must be >= low=240"),
        ("uniform:60", "two bounds"),
        ("lognormal:p50=120", "needs p90"),
        ("lognormal:p50=240,p90=120", "p90=120 must be >= p50=240"),
        ("lognormal:mean=3,p90=5", "lognormal takes p50"),
        ("empirical:[]", "at least one"),
        ("empirical:[1,x]", "empirical[1]='x'"),
        ("empirical:[1,2", "[a,b,...]"),
        ("empirical:/no/such/file.csv", "no such file"),
    ],
)
def test_parse_errors_name_the_problem(spec: str, needle: str) -> None:
    with pytest.raises(ColdStartError) as err:
        parse_cold_start(spec)
    assert needle in str(err.value)


def test_empirical_file(tmp_path) -> None:
    path = tmp_path / "starts.csv"
    path.write_text("seconds,node\n100,a\n\n# comment\n200,b\n")
    cs = parse_cold_start(f"empirical:{path}")
    assert cs.params == (100.0, 200.0)
    bad = tmp_path / "bad.csv"
    bad.write_text("seconds\n100\nlots\n")
    with pytest.raises(ColdStartError, match=r"bad\.csv:3"):
        parse_cold_start(f"empirical:{bad}")


def test_lognormal_quantiles_match_spec() -> None:
    cs = parse_cold_start("lognormal:p50=120,p90=240")
    assert cs.quantile(0.5) == pytest.approx(120.0)
    assert cs.quantile(0.9) == pytest.approx(240.0)
    rng = np.random.default_rng(11)
    samples = np.array([cs.sample(rng) for _ in range(20000)])
    assert np.quantile(samples, 0.5) == pytest.approx(120.0, rel=0.03)
    assert np.quantile(samples, 0.9) == pytest.approx(240.0, rel=0.04)
    assert samples.mean() == pytest.approx(cs.mean(), rel=0.03)


def test_uniform_and_empirical_sampling_stay_in_support() -> None:
    rng = np.random.default_rng(3)
    uni = parse_cold_start("uniform:60,240")
    values = [uni.sample(rng) for _ in range(2000)]
    assert min(values) >= 60 and max(values) <= 240
    assert uni.quantile(0.5) == pytest.approx(150.0)
    emp = parse_cold_start("empirical:[90,120,180]")
    assert {emp.sample(rng) for _ in range(200)} == {90.0, 120.0, 180.0}


def test_same_seed_same_samples() -> None:
    cs = parse_cold_start("lognormal:p50=120,p90=240")
    a = [cs.sample(np.random.default_rng(5)) for _ in range(3)]
    b = [cs.sample(np.random.default_rng(5)) for _ in range(3)]
    assert a == b


def test_phases_split_the_total() -> None:
    cs = parse_cold_start("fixed:100", pending_fraction=0.25)
    phases = cs.sample_phases(np.random.default_rng(0))
    assert (phases.pending_s, phases.loading_s, phases.total_s) == (25.0, 75.0, 100.0)
    with pytest.raises(ColdStartError, match="pending_fraction"):
        parse_cold_start("fixed:100", pending_fraction=1.0)


def test_as_cold_start_accepts_three_forms() -> None:
    parsed = parse_cold_start("fixed:9")
    assert as_cold_start(parsed) is parsed
    assert as_cold_start("fixed:9").params == (9.0,)
    assert as_cold_start([10, 20]).params == (10.0, 20.0)
    with pytest.raises(ValueError, match="between 0 and 1"):
        parsed.quantile(1.0)


@given(st.text(max_size=40))
def test_any_text_parses_or_raises_cold_start_error(spec: str) -> None:
    try:
        cs = parse_cold_start(spec)
    except ColdStartError:
        return
    assert isinstance(cs, ColdStart)
    value = cs.sample(np.random.default_rng(0))
    assert math.isfinite(value) and value > 0


@settings(max_examples=50, deadline=None)
@given(st.floats(1, 1e4), st.floats(1, 10))
def test_lognormal_sampling_is_positive_and_finite(p50: float, ratio: float) -> None:
    cs = parse_cold_start(f"lognormal:p50={p50},p90={p50 * ratio}")
    rng = np.random.default_rng(1)
    for _ in range(20):
        value = cs.sample(rng)
        assert math.isfinite(value) and value > 0
