"""The Kubernetes observer the evaluator consults: ``observe(namespace, name) -> KubeView``.

For each ScaledObject it serves, the scaler reads the ScaledObject (namespace/name arrive in every
RPC), follows ``scaleTargetRef`` to the Deployment and its selector, and keeps that Deployment's pods
current with one list + watch per Deployment (shared by every ScaledObject that targets it). From the
pods it reports ready/starting counts, the measured cold-start lead time (rolling p90, ``None`` until
``lead_min_samples`` clean starts: the evaluator then keeps the configured ``leadTime``), the
ScaledObject's min/max, and the ready pods' ``/metrics`` URLs for direct-scrape mode.

``KubeView`` (frozen) — the type the evaluator reads by attribute:

- ``ready_replicas``, ``starting_replicas``: Ready pods, and pods on their way (pending, pulling,
  loading; unschedulable ones included and also counted in ``unschedulable_replicas``). Stuck pods
  (crash loop, image pull failure, not ready for ``stuck_after_s``), terminating and evicted pods
  count as neither.
- ``lead_time_s``: the measured p90 cold start plus ``control_lag_s`` (15 s: KEDA's poll and the
  HPA sync before the ReplicaSet creates a pod, which pod timestamps cannot see), or None with fewer
  than ``lead_min_samples`` clean starts; ``cold_start_p90_s`` is the bare p90 and
  ``lead_time_samples`` the number of starts behind it.
- ``min_replicas``, ``max_replicas``: the ScaledObject's (KEDA defaults 0 and 100).
- ``scrape_urls``: ``http://<podIP>:<port>/metrics`` of ready pods, sorted.
- ``synced``: False while the watch is failing (counts come from the last good list).

Errors (no RBAC, object missing, unsupported target kind, API down) raise ``KubeError`` or
``KubeObjectError`` with a message naming the object; the evaluator logs and counts them and
carries on with the load source's view. The resolved target is cached for ``resolve_ttl_s`` (a
failed refresh keeps it); a failed first resolution is re-raised without a new request for
``retry_after_s``, so a missing object or a down API server costs one request per 30 s, not per round.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from scaler.kube.client import KubeApi, KubeError
from scaler.kube.drain import (
    PodLoad,
    ShutdownAdvice,
    deletion_costs,
    in_flight_tokens,
    parse_pod_metrics,
    patches_needed,
    shutdown_advice,
)
from scaler.kube.leadtime import LeadTimeTracker
from scaler.kube.objects import KubeObjectError, ScaleTarget, parse_scaled_object, with_deployment
from scaler.kube.pods import DELETION_COST_ANNOTATION, READY, PodState, count_pods
from scaler.kube.watcher import PodWatcher

__all__ = ["KubeError", "KubeObjectError", "KubeObserver", "KubeView"]
log = logging.getLogger(__name__)
HTTP_NOT_FOUND = 404


@dataclass(frozen=True)
class KubeView:
    """What Kubernetes says about one ScaledObject's target at ``at`` (see the module docstring)."""

    namespace: str
    scaled_object: str
    deployment: str
    min_replicas: int
    max_replicas: int
    ready_replicas: int
    starting_replicas: int
    stuck_replicas: int
    unschedulable_replicas: int
    terminating_replicas: int
    lead_time_s: float | None
    cold_start_p90_s: float | None
    lead_time_samples: int
    cold_starts_s: tuple[float, ...]
    """The measured cold starts behind ``cold_start_p90_s`` (oldest first): how long pods took."""
    scrape_urls: tuple[str, ...]
    synced: bool
    at: float


def _http_get(url: str) -> str:
    import httpx

    response = httpx.get(url, timeout=2.0)
    response.raise_for_status()
    return response.text


