"""The KEDA/HPA loop against Kubernetes' and KEDA's documented behaviour, on a hand-moved clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.control import (
    HPA,
    ControlConfig,
    ControlLoop,
    ScalingPolicy,
    ScalingRules,
    average_value_replicas,
    to_milli,
)

NO_WINDOW_DOWN = ScalingRules(0.0, (ScalingPolicy("Percent", 100, 15.0),))


def hpa(**kw) -> HPA:
    return HPA(ControlConfig(**kw))


@pytest.mark.parametrize(
    ("metric_sum", "target", "current", "expected"),
    [
        (10.9, 1, 10, 10),   # ratio 1.09: within the 10 % tolerance
        (11.1, 1, 10, 12),   # ratio 1.11: ceil(11.1)
        (9.1, 1, 10, 10),    # ratio 0.91: within
        (8.9, 1, 10, 9),
        (50, 5, 3, 10),      # waiting requests 50, threshold 5
        (0, 5, 3, 0),
        (0.3, 1, 0, 1),      # from zero replicas no tolerance applies
    ],
    ids=["tol-up-in", "tol-up-out", "tol-down-in", "tol-down-out", "avg-value", "zero", "from-zero"],
)
def test_average_value_with_tolerance(metric_sum: float, target: float, current: int, expected: int) -> None:
    assert average_value_replicas(metric_sum, target, current) == expected


def test_tolerance_is_configurable_per_direction() -> None:
    assert average_value_replicas(10.5, 1, 10, tolerance_up=0.01) == 11
    assert average_value_replicas(9.5, 1, 10, tolerance_down=0.0) == 10  # ceil(9.5) = 10
    assert average_value_replicas(8.5, 1, 10, tolerance_down=0.2) == 10


def test_values_travel_as_milli_quantities() -> None:
    assert to_milli(0.0009) == 0
    assert to_milli(2.5) == 2500
    assert average_value_replicas(1.0001, 1, 0) == 1  # 1000 milli: no spurious extra replica


def test_scale_down_stabilization_keeps_the_highest_recommendation_for_300s() -> None:
    h = hpa(max_replicas=50)
    assert h.sync(0, 10, 10.0) == 10
    assert h.sync(15, 10, 5.0) == 10
    assert h.sync(285, 10, 5.0) == 10
    assert h.sync(300, 10, 5.0) == 5  # the t=0 recommendation left the window (strictly after the cutoff)


def test_scale_up_is_immediate_but_limited_by_default_policies() -> None:
    h = hpa(max_replicas=100)
    assert h.sync(0, 2, 20.0) == 6      # max(2 + 4 pods, 2 + 100 %) per 15 s
    assert h.sync(15, 6, 20.0) == 12    # the t=0 event is out of the 15 s period
    assert h.sync(30, 12, 20.0) == 20
    assert h.sync(45, 20, 200.0) == 40  # +100 % beats +4 pods


def test_scale_up_limit_counts_events_inside_the_period() -> None:
    rules = ScalingRules(0.0, (ScalingPolicy("Pods", 2, 60.0),))
    h = HPA(ControlConfig(scale_up=rules, max_replicas=100))
    assert h.sync(0, 1, 10.0) == 3
    assert h.sync(15, 3, 10.0) == 3     # 2 pods already added in the last 60 s
    assert h.sync(60, 3, 10.0) == 5     # the t=0 event expired


def test_select_policy_min_and_disabled() -> None:
    up_min = ScalingRules(0.0, (ScalingPolicy("Pods", 4, 15.0), ScalingPolicy("Percent", 100, 15.0)), "Min")
    assert HPA(ControlConfig(scale_up=up_min, max_replicas=100)).sync(0, 2, 20.0) == 4
    down_off = ScalingRules(0.0, (), "Disabled")
    h = HPA(ControlConfig(scale_down=down_off))
    assert h.sync(0, 10, 1.0) == 10
    up_off = ScalingRules(0.0, (), "Disabled")
    assert HPA(ControlConfig(scale_up=up_off)).sync(0, 3, 30.0) == 3


def test_percent_scale_down_per_period() -> None:
    rules = ScalingRules(0.0, (ScalingPolicy("Percent", 50, 60.0),))
    h = HPA(ControlConfig(scale_down=rules))
    assert h.sync(0, 10, 1.0) == 5
    assert h.sync(15, 5, 1.0) == 5      # the period started at 10: 50 % of it is already gone
    assert h.sync(60, 5, 1.0) == 2      # new period: int(5 * 0.5)


def test_min_max_bounds_and_zero() -> None:
    h = hpa(min_replicas=2, max_replicas=8, scale_down=NO_WINDOW_DOWN)
    assert h.sync(0, 4, 100.0) == 8
    assert h.sync(15, 8, 0.0) == 2
    assert h.sync(30, 12, 5.0) == 8     # above max: straight to max, metric ignored
    assert h.sync(45, 1, 0.0) == 2      # below min: straight to min
    assert h.sync(60, 0, 50.0) == 0     # the HPA does nothing at zero replicas


def test_failed_metric_read_changes_nothing() -> None:
    assert hpa().sync(0, 5, None) == 5


def loop(config: ControlConfig, metric, active) -> ControlLoop:
    return ControlLoop(config, metric, active)


def test_keda_activates_from_zero_on_poll_and_cools_down_to_zero() -> None:
    demand = {"value": 0.0}
    cl = loop(ControlConfig(scale_down=NO_WINDOW_DOWN), lambda now: demand["value"],
              lambda now: demand["value"] > 0)
    assert cl.tick(0, 0) == 0
    demand["value"] = 3.0
    assert cl.tick(15, 0) == 0          # HPA sync only: nothing at zero, and KEDA polls every 30 s
    assert cl.tick(30, 0) == 3          # KEDA poll: 0 -> 1, then the HPA sync of the same instant: 1 -> 3
    demand["value"] = 0.0
    replicas = 3
    for t in range(60, 330, 15):
        replicas = cl.tick(t, replicas)
        assert replicas >= 1, t         # the HPA keeps minReplicas 1; KEDA waits for the cooldown
    assert cl.last_active_at == 30
    assert cl.tick(330, replicas) == 0  # first poll with last activity >= 300 s ago


def test_keda_poll_alone_activates_to_one() -> None:
    cl = loop(ControlConfig(), lambda now: 5.0, lambda now: True)
    assert cl.poll(0, 0) == 1


def test_keda_min_replica_count_blocks_scale_to_zero() -> None:
    cl = loop(ControlConfig(min_replicas=2), lambda now: 0.0, lambda now: False)
    assert cl.tick(0, 0) == 2
    assert cl.tick(400, 2) == 2


def test_fallback_after_failure_threshold() -> None:
    cfg = ControlConfig(fallback_failure_threshold=3, fallback_replicas=6, max_replicas=20)
    cl = loop(cfg, lambda now: None, lambda now: True)
    assert cl.sync(0, 2) == 2
    assert cl.sync(15, 2) == 2
    assert cl.sync(30, 2) == 6          # third failure: KEDA reports 6 x target
    ok = loop(ControlConfig(), lambda now: None, lambda now: True)
    assert [ok.sync(t, 2) for t in (0, 15, 30, 45)] == [2, 2, 2, 2]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"target_value": 0}, "target_value=0"),
        ({"max_replicas": 0}, "max_replicas=0"),
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas=2"),
        ({"polling_interval_s": 0}, "polling_interval_s=0"),
        ({"fallback_failure_threshold": 3}, "fallback_replicas=0"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        ControlConfig(**kwargs)


def test_rules_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="type='Replicas'"):
        ScalingPolicy("Replicas", 1, 15)
    with pytest.raises(ValueError, match="select_policy='Fast'"):
        ScalingRules(0, (ScalingPolicy("Pods", 1, 15),), "Fast")
    with pytest.raises(ValueError, match=r"tolerance=1\.5"):
        ScalingRules(0, (ScalingPolicy("Pods", 1, 15),), tolerance=1.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 500, allow_nan=False), min_size=1, max_size=40), st.integers(1, 30))
def test_hpa_stays_in_bounds_and_respects_default_rate(values: list[float], start: int) -> None:
    cfg = ControlConfig(min_replicas=1, max_replicas=60)
    h = HPA(cfg)
    replicas = min(start, cfg.max_replicas)
    raws: list[tuple[float, int]] = []
    for i, value in enumerate(values):
        now = i * 15.0
        raws.append((now, average_value_replicas(value, 1, replicas)))
        new = h.sync(now, replicas, value)
        assert cfg.hpa_min_replicas <= new <= cfg.max_replicas
        assert new <= max(replicas + 4, 2 * replicas)  # default scale-up policies per 15 s
        highest_in_window = max(r for t, r in raws if t > now - 300)
        assert new >= min(replicas, highest_in_window, cfg.max_replicas)  # scale-down stabilization
        replicas = new


def test_a_new_hpa_does_not_scale_down_before_its_window_has_passed() -> None:
    h = hpa()
    assert h.sync(0, 6, 0.0) == 6      # seeded with the current size (maybeInitScaleDownStabilizationWindow)
    assert h.sync(285, 6, 0.0) == 6
    assert h.sync(300, 6, 0.0) == 1


@pytest.mark.parametrize(
    ("behavior", "current", "expected"),
    [("static", 2, 6), ("currentReplicas", 2, 2), ("currentReplicasIfHigher", 8, 8), ("currentReplicasIfHigher", 2, 6),
     ("currentReplicasIfLower", 8, 6), ("currentReplicasIfLower", 2, 2)],
)
def test_fallback_behaviors(behavior: str, current: int, expected: int) -> None:
    cfg = ControlConfig(fallback_failure_threshold=1, fallback_replicas=6, fallback_behavior=behavior,
                        max_replicas=20, scale_down=NO_WINDOW_DOWN)
    assert loop(cfg, lambda now: None, lambda now: True).sync(0, current) == expected
    with pytest.raises(ValueError, match="fallback_behavior='sometimes'"):
        ControlConfig(fallback_behavior="sometimes")


def test_loop_polls_every_30s_and_syncs_every_15s() -> None:
    polls: list[float] = []
    syncs: list[float] = []
    cl = loop(ControlConfig(), lambda now: syncs.append(now) or 1.0, lambda now: polls.append(now) or True)
    replicas = 1
    for t in range(0, 91):
        if t + 1e-9 >= cl.next_due():
            replicas = cl.tick(float(t), replicas)
    assert polls == [0.0, 30.0, 60.0, 90.0]
    assert syncs == [0.0, 15.0, 30.0, 45.0, 60.0, 75.0, 90.0]
