"""The policy's look-ahead: lead-time rises of demand, the headroom they give, the backlog projection."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.forecast import horizon_rises, lead_time_headroom, project_backlog, push_spaced


def series(values: list[float], spacing: float = 15.0) -> tuple[tuple[float, float], ...]:
    return tuple((i * spacing, v) for i, v in enumerate(values))


def test_rises_are_every_later_moment_of_each_complete_horizon_against_its_start() -> None:
    history = series([2.0, 3.0, 2.0, 4.0, 2.0, 2.0])
    # horizons of 30 s from t = 0, 15, 30, 45 (the last two samples have none complete yet): lag 0 is 0
    # for each, then one and two samples later, relative to the start
    rises = sorted(horizon_rises(history, 30.0).tolist())
    expected = sorted([0.0] * 4 + [(3 - 2) / 2, (2 - 3) / 3, (4 - 2) / 2, (2 - 4) / 4]
                      + [(2 - 2) / 2, (4 - 3) / 3, (2 - 2) / 2, (2 - 4) / 4])
    assert rises == pytest.approx(expected)


def test_below_one_replica_rises_count_in_replicas_and_a_trend_is_subtracted() -> None:
    history = series([0.2, 1.2, 1.2])
    assert sorted(horizon_rises(history, 15.0).tolist()) == pytest.approx([0.0, 0.0, 0.0, 1.0])
    slopes = ((0.0, 1 / 30), (15.0, 0.0))  # a forecast that expected +0.5 over the 15 s to the next sample
    assert sorted(horizon_rises(history, 15.0, slopes).tolist()) == pytest.approx([0.0, 0.0, 0.0, 0.5])


def test_only_horizons_from_comparable_levels_count() -> None:
    history = series([1.0, 8.0, 8.0, 8.0, 8.0])
    assert horizon_rises(history, 15.0).max() == pytest.approx(7.0)
    assert horizon_rises(history, 15.0, level=8.0).max() == pytest.approx(0.0)


def test_headroom_pools_a_prior_that_one_event_cannot_overrule() -> None:
    quiet = series([5.0] * 240)  # an hour of evidence outweighs the prior
    assert lead_time_headroom(quiet, (), 60.0, 5.0, 0.9, 0.25, 20).rise == 0.0
    step = series([5.0] * 20 + [9.0] * 10)  # one jump in a short history: the prior's 80 values hold q 0.9
    head = lead_time_headroom(step, (), 60.0, 5.0, 0.9, 0.25, 20)
    assert head.rise == pytest.approx(0.25)
    # the jump is 10 of the 130 moments the 26 horizons hold: beyond q 0.9, within q 0.95
    assert lead_time_headroom(step, (), 60.0, 5.0, 0.9, 0.25, 0).rise == 0.0
    assert lead_time_headroom(step, (), 60.0, 5.0, 0.95, 0.25, 0).rise == pytest.approx(0.8)
    assert lead_time_headroom((), (), 60.0, 5.0, 0.9, 0.25, 0).rise == 0.25  # nothing at all: the prior


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1e4), min_size=0, max_size=80), st.floats(0.0, 600.0), st.floats(0.01, 0.99))
def test_headroom_is_finite_non_negative_and_monotone_in_the_quantile(values, lead, q) -> None:
    history = series(values)
    low = lead_time_headroom(history, (), lead, values[-1] if values else 0.0, q * 0.5, 0.25, 20)
    high = lead_time_headroom(history, (), lead, values[-1] if values else 0.0, q, 0.25, 20)
    assert math.isfinite(high.rise) and 0.0 <= low.rise <= high.rise


def test_push_spaced_keeps_one_sample_per_spacing_within_the_history() -> None:
    samples: tuple[tuple[float, float], ...] = ()
    for t in range(0, 200, 5):
        samples = push_spaced(samples, float(t), float(t), keep_s=100.0, spacing_s=15.0)
    times = [t for t, _ in samples]
    assert np.all(np.diff(times) >= 15.0) and times[0] >= 195 - 100


def test_backlog_drains_with_the_starting_replicas_as_they_arrive() -> None:
    # 100 replica-s queued, demand 4 on 4 ready: nothing drains it; two more at 30 s drain 2 a second
    assert project_backlog(100.0, 4.0, 0.0, 4, (), 60.0) == pytest.approx(100.0)
    assert project_backlog(100.0, 4.0, 0.0, 4, (30.0, 30.0), 60.0) == pytest.approx(100.0 - 2 * 30.0, abs=1.0)
    assert project_backlog(0.0, 5.0, 0.0, 4, (), 60.0) == pytest.approx(60.0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 50.0).map(lambda v: round(v, 1)), min_size=2, max_size=14),
       st.floats(0.05, 0.99), st.booleans())
def test_theil_sen_equals_scipy_theilslopes_including_ties(values, confidence, tied_times) -> None:
    """Our Theil–Sen replaces scipy's call (its overhead was most of a decision): same slope, same
    lower confidence bound, ties in values (rounded) and in times included."""
    from scipy import stats

    from scaler.forecast import theil_sen

    t = np.arange(len(values), dtype=float) * 60.0
    if tied_times:
        t = np.floor(t / 120.0) * 120.0  # pairs of equal times
    y = np.asarray(values)
    if not (np.diff(t) > 0).any():
        return
    slope, low = theil_sen(t, y, confidence)
    with np.errstate(invalid="ignore"):
        expected = stats.theilslopes(y, t, alpha=confidence)
    assert slope == pytest.approx(float(expected.slope), abs=1e-12)
    if math.isnan(float(expected.low_slope)):
        assert math.isnan(low)
    else:
        assert low == pytest.approx(float(expected.low_slope), abs=1e-12)


def test_push_spaced_drops_exactly_the_samples_older_than_the_history_when_it_adds_one() -> None:
    history = series([1.0, 2.0, 3.0, 4.0])  # t = 0, 15, 30, 45
    assert push_spaced(history, 60.0, 5.0, 30.0, 15.0) == ((30.0, 3.0), (45.0, 4.0), (60.0, 5.0))
    # between samples the history stands still, its oldest sample included: it moves once per spacing
    assert push_spaced(history, 50.0, 5.0, 35.0, 15.0) is history
    assert push_spaced(history, 65.0, 5.0, 35.0, 15.0) == ((30.0, 3.0), (45.0, 4.0), (65.0, 5.0))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 40.0), min_size=2, max_size=80), st.sampled_from([30.0, 60.0, 180.0]),
       st.floats(0.01, 0.99))
def test_headroom_is_numpys_higher_quantile_of_the_pooled_rises(values, lead, q) -> None:
    """The order statistic taken by index is exactly ``np.quantile(..., method="higher")`` (what it replaced)."""
    history = series(values)
    got = lead_time_headroom(history, (), lead, values[-1], q, 0.25, 5)
    rises = horizon_rises(history, lead, (), values[-1])
    pooled = np.concatenate([rises, np.full(5 * max(1, int(lead // 15.0)), 0.25)])
    assert got.rise == max(float(np.quantile(pooled, q, method="higher")), 0.0)


def test_survival_is_the_share_of_measured_starts_longer_than_the_lag() -> None:
    from scaler.lead_time import survival

    assert survival((100.0, 200.0)) is None  # fewer than three starts measured: no distribution yet
    still = survival((300.0, 100.0, 200.0))
    assert still(np.array([0.0, 99.0, 100.0, 150.0, 250.0, 300.0])).tolist() == pytest.approx(
        [1.0, 1.0, 2 / 3, 2 / 3, 1 / 3, 0.0])
    assert survival((300.0, 100.0, 200.0), scale=2.0)(np.array([150.0, 250.0])).tolist() == pytest.approx(
        [1.0, 2 / 3])  # leadTimeScale stretches every start


def test_headroom_counts_a_lag_as_often_as_a_pod_ordered_now_is_still_starting_then() -> None:
    # a ramp the trend is not told about: the rise grows with the lag (0.1 of the level per 15 s)
    history = series([10.0 * 1.1 ** i for i in range(60)])
    uniform = lead_time_headroom(history, (), 120.0, 100.0, 0.9, 0.25, 0)
    # every pod starts in 20 s: beyond the first 15-s lag the fleet decided now is never the whole fleet
    short = lead_time_headroom(history, (), 120.0, 100.0, 0.9, 0.25, 0,
                               survival=lambda lags: np.where(lags < 20.0, 1.0, 0.0))
    assert short.rise == pytest.approx(0.1)
    assert uniform.rise == pytest.approx(1.1 ** 8 - 1)
    # starts that all outlast the horizon weigh every lag alike: the unweighted quantile, within one rank
    long = lead_time_headroom(history, (), 120.0, 100.0, 0.9, 0.25, 0, survival=lambda lags: np.ones(lags.size))
    assert long.rise == pytest.approx(uniform.rise)
    assert short.horizons == uniform.horizons


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1e4), min_size=0, max_size=80), st.floats(0.0, 600.0), st.floats(0.01, 0.99),
       st.lists(st.floats(0.0, 900.0), min_size=3, max_size=20))
def test_weighted_headroom_is_finite_non_negative_and_monotone_in_the_quantile(values, lead, q, starts) -> None:
    from scaler.lead_time import survival

    history, still = series(values), survival(starts)
    level = values[-1] if values else 0.0
    low = lead_time_headroom(history, (), lead, level, q * 0.5, 0.25, 5, survival=still)
    high = lead_time_headroom(history, (), lead, level, q, 0.25, 5, survival=still)
    assert math.isfinite(high.rise) and 0.0 <= low.rise <= high.rise
