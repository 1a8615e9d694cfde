"""The efficiency correction: one rule, judged once per rate window on a steady fleet."""

from __future__ import annotations

import pytest

from scaler.efficiency import (
    LATE_SHARE,
    LOADED,
    MAX_EFFICIENCY,
    STEP,
    TAIL_SHARE,
    CapacityMemory,
    assess,
    estimated_late_share,
)
from scaler.signals import Signals

WINDOW = 60.0


def snapshot(**overrides: object) -> Signals:
    base: dict[str, object] = dict(at=0.0, prompt_tokens_per_s=0.0, generation_tokens_per_s=0.0,
                                   requests_waiting=0.0, requests_running=4.0, ready_replicas=4)
    base.update(overrides)
    return Signals(**base)  # type: ignore[arg-type]


def feed(seconds: float, served: float, late: float | None, memory: CapacityMemory | None = None,
         start: float = 0.0, **signal_fields: object) -> CapacityMemory:
    """Observations 5 s apart with the same snapshot for ``seconds``; return the memory."""
    memory = memory or CapacityMemory()
    for i in range(int(seconds // 5) + 1):
        _, memory = assess(memory, snapshot(**signal_fields), served, late, start + 5.0 * i, WINDOW)
    return memory


def windows_judged(seconds: float) -> int:
    """Rate windows judged in ``seconds`` from a fresh memory: the first after one window of steadiness."""
    return int((seconds - WINDOW) // WINDOW) + 1


def test_fresh_memory_is_neutral() -> None:
    seen, _ = assess(CapacityMemory(), snapshot(), 3.0, 0.0, 0.0, WINDOW)
    assert seen.efficiency == 1.0 and seen.verdict == "unsteady"  # one snapshot is not a steady window


@pytest.mark.parametrize(("served", "late", "slack"), [
    (2.0, 0.0, True),     # calm: the fleet carried its load with time to spare
    (0.1, None, True),    # idle: nothing to serve is slack too
    (2.0, 0.03, False),   # at the edge of the budget
    (2.0, 0.2, False),    # late at a light load: teaches the efficiency nothing, and shows no slack either
    (3.2, 0.2, False),    # late at a real load
])
def test_only_a_calm_or_idle_window_shows_slack_and_it_is_remembered(served: float, late: float | None,
                                                                    slack: bool) -> None:
    memory = feed(WINDOW * 2, served=served, late=late)
    assert memory.slack_seen is slack
    # once seen it stays: a later late window is the efficiency's business, not a fresh fleet's
    assert feed(WINDOW * 2, served=3.2, late=0.2, memory=memory, start=WINDOW * 3).slack_seen is slack
    assert not feed(WINDOW / 2, served=served, late=late).slack_seen  # no judged window yet


def test_late_at_a_real_load_steps_down_once_per_window() -> None:
    # 4 replicas serve 3.2 units (0.8 each, above LOADED) and 20 % of first tokens are late
    memory = feed(300, served=3.2, late=0.2)
    assert memory.efficiency == pytest.approx((1 - STEP) ** windows_judged(300))


def test_a_window_is_late_a_point_below_the_budget_and_calm_at_half_of_it() -> None:
    """The SLO is judged over the run: a window between 4 % and 5 % late already steps the efficiency down,
    one between half the budget and 4 % holds it, one under half the budget may raise it."""
    assert 0.039 < LATE_SHARE < 0.041 and LATE_SHARE < TAIL_SHARE
    assert feed(300, served=3.2, late=0.045).efficiency == pytest.approx((1 - STEP) ** windows_judged(300))
    held = feed(300, served=3.2, late=0.03)
    assert held.efficiency == 1.0
    _, memory = assess(held, snapshot(), 3.2, 0.03, 300.0, WINDOW)
    assert assess(memory, snapshot(), 3.2, 0.03, 305.0, WINDOW)[0].verdict in ("edge", "none")
    assert feed(300, served=3.2, late=0.02).efficiency == 1.0  # calm at 0.8 a replica: one step past, capped
    assert feed(300, served=3.2, late=0.0, memory=CapacityMemory(efficiency=0.5)).efficiency > 0.5


def test_late_at_a_light_load_teaches_nothing() -> None:
    # 0.4 units a replica is below LOADED: prompts that fill the SLO on their own, not a capacity problem
    assert LOADED > 0.4
    memory = feed(600, served=1.6, late=0.5)
    assert memory.efficiency == 1.0


def test_calm_probes_one_step_past_the_load_carried_and_no_further() -> None:
    lowered = feed(300, served=3.2, late=0.2)  # down to 0.9 ** 5 = 0.59
    # now calm while each replica carries 0.7: the estimate follows, to one step past 0.7 and no further
    recovered = feed(1200, served=2.8, late=0.0, memory=lowered, start=1000.0)
    assert recovered.efficiency == pytest.approx(0.7 * (1 + STEP))
    # calm at 0.95 of the estimate: one step up per window, bounded by 1.1 x 0.95 x ... of the evidence
    loaded = feed(1200, served=3.8, late=0.0)  # 0.95 a replica
    assert loaded.efficiency == pytest.approx(0.95 * (1 + STEP))
    # calm at a light load says nothing: a replica that was never pushed shows no capacity
    assert feed(1200, served=2.0, late=0.0).efficiency == 1.0


def test_edge_share_between_half_and_whole_budget_holds() -> None:
    memory = feed(600, served=3.6, late=TAIL_SHARE * 0.75)
    assert memory.efficiency == 1.0


def test_a_fleet_that_just_changed_teaches_nothing() -> None:
    memory = CapacityMemory()
    for i in range(60):  # a replica joins every 5 s: rates never match the fleet
        _, memory = assess(memory, snapshot(ready_replicas=4 + i), 3.0 + i, 0.5, 5.0 * i, WINDOW)
    assert memory.efficiency == 1.0


def test_idle_fleet_teaches_nothing_and_the_bounds_hold() -> None:
    assert feed(600, served=0.1, late=1.0).efficiency == 1.0
    high = CapacityMemory(efficiency=MAX_EFFICIENCY)
    assert feed(600, served=40.0, late=0.0, memory=high).efficiency == MAX_EFFICIENCY


def test_past_windows_only_decide_the_current_factor() -> None:
    memory = feed(300, served=3.2, late=0.2)
    seen, after = assess(memory, snapshot(), 3.2, 0.2, 360.0, WINDOW)
    assert seen.efficiency == memory.efficiency  # what this snapshot shows changes the next one
    assert after.efficiency < memory.efficiency


def test_kv_replicas_are_the_fleet_share_in_use() -> None:
    seen, _ = assess(CapacityMemory(), snapshot(kv_cache_usage=0.5), 1.0, None, 0.0, WINDOW)
    assert seen.kv_replicas == pytest.approx(2.0)


@pytest.mark.parametrize(("mean_wait", "budget", "expected"), [
    (0.0, 1.0, 0.0), (1.0, 1.0, pytest.approx(0.3679, abs=1e-4)), (0.1, 2.0, pytest.approx(2.06e-9, rel=1e-2)),
    (5.0, 0.0, 1.0),
])
def test_estimated_late_share_is_an_exponential_tail(mean_wait: float, budget: float, expected: object) -> None:
    assert estimated_late_share(mean_wait, budget) == expected
