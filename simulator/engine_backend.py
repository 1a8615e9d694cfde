"""The core engine behind ``simulator.autoscale.Backend``: a thin adapter, no logic of its own.

The autoscaling layer starts the engine with no replica and adds them through the fleet hooks as pods
become Ready; requests that arrive before any replica serves wait at the gateway (bounded). The
summary is the core's (``results.summarize``); the autoscaling layer overrides ``gpu_hours`` with its
own pod accounting (cold starts included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.engine import Engine, EngineConfig
from simulator.replica import ReplicaMetrics
from simulator.results import REJECTED, Outcome


class EngineBackend:
    """``Backend`` protocol over ``simulator.engine.Engine``."""

    def __init__(self, workload: Any, profile: Any, seed: int = 0, slo_ttft_s: float = 2.0,
                 slo_tpot_s: float = 0.1, router: str = "auto", gateway_limit: int = 100_000,
                 waiting_tokens_limit: float | None = None) -> None:
        if isinstance(profile, str):
            from scaler.profiles import get_profile

            profile = get_profile(profile)
        self.engine = Engine(workload, profile, EngineConfig(router=router, seed=seed, gateway_limit=gateway_limit,
                                                             waiting_tokens_limit=waiting_tokens_limit))
        self.slo_ttft_s, self.slo_tpot_s = slo_ttft_s, slo_tpot_s

    def add_replica(self, now: float) -> int:
        return self.engine.fleet.add_replica(now)

    def drain_replica(self, replica_id: int, now: float) -> None:
        self.engine.fleet.drain_replica(replica_id, now)

    def remove_replica(self, replica_id: int, now: float) -> int:
        return self.engine.fleet.remove_replica(replica_id, now)

    def metrics(self, replica_id: int) -> ReplicaMetrics:
        return self.engine.fleet.metrics(replica_id, self.engine.now)

    def in_flight(self, replica_id: int) -> int:
        return self.engine.fleet.in_flight(replica_id)

    def gateway_waiting(self) -> int:
        return self.engine.gateway_waiting

    def every(self, period_s: float, fn: Callable[[float], None]) -> None:
        self.engine.every(period_s, fn)

    def run(self) -> Any:
        result = self.engine.run()
        log = result.log
        return Outcome(arrival_s=log.arrival_s, ttft_s=log.first_token_s - log.arrival_s,
                       rejected=int((log.status == REJECTED).sum()), end_s=result.end_s,
                       summary=result.summary(self.slo_ttft_s, self.slo_tpot_s), status=log.status.copy())
