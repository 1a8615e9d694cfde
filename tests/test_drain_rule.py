"""Streaming drain: one rule (preStop sleep + p99 request duration + engine stop) for the chart, the
docs, ``shutdown-advice`` and the simulator's default drain grace."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaler.kube.drain import ENGINE_STOP_S, PRE_STOP_SLEEP_S, drain_timing


@given(st.floats(0, 86400))
def test_the_grace_covers_the_prestop_sleep_and_the_longest_usual_request(p99: float) -> None:
    timing = drain_timing(p99)
    assert timing.shutdown_timeout_s >= p99 and timing.shutdown_timeout_s == max(1, math.ceil(p99 - 1e-9))
    assert timing.termination_grace_period_s == PRE_STOP_SLEEP_S + timing.shutdown_timeout_s + ENGINE_STOP_S
    settings = timing.pod_settings()
    assert settings["lifecycle"] == {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_S}}}
    assert settings["vllmArgs"] == [f"--shutdown-timeout={timing.shutdown_timeout_s}"]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "60"])
def test_bad_durations_are_named(bad: object) -> None:
    with pytest.raises(ValueError, match="p99_request_s"):
        drain_timing(bad)  # type: ignore[arg-type]


def test_the_simulator_drains_for_the_same_rule_on_its_own_p99() -> None:
    from scaler.profiles import get_profile
    from simulator.autoscale import INITIAL_WINDOW_S, _simulate, default_drain_grace, run_autoscaled, starting_fleet
    from simulator.coldstart import as_cold_start
    from simulator.engine_backend import EngineBackend
    from simulator.policies import Fixed
    from simulator.synthetic import load_workload
    from simulator.workload import select_window

    profile = get_profile("h100-llama3-8b")
    workload = select_window(load_workload("builtin:default", None, seed=2), 0.0, 600.0)
    replicas = starting_fleet(workload, profile, 2.0, 0)
    head = select_window(workload, 0.0, INITIAL_WINDOW_S)
    fixed = _simulate(EngineBackend(head, profile, seed=0), Fixed(replicas), as_cold_start("fixed:1"), 0, 2.0,
                      __import__("numpy").zeros(1), replicas, 0.0, 1.0, None, None, 1)
    expected = drain_timing(fixed.summary["e2e_p99"]).termination_grace_period_s
    assert default_drain_grace(workload, profile, 2.0, 0, replicas=replicas) == expected
    run = run_autoscaled(workload, profile, "leadscale", "fixed:30", 2.0, 0, max_replicas=10)
    assert run.summary["drain_grace_s"] == expected and run.summary["drain_grace_from"].startswith("p99")
    override = run_autoscaled(workload, profile, "fixed:2", "fixed:30", 2.0, 0, drain_grace_s=7.0)
    assert override.summary["drain_grace_s"] == 7.0 and override.summary["drain_grace_from"] == "--drain-grace"
