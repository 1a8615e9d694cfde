"""The policy's look-ahead: lead-time rises of demand, the headroom they give, the backlog projection."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.forecast import PROJECTION_STEPS, horizon_rises, lead_time_headroom, project_backlog, push_spaced


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


def queue_step_by_step(backlog: float, level: float, slope: float, ready: int, arrivals: tuple[float, ...],
                       horizon_s: float) -> float:
    """The fluid queue as defined: at each of the projection's midpoints, demand (never negative) less the
    replicas serving by then, added to a queue that never goes negative."""
    dt, queue = horizon_s / PROJECTION_STEPS, max(0.0, backlog)
    for step in range(PROJECTION_STEPS):
        mid = (step + 0.5) * dt
        serving = ready + sum(1 for t in arrivals if t <= mid)
        queue = max(0.0, queue + (max(0.0, level + slope * mid) - serving) * dt)
    return queue


@settings(max_examples=400, deadline=None)
@given(st.floats(-5.0, 500.0), st.floats(0.0, 60.0), st.floats(-0.5, 0.5), st.integers(0, 40),
       st.lists(st.floats(0.0, 400.0), max_size=6).map(tuple), st.floats(0.0, 400.0))
def test_the_projected_backlog_is_the_fluid_queue_step_by_step(backlog: float, level: float, slope: float,
                                                               ready: int, arrivals: tuple[float, ...],
                                                               horizon_s: float) -> None:
    # project_backlog computes the queue in closed form (Lindley: the work added since it was last empty), with no
    # clip per step: the same queue as clipping at every step, to rounding
    expected = queue_step_by_step(backlog, level, slope, ready, arrivals, horizon_s)
    got = project_backlog(backlog, level, slope, ready, arrivals, horizon_s)
    assert got >= 0.0
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)


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


# ---------------------------------------------------------------- the level a band is measured from


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 400.0), st.floats(0.0, 1e4)), min_size=1, max_size=120),
       st.sampled_from([0.0, 0.5, 15.0, 300.0, 1e7]))
def test_smoothed_levels_are_the_exponential_recursion_at_any_spacing(steps, tau) -> None:
    """The telescoped, blocked evaluation is the recursion it documents, even where one block could overflow."""
    from scaler.forecast import smoothed_levels

    t = np.cumsum([dt for dt, _ in steps])
    v = np.array([x for _, x in steps])
    got = smoothed_levels(t, v, tau)
    level, expected = v[0], [v[0]]
    for i in range(1, v.size):
        level += (1.0 - math.exp(-(t[i] - t[i - 1]) / tau)) * (v[i] - level) if tau > 0 else v[i] - level
        expected.append(level)
    assert np.all(np.isfinite(got))
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert v.min() - 1e-9 <= got.min() and got.max() <= v.max() + 1e-9  # an average never leaves the range


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 400.0), st.floats(0.0, 1e4)), min_size=2, max_size=60),
       st.integers(1, 5), st.sampled_from([0.0, 15.0, 300.0]))
def test_a_reused_band_carries_its_level_to_what_the_longer_history_gives(steps, added, tau) -> None:
    """``advance_level`` walks a band's level through the samples newer than the band's history: the level a
    band measured on the longer history would have (``smoothed_levels``' last), so a band reused for a rate
    window does not move the level the fleet is sized on."""
    from scaler.forecast import Headroom, advance_level, smoothed_levels

    t = np.cumsum([dt for dt, _ in steps])
    v = np.array([x for _, x in steps])
    cut = max(1, t.size - added)
    old = smoothed_levels(t[:cut], v[:cut], tau)
    band = Headroom(0.3, 7, tau, float(old[-1]), float(t[cut - 1]))
    carried = advance_level(band, tuple(zip(t.tolist(), v.tolist(), strict=True)))
    expected = smoothed_levels(t, v, tau)[-1] if tau > 0 else band.level
    assert carried.level == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert (carried.rise, carried.horizons, carried.tau_s) == (band.rise, band.horizons, band.tau_s)
    assert carried.level_at == (float(t[-1]) if tau > 0 else band.level_at)


def noisy(level: Callable[[int], float], n: int = 240, seed: int = 5) -> tuple[tuple[float, float], ...]:
    """15 s samples of a demand whose 60 s rates carry noise that does not persist past a minute."""
    rng = np.random.default_rng(seed)
    minutes = rng.normal(0.0, 0.1, n // 4 + 2)
    return series([level(i) * (1.0 + minutes[i // 4]) for i in range(n)])


def test_a_steady_noisy_load_is_sized_from_its_average_and_a_moving_one_from_its_raw_demand() -> None:
    from scaler.forecast import level_headroom

    steady = noisy(lambda i: 8.0)
    raw = lead_time_headroom(steady, (), 180.0, steady[-1][1], 0.8, 0.25, 5)
    chosen = level_headroom(steady, (), 180.0, steady[-1][1], 0.8, 0.25, 5, time_constants=(0.0, 300.0))
    assert chosen.tau_s == 300.0 and chosen.rise < raw.rise * 0.9
    # what it carries: the smoothed level at the last sample, far nearer 8 than the last noisy minute
    assert abs(chosen.level - 8.0) < 0.4 and chosen.level_at == steady[-1][0]
    # a ramp (+40 % over the hour, in steps every 10 minutes) moves: a smoothed level lags it, so raw wins
    moving = noisy(lambda i: 8.0 * 1.5 ** (i // 40), seed=6)
    lagging = level_headroom(moving, (), 180.0, moving[-1][1], 0.8, 0.25, 5, time_constants=(0.0, 300.0))
    assert lagging.tau_s == 0.0
    assert lagging.rise == lead_time_headroom(moving, (), 180.0, moving[-1][1], 0.8, 0.25, 5).rise


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.0, 50.0), min_size=0, max_size=80), st.sampled_from([60.0, 180.0]),
       st.floats(0.05, 0.95), st.lists(st.sampled_from([0.0, 60.0, 150.0, 600.0]), min_size=1, max_size=3))
def test_the_chosen_level_has_the_narrowest_band_and_ties_go_to_the_first(values, lead, q, taus) -> None:
    from scaler.forecast import level_headroom, smoothed_levels

    history = series(values)
    level = values[-1] if values else 0.0
    chosen = level_headroom(history, (), lead, level, q, 0.25, 5, time_constants=tuple(taus))
    t, v = np.array([s[0] for s in history]), np.array([s[1] for s in history])
    bands = [lead_time_headroom(history, (), lead, level, q, 0.25, 5,
                                levels=smoothed_levels(t, v, tau) if tau > 0 and v.size else None).rise
             for tau in taus]
    assert chosen.rise == min(bands)
    assert chosen.tau_s == taus[bands.index(min(bands))]
    assert math.isfinite(chosen.rise) and chosen.rise >= 0.0


def test_the_level_carries_forward_one_smoothing_step_and_raw_is_the_demand_itself() -> None:
    from scaler.forecast import Headroom, level_now

    raw = Headroom(0.1, 10, 0.0, 5.0, 100.0)
    assert level_now(raw, 105.0, 9.0) == 9.0
    smooth = Headroom(0.1, 10, 300.0, 5.0, 100.0)
    assert level_now(smooth, 100.0, 9.0) == 5.0  # at the sample itself: the level already holds it
    assert level_now(smooth, 110.0, 9.0) == pytest.approx(5.0 + (1 - math.exp(-10 / 300)) * 4.0)
    assert level_now(smooth, 1e6, 9.0) == pytest.approx(9.0)
    assert level_now(Headroom(0.1, 0, 300.0, None, 0.0), 10.0, 9.0) == 9.0  # no history: the demand


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 40.0), min_size=0, max_size=60), st.floats(0.0, 400.0),
       st.floats(0.0, 50.0), st.floats(0.0, 50.0))
def test_the_level_index_selects_the_horizons_a_pass_over_the_history_selects(values, lead_s, a, b) -> None:
    """``LevelIndex.run`` stands in for ``_selected_starts`` in a band's inputs: two levels give the same run
    exactly when they select the same past horizons, and a run is as long as that selection."""
    from scaler.forecast import RISE_FLOOR, _columns, _selected_starts, level_index

    history = tuple((15.0 * i, v) for i, v in enumerate(values))
    index = level_index(history, lead_s)

    def selected(level: float) -> np.ndarray:
        return _selected_starts(*_columns(history), lead_s, level, RISE_FLOOR) if len(history) >= 2 else np.empty(0)

    for level in (a, b):
        first, stop = index.run(level)
        assert stop - first == selected(level).size
    assert (index.run(a) == index.run(b)) == np.array_equal(selected(a), selected(b))
    assert index.reads(history, lead_s) and not index.reads((*history, (15.0 * len(values), 1.0)), lead_s)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**32 - 1), st.sampled_from([0.05, 0.5, 0.8, 0.9, 0.99]),
       st.booleans(), st.booleans(), st.booleans())
def test_the_weighted_quantile_is_the_one_a_full_sort_gives(n, seed, quantile, ties, zero_masses,
                                                             whole_masses) -> None:
    """``weighted_quantile`` sorts only the largest values when they carry the quantile's tail: the same value
    as sorting them all (ties, massless values and cumulative masses exactly at the quantile included), on both
    of its paths."""
    from scaler.forecast import weighted_quantile

    rng = np.random.default_rng(seed)
    values = rng.integers(-5, 6, n).astype(float) / 4 if ties else rng.normal(0.0, 0.3, n)
    mass = rng.integers(0, 3, n).astype(float) if whole_masses else rng.uniform(0.0, 1.0, n)
    mass *= rng.uniform(0.0, 1.0, n) > 0.3 if zero_masses else 1.0
    mass[rng.integers(0, n)] += 1.0  # a positive sum
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(mass[order])
    expected = values[order[min(int(np.searchsorted(cumulative, quantile * cumulative[-1])), n - 1)]]
    assert weighted_quantile(values, mass, quantile) == expected