class KubeObserver:
    """Follows ScaledObjects to their pods; thread-safe; one watch per Deployment."""

    def __init__(self, api: KubeApi | None = None, *, stuck_after_s: float = 1800.0, lead_window: int = 20,
                 lead_min_samples: int = 3, control_lag_s: float = 15.0, resolve_ttl_s: float = 60.0,
                 retry_after_s: float = 30.0,
                 idle_s: float = 900.0, deletion_cost: bool = False, deletion_cost_interval_s: float = 10.0,
                 watch: bool = True,
                 clock: Callable[[], float] = time.time, http_get: Callable[[str], str] = _http_get) -> None:
        for field, value in (("stuck_after_s", stuck_after_s), ("resolve_ttl_s", resolve_ttl_s),
                             ("retry_after_s", retry_after_s), ("idle_s", idle_s),
                             ("deletion_cost_interval_s", deletion_cost_interval_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"KubeObserver.{field}={value!r}: must be a finite number of seconds > 0")
        self.api = api if api is not None else KubeApi.from_environment()
        self.stuck_after_s, self.resolve_ttl_s, self.idle_s = stuck_after_s, resolve_ttl_s, idle_s
        self.retry_after_s = retry_after_s
        if not (isinstance(control_lag_s, (int, float)) and math.isfinite(control_lag_s) and control_lag_s >= 0):
            raise ValueError(f"KubeObserver.control_lag_s={control_lag_s!r}: must be a finite number of seconds >= 0")
        self.lead_window, self.lead_min_samples, self.control_lag_s = lead_window, lead_min_samples, control_lag_s
        self.deletion_cost, self.deletion_cost_interval_s = deletion_cost, deletion_cost_interval_s
        self.watch, self.clock, self.http_get = watch, clock, http_get
        self._targets: dict[tuple[str, str], tuple[ScaleTarget, float]] = {}
        self._watchers: dict[tuple[str, str], PodWatcher] = {}
        self._trackers: dict[tuple[str, str], LeadTimeTracker] = {}
        self._last_used: dict[tuple[str, str], float] = {}
        self._last_costs: dict[tuple[str, str], float] = {}
        self._failures: dict[tuple[str, str], tuple[Exception, float]] = {}
        self._lock = threading.Lock()

    # --- resolving and watching ------------------------------------------------------------------
    def target(self, namespace: str, name: str) -> ScaleTarget:
        """ScaledObject → Deployment → selector, cached; a failed refresh keeps the cached target."""
        now = self.clock()
        cached = self._targets.get((namespace, name))
        if cached is not None and now - cached[1] < self.resolve_ttl_s:
            return cached[0]
        failed = self._failures.get((namespace, name))
        if cached is None and failed is not None and now - failed[1] < self.retry_after_s:
            raise failed[0]  # do not hammer a missing object or a down API server every round
        try:
            partial = parse_scaled_object(self.api.get_scaled_object(namespace, name))
            target = with_deployment(partial, self.api.get_deployment(namespace, partial.deployment))
        except (KubeError, KubeObjectError) as exc:
            self._failures[(namespace, name)] = (exc, now)
            if cached is None:
                raise
            log.warning("keeping the cached target of %s/%s after a failed refresh: %s", namespace, name, exc)
            self._targets[(namespace, name)] = (cached[0], now)  # retry after another TTL
            return cached[0]
        self._failures.pop((namespace, name), None)
        self._targets[(namespace, name)] = (target, now)
        return target

    def watcher(self, target: ScaleTarget) -> PodWatcher:
        """The Deployment's pod watcher, listed synchronously the first time (raises ``KubeError``)."""
        key = (target.namespace, target.selector)
        with self._lock:
            found = self._watchers.get(key)
            tracker = self._trackers.setdefault((target.namespace, target.deployment), LeadTimeTracker(
                window=self.lead_window, min_samples=self.lead_min_samples))
            if found is None:
                found = self._watchers[key] = PodWatcher(self.api, target.namespace, target.selector, tracker,
                                                         clock=self.clock)
            self._last_used[key] = self.clock()
        found.ensure_synced(background=self.watch)
        return found

    def observe(self, namespace: str, name: str) -> KubeView:
        """The current view of ScaledObject ``namespace/name`` (raises ``KubeError``/``KubeObjectError``)."""
        self._drop_idle()
        target = self.target(namespace, name)
        watcher = self.watcher(target)
        now = self.clock()
        pods = watcher.pods()
        counts = count_pods(pods, now, self.stuck_after_s)
        tracker = watcher.tracker
        starts = tuple(float(s.total_s) for s in tracker.samples())
        p90 = tracker.lead_time_s()
        urls = sorted(u for u in (p.metrics_url for p in self._ready(pods, now)) if u)
        return KubeView(namespace=namespace, scaled_object=name, deployment=target.deployment,
                        min_replicas=target.min_replicas, max_replicas=target.max_replicas,
                        ready_replicas=counts.ready, starting_replicas=counts.starting,
                        stuck_replicas=counts.stuck, unschedulable_replicas=counts.unschedulable,
                        terminating_replicas=counts.terminating,
                        lead_time_s=None if p90 is None else p90 + self.control_lag_s, cold_start_p90_s=p90,
                        lead_time_samples=len(starts), cold_starts_s=starts, scrape_urls=tuple(urls),
                        synced=watcher.healthy(), at=now)

    def _ready(self, pods: list[PodState], now: float) -> list[PodState]:
        return [p for p in pods if p.status(now, self.stuck_after_s) == READY]

    def _drop_idle(self) -> None:
        now = self.clock()
        with self._lock:
            idle = [k for k, t in self._last_used.items() if now - t > self.idle_s]
            for key in idle:
                self._last_used.pop(key, None)
                watcher = self._watchers.pop(key, None)
                if watcher is not None:
                    watcher.stop()

    def note_scrape(self, url: str, at: float) -> None:
        """A successful scrape of ``url`` (a pod's /metrics): ends that pod's cold start if it is its first."""
        with self._lock:
            watchers = list(self._watchers.values())
        for watcher in watchers:
            for pod in watcher.pods():
                if pod.metrics_url == url:
                    watcher.tracker.note_first_scrape(pod.uid, at)
                    return

    def close(self) -> None:
        """Stop every watch."""
        with self._lock:
            watchers, self._watchers = list(self._watchers.values()), {}
        for watcher in watchers:
            watcher.stop()

    # --- drain-aware scale-down ------------------------------------------------------------------
    def scrape_ready(self, namespace: str, name: str, model: str | None = None) -> dict[str, PodLoad]:
        """One scrape of each ready pod's /metrics (pods that fail to answer are left out)."""
        target = self.target(namespace, name)
        pods = [p for p in self._ready(self.watcher(target).pods(), self.clock()) if p.metrics_url]

        def one(pod: PodState) -> tuple[str, PodLoad | None]:
            try:
                return pod.name, parse_pod_metrics(self.http_get(pod.metrics_url or ""), model)
            except Exception as exc:  # a pod that does not answer keeps its annotation
                log.info("scrape of %s failed: %s", pod.metrics_url, exc)
                return pod.name, None

        with ThreadPoolExecutor(max_workers=max(1, min(8, len(pods)))) as pool:
            results = list(pool.map(one, pods))
        return {name_: load for name_, load in results if load is not None}

    def before_scale_down(self, namespace: str, name: str, model: str | None = None) -> dict[str, int]:
        """Set each ready pod's deletion cost to its in-flight tokens; returns the patches sent.

        A no-op (``{}``) unless deletion cost is enabled, and at most once per ``deletion_cost_interval_s``
        per ScaledObject. Call it on every evaluation that wants fewer replicas than are ready.
        """
        key = (namespace, name)
        now = self.clock()
        if not self.deletion_cost or now - self._last_costs.get(key, -1e18) < self.deletion_cost_interval_s:
            return {}
        self._last_costs[key] = now
        target = self.target(namespace, name)
        current = {p.name: p.deletion_cost for p in self.watcher(target).pods()}
        wanted = patches_needed(deletion_costs(in_flight_tokens(self.scrape_ready(namespace, name, model))), current)
        sent = {}
        for pod, cost in sorted(wanted.items()):
            try:
                self.api.set_pod_annotation(namespace, pod, DELETION_COST_ANNOTATION, str(cost))
            except KubeError as exc:
                if exc.status != HTTP_NOT_FOUND:
                    raise
                continue  # deleted since the last watch event: nothing left to rank
            sent[pod] = cost
        return sent

    def shutdown_advice(self, namespace: str, name: str, model: str | None = None) -> tuple[ShutdownAdvice, int | None]:
        """Recommended vLLM shutdown timeout and grace period, with the Deployment's current grace period."""
        target = self.target(namespace, name)
        return shutdown_advice(self.scrape_ready(namespace, name, model)), target.termination_grace_period_s
