"""Several Deployments of one model behind one route (a rollout): each sized from its share.

A rollout runs a stable and a canary Deployment of the same model behind one route whose weights
split the traffic. KEDA gives each Deployment its own ScaledObject; each trigger selects its own pods
(``labelSelector: version=canary``), names its share of the route (``trafficWeight``, percent) and
the route's pods (``routeSelector``, every version), so it sees both its own demand and the route's.

One mechanism, built from ``scaler.policy.decide`` twice (never a fork of it):

1. The route as one fleet: ``decide(route signals, route state)`` recommends ``N``, the replicas the
   whole route needs now (its lead-time peak and backlog, the route's starting pods counted on their
   way). Its *recommendation*, not its stabilized answer: that one holds the route's current fleet,
   which this floor itself grows (the scale-down window is each version's own decision's job). vLLM's series show
   only what is *served*: requests routed to a version with no Ready pod wait at the gateway (or
   fail) and appear nowhere. So while the other versions hold weight but have no Ready pod, ``N`` is
   held at its level from before they went dark (``RouteState.held``): the route's demand did not
   fall because part of it became invisible. (A gateway that fails over to this version shows the
   whole demand here anyway; the hold then changes nothing.)
2. This Deployment's floor: its share of that, plus whatever the *other* versions cannot serve yet
   out of the replicas it already has: ``F = max(w·N, min(own, w·N + max(0, (1 − w)·N −
   others_ready)))`` with ``own`` its ready and starting replicas. The others' shortfall counts only
   their *Ready* replicas: while the canary's pods start, the stable fleet keeps what carries the
   canary's share, so traffic that moved to a canary that is not Ready never shrinks the stable
   fleet, and a rollback lands on a fleet that is still there. It only *keeps* replicas: a version
   never grows for another's traffic (that one's own decision grows it; growing both would start
   every missing pod twice). A canary with no pods and no traffic yet gets ``w·N`` and starts
   before traffic reaches it.
3. ``decide(own signals, own state)`` with ``min_replicas = ceil(F)``: its own demand (a backlog on
   its pods, its own starting pods, the efficiency it learns) still wins when larger. The answer is
   active when ``F > 0``, so KEDA does not hold a canary at zero that its share needs.

The decision's terms gain ``traffic_weight``, ``route_desired_replicas`` (``N``),
``route_others_ready``, ``route_held`` (1 while ``N`` is held) and ``route_floor_replicas`` (``F``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from scaler import policy
from scaler.signals import Signals

ROUTE_MAX_REPLICAS = 100_000


@dataclass(frozen=True)
class RouteState:
    """What a route member remembers besides its own ``PolicyState``."""

    route: policy.PolicyState = field(default_factory=policy.PolicyState)
    """The whole route's policy state (``decide`` on the route's signals)."""
    held: float = 0.0
    """The route's need when the other versions last had Ready pods (or no weight)."""


@dataclass(frozen=True)
class RouteDecision:
    """This Deployment's decision (its floor applied), the whole route's, and the state to pass on."""

    decision: policy.Decision
    route: policy.Decision
    floor: float
    route_needed: float
    state: RouteState


def empty_signals(route: Signals, ready_replicas: int = 0, starting_replicas: int = 0) -> Signals:
    """A Deployment with no series of its own yet (a canary before its first pod): no load, its pods, and
    the route's engine limits (the same model: its KV cache stands in until the canary reports its own)."""
    return Signals(at=route.at, prompt_tokens_per_s=0.0, generation_tokens_per_s=0.0, requests_waiting=0.0,
                   requests_running=0.0, ready_replicas=ready_replicas, starting_replicas=starting_replicas,
                   kv_cache_tokens=route.kv_cache_tokens, lead_time_s=route.lead_time_s,
                   cold_starts_s=route.cold_starts_s, data_age_s=route.data_age_s)


def share_floor(weight: float, route_needed: float, others_ready: float, own_replicas: float = math.inf) -> float:
    """Replicas this Deployment must hold: its share of the route's need, plus the others' shortfall of
    Ready replicas out of the ``own_replicas`` (ready + starting) it already has."""
    if not (math.isfinite(weight) and 0.0 <= weight <= 1.0):
        raise ValueError(f"weight={weight!r}: must be a share in [0, 1]")
    need, others = max(0.0, route_needed), max(0.0, others_ready)
    share = weight * need
    return max(share, min(max(0.0, own_replicas), share + max(0.0, (1.0 - weight) * need - others)))


def decide_share(own: Signals, route: Signals, weight: float, own_state: policy.PolicyState,
                 route_state: RouteState, config: policy.PolicyConfig, now: float) -> RouteDecision:
    """This Deployment's decision as one version of a route (see the module docstring)."""
    route_config = replace(config, min_replicas=0, max_replicas=max(config.max_replicas, ROUTE_MAX_REPLICAS))
    whole = policy.decide(route, route_state.route, route_config, now)
    others_ready = max(0, route.ready_replicas - own.ready_replicas)
    dark = weight < 1.0 and others_ready == 0  # the others' share is routed to no Ready pod: invisible
    recommended = float(whole.terms["recommended_replicas"])
    needed = max(recommended, route_state.held) if dark else recommended
    floor = share_floor(weight, needed, float(others_ready), float(own.ready_replicas + own.starting_replicas))
    minimum = min(max(config.min_replicas, math.ceil(floor - 1e-9)), config.max_replicas)
    mine = policy.decide(own, own_state, replace(config, min_replicas=minimum), now)
    terms = {**mine.terms, "traffic_weight": weight, "route_desired_replicas": needed,
             "route_others_ready": float(others_ready), "route_held": 1.0 if dark else 0.0,
             "route_floor_replicas": floor}
    active = mine.active or minimum > 0
    reason = mine.reason + (f"; route share {weight:.0%} of {needed:g} (+ the others' shortfall) holds at least "
                            f"{minimum}" if minimum > config.min_replicas else "")
    decision = replace(mine, active=active, terms=MappingProxyType(terms), reason=reason)
    return RouteDecision(decision, whole, floor, needed, RouteState(whole.state, needed))
