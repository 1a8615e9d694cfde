"""Baselines as their recipes define them, and one policy code path for the live scaler and the simulator."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import scaler.policy
from scaler.metadata import parse_metadata
from simulator import policies
from simulator.control import ControlConfig
from simulator.observe import Observer
from simulator.policies import Leadscale, PrometheusTrigger, Saturation, View, make_policy, parse_policies

CAPACITY_META = {"model": "m", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000",
                 "maxNumSeqs": "128", "kvCacheTokens": "200000", "ttftSeconds": "2", "leadTime": "auto",
                 "activationQuery": "sum(gateway_queue_requests)"}


def observed(replicas: dict[int, tuple[float, float]], until: int = 90, rate: float = 1000.0) -> Observer:
    """An observer that scraped replicas with given (kv usage, waiting requests) for ``until`` seconds."""
    obs = Observer()
    for t in range(until + 1):
        obs.scrape(float(t), {rid: {"kv_cache_usage_perc": kv, "num_requests_waiting": q, "num_requests_running": 4,
                                    "prompt_tokens_total": rate * t, "generation_tokens_total": rate / 4 * t}
                              for rid, (kv, q) in replicas.items()})
    return obs


def view(obs: Observer, spec: int, starting: int = 0) -> View:
    return View(obs, spec_replicas=spec, ready_replicas=spec - starting, starting_replicas=starting)


def test_waiting_requests_is_the_production_stack_recipe() -> None:
    p = make_policy("waiting-requests", "any", 2.0)
    assert isinstance(p, PrometheusTrigger)
    assert p.control.target_value == 5.0 and p.control.polling_interval_s == 30 and p.control.cooldown_period_s == 300
    assert p.control.scale_down.stabilization_window_s == 300  # HPA default behavior
    obs = observed({0: (0.5, 7), 1: (0.5, 6)})
    assert p.metric(90.0, view(obs, 2)) == 13.0
    assert p.active(90.0, view(obs, 2)) is True
    assert p.metric(90.0, view(Observer(), 0)) == 0.0  # empty query: ignoreNullValues -> 0


def test_kv_cache_sums_usage_against_point_eight() -> None:
    p = make_policy("kv-cache", "any", 2.0)
    assert isinstance(p, PrometheusTrigger) and p.control.target_value == 0.8
    assert p.metric(90.0, view(observed({0: (0.9, 0), 1: (0.7, 0)}), 2)) == pytest.approx(1.6)


@pytest.mark.parametrize(
    ("replicas", "starting", "expected"),
    [
        ({0: (0.5, 0), 1: (0.5, 0)}, 0, 2),        # spare kv 0.3, spare queue 5: hold (2 -> 1 would leave 0.8-1.0)
        ({0: (0.2, 0), 1: (0.2, 0), 2: (0.2, 0)}, 0, 2),  # one fewer keeps both margins: -1
        ({0: (0.75, 0), 1: (0.75, 0)}, 0, 3),      # spare kv 0.05 < 0.1: +1
        ({0: (0.5, 3), 1: (0.5, 3)}, 0, 3),        # spare queue 2 < 3: +1
        ({0: (0.9, 0), 1: (0.85, 9)}, 0, 3),       # all saturated: +1
        ({0: (0.9, 0), 1: (0.85, 9)}, 1, 3),       # ... but not while a replica is pending
        ({0: (0.9, 0), 1: (0.1, 0), 2: (0.1, 0)}, 0, 3),  # a saturated replica blocks scale-down
    ],
    ids=["hold", "down", "kv-spare", "queue-spare", "saturated", "pending-blocks", "no-down-when-saturated"],
)
def test_saturation_follows_wva_v1(replicas: dict[int, tuple[float, float]], starting: int, expected: int) -> None:
    p = make_policy("saturation", "any", 2.0)
    assert isinstance(p, Saturation)
    spec = len(replicas) + starting
    assert p.metric(90.0, view(observed(replicas), spec, starting)) == expected


def test_policy_names_and_errors() -> None:
    assert parse_policies("leadscale, oracle,fixed:3") == ["leadscale", "oracle", "fixed:3"]
    fixed = make_policy("fixed:4", "any", 2.0)
    assert isinstance(fixed, policies.Fixed) and fixed.replicas == 4
    with pytest.raises(ValueError, match="'cpu' is not a policy; allowed leadscale"):
        parse_policies("leadscale,cpu")
    with pytest.raises(ValueError, match="listed twice"):
        parse_policies("oracle,oracle")
    with pytest.raises(ValueError, match="fixed:N needs an integer N >= 1"):
        make_policy("fixed:0", "any", 2.0)
    with pytest.raises(ValueError, match="give at least one"):
        parse_policies(" , ")


@given(st.text(max_size=30))
def test_parse_policies_accepts_or_names_the_problem(text: str) -> None:
    try:
        names = parse_policies(text)
    except ValueError as exc:
        assert "policies" in str(exc)
        return
    assert names and all(isinstance(n, str) for n in names)


def test_simulator_and_live_scaler_build_the_same_policy_config() -> None:
    """Same metadata -> same PolicyConfig, by the very code the evaluator uses."""
    control = ControlConfig(min_replicas=1, max_replicas=40)
    lead = Leadscale(CAPACITY_META, control)
    live = parse_metadata(dict(CAPACITY_META)).policy_config(1, 40)
    assert lead.policy_config() == live
    assert lead.control.target_value == 1.0


def test_simulator_calls_the_live_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails if the simulator ever runs a copy of the policy instead of scaler.policy.decide."""
    calls = []
    real = scaler.policy.decide

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(scaler.policy, "decide", spy)
    assert policies.live_policy is scaler.policy
    lead = Leadscale(CAPACITY_META, ControlConfig(min_replicas=1, max_replicas=40))
    obs = observed({0: (0.5, 20), 1: (0.6, 30)}, until=120, rate=20000.0)
    v = view(obs, 2)
    lead.evaluate(120.0, v)
    assert len(calls) == 1
    signals, state, config, now = calls[0]
    assert now == 120.0 and config == lead.policy_config() and state == scaler.policy.PolicyState()
    assert signals.requests_waiting == 50 and signals.ready_replicas == 2
    assert lead.metric(120.0, v) == float(lead.decision.desired_replicas) >= 2
    assert lead.active(120.0, v) is True
    assert lead.metric(120.0 + policies.STALENESS_LIMIT_S + 1, v) is None  # stale: Unavailable, KEDA decides


