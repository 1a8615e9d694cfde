"""Pods of one vLLM Deployment on top of the engine's Fleet: lifecycle, deletion order, GPU accounting.

Lifecycle of a pod: **Pending** (node provisioning, scheduling) -> **Loading** (image pull, weights,
torch.compile, CUDA graphs) -> **Ready** (the Fleet routes to it) -> **Draining** (deleted: out of
the Service's endpoints, no new requests; in-flight requests run until they finish or the
termination grace period ends, and those still running then are aborted and counted) -> **Gone**.

GPU accounting, explicitly: a pod holds its GPU from creation (Pending) until Gone, so
``gpu_seconds`` = sum over pods of (gone or now) - created. Cold starts and drains are paid for.

Deletion order on scale-down follows the ReplicaSet controller's ranking (``ActivePodsWithRanks``):
pods not yet ready go first (Pending before Loading, newest first), then Ready pods, the most
recently ready first. Deleting a Pending or Loading pod frees its GPU at once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from simulator.coldstart import ColdStart


class Phase(enum.Enum):
    PENDING = "pending"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    GONE = "gone"


class FleetHooks(Protocol):
    """What the cluster needs from the engine's Fleet (see docs/architecture.md)."""

    def add_replica(self, now: float) -> int: ...
    def drain_replica(self, replica_id: int, now: float) -> None: ...
    def remove_replica(self, replica_id: int, now: float) -> int: ...


@dataclass
class Pod:
    """One pod's timeline (seconds of simulated time)."""

    pod_id: int
    created_at: float
    pending_s: float
    loading_s: float
    phase: Phase = Phase.PENDING
    replica_id: int | None = None
    ready_at: float | None = None
    drain_at: float | None = None
    gone_at: float | None = None
    aborted: int = 0

    @property
    def loading_at(self) -> float:
        return self.created_at + self.pending_s

    @property
    def due_ready_at(self) -> float:
        return self.created_at + self.pending_s + self.loading_s

    def gpu_seconds(self, now: float) -> float:
        end = self.gone_at if self.gone_at is not None else now
        return max(0.0, end - self.created_at)


@dataclass(frozen=True)
class Counts:
    """Pods per phase at one instant (Draining pods still hold GPUs)."""

    at: float
    pending: int
    loading: int
    ready: int
    draining: int

    @property
    def starting(self) -> int:
        return self.pending + self.loading

    @property
    def holding_gpus(self) -> int:
        return self.pending + self.loading + self.ready + self.draining


