"""What one vLLM pod is doing, read from the Kubernetes Pod object.

A pod is *ready* (serving), *starting* (capacity on its way: scheduled or not, pulling, loading
weights), *stuck* (it will not become ready on its own: a crash loop, an image that cannot be pulled,
or not ready for longer than ``stuck_after_s``), *terminating* (deletionTimestamp set) or *gone*
(phase Failed/Succeeded: evicted, preempted, completed). Only ready and starting pods are capacity;
counting a stuck pod as "starting" would block every scale-up behind a pod that never arrives.

NOTE: a ready pod whose container restarts (OOM, engine crash) becomes *starting* again, aged from
the moment it lost readiness, not from its creation, so an old pod that restarts is not "stuck".
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from kubernetes.client import V1Pod

READY = "ready"
STARTING = "starting"
STUCK = "stuck"
TERMINATING = "terminating"
GONE = "gone"

# container waiting reasons after which a pod does not become ready without someone acting
FATAL_WAITING_REASONS = frozenset({
    "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
DEFAULT_METRICS_PORT = 8000  # vLLM's OpenAI server default
METRICS_PORT_NAMES = ("metrics", "http")


def _ts(value: dt.datetime | None) -> float | None:
    """API timestamps (RFC 3339, UTC) as epoch seconds."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


@dataclass(frozen=True)
class PodState:
    """The facts about one pod that scaling needs; times are epoch seconds from the API server."""

    namespace: str
    name: str
    uid: str
    created: float
    phase: str
    ready: bool
    restarts: int
    ip: str | None = None
    scheduled_at: float | None = None
    """PodScheduled turned True."""
    containers_ready_at: float | None = None
    """ContainersReady turned True (only while it is True)."""
    ready_at: float | None = None
    """Ready turned True (only while it is True)."""
    not_ready_since: float | None = None
    """Ready turned False (only while it is False): the age of a starting pod."""
    unschedulable: bool = False
    waiting_reason: str | None = None
    """The first container waiting reason, e.g. ContainerCreating or CrashLoopBackOff."""
    reason: str | None = None
    """status.reason, e.g. Evicted."""
    deleting: bool = False
    metrics_port: int = DEFAULT_METRICS_PORT
    deletion_cost: int | None = None
    resource_version: str | None = None

    def status(self, now: float, stuck_after_s: float) -> str:
        """One of READY, STARTING, STUCK, TERMINATING, GONE at time ``now``."""
        if self.deleting:
            return TERMINATING
        if self.phase in ("Failed", "Succeeded"):
            return GONE
        if self.ready:
            return READY
        if self.waiting_reason in FATAL_WAITING_REASONS:
            return STUCK
        since = self.not_ready_since if self.not_ready_since is not None else self.created
        if now - max(since, self.created) > stuck_after_s:
            return STUCK
        return STARTING

    @property
    def metrics_url(self) -> str | None:
        """``http://<podIP>:<port>/metrics`` for direct scraping, or None without an IP."""
        if not self.ip:
            return None
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.metrics_port}/metrics"


def _conditions(pod: V1Pod) -> dict[str, Any]:
    status = pod.status
    return {c.type: c for c in (status.conditions or [])} if status else {}


def _metrics_port(pod: V1Pod) -> int:
    """The container port named ``metrics`` or ``http``, else the first declared port, else 8000."""
    ports = [p for c in (pod.spec.containers if pod.spec else []) for p in (c.ports or [])]
    for wanted in METRICS_PORT_NAMES:
        for port in ports:
            if port.name == wanted and (port.protocol or "TCP") == "TCP":
                return int(port.container_port)
    return int(ports[0].container_port) if ports else DEFAULT_METRICS_PORT


def _deletion_cost(annotations: dict[str, str] | None) -> int | None:
    raw = (annotations or {}).get(DELETION_COST_ANNOTATION)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def pod_state(pod: V1Pod) -> PodState:
    """Reduce a deserialized ``V1Pod`` (from a list, a get or a watch event) to a ``PodState``."""
    meta = pod.metadata
    if meta is None:
        raise ValueError("a Pod without metadata: the API server always sends it")
    status = pod.status
    conditions = _conditions(pod)

    def when(kind: str, value: str) -> float | None:
        cond = conditions.get(kind)
        return _ts(cond.last_transition_time) if cond is not None and cond.status == value else None

    scheduled = conditions.get("PodScheduled")
    statuses = list((status.init_container_statuses or []) + (status.container_statuses or [])) if status else []
    waiting = next((s.state.waiting.reason for s in statuses
                    if s.state and s.state.waiting and s.state.waiting.reason), None)
    created = _ts(meta.creation_timestamp)
    return PodState(
        namespace=meta.namespace or "",
        name=meta.name or "",
        uid=meta.uid or meta.name or "",
        created=created if created is not None else 0.0,
        phase=(status.phase if status else None) or "Unknown",
        ready=conditions.get("Ready") is not None and conditions["Ready"].status == "True",
        restarts=sum(int(s.restart_count or 0) for s in (status.container_statuses or [])) if status else 0,
        ip=(status.pod_ip if status else None) or None,
        scheduled_at=when("PodScheduled", "True"),
        containers_ready_at=when("ContainersReady", "True"),
        ready_at=when("Ready", "True"),
        not_ready_since=when("Ready", "False"),
        unschedulable=bool(scheduled is not None and scheduled.status == "False"
                           and scheduled.reason == "Unschedulable"),
        waiting_reason=waiting,
        reason=status.reason if status else None,
        deleting=meta.deletion_timestamp is not None,
        metrics_port=_metrics_port(pod),
        deletion_cost=_deletion_cost(meta.annotations),
        resource_version=meta.resource_version,
    )


@dataclass(frozen=True)
class PodCounts:
    """How many of a Deployment's pods are in each state."""

    ready: int = 0
    starting: int = 0
    stuck: int = 0
    terminating: int = 0
    gone: int = 0
    unschedulable: int = 0


def count_pods(pods: list[PodState], now: float, stuck_after_s: float) -> PodCounts:
    """Tally pods by ``PodState.status``; ``unschedulable`` is the subset of starting pods with no node."""
    tally = {READY: 0, STARTING: 0, STUCK: 0, TERMINATING: 0, GONE: 0}
    unschedulable = 0
    for pod in pods:
        state = pod.status(now, stuck_after_s)
        tally[state] += 1
        unschedulable += state == STARTING and pod.unschedulable
    return PodCounts(ready=tally[READY], starting=tally[STARTING], stuck=tally[STUCK],
                     terminating=tally[TERMINATING], gone=tally[GONE], unschedulable=unschedulable)
