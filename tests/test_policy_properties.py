"""Hypothesis properties of the policy: monotone in demand, damped by starting replicas, bounded,
finite, patient on the way down, holding a fresh fleet no longer than a lead time, deterministic; and the
config validator never crashes."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.capacity import ReplicaCapacity
from scaler.policy import Decision, PolicyConfig, PolicyState, decide
from scaler.signals import Signals

CAP = ReplicaCapacity(prefill_tokens_per_s=10_000.0, decode_tokens_per_s=2_000.0, max_num_seqs=256,
                      kv_cache_tokens=200_000)

rates = st.floats(min_value=0.0, max_value=1e7, allow_nan=False)
any_finite = st.floats(min_value=0.0, max_value=1e300, allow_nan=False, allow_infinity=False)
counts = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)
optional_mean = st.none() | st.floats(min_value=0.0, max_value=1e5, allow_nan=False)


@st.composite
def signal_values(draw: st.DrawFn, rate: st.SearchStrategy[float] = rates) -> dict[str, object]:
    """The fields of one Signals (``at`` is filled in by the caller)."""
    return dict(
        prompt_tokens_per_s=draw(rate), generation_tokens_per_s=draw(rate),
        requests_waiting=draw(counts), requests_running=draw(counts),
        ready_replicas=draw(st.integers(0, 200)), starting_replicas=draw(st.integers(0, 50)),
        mean_prompt_tokens=draw(optional_mean), mean_output_tokens=draw(optional_mean),
        waiting_tokens=draw(st.none() | rate), lead_time_s=draw(st.none() | st.floats(0.0, 3600.0)),
        activation_value=draw(st.none() | st.floats(-10.0, 10.0)),
        kv_cache_usage=draw(st.none() | st.floats(0.0, 1.0)),
    )


@st.composite
def configs(draw: st.DrawFn) -> PolicyConfig:
    low = draw(st.integers(0, 5))
    return PolicyConfig(
        capacity=CAP, target_utilization=draw(st.floats(0.3, 1.0)), lead_time_s=draw(st.floats(0.0, 600.0)),
        scale_down_delay_s=draw(st.floats(0.0, 900.0)), min_replicas=low,
        max_replicas=draw(st.integers(max(low, 1), 500)), backlog_drain_s=draw(st.floats(1.0, 600.0)),
        trend_window_s=draw(st.floats(10.0, 900.0)),
    )


@st.composite
def histories(draw: st.DrawFn, config: PolicyConfig) -> tuple[PolicyState, float]:
    """A state reached by a random sequence of decisions, and the time of the last one."""
    state, now = PolicyState(), 0.0
    for _ in range(draw(st.integers(0, 12))):
        now += draw(st.floats(1.0, 120.0))
        state = decide(Signals(at=now, **draw(signal_values())), state, config, now).state  # type: ignore[arg-type]
    return state, now


@st.composite
def cases(draw: st.DrawFn) -> tuple[PolicyConfig, PolicyState, float, dict[str, object]]:
    config = draw(configs())
    state, now = draw(histories(config))
    return config, state, now + draw(st.floats(1.0, 60.0)), draw(signal_values())


def run(config: PolicyConfig, state: PolicyState, now: float, values: dict[str, object]) -> Decision:
    return decide(Signals(at=now, **values), state, config, now)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(cases(), rates, rates, counts, rates, counts)
def test_more_demand_never_means_fewer_replicas(case, d_prompt, d_gen, d_waiting, d_tokens, d_running) -> None:
    config, state, now, values = case
    more = dict(values)
    more["prompt_tokens_per_s"] = values["prompt_tokens_per_s"] + d_prompt  # type: ignore[operator]
    more["generation_tokens_per_s"] = values["generation_tokens_per_s"] + d_gen  # type: ignore[operator]
    more["requests_waiting"] = values["requests_waiting"] + d_waiting  # type: ignore[operator]
    more["requests_running"] = values["requests_running"] + d_running  # type: ignore[operator]
    if values["waiting_tokens"] is not None:
        more["waiting_tokens"] = values["waiting_tokens"] + d_tokens  # type: ignore[operator]
    if values["kv_cache_usage"] is not None:
        more["kv_cache_usage"] = min(1.0, values["kv_cache_usage"] + d_waiting / 1e4)  # type: ignore[operator]
    assert run(config, state, now, more).desired_replicas >= run(config, state, now, values).desired_replicas


@settings(max_examples=150, deadline=None)
@given(cases(), st.integers(1, 40))
def test_starting_replicas_damp_further_scale_up(case, extra_starting: int) -> None:
    config, state, now, values = case
    more = dict(values, starting_replicas=values["starting_replicas"] + extra_starting)  # type: ignore[operator]
    base, damped = run(config, state, now, values), run(config, state, now, more)
    base_current = values["ready_replicas"] + values["starting_replicas"]  # type: ignore[operator]
    assert damped.desired_replicas - (base_current + extra_starting) <= max(0, base.desired_replicas - base_current)
    if base.terms["fresh_hold_s"] == 0 and damped.terms["fresh_hold_s"] == 0:
        # past a fresh state's hold (its first scale-down delay, or one lead time while no window has shown
        # slack: policy._fresh_hold_s), which keeps whatever fleet it finds: never more
        assert damped.desired_replicas <= base.desired_replicas


@settings(max_examples=200, deadline=None)
@given(configs(), signal_values(any_finite), st.floats(-1e12, 1e12))
def test_bounds_hold_and_terms_are_finite_for_any_finite_input(config, values, now) -> None:
    d = run(config, PolicyState(), now, values)
    assert isinstance(d.desired_replicas, int)
    assert config.min_replicas <= d.desired_replicas <= config.max_replicas
    if d.active:
        assert d.desired_replicas >= 1
    assert all(isinstance(v, float) and math.isfinite(v) for v in d.terms.values()), d.terms
    assert all(v >= 0 for k, v in d.terms.items() if not k.startswith(("trend_replicas", "backlog_growth")))
    assert d.reason and "\n" not in d.reason and "nan" not in d.reason and "inf" not in d.reason


@settings(max_examples=100, deadline=None)
@given(configs(), st.lists(st.tuples(st.floats(1.0, 120.0), signal_values()), min_size=2, max_size=25))
def test_scale_down_waits_for_its_delay(config, steps) -> None:
    state, now, seen = PolicyState(), 0.0, []
    for dt, values in steps:
        now += dt
        d = run(config, state, now, values)
        state = d.state
        seen.append((now, d.terms["recommended_replicas"]))
        within = [rec for t, rec in seen if now - t < config.scale_down_delay_s or t == now]
        assert d.desired_replicas >= max(within)


@settings(max_examples=100, deadline=None)
@given(configs(), st.lists(st.tuples(st.floats(1.0, 120.0), signal_values()), min_size=2, max_size=25))
def test_a_fresh_serving_fleet_is_held_until_it_shows_slack_never_past_a_lead_time(config, steps) -> None:
    state, first, now = PolicyState(), None, 0.0
    for dt, values in steps:
        now += dt
        d = run(config, state, now, values)
        state, first = d.state, now if first is None else first
        hold = max(config.scale_down_delay_s, d.terms["lead_time_s"])
        current = int(d.terms["ready_replicas"] + d.terms["starting_replicas"])
        if d.active and not state.capacity.slack_seen and now - first < hold:
            assert d.desired_replicas >= min(current, config.max_replicas)
            assert d.terms["fresh_hold_s"] == hold
        if now - first >= hold:
            assert d.terms["fresh_hold_s"] == 0.0


@settings(max_examples=100, deadline=None)
@given(cases())
def test_same_inputs_same_output(case) -> None:
    config, state, now, values = case
    frozen = replace(state)
    first, second = run(config, state, now, values), run(config, state, now, values)
    assert first == second
    assert state == frozen


field_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 2000), st.booleans(),
                         st.none(), st.text(max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["ttft_slo_s", "target_utilization", "lead_time_s", "scale_down_delay_s",
                                        "min_replicas", "max_replicas", "activation_threshold", "backlog_drain_s",
                                        "trend_window_s", "trend_confidence", "rate_window_s"]),
                       field_values, max_size=4))
def test_config_either_validates_or_names_the_bad_field(overrides) -> None:
    try:
        config = PolicyConfig(capacity=CAP, **overrides)
    except ValueError as err:
        assert any(f"{name}={value!r}" in str(err) for name, value in overrides.items()), str(err)
    else:
        assert 0 < config.target_utilization <= 1 and config.max_replicas >= max(config.min_replicas, 1)
