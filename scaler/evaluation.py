"""One evaluation of one scaled object, as a pure step: shared by the live evaluator and the simulator.

``scaler.evaluator`` runs it for every object each round (threads, caches, RPCs around it);
``simulator.policies.Leadscale`` runs it on the simulated clock. Everything that decides what a
scaled object answers lives here, once:

- ``usable``: a source's answer is used only when it is a ``Signals`` no older than the staleness
  limit; otherwise ``Skipped`` (reason ``source`` or ``stale``) and the object keeps its last decision;
- ``inputs``: the snapshots a step decides on; a route member also needs the route's, and a version
  with no series of its own yet (a canary before its first pod) gets an empty one
  (``scaler.route.empty_signals``);
- ``step``: the engine limits the metadata leaves open come from the snapshot (none: ``Skipped``),
  then ``policy.decide`` (or ``route.decide_share`` for a route member); the ``PolicyConfig`` is
  rebuilt only when its bounds or capacity change;
- ``fresh``: the decision an RPC may answer with, only while the data behind it is younger than the
  limit; ``None`` means UNAVAILABLE, so KEDA's own fallback applies. Nothing here invents a 0.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scaler import policy
from scaler import route as route_mod
from scaler.capacity import ReplicaCapacity
from scaler.engine_limits import EngineLimitMissing
from scaler.metadata import ScalerConfig
from scaler.signals import Signals
from scaler.sources.base import SourceError

DEFAULT_INTERVAL_S = 5.0
"""Seconds between evaluations of each object (``leadscale serve --interval``)."""
DEFAULT_STALENESS_LIMIT_S = 60.0
"""Data older than this is not decided on, and a decision made on it is not answered (``--staleness-limit``)."""


class Skipped(Exception):
    """No new decision this round; ``reason`` labels the failure metric (``source``, ``stale``)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Held:
    """What one scaled object carries from one evaluation to the next."""

    state: policy.PolicyState | None = None
    route_state: route_mod.RouteState | None = None
    decision: policy.Decision | None = None
    data_at: float = -math.inf
    """The evaluator's clock at the data behind ``decision`` (``now - data_age_s``)."""
    policy_config: policy.PolicyConfig | None = None
    policy_key: tuple[tuple[int | None, int | None], ReplicaCapacity] | None = None
    """The (bounds, capacity) ``policy_config`` was built for."""


def usable(result: Signals | SourceError | None, staleness_limit_s: float) -> Signals:
    """``result`` when it can be decided on; else ``Skipped`` saying why."""
    if not isinstance(result, Signals):
        raise Skipped((str(result) or type(result).__name__) if result is not None else "the source returned nothing",
                      "source")
    if result.data_age_s > staleness_limit_s:
        raise Skipped(f"data is {result.data_age_s:.0f} s old (limit {staleness_limit_s:g} s)", "stale")
    return result


def inputs(own: Signals | SourceError | None, route: Signals | SourceError | None, staleness_limit_s: float,
           route_label: str = "") -> tuple[Signals, Signals | None]:
    """(own, route) snapshots to decide on. ``route`` None: not a route member. A member needs the route's
    answer (``route_label`` names it in messages); a version without series of its own gets an empty one."""
    if route is None:
        return usable(own, staleness_limit_s), None
    try:
        whole = usable(route, staleness_limit_s)
    except Skipped as exc:
        raise Skipped(f"route ({route_label}): {exc}", exc.reason) from None
    mine = own if isinstance(own, Signals) else route_mod.empty_signals(whole)
    return usable(mine, staleness_limit_s), whole


def step(config: ScalerConfig, held: Held, signals: Signals, now: float, bounds: tuple[int | None, int | None],
         where: str, route: Signals | None = None) -> Held:
    """Decide once on ``signals`` (and the ``route`` snapshot for a route member); ``Skipped`` when the
    engine limits the policy needs are neither in the metadata nor in the snapshot."""
    try:
        capacity = config.replica_capacity(signals, where)
    except EngineLimitMissing as exc:
        raise Skipped(str(exc), "source") from None
    policy_config, key = held.policy_config, (bounds, capacity)
    if policy_config is None or held.policy_key != key:
        policy_config = config.policy_config(*bounds, capacity=capacity)
    state = held.state if held.state is not None else policy.PolicyState()
    route_state = held.route_state
    if route is not None and config.traffic_weight is not None:
        # Prometheus sees no starting pods: the route's are at least this Deployment's (Kubernetes)
        route = dataclasses.replace(route, starting_replicas=max(route.starting_replicas, signals.starting_replicas),
                                    lead_time_s=signals.lead_time_s, cold_starts_s=signals.cold_starts_s)
        shared = route_mod.decide_share(signals, route, config.traffic_weight, state,
                                        route_state if route_state is not None else route_mod.RouteState(),
                                        policy_config, now)
        decision, route_state = shared.decision, shared.state
    else:
        decision = policy.decide(signals, state, policy_config, now)
    return Held(state=decision.state, route_state=route_state, decision=decision, data_at=now - signals.data_age_s,
                policy_config=policy_config, policy_key=key)


def fresh(held: Held, now: float, staleness_limit_s: float) -> policy.Decision | None:
    """The decision an RPC may answer with now; None: UNAVAILABLE (none yet, or its data is too old)."""
    if held.decision is None or not is_fresh(held.data_at, now, staleness_limit_s):
        return None
    return held.decision


def is_fresh(data_at: float, now: float, staleness_limit_s: float) -> bool:
    """Whether a decision made on data from ``data_at`` may still be answered at ``now`` (the one rule, also
    for the decision process's mirrored answers)."""
    return now - data_at <= staleness_limit_s
