"""Policy tables and fake-clock scenarios: validation, demand terms, bounds, bursts, runaway, look-ahead."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from scaler.capacity import ReplicaCapacity
from scaler.policy import Decision, PolicyConfig, PolicyState, decide
from scaler.signals import Signals

CAP = ReplicaCapacity(prefill_tokens_per_s=10_000.0, decode_tokens_per_s=2_000.0, max_num_seqs=256,
                      kv_cache_tokens=200_000)


def config(**overrides: object) -> PolicyConfig:
    return PolicyConfig(**{"capacity": CAP, **overrides})  # type: ignore[arg-type]


def signals(**overrides: object) -> Signals:
    base: dict[str, object] = dict(at=0.0, prompt_tokens_per_s=0.0, generation_tokens_per_s=0.0,
                                   requests_waiting=0.0, requests_running=0.0, ready_replicas=1)
    base.update(overrides)
    return Signals(**base)  # type: ignore[arg-type]


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(("field_name", "value"), [
    ("ttft_slo_s", 0.0), ("ttft_slo_s", math.nan), ("target_utilization", 0.0),
    ("target_utilization", 1.5), ("lead_time_s", -1.0), ("lead_time_s", math.inf), ("lead_time_scale", -0.5),
    ("lead_time_scale", 10.5), ("lead_time_scale", math.nan),
    ("scale_down_delay_s", -5.0), ("min_replicas", -1), ("min_replicas", 1.5), ("max_replicas", 0),
    ("max_replicas", True), ("activation_threshold", math.inf), ("backlog_drain_s", 0.0),
    ("trend_window_s", -1.0), ("trend_confidence", 1.0), ("trend_confidence", 0.0), ("rate_window_s", 0.0),
    ("headroom_quantile", 1.0), ("headroom_quantile", 0.0), ("headroom_history_s", 0.0), ("prior_rise", -0.1),
    ("prior_horizons", -1), ("capacity", "h100"), ("level_time_constants_s", ()),
    ("level_time_constants_s", (0.0, -60.0)), ("level_time_constants_s", (0.0, math.inf)),
    ("level_time_constants_s", [0.0, 300.0]), ("level_time_constants_s", (0.0, True)),
], ids=lambda v: str(v))
def test_config_rejects_bad_value_naming_field_and_value(field_name: str, value: object) -> None:
    with pytest.raises(ValueError) as err:
        config(**{field_name: value})
    assert f"{field_name}={value!r}" in str(err.value)
    assert "must be" in str(err.value)


def test_config_reports_every_problem_at_once() -> None:
    with pytest.raises(ValueError) as err:
        config(target_utilization=2.0, min_replicas=-1, backlog_drain_s=0.0)
    text = str(err.value)
    assert "target_utilization" in text and "min_replicas" in text and "backlog_drain_s" in text


def test_config_rejects_max_below_min() -> None:
    with pytest.raises(ValueError, match="max_replicas=2: must be >= min_replicas=3"):
        config(min_replicas=3, max_replicas=2)


def test_now_must_be_finite() -> None:
    with pytest.raises(ValueError, match="now=nan"):
        decide(signals(), PolicyState(), config(), math.nan)


# ---------------------------------------------------------------- single decisions


@pytest.mark.parametrize(("sig", "expected_served", "expected_desired"), [
    pytest.param(dict(prompt_tokens_per_s=40_000.0, requests_running=5.0), 4.0, 5, id="prefill-only"),
    pytest.param(dict(generation_tokens_per_s=8_000.0, requests_running=5.0), 4.0, 5, id="decode-only"),
    pytest.param(dict(prompt_tokens_per_s=20_000.0, generation_tokens_per_s=4_000.0, requests_running=5.0),
                 4.0, 5, id="both-add"),
    pytest.param(dict(prompt_tokens_per_s=7_000.0, requests_running=1.0), 0.7, 1, id="one-with-prior-headroom"),
    pytest.param(dict(), 0.0, 0, id="idle-scales-to-min"),
], )
def test_demand_in_replica_units(sig: dict[str, float], expected_served: float, expected_desired: int) -> None:
    settled = PolicyState(first_seen=-1000.0)  # past the initial hold; the fleet is sized right
    d = decide(signals(ready_replicas=expected_desired, **sig), settled, config(), 0.0)
    assert d.terms["served_replicas"] == pytest.approx(expected_served)
    assert d.terms["projected_backlog_replica_s"] == 0.0
    assert d.desired_replicas == expected_desired


@pytest.mark.parametrize(("sig", "tokens", "estimated"), [
    pytest.param(dict(requests_waiting=4.0, waiting_tokens=1234.0), 1234.0, 0.0, id="exact-from-gateway"),
    pytest.param(dict(requests_waiting=4.0, mean_prompt_tokens=500.0), 2000.0, 1.0, id="estimated-from-mean"),
    pytest.param(dict(requests_waiting=4.0), 4 * 200_000 / 256, 1.0, id="no-mean-kv-share"),
    pytest.param(dict(requests_waiting=4.0, mean_prompt_tokens=0.0), 4 * 200_000 / 256, 1.0, id="zero-mean"),
])
def test_waiting_tokens_source_is_reported(sig: dict[str, float], tokens: float, estimated: float) -> None:
    d = decide(signals(**sig), PolicyState(), config(), 0.0)
    assert d.terms["waiting_tokens"] == pytest.approx(tokens)
    assert d.terms["waiting_tokens_estimated"] == estimated


@pytest.mark.parametrize(("sig", "cfg", "desired", "active"), [
    pytest.param(dict(), dict(min_replicas=2), 2, False, id="min-floor"),
    pytest.param(dict(prompt_tokens_per_s=1e9, requests_running=9.0), dict(max_replicas=7), 7, True, id="max-cap"),
    pytest.param(dict(requests_waiting=1.0, mean_prompt_tokens=1.0), dict(), 1, True, id="active-at-least-one"),
    pytest.param(dict(activation_value=3.0), dict(activation_threshold=2.0), 1, True, id="activation-over"),
    pytest.param(dict(activation_value=2.0), dict(activation_threshold=2.0), 0, False, id="activation-equal"),
    pytest.param(dict(requests_running=1.0), dict(), 1, True, id="running-is-active"),
])
def test_bounds_and_activity(sig: dict[str, float], cfg: dict[str, float], desired: int, active: bool) -> None:
    d = decide(signals(ready_replicas=0, **sig), PolicyState(), config(**cfg), 0.0)
    assert (d.desired_replicas, d.active) == (desired, active)


def test_signals_lead_time_overrides_config() -> None:
    assert decide(signals(lead_time_s=42.0), PolicyState(), config(), 0.0).terms["lead_time_s"] == 42.0
    assert decide(signals(), PolicyState(), config(lead_time_s=99.0), 0.0).terms["lead_time_s"] == 99.0


def test_the_look_ahead_scale_multiplies_the_measured_lead_time_and_the_configured_one() -> None:
    measured = decide(signals(lead_time_s=42.0), PolicyState(), config(lead_time_scale=1.5), 0.0)
    assert measured.terms["lead_time_s"] == 63.0
    configured = decide(signals(), PolicyState(), config(lead_time_s=100.0, lead_time_scale=0.5), 0.0)
    assert configured.terms["lead_time_s"] == 50.0
    # the scale stays a multiple when the measured cold start changes (what a tuned ScaledObject relies on)
    looks = [decide(signals(lead_time_s=lead), PolicyState(), config(lead_time_scale=2.0), 0.0) for lead in (60, 240)]
    assert [d.terms["lead_time_s"] for d in looks] == [120.0, 480.0]


def test_terms_are_finite_and_reason_is_one_line() -> None:
    d = decide(signals(prompt_tokens_per_s=1e300, generation_tokens_per_s=1e300, requests_waiting=1e300,
                       requests_running=1.0, lead_time_s=1e300), PolicyState(), config(), 1e12)
    assert all(math.isfinite(v) for v in d.terms.values())
    assert d.desired_replicas == 1000
    assert "\n" not in d.reason and d.reason


def test_fresh_state_never_drops_below_current_fleet() -> None:
    d = decide(signals(ready_replicas=6), PolicyState(), config(), 0.0)
    assert d.desired_replicas == 6 and "fresh scaler keeps the fleet it found" in d.reason
    assert d.terms["fresh_hold_s"] == 300.0  # the first scale-down delay (longer than the 180 s lead time here)


LATE_BUCKETS = ((0.5, 0.0), (1.0, 5.0), (2.5, 8.0), (5.0, 10.0), (math.inf, 10.0))
"""27 % of first tokens after 2 s (the tail taken as exponential inside the (1, 2.5] bucket)."""
CALM_BUCKETS = ((0.5, 5.0), (1.0, 10.0), (2.5, 10.0), (5.0, 10.0), (math.inf, 10.0))
"""None after 2 s."""


@pytest.mark.parametrize(("buckets", "released_by"), [
    pytest.param(CALM_BUCKETS, 60.0, id="calm: after the first delay"),
    pytest.param(LATE_BUCKETS, 180.0, id="late: after one lead time"),
])
def test_a_fresh_fleet_is_held_until_a_window_shows_slack_and_at_most_one_lead_time(
        buckets: tuple[tuple[float, float], ...], released_by: float) -> None:
    """Six ready replicas carry 3 units (0.5 each, below LOADED, so a late tail does not move the efficiency):
    the model asks for 4. If the first judged window is calm, the fleet may shrink once the 60 s delay has
    passed; if it is late, the model is unverified and the fleet is held for one lead time (180 s)."""
    cfg, state, desired = config(scale_down_delay_s=60.0), PolicyState(), {}
    for t in range(0, 300, 5):
        d = decide(signals(at=float(t), prompt_tokens_per_s=30_000.0, requests_running=6.0, ready_replicas=6,
                           ttft_buckets=buckets), state, cfg, float(t))
        state, desired[t] = d.state, d.desired_replicas
        assert d.terms["efficiency"] == 1.0
        if t == 100:
            says_why = "up to 180 s (one lead time), until a judged window shows it has slack" in d.reason
            assert says_why is (released_by > 100) and d.terms["fresh_hold_s"] == (180.0 if says_why else 0.0)
    assert d.terms["recommended_replicas"] == 4.0
    held = [t for t, n in desired.items() if n == 6]
    assert max(held) == released_by - 5  # the recommendations were 4 all along: nothing else holds the fleet
    assert desired[295] == 4


# ---------------------------------------------------------------- fake-clock scenarios


@dataclass
class FluidFleet:
    """A fake cluster and clock: prefill-only work, replicas ready ``lead`` seconds after being asked,
    token rates reported as 60 s averages (as Prometheus ``rate()`` would), exact waiting tokens."""

    demand: Callable[[float], float]  # replica units
    cfg: PolicyConfig
    ready: int = 1
    lead: float = 180.0
    dt: float = 5.0
    report_lead: bool = True
    t: float = 0.0
    waiting: float = 0.0
    state: PolicyState = field(default_factory=PolicyState)
    starting: list[float] = field(default_factory=list)
    served_total: list[tuple[float, float]] = field(default_factory=lambda: [(0.0, 0.0)])
    log: list[tuple[float, Decision, int, int]] = field(default_factory=list)

    def step(self) -> Decision:
        self.starting.sort()
        while self.starting and self.starting[0] <= self.t:
            self.starting.pop(0)
            self.ready += 1
        arriving = self.demand(self.t) * CAP.prefill_tokens_per_s
        served = min(arriving + self.waiting / self.dt, self.ready * CAP.prefill_tokens_per_s)
        self.waiting = max(0.0, self.waiting + (arriving - served) * self.dt)
        total = self.served_total[-1][1] + served * self.dt
        self.served_total.append((self.t + self.dt, total))
        before = [c for u, c in self.served_total if u <= self.t + self.dt - 60.0]
        rate = (total - (before[-1] if before else 0.0)) / 60.0
        sig = Signals(at=self.t, prompt_tokens_per_s=rate, generation_tokens_per_s=0.0,
                      requests_waiting=self.waiting / 1000.0, requests_running=1.0 if served else 0.0,
                      ready_replicas=self.ready, starting_replicas=len(self.starting), waiting_tokens=self.waiting,
                      lead_time_s=self.lead if self.report_lead else None)
        d = decide(sig, self.state, self.cfg, self.t)
        self.state = d.state
        current = self.ready + len(self.starting)
        if d.desired_replicas > current:
            self.starting += [self.t + self.lead] * (d.desired_replicas - current)
        excess = current - d.desired_replicas
        while excess > 0 and self.starting:
            self.starting.pop()
            excess -= 1
        self.ready -= max(0, excess)
        self.log.append((self.t, d, self.ready, len(self.starting)))
        self.t += self.dt
        return d

    def run_until(self, end_s: float) -> None:
        while self.t <= end_s:
            self.step()


def desired_between(fleet: FluidFleet, start: float, end: float) -> list[int]:
    return [d.desired_replicas for t, d, _, _ in fleet.log if start <= t < end]


def test_burst_up_then_down_only_after_the_delay() -> None:
    cfg = config(scale_down_delay_s=300.0)
    fleet = FluidFleet(lambda t: 8.0 if 600 <= t < 1800 else 1.0, cfg, ready=2)
    fleet.run_until(3600)
    assert max(desired_between(fleet, 0, 600)) <= 2
    burst = min(desired_between(fleet, 900, 1800))
    # 8 replicas of demand plus measured headroom; the jump from 1 to 8 is one event, not the rule
    assert 9 <= burst <= 8 * 1.8
    # the burst ends at 1800: nothing goes below what its last minute asked for before 1800 + delay
    at_end = max(int(d.terms["recommended_replicas"]) for t, d, _, _ in fleet.log if 1740 <= t < 1800)
    assert at_end >= 9
    assert min(desired_between(fleet, 1800, 1800 + 300 - 60)) >= at_end
    assert max(desired_between(fleet, 2700, 3600)) <= 2
    downs = [t for t, d, _, _ in fleet.log if t > 1800 and d.desired_replicas < at_end]
    assert downs and downs[0] >= 1800 + 300 - 60  # rate windows lag the end of the burst by up to 60 s


def test_no_runaway_while_replicas_start() -> None:
    """Demand steps from 2 to 10 replicas; pods take 180 s. Requests must converge, not double."""
    fleet = FluidFleet(lambda t: 10.0 if t >= 300 else 2.0, config(), ready=3)
    fleet.run_until(1500)
    during_load = desired_between(fleet, 300, 300 + 180)
    peak = max(during_load)
    # the demand needs 13; the backlog of one lead time (~8 x 180 replica-s) drained within 60 s
    # needs ~24 more: anything beyond 2x that is re-counting the backlog
    assert peak <= 40
    # once the first ordered replicas are ready, nothing more is asked for
    after_arrival = desired_between(fleet, 300 + 180 + 60, 300 + 180 + 300)
    assert max(after_arrival) <= peak
    last = fleet.log[-1][1]
    assert last.terms["recommended_replicas"] == math.ceil(last.terms["peak_replicas"] - 1e-9) >= 11


def test_starting_replicas_are_not_asked_for_again() -> None:
    cfg = config()
    state = PolicyState()
    for t in range(0, 120, 5):
        busy = signals(at=float(t), prompt_tokens_per_s=20_000.0, requests_running=4.0, ready_replicas=2,
                       starting_replicas=8, waiting_tokens=1000.0 * t, requests_waiting=t)
        d = decide(busy, state, cfg, float(t))
        state = d.state
    # the backlog keeps growing (saturated), but the 8 starting replicas cover demand when they land
    assert d.desired_replicas <= 2 + 8 + 2


def test_ramp_is_anticipated_by_the_lead_time() -> None:
    """A slow ramp: with the look-ahead, capacity asked at t covers demand at t + lead."""

    def ramp(t: float) -> float:
        return 2.0 + t / 60.0  # +1 replica of demand every minute

    ahead = FluidFleet(ramp, config(lead_time_s=180.0, target_utilization=0.9), ready=3)
    ahead.run_until(1800)
    level_only = FluidFleet(ramp, config(lead_time_s=0.0, target_utilization=0.9), ready=3, report_lead=False)
    level_only.run_until(1800)
    for t, d, _, _ in ahead.log:
        if 900 <= t <= 1800:
            assert d.desired_replicas * 0.9 >= ramp(t + 180.0) - 1.0, (t, d.terms)
    assert sum(desired_between(ahead, 900, 1800)) > sum(desired_between(level_only, 900, 1800))

    def backlog(fleet: FluidFleet) -> float:
        return max(d.terms["waiting_tokens"] for t, d, _, _ in fleet.log if t >= 900)

    assert backlog(ahead) < 1.0


def test_noise_around_a_flat_load_does_not_overshoot() -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    noise = rng.normal(0.0, 1.0, 1000)
    fleet = FluidFleet(lambda t: 6.0 + noise[int(t // 5) % 1000], config(), ready=9)
    fleet.run_until(3000)
    # 6 replicas of demand, noise sigma 1 replica: the peak of a lead time's noise and no more
    assert max(desired_between(fleet, 900, 3000)) <= 6 + 5
    assert all(d.terms["trend_used_replicas_per_s"] < 0.005 for t, d, _, _ in fleet.log if t > 900)


def test_same_inputs_same_output() -> None:
    fleet_a = FluidFleet(lambda t: 3.0 + math.sin(t / 100.0) * 2, config(), ready=4)
    fleet_b = FluidFleet(lambda t: 3.0 + math.sin(t / 100.0) * 2, config(), ready=4)
    fleet_a.run_until(900)
    fleet_b.run_until(900)
    assert [d for _, d, _, _ in fleet_a.log] == [d for _, d, _, _ in fleet_b.log]


def test_state_is_not_mutated_and_replaying_gives_the_same_decision() -> None:
    state = decide(signals(prompt_tokens_per_s=30_000.0, requests_running=3.0), PolicyState(), config(), 0.0).state
    snapshot = replace(state)
    later = signals(at=5.0, prompt_tokens_per_s=50_000.0, requests_running=3.0)
    first = decide(later, state, config(), 5.0)
    second = decide(later, state, config(), 5.0)
    assert state == snapshot
    assert first == second


def test_a_late_tail_at_a_real_load_grows_the_fleet_and_a_calm_one_does_not() -> None:
    # 8 ready replicas each serving 0.75 units: 50 % of first tokens after 1 s and 20 % after 2.5 s (27 % after
    # 2 s, the tail taken as exponential inside the bucket), or none
    late = ((0.5, 0.0), (1.0, 5.0), (2.5, 8.0), (5.0, 10.0), (math.inf, 10.0))
    on_time = ((0.5, 5.0), (1.0, 10.0), (2.5, 10.0), (5.0, 10.0), (math.inf, 10.0))  # none after 2 s
    busy = dict(prompt_tokens_per_s=60_000.0, requests_running=8.0, ready_replicas=8)
    final = {}
    for name, buckets in (("late", late), ("on_time", on_time)):
        state = PolicyState()
        for t in range(0, 600, 5):
            d = decide(signals(at=float(t), ttft_buckets=buckets, **busy), state, config(), float(t))
            state = d.state
        final[name] = d
    assert final["late"].terms["ttft_late_share"] == pytest.approx(0.5 * 0.4 ** (2 / 3))
    assert final["late"].terms["efficiency"] < 0.7 and final["on_time"].terms["efficiency"] == 1.0
    assert final["late"].desired_replicas > final["on_time"].desired_replicas >= 8


def test_headroom_follows_the_demand_s_own_variability() -> None:
    """A steady load keeps little headroom; the same mean with minute-scale bursts keeps more."""
    import numpy as np

    rng = np.random.default_rng(3)
    bursts = rng.random(1000) < 0.15

    def steady(t: float) -> float:
        return 6.0

    def bursty(t: float) -> float:
        return 6.0 + (4.0 if bursts[int(t // 60) % 1000] else 0.0)

    rises = {}
    for name, demand in (("steady", steady), ("bursty", bursty)):
        # bursts are above the band at about 13 % of moments: a band at q 0.9 must cover them, one at 0.8 need not
        fleet = FluidFleet(demand, config(headroom_quantile=0.9), ready=8)
        fleet.run_until(3600)
        rises[name] = fleet.log[-1][1].terms["headroom_rise"]
    assert rises["steady"] < 0.1 < rises["bursty"]


def test_scale_down_waits_until_the_fleet_could_come_back_in_time() -> None:
    """After a lead time with a burst every few minutes, the fleet keeps the bursts' peak."""
    # the bursts are about 17 % of the moments within a lead time: a band at q 0.9 covers them
    cfg = config(scale_down_delay_s=0.0, headroom_quantile=0.9)
    fleet = FluidFleet(lambda t: 9.0 if (t // 60) % 4 == 0 else 5.0, cfg, ready=10)
    fleet.run_until(3600)
    quiet = [d.desired_replicas for t, d, _, _ in fleet.log if t > 1800 and (t // 60) % 4 == 2]
    assert min(quiet) >= 9  # a trough between bursts 4 minutes apart is no time to give replicas back


def test_prefix_cache_hits_and_long_contexts_change_what_a_token_costs() -> None:
    cap = ReplicaCapacity(prefill_tokens_per_s=10_000.0, decode_tokens_per_s=2_000.0, max_num_seqs=256,
                          kv_cache_tokens=200_000, decode_context_tokens=500.0)
    base = dict(prompt_tokens_per_s=20_000.0, generation_tokens_per_s=2_000.0, requests_running=4.0,
                ready_replicas=4, mean_prompt_tokens=1024.0, mean_output_tokens=0.0)
    plain = decide(signals(**base), PolicyState(), config(capacity=cap), 0.0)
    assert plain.terms["served_replicas"] == pytest.approx(2.0 + 1.0)  # decode at the reference context
    cached = decide(signals(**base, prefix_cache_hit_share=0.5), PolicyState(), config(capacity=cap), 0.0)
    assert cached.terms["served_replicas"] == pytest.approx(1.0 + 1.0)  # half the prompt tokens not prefilled
    long = decide(signals(**{**base, "mean_prompt_tokens": 3024.0}), PolicyState(), config(capacity=cap), 0.0)
    factor = (1 + 3024 / 500) / (1 + 1024 / 500)
    assert long.terms["decode_cost_factor"] == pytest.approx(factor)
    assert long.terms["served_replicas"] == pytest.approx(2.0 + factor)


def test_a_pod_overdue_past_the_lead_time_is_still_on_its_way_not_serving() -> None:
    """Four ready pods serve a 4-replica demand and 150 replica-seconds wait; a fifth pod has been starting
    for 400 s against a 180 s lead time (a tail draw). Counted as arriving now it would drain the backlog
    within the lead time, and the policy would even cancel it. The measured starts say it still needs
    120 s (the spread of the three longest: memoryless past the data), so the backlog is projected with
    four pods for that time and more are ordered."""
    starts = (90.0, 100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0, 170.0, 280.0)
    now = 1000.0
    state = PolicyState(starting_since=(now - 400.0,), first_seen=0.0)
    busy = signals(at=now, prompt_tokens_per_s=40_000.0, requests_running=8.0, requests_waiting=150.0,
                   ready_replicas=4, starting_replicas=1, waiting_tokens=1_500_000.0, lead_time_s=180.0)
    cfg = config(prior_rise=0.0, scale_down_delay_s=0.0)
    blind = decide(busy, state, cfg, now)
    seen = decide(replace(busy, cold_starts_s=starts), state, cfg, now)
    assert blind.terms["projected_backlog_replica_s"] == 0.0  # five pods against four of demand: drained
    assert seen.terms["projected_backlog_replica_s"] == pytest.approx(150.0 - 60.0, rel=0.05)
    assert blind.desired_replicas == 4 < 5 < seen.desired_replicas


def test_signals_refuse_a_cold_start_that_is_not_a_duration() -> None:
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="cold_starts_s"):
            signals(cold_starts_s=(120.0, bad))


def test_the_kv_cache_gets_its_own_band_from_how_far_it_rose_at_this_level() -> None:
    """The same token work and the same KV in use now; one history's KV cache jumped from 2 to 5 replicas'
    worth for a minute in every four (the memory edge a long-context burst reaches before the token rates
    show it), the other's held still. Only the first covers the jump."""
    busy = dict(prompt_tokens_per_s=20_000.0, requests_running=8.0, ready_replicas=8)
    final = {}
    for name, jumps in (("jumpy", True), ("still", False)):
        state = PolicyState()
        for t in range(0, 3600, 15):
            usage = 5.0 / 8 if jumps and (t // 60) % 4 == 3 else 2.0 / 8
            usage = 2.0 / 8 if t == 3585 else usage  # the decision looked at: 2 replicas' worth in use now
            d = decide(signals(at=float(t), kv_cache_usage=usage, **busy), state, config(), float(t))
            state = d.state
        final[name] = d
    for d in final.values():
        assert d.terms["kv_replicas"] == pytest.approx(2.0)
    assert final["still"].terms["kv_headroom_rise"] == pytest.approx(0.0)
    assert final["still"].terms["needed_for_kv"] == pytest.approx(2.0 / 0.9)
    assert final["jumpy"].terms["kv_headroom_rise"] == pytest.approx(1.5)  # 2 -> 5 replicas: +150 %
    assert final["jumpy"].terms["needed_for_kv"] == pytest.approx(5.0 / 0.9)
    assert final["jumpy"].desired_replicas >= 6 > final["still"].desired_replicas
    # what binds is named, with its numbers
    assert "KV cache in use (2.00 replicas' worth, up to 5.00 within the next" in final["jumpy"].reason
    assert "needs 5.56 replicas at 90% each" in final["jumpy"].reason


def test_a_band_is_reused_for_less_than_a_rate_window_and_is_then_what_measuring_it_again_gives() -> None:
    """Once the history is full, the bands are measured again once per rate window, or sooner when the level
    selects other horizons (``policy._band_holds``); a younger history, at every sample. A round that measures
    them answers exactly as a state stripped of them does, terms included, through bursts, KV jumps and
    measured starts; a round that reuses them reuses a band less than a rate window old, and says so in its
    terms."""
    import numpy as np

    rng = np.random.default_rng(11)
    starts = tuple(float(s) for s in rng.lognormal(np.log(120.0), 0.54, 20))
    cfg = config()
    state = PolicyState()
    measured = reused_across_samples = 0
    for k in range(1500):  # two hours of 5 s rounds: the history fills, then drops samples at its front
        t = 5.0 * k
        level = 4.0 + 3.0 * ((k // 24) % 5 == 0) + rng.normal(0.0, 0.3)
        sig = signals(at=t, prompt_tokens_per_s=10_000.0 * max(level, 0.0), requests_running=8.0, ready_replicas=6,
                      kv_cache_usage=min(1.0, 0.2 + 0.6 * ((k // 24) % 5 == 0) + rng.uniform(0.0, 0.1)),
                      lead_time_s=240.0, cold_starts_s=starts)
        a = decide(sig, state, cfg, t)
        b = decide(sig, replace(state, bands=()), cfg, t)
        band = a.state.bands[0]
        if not state.bands or band[0] is not state.bands[0][0]:
            measured += 1
            if not state.bands or a.state.bands[1][0] is not state.bands[1][0]:  # both measured on this history
                assert a.desired_replicas == b.desired_replicas and dict(a.terms) == dict(b.terms)
        elif a.state.demand:
            (first, measured_on, _), newest = band[0][0], a.state.demand[-1][0]
            assert 0.0 <= newest - measured_on < cfg.rate_window_s
            if newest > measured_on:  # only a band measured on a full history outlives a sample
                assert measured_on - first >= cfg.headroom_history_s - 15.0
                reused_across_samples += 1
            assert a.terms["headroom_rise"] == band[1].rise and a.terms["headroom_horizons"] == band[1].horizons
        state = a.state
    assert reused_across_samples > 100  # in the second hour a band outlives the samples of its rate window
    assert measured >= 1500 / 12  # at least once per rate window (the age above), and exact each time


def test_a_level_that_selects_other_horizons_measures_the_band_at_once() -> None:
    """A step to a demand never seen: the first decision at it gets the prior's band (no past horizon started
    within a factor two of it), not the band measured a moment ago at the old level."""
    cfg = config()
    state = PolicyState()
    for k in range(720):  # an hour at 2 replicas of demand, gently wobbling
        t = 5.0 * k
        state = decide(signals(at=t, prompt_tokens_per_s=20_000.0 * (1.0 + 0.05 * (k % 4)), requests_running=8.0,
                               ready_replicas=3), state, cfg, t).state
    assert state.bands[0][1].horizons > 100
    t = 5.0 * 720
    stepped = decide(signals(at=t, prompt_tokens_per_s=200_000.0, requests_running=8.0, ready_replicas=3),
                     state, cfg, t)
    assert stepped.state.bands[0][0] is not state.bands[0][0]
    assert stepped.terms["headroom_horizons"] == 0.0
    assert stepped.terms["headroom_rise"] == pytest.approx(cfg.prior_rise)


def test_the_reason_names_the_need_that_binds() -> None:
    """A deep queue on one replica: the backlog's drain, not the peak, sets the answer, and the reason says so."""
    d = decide(signals(prompt_tokens_per_s=5_000.0, requests_running=4.0, requests_waiting=40.0,
                       waiting_tokens=2_000_000.0), PolicyState(), config(), 0.0)
    assert d.terms["needed_for_backlog"] > max(d.terms["needed_for_peak"], d.terms["needed_for_kv"])
    assert d.reason.startswith(f"scale up from 1 to {d.desired_replicas}: a backlog of ")
    assert f"needs {d.terms['needed_for_backlog']:.2f} replicas" in d.reason


def test_a_steady_noisy_load_is_carried_by_its_average_and_a_surge_by_its_raw_demand() -> None:
    """Minute-to-minute noise that does not persist: sized from a smoothed level the fleet is smaller on
    average than sized from every noisy minute, and a backlog that makes first tokens late is read raw."""
    import numpy as np

    def run(taus: tuple[float, ...]) -> tuple[float, list[Decision]]:
        rng = np.random.default_rng(3)
        minute = rng.normal(0.0, 0.12, 200)
        state, desired, decisions = PolicyState(), [], []
        ready = 6
        for k in range(1440):  # two hours of 5 s rounds
            t = 5.0 * k
            load = 5.0 * (1.0 + minute[k // 12])  # 60 s rates: one noisy value a minute
            d = decide(signals(at=t, prompt_tokens_per_s=10_000.0 * load, requests_running=8.0, ready_replicas=ready),
                       state, config(level_time_constants_s=taus, scale_down_delay_s=60.0), t)
            state, ready = d.state, d.desired_replicas
            if t >= 3600.0:
                desired.append(d.desired_replicas)
                decisions.append(d)
        return float(np.mean(desired)), decisions

    raw, raw_decisions = run((0.0,))
    smoothed, decisions = run((0.0, 300.0))
    assert all(d.terms["level_time_constant_s"] == 0.0 for d in raw_decisions)
    assert sum(d.terms["level_time_constant_s"] == 300.0 for d in decisions) > len(decisions) / 2
    assert smoothed < raw - 0.3
    levels = np.array([d.terms["level_replicas"] for d in decisions])
    nominal = np.array([d.terms["nominal_demand_replicas"] for d in decisions])
    assert levels.std() < 0.7 * nominal.std()

    # a surge: the backlog alone makes first tokens late, and the fleet is sized on the raw demand at once
    state = decisions[-1].state
    t = 7200.0
    surge = decide(signals(at=t, prompt_tokens_per_s=10_000.0 * 9.0, requests_running=8.0, ready_replicas=6,
                           requests_waiting=400.0, mean_prompt_tokens=1000.0),
                   state, config(level_time_constants_s=(0.0, 300.0), scale_down_delay_s=60.0), t)
    assert surge.terms["surging"] == 1.0
    assert surge.terms["level_replicas"] == surge.terms["nominal_demand_replicas"]


def test_an_idle_model_scales_to_zero_even_when_its_band_was_measured_from_a_smoothed_level() -> None:
    """An average of the past lags a drop to nothing by its time constant; an idle model is read raw, so
    scale-to-zero (minReplicas 0) happens after the scale-down delay, not after the average decays. A small
    load (1.5 replicas): its past horizons stay comparable to an idle level, so the band keeps its choice."""
    import numpy as np

    rng = np.random.default_rng(3)
    minute = rng.normal(0.0, 0.12, 200)
    cfg = config(scale_down_delay_s=60.0, min_replicas=0)
    state, ready, d = PolicyState(), 2, None
    for k in range(1440):
        t = 5.0 * k
        d = decide(signals(at=t, prompt_tokens_per_s=10_000.0 * 1.5 * (1.0 + minute[k // 12]), requests_running=2.0,
                           ready_replicas=ready), state, cfg, t)
        state, ready = d.state, d.desired_replicas
    assert d is not None and d.terms["level_time_constant_s"] == 300.0  # the smoothed level sizes this load
    first = decide(signals(at=7200.0, ready_replicas=ready), state, cfg, 7200.0)  # the load stops
    assert first.terms["level_replicas"] == 0.0 and first.terms["demand_replicas"] == 0.0
    state = first.state
    for k in range(1441, 1441 + 30):  # nothing running, nothing waiting, for 150 s
        t = 5.0 * k
        d = decide(signals(at=t, ready_replicas=ready), state, cfg, t)
        state, ready = d.state, d.desired_replicas
    assert d.desired_replicas == 0