class Cluster:
    """A Deployment's pods; ``set_replicas`` is the spec, ``advance`` moves every pod's clock forward.

    ``is_idle(replica_id)`` tells whether a draining replica has no request left (then it goes at once).
    """

    def __init__(self, fleet: FleetHooks, cold_start: ColdStart, rng: np.random.Generator,
                 is_idle: Callable[[int], bool], drain_grace_s: float = 30.0) -> None:
        if not drain_grace_s >= 0:
            raise ValueError(f"Cluster.drain_grace_s={drain_grace_s!r}: must be a number of seconds >= 0")
        self.fleet, self.cold_start, self.rng = fleet, cold_start, rng
        self.is_idle, self.drain_grace_s = is_idle, float(drain_grace_s)
        self.pods: list[Pod] = []
        self.spec_replicas = 0
        self.scale_events = 0
        self.aborted = 0
        self.timeline: list[Counts] = []
        self.on_ready: Callable[[Pod], None] | None = None

    # -- the Deployment's spec ---------------------------------------------------------------------
    def live(self) -> list[Pod]:
        """Pods that count towards the spec (not Draining, not Gone)."""
        return [p for p in self.pods if p.phase in (Phase.PENDING, Phase.LOADING, Phase.READY)]

    def set_replicas(self, now: float, replicas: int) -> None:
        """The Deployment's ``spec.replicas`` changes; the ReplicaSet creates or deletes pods to match."""
        if not (isinstance(replicas, int) and replicas >= 0):
            raise ValueError(f"replicas={replicas!r}: must be an integer >= 0")
        if replicas != self.spec_replicas:
            self.scale_events += 1
            self.spec_replicas = replicas
        live = self.live()
        for _ in range(replicas - len(live)):
            self.create_pod(now)
        if len(live) > replicas:
            rank = {Phase.PENDING: 0, Phase.LOADING: 1, Phase.READY: 2}
            victims = sorted(live, key=lambda p: (rank[p.phase], -(p.ready_at or 0.0), -p.created_at))
            for pod in victims[: len(live) - replicas]:
                self.delete_pod(pod, now)
        self._record(now)

    def warm_start(self, now: float, replicas: int) -> None:
        """Begin with ``replicas`` pods already Ready (no cold start, no scale event)."""
        for _ in range(replicas):
            self.create_pod(now, cold_start_s=0.0)
        self.spec_replicas = len(self.live())
        self.advance(now)
        self._record(now)

    def create_pod(self, now: float, cold_start_s: float | None = None) -> Pod:
        """A new pod, its cold start drawn from the spec (or given: the oracle knows it)."""
        if cold_start_s is None:
            phases = self.cold_start.sample_phases(self.rng)
            pending, loading = phases.pending_s, phases.loading_s
        else:
            pending = cold_start_s * self.cold_start.pending_fraction
            loading = cold_start_s - pending
        pod = Pod(pod_id=len(self.pods), created_at=now, pending_s=pending, loading_s=loading)
        self.pods.append(pod)
        return pod

    def delete_pod(self, pod: Pod, now: float) -> None:
        """Delete a pod: a starting one is gone at once; a Ready one drains."""
        if pod.phase in (Phase.PENDING, Phase.LOADING):
            pod.phase, pod.gone_at = Phase.GONE, now
        elif pod.phase is Phase.READY:
            assert pod.replica_id is not None
            pod.phase, pod.drain_at = Phase.DRAINING, now
            self.fleet.drain_replica(pod.replica_id, now)
            self._finish_drain(pod, now)

    # -- time ------------------------------------------------------------------------------------------
    def next_event(self) -> float | None:
        """The next time a pod changes phase on its own (Loading, Ready, grace-period end)."""
        times = []
        for p in self.pods:
            if p.phase is Phase.PENDING:
                times.append(p.loading_at)
            elif p.phase is Phase.LOADING:
                times.append(p.due_ready_at)
            elif p.phase is Phase.DRAINING and p.drain_at is not None:
                times.append(p.drain_at + self.drain_grace_s)
        return min(times) if times else None

    def advance(self, now: float) -> None:
        """Apply every transition due by ``now``; draining pods leave once idle or out of grace."""
        changed = False
        for pod in self.pods:
            if pod.phase is Phase.PENDING and now >= pod.loading_at - 1e-9:
                pod.phase, changed = Phase.LOADING, True
            if pod.phase is Phase.LOADING and now >= pod.due_ready_at - 1e-9:
                pod.phase, pod.ready_at, changed = Phase.READY, now, True
                pod.replica_id = self.fleet.add_replica(now)
                if self.on_ready is not None:
                    self.on_ready(pod)
            if pod.phase is Phase.DRAINING:
                changed = self._finish_drain(pod, now) or changed
        if changed:
            self._record(now)

    def _finish_drain(self, pod: Pod, now: float) -> bool:
        assert pod.replica_id is not None and pod.drain_at is not None
        out_of_grace = now >= pod.drain_at + self.drain_grace_s - 1e-9
        if not (out_of_grace or self.is_idle(pod.replica_id)):
            return False
        pod.aborted = int(self.fleet.remove_replica(pod.replica_id, now) or 0)
        self.aborted += pod.aborted
        pod.phase, pod.gone_at = Phase.GONE, now
        return True

    # -- accounting ----------------------------------------------------------------------------------
    def counts(self, now: float) -> Counts:
        by = {phase: 0 for phase in Phase}
        for p in self.pods:
            by[p.phase] += 1
        return Counts(now, by[Phase.PENDING], by[Phase.LOADING], by[Phase.READY], by[Phase.DRAINING])

    def _record(self, now: float) -> None:
        counts = self.counts(now)
        if self.timeline and self.timeline[-1].at == now:
            self.timeline[-1] = counts
        elif not self.timeline or _tail(self.timeline[-1]) != _tail(counts):
            self.timeline.append(counts)

    def gpu_seconds(self, now: float) -> float:
        """GPU-seconds held so far: every pod from creation until gone (or ``now``)."""
        return sum(p.gpu_seconds(now) for p in self.pods)

    def ready_replica_ids(self) -> dict[int, Pod]:
        return {p.replica_id: p for p in self.pods if p.phase is Phase.READY and p.replica_id is not None}


def _tail(c: Counts) -> tuple[int, int, int, int]:
    return c.pending, c.loading, c.ready, c.draining
