"""Rollouts: each Deployment behind one route sized from its share (scaler.route, trafficWeight)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_evaluator import Clock, make

from scaler import policy
from scaler.capacity import ReplicaCapacity
from scaler.evaluator import Unavailable
from scaler.metadata import MetadataError, parse_metadata
from scaler.route import RouteDecision, RouteState, decide_share, empty_signals, share_floor
from scaler.signals import Signals
from scaler.sources.base import SourceError, Target

CAPACITY = ReplicaCapacity(8000.0, 2000.0, 256, 200000)
CONFIG = policy.PolicyConfig(capacity=CAPACITY, scale_down_delay_s=0.0, lead_time_s=120.0, max_replicas=50)
BASE = {"model": "llama", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000", "maxNumSeqs": "256",
        "kvCacheTokens": "200000", "scaleDownDelay": "0", "routeSelector": "app=llama"}


def load(replicas: float, ready: int, at: float = 0.0) -> Signals:
    """A steady load of ``replicas`` replica units (half prefill, half decode work) on ``ready`` pods."""
    return Signals(at=at, prompt_tokens_per_s=replicas * 4000.0, generation_tokens_per_s=replicas * 1000.0,
                   requests_waiting=0.0, requests_running=20.0 * ready if replicas else 0.0, ready_replicas=ready)


@pytest.mark.parametrize(("weight", "need", "others", "own", "floor"), [
    (1.0, 10, 0, 10, 10.0),   # the only version: all of it
    (0.0, 10, 10, 0, 0.0),    # a canary at 0 %: nothing
    (0.1, 10, 10, 0, 1.0),    # a canary's share; the stable covers the rest
    (0.9, 10, 0, 10, 10.0),   # stable while the canary has no Ready pod: keeps the canary's share too
    (0.5, 10, 2, 10, 8.0),    # canary Ready for 2 of its 5: the stable keeps the other 3
    (0.5, 10, 9, 10, 5.0),    # the others hold more than their share: only mine
    (0.9, 10, 0, 9, 9.0),     # keeps what it has for the canary's share, never grows for it
    (0.0, 10, 7, 0, 0.0),     # the stable is short: a 0 % canary does not start pods for it
], ids=["only", "canary-zero", "canary-share", "stable-canary-not-ready", "stable-partial", "stable-covered",
        "keeps-not-grows", "no-growth-for-others"])
def test_share_floor(weight: float, need: float, others: float, own: float, floor: float) -> None:
    assert share_floor(weight, need, others, own) == pytest.approx(floor)


@given(st.floats(0, 1), st.floats(0, 1000), st.floats(0, 1000), st.floats(0, 1000))
def test_a_version_holds_its_share_and_only_keeps_more(weight: float, need: float, others: float,
                                                       own: float) -> None:
    floor = share_floor(weight, need, others, own)
    assert floor >= weight * need - 1e-6  # its share, whatever it has
    assert floor <= max(weight * need, own) + 1e-6  # beyond its share only what it already has
    if own >= need:  # a version holding the whole route keeps what the others cannot serve yet
        assert floor + min(others, need) >= need - 1e-6
    with pytest.raises(ValueError, match="weight"):
        share_floor(1.5, need, 0.0)


def run(own: list[Signals], route: list[Signals], weight: list[float],
        state: tuple[policy.PolicyState, RouteState] | None = None) -> list[RouteDecision]:
    own_state, route_state = state or (policy.PolicyState(), RouteState())
    out = []
    for mine, whole, w in zip(own, route, weight, strict=True):
        shared = decide_share(mine, whole, w, own_state, route_state, CONFIG, whole.at)
        own_state, route_state = shared.decision.state, shared.state
        out.append(shared)
    return out


def test_a_canary_without_pods_or_traffic_starts_for_its_share() -> None:
    route = [load(8.0, 10, at=5.0 * k) for k in range(40)]
    canary = [empty_signals(r) for r in route]
    last = run(canary, route, [0.5] * 40)[-1]
    assert last.decision.active and last.decision.desired_replicas >= math.ceil(0.5 * last.route_needed)
    assert last.route_needed >= 8  # the route as one fleet: its demand plus headroom
    terms = last.decision.terms
    assert terms["traffic_weight"] == 0.5 and terms["route_others_ready"] == 10 and terms["route_held"] == 0
    plain = policy.decide(canary[-1], policy.PolicyState(), CONFIG, 0.0)
    assert plain.desired_replicas == 0 and not plain.active  # without the route the canary would never start


def test_traffic_moved_to_a_canary_that_is_not_ready_never_shrinks_the_stable() -> None:
    # 10 minutes at 100 %, then the route moves 50 % to a canary with no Ready pod: its share is invisible
    before = run([load(8.0, 10, at=5.0 * k) for k in range(120)], [load(8.0, 10, at=5.0 * k) for k in range(120)],
                 [1.0] * 120)
    need = before[-1].route_needed
    after = [load(4.0, 10, at=600.0 + 5.0 * k) for k in range(60)]
    state = (before[-1].decision.state, before[-1].state)
    held = run(after, after, [0.5] * 60, state)
    assert all(d.decision.terms["route_held"] == 1 for d in held)
    assert min(d.decision.desired_replicas for d in held) >= need  # the canary serves nothing yet
    plain, own = [], before[-1].decision.state
    for signals in after:
        plain.append(policy.decide(signals, own, CONFIG, signals.at))
        own = plain[-1].state
    assert plain[-1].desired_replicas < need  # what the hold prevents: the stable would halve
    # five canary pods Ready (the route counts 15): the stable keeps only its share
    ready = [load(8.0, 15, at=900.0 + 5.0 * k) for k in range(60)]
    mine = [load(4.0, 10, at=r.at) for r in ready]
    done = run(mine, ready, [0.5] * 60, (held[-1].decision.state, held[-1].state))[-1]
    assert done.decision.terms["route_held"] == 0
    assert done.floor == pytest.approx(share_floor(0.5, done.route_needed, 5, 10))
    assert done.decision.desired_replicas < min(d.decision.desired_replicas for d in held)


# --- metadata -----------------------------------------------------------------------------------------------

def test_traffic_weight_is_a_share_and_the_route_a_target() -> None:
    config = parse_metadata({**BASE, "trafficWeight": "10", "labelSelector": "version=canary",
                             "namespaceLabel": "namespace"})
    assert config.traffic_weight == pytest.approx(0.1)
    own, route = config.target("llm"), config.route_target("llm")
    assert dict(own.label_matchers) == {"version": "canary", "namespace": "llm"}
    assert dict(route.label_matchers) == {"app": "llama", "namespace": "llm"}
    assert parse_metadata({k: v for k, v in BASE.items() if k != "routeSelector"}).route_target("llm") is None


@pytest.mark.parametrize(("changes", "key"), [
    ({"trafficWeight": "150"}, "trafficWeight"),
    ({"trafficWeight": "-1"}, "trafficWeight"),
    ({"trafficWeight": "half"}, "trafficWeight"),
    ({"trafficWeight": "10", "routeSelector": None}, "routeSelector"),
    ({"routeSelector": "app=llama"}, "trafficWeight"),
    ({"trafficWeight": "10", "routeSelector": "app"}, "routeSelector"),
    ({"trafficWeight": "10", "labelSelector": "app=llama"}, "routeSelector"),
    ({"trafficWeight": "10", "scrapeTargets": "http://10.0.0.1:8000/metrics"}, "trafficWeight"),
], ids=["over-100", "negative", "text", "no-route", "no-weight", "bad-route", "route-is-own", "scrape"])
def test_bad_route_keys_are_named(changes: dict[str, str | None], key: str) -> None:
    meta = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
    with pytest.raises(MetadataError) as info:
        parse_metadata(meta)
    assert key in {p.key for p in info.value.problems}, str(info.value)


# --- the live evaluator -------------------------------------------------------------------------------------

@dataclass
class RouteSource:
    """The route (``app=llama``) carries 8 replicas of load on 10 stable pods; the canary has no series."""

    calls: list[tuple[Target, ...]] = field(default_factory=list)

    def fetch(self, targets: Sequence[Target], now: float) -> dict[Target, Signals | SourceError]:
        self.calls.append(tuple(targets))
        out: dict[Target, Signals | SourceError] = {}
        for t in targets:
            matchers = dict(t.label_matchers)
            if matchers.get("version") == "canary":
                out[t] = SourceError("no data: no vllm:num_requests_running series for version='canary'")
            else:
                out[t] = Signals(**{**load(8.0, 10, at=now).__dict__, "data_age_s": 1.0})
        return out


def test_the_evaluator_reads_the_route_in_the_same_fetch_and_starts_the_canary() -> None:
    source = RouteSource()
    ev = make(source, clock=Clock())  # type: ignore[arg-type]
    canary = {**BASE, "trafficWeight": "50", "labelSelector": "version=canary"}
    answer = ev.lookup("llm", "vllm-canary", canary)
    assert answer.active and answer.desired_replicas >= 4  # half of the route's 8+ replicas
    assert len(source.calls) == 1 and len(source.calls[0]) == 2  # own and route targets in one fetch
    (entry,) = ev.snapshot()
    assert entry["terms"]["traffic_weight"] == 0.5 and entry["terms"]["route_others_ready"] == 10


def test_a_route_that_does_not_answer_is_unavailable_not_a_guess() -> None:
    class Broken(RouteSource):
        def fetch(self, targets, now):  # type: ignore[no-untyped-def]
            out = super().fetch(targets, now)
            return {t: (SourceError("no data: route") if dict(t.label_matchers).get("app") else s)
                    for t, s in out.items()}

    ev = make(Broken(), clock=Clock())  # type: ignore[arg-type]
    with pytest.raises(Unavailable, match="route"):
        ev.lookup("llm", "vllm-stable", {**BASE, "trafficWeight": "90", "labelSelector": "version=stable"})


def test_trafficweight_needs_a_prometheus_source() -> None:
    ev = make(RouteSource(), clock=Clock())  # type: ignore[arg-type]
    ev.prometheus_url = None
    ev.scrape_targets = ("http://10.0.0.1:8000/metrics",)
    with pytest.raises(MetadataError, match="trafficWeight"):
        ev.lookup("llm", "vllm-canary", {**BASE, "trafficWeight": "50", "labelSelector": "version=canary"})


def test_a_canary_without_pods_reads_the_engine_limits_from_the_route() -> None:
    class WithKv(RouteSource):
        def fetch(self, targets, now):  # type: ignore[no-untyped-def]
            out = super().fetch(targets, now)
            return {t: (Signals(**{**s.__dict__, "kv_cache_tokens": 131072.0}) if isinstance(s, Signals) else s)
                    for t, s in out.items()}

    ev = make(WithKv(), clock=Clock())  # type: ignore[arg-type]
    canary = {k: v for k, v in BASE.items() if k not in ("maxNumSeqs", "kvCacheTokens")}
    answer = ev.lookup("llm", "vllm-canary", {**canary, "trafficWeight": "50", "labelSelector": "version=canary"})
    assert answer.active and answer.desired_replicas >= 4  # not UNAVAILABLE for want of its own cache_config