def test_leadscale_without_data_keeps_no_decision() -> None:
    lead = Leadscale(CAPACITY_META, ControlConfig(min_replicas=1))
    lead.evaluate(0.0, view(Observer(), 1))
    assert lead.metric(0.0, view(Observer(), 1)) is None and lead.active(0.0, view(Observer(), 1)) is None


def test_simulated_leadscale_decides_exactly_like_the_live_evaluator() -> None:
    """Same metadata and the same Signals, step by step: the live Evaluator and the simulator agree."""
    from scaler.evaluator import Evaluator
    from scaler.signals import Signals
    from scaler.telemetry import Telemetry

    meta = {**CAPACITY_META, "minReplicas": "1", "maxReplicas": "40", "leadTime": "120s"}
    meta.pop("activationQuery")
    script: list[Signals] = []
    for i in range(40):  # a ramp with a queue building, then easing off
        load = 4000.0 * (1 + min(i, 25) / 5) if i < 30 else 4000.0
        script.append(Signals(at=0.0, prompt_tokens_per_s=load, generation_tokens_per_s=load / 4,
                              requests_waiting=float(max(0, i - 10) * 3 if i < 30 else 0), requests_running=20.0,
                              ready_replicas=2 + i // 10, starting_replicas=1 if 8 < i < 20 else 0,
                              mean_prompt_tokens=800.0, mean_output_tokens=200.0, data_age_s=2.0))
    current = {"s": script[0]}

    class Source:
        def fetch(self, targets, now):
            return {t: current["s"] for t in targets}

    class Stub:
        def signals(self, now, ready, starting, lead_time_auto=True):
            return current["s"]

    clock = {"t": 1000.0}
    ev = Evaluator(prometheus_url="http://127.0.0.1:9", source_factory=lambda key: Source(),
                   clock=lambda: clock["t"], telemetry=Telemetry())
    lead = Leadscale(meta, ControlConfig(min_replicas=1, max_replicas=40))
    try:
        for i, signals in enumerate(script):
            clock["t"] = 1000.0 + 5.0 * i
            current["s"] = signals
            if i:
                ev.run_once()
            answer = ev.lookup("llm", "chat", meta)
            lead.evaluate(clock["t"], View(Stub(), signals.ready_replicas + signals.starting_replicas,
                                           signals.ready_replicas, signals.starting_replicas))
            assert (lead.decision.desired_replicas, lead.decision.active) == (answer.desired_replicas,
                                                                              answer.active), i
    finally:
        ev.stop()
    assert len({d for _, d, _ in lead.decisions}) > 1  # the script made the policy move
