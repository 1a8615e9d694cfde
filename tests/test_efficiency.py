"""The learned replica efficiency: KV binding, multiplicative decrease at the SLO's edge, slow probing."""

from __future__ import annotations

import pytest

from scaler.efficiency import EVIDENCE_WINDOWS, MAX_EFFICIENCY, TAIL_FLOOR, CapacityMemory, assess
from scaler.signals import Signals

WINDOW = 60.0


def snapshot(**overrides: object) -> Signals:
    base: dict[str, object] = dict(at=0.0, prompt_tokens_per_s=0.0, generation_tokens_per_s=0.0,
                                   requests_waiting=0.0, requests_running=4.0, ready_replicas=4)
    base.update(overrides)
    return Signals(**base)  # type: ignore[arg-type]


def feed(steps: int, served: float, queue: float, queued: bool = False, memory: CapacityMemory | None = None,
         start: float = 0.0, **signal_fields: object) -> CapacityMemory:
    """Run ``steps`` observations 5 s apart with the same snapshot; return the memory."""
    memory = memory or CapacityMemory()
    for i in range(steps):
        now = start + 5.0 * i
        _, memory = assess(memory, snapshot(**signal_fields), served, queue, queued, now, WINDOW, 0.8, 2.0, 240.0)
    return memory


def test_fresh_memory_is_neutral() -> None:
    seen, _ = assess(CapacityMemory(), snapshot(), 3.0, 0.0, False, 0.0, WINDOW, 0.8, 2.0, 240.0)
    assert (seen.efficiency, seen.factor, seen.saturated) == (1.0, 1.0, False)


def test_saturation_throughout_a_window_sets_efficiency_to_what_a_replica_serves() -> None:
    # 4 ready replicas serve 2 replica units while a queue waits (mean wait 10 s > 2 s / 3)
    memory = feed(30, served=2.0, queue=20.0, queued=True, requests_waiting=50.0)
    assert memory.efficiency == pytest.approx(0.5)
    seen, _ = assess(memory, snapshot(requests_waiting=50.0), 2.0, 20.0, True, 150.0, WINDOW, 0.8, 2.0, 240.0)
    assert seen.factor == pytest.approx(2.0) and seen.saturated


def test_a_queue_that_just_formed_teaches_nothing() -> None:
    memory = feed(30, served=2.0, queue=20.0, queued=False, requests_waiting=50.0)
    assert memory.efficiency == 1.0


def test_a_fleet_that_just_changed_teaches_nothing() -> None:
    memory = CapacityMemory()
    for i in range(30):  # a replica joins every 5 s: rates never match the fleet
        _, memory = assess(memory, snapshot(ready_replicas=4 + i), 2.0, 20.0, True, 5.0 * i, WINDOW, 0.8, 2.0, 240.0)
    assert memory.efficiency == 1.0


def test_calm_loaded_fleet_probes_slowly_upwards_and_idle_one_does_not() -> None:
    loaded = feed(120, served=3.8, queue=0.0)  # 0.95 per replica, no queue: calm near the estimate
    # +12.5 % (half of the 0.8 target's 25 % headroom) per 240 s lead time, for 600 s, and never more
    # than that step past the load seen calm (0.95 x 1.125)
    assert 1.0 < loaded.efficiency <= min(1.0 + 0.125 * 600 / 240, 0.95 * 1.125) + 1e-9
    idle = feed(120, served=1.0, queue=0.0)  # 0.25 per replica: calm says nothing
    assert idle.efficiency == 1.0


def test_probing_never_runs_past_the_evidence() -> None:
    # calm at 0.75 per replica: the estimate's own operating point (0.8 x 1.0) was never tried, so it
    # must not grow (growing past it is how a ramp outruns the fleet by a whole cold start)
    assert feed(240, served=3.0, queue=0.0).efficiency == 1.0
    # calm at 0.95 for long: e settles at one probe step past it, not at the 2.0 bound
    settled = feed(600, served=3.8, queue=0.0)
    assert settled.efficiency == pytest.approx(0.95 * 1.125)
    # evidence ages out after EVIDENCE_WINDOWS rate windows; the estimate itself is kept
    later = feed(1, served=3.8, queue=0.0, memory=settled, start=5.0 * 600 + EVIDENCE_WINDOWS * WINDOW)
    assert later.calm_loads == () and later.efficiency == settled.efficiency


def test_a_late_tail_lowers_the_estimate_but_never_below_the_floor() -> None:
    late = 0.3  # 30 % of first tokens after the SLO
    # 0.8 per replica (the estimate's operating point) and late: the estimate is too high
    memory = CapacityMemory()
    for i in range(40):
        _, memory = assess(memory, snapshot(), 3.2, 0.1, False, 5.0 * i, WINDOW, 0.8, 2.0, 240.0, late)
    assert memory.efficiency < 0.9
    # late at any load, for an hour (prompts whose own prefill outlasts the SLO): bounded below
    for i in range(40, 760):
        served = 4.0 * 0.8 * memory.efficiency  # the fleet follows the estimate down
        _, memory = assess(memory, snapshot(), served, 0.1, False, 5.0 * i, WINDOW, 0.8, 2.0, 240.0, late)
    assert memory.efficiency == pytest.approx(TAIL_FLOOR)


def test_a_late_tail_teaches_nothing_while_replicas_are_starting() -> None:
    # the replicas ordered for the lateness have not arrived: their effect cannot be judged yet
    memory = CapacityMemory()
    for i in range(40):
        _, memory = assess(memory, snapshot(starting_replicas=2), 3.2, 0.1, False, 5.0 * i, WINDOW, 0.8, 2.0,
                           240.0, 0.3)
    assert memory.efficiency == 1.0


def test_probing_is_bounded() -> None:
    memory = CapacityMemory(efficiency=MAX_EFFICIENCY - 1e-6)
    memory = feed(200, served=8.0, queue=0.0, memory=memory)
    assert memory.efficiency <= MAX_EFFICIENCY


def test_kv_binding_factor_comes_from_the_previous_window() -> None:
    # the KV cache is 90 % full while token work is 1.2 of 4 replicas: KV binds 3x
    memory = feed(12, served=1.2, queue=0.0, kv_cache_usage=0.9)
    seen, _ = assess(memory, snapshot(kv_cache_usage=0.9), 1.2, 0.0, False, 60.0, WINDOW, 0.8, 2.0, 240.0)
    assert seen.kv_replicas == pytest.approx(3.6)
    assert seen.kv_factor == pytest.approx(3.0)
    assert seen.factor == pytest.approx(3.0)
