"""Measured cold starts: clean starts only, nearest-rank p90, the stated fallback, first scrapes."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.kube.leadtime import LeadTimeTracker
from scaler.kube.pods import PodState


def started(name: str, seconds: float, created: float = 1000.0, restarts: int = 0) -> PodState:
    """A pod created at ``created`` that turned Ready ``seconds`` later."""
    return PodState(namespace="llm", name=name, uid=f"uid-{name}", created=created, phase="Running", ready=True,
                    restarts=restarts, scheduled_at=created + 2, containers_ready_at=created + seconds,
                    ready_at=created + seconds)


def test_fallback_is_stated_until_enough_pods_started() -> None:
    tracker = LeadTimeTracker(min_samples=3)
    tracker.observe(started("a", 150))
    tracker.observe(started("b", 200))
    assert tracker.lead_time_s() is None
    est = tracker.estimate(fallback_s=180.0)
    assert (est.lead_time_s, est.source, est.samples, est.measured_s) == (180.0, "fallback", 2, None)
    tracker.observe(started("c", 170))
    est = tracker.estimate(fallback_s=180.0)
    assert (est.lead_time_s, est.source, est.samples) == (200.0, "measured", 3)


def test_p90_is_nearest_rank_over_the_newest_window() -> None:
    tracker = LeadTimeTracker(window=10, min_samples=3)
    for i in range(30):  # pods started one after another, each slower than the one before
        tracker.observe(started(f"p{i}", 100 + i, created=1000.0 + 600 * i))
    # window keeps the 10 newest: 120..129; nearest-rank p90 of 10 values is the 9th
    assert [s.total_s for s in tracker.samples()] == [float(v) for v in range(120, 130)]
    assert tracker.lead_time_s() == 128.0


def test_restarted_unready_and_implausible_pods_are_not_samples() -> None:
    tracker = LeadTimeTracker(min_samples=1)
    assert tracker.observe(started("restarted", 120, restarts=1)) is None
    assert tracker.observe(replace(started("unready", 120), ready=False)) is None
    assert tracker.observe(started("a-day", 86400.0)) is None
    assert tracker.observe(replace(started("clock-skew", 10), ready_at=900.0)) is None
    assert tracker.samples() == []
    assert tracker.observe(started("ok", 120)) is not None
    assert tracker.observe(started("ok", 120)) is None  # once per pod uid


def test_a_first_scrape_after_ready_extends_the_cold_start() -> None:
    tracker = LeadTimeTracker(min_samples=1)
    tracker.note_first_scrape("uid-late", 1000.0 + 240)  # scraped before the watcher saw it Ready
    tracker.observe(started("late", 200))
    tracker.observe(started("early", 200, created=5000.0))
    tracker.note_first_scrape("uid-early", 5000.0 + 150)  # scrape before Ready does not shorten it
    tracker.note_first_scrape("uid-early", 5000.0 + 999)  # only the first scrape counts
    by_pod = {s.pod: s for s in tracker.samples()}
    assert by_pod["late"].total_s == 240.0 and by_pod["early"].total_s == 200.0
    assert by_pod["late"].phases() == {"scheduling_s": 2.0, "container_start_s": 198.0, "readiness_s": 0.0,
                                       "first_scrape_s": 40.0, "total_s": 240.0}


@pytest.mark.parametrize(("kwargs", "match"), [
    pytest.param({"window": 0}, "window=0", id="window"),
    pytest.param({"window": 5, "min_samples": 6}, "min_samples=6", id="min-above-window"),
    pytest.param({"quantile": 1.5}, "quantile=1.5", id="quantile"),
])
def test_bad_tracker_settings_name_the_field(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LeadTimeTracker(**kwargs)


@settings(max_examples=100, deadline=None)
@given(durations=st.lists(st.floats(min_value=1.0, max_value=7200.0), min_size=3, max_size=40))
def test_lead_time_is_an_observed_value_at_or_above_most_starts(durations: list[float]) -> None:
    tracker = LeadTimeTracker(window=20, min_samples=3)
    for i, seconds in enumerate(durations):
        tracker.observe(started(f"p{i}", seconds, created=1000.0 + 10000.0 * i))
    kept = [s.total_s for s in tracker.samples()]
    lead = tracker.lead_time_s()
    assert lead in kept
    assert np.mean(np.asarray(kept) <= lead) >= 0.9


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 3600.0, allow_nan=False), max_size=40), st.integers(1, 25), st.integers(1, 25))
def test_rolling_lead_time_is_an_observed_start_at_or_above_nine_in_ten(starts: list[float], window: int,
                                                                         min_samples: int) -> None:
    """The one rule both the live tracker and the simulator's observer use (``scaler.lead_time``)."""
    from scaler.lead_time import rolling_lead_time

    min_samples = min(min_samples, window)
    got = rolling_lead_time(starts, window, min_samples)
    recent = starts[-window:]
    if len(recent) < min_samples:
        assert got is None
        return
    assert got in recent
    assert sum(s <= got for s in recent) >= 0.9 * len(recent) - 1e-9
    assert sum(s < got for s in recent) < 0.9 * len(recent)  # the smallest such value: nearest rank


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 3600.0, allow_nan=False), max_size=40), st.floats(0.0, 7200.0, allow_nan=False))
def test_a_pod_still_starting_needs_what_the_longer_starts_took_beyond_its_age(starts: list[float],
                                                                              elapsed: float) -> None:
    """``remaining_s`` at age 0 is the lead time itself; a pod past the data keeps a constant residual
    (memoryless past what was seen), never 0 as if it were arriving now; never negative."""
    from scaler.lead_time import MIN_SAMPLES, WINDOW, remaining_s, rolling_lead_time

    got = remaining_s(starts, elapsed)
    recent = sorted(starts[-WINDOW:])
    assert math.isfinite(got) and got >= 0.0
    if len(recent) < MIN_SAMPLES:
        assert got == 0.0
        return
    if recent[0] > 0:
        assert remaining_s(starts, 0.0) == rolling_lead_time(starts)
    longer = [s for s in recent if s > elapsed]
    if len(longer) >= MIN_SAMPLES:
        assert any(math.isclose(elapsed + got, s, rel_tol=1e-12, abs_tol=1e-9) for s in longer)  # an observed start
    else:
        assert got == remaining_s(starts, 1e9) == recent[-1] - recent[-MIN_SAMPLES]


def test_remaining_start_of_a_lognormal_fleet_at_and_past_the_lead_time() -> None:
    """Twenty starts of lognormal p50 120 s, p90 240 s: a fresh pod needs the lead time, one at 180 s still
    needs minutes, one at 475 s (past every start) as long as the tail of the data says, never 0."""
    from scaler.lead_time import remaining_s, rolling_lead_time

    rng = np.random.default_rng(7)
    starts = list(rng.lognormal(math.log(120.0), math.log(2.0) / 1.2816, 20))
    lead = rolling_lead_time(starts)
    assert lead is not None and remaining_s(starts, 0.0) == lead
    assert remaining_s(starts, 180.0) > lead - 180.0
    tail = sorted(starts)[-1] - sorted(starts)[-3]
    assert remaining_s(starts, 475.0) == remaining_s(starts, 5000.0) == pytest.approx(tail)
    assert tail > 0
