"""Keep one Deployment's pods current: list once, then watch from that resourceVersion.

The usual informer loop without the informer: ``sync()`` lists the pods and remembers the list's
resourceVersion; ``watch_once()`` applies ADDED/MODIFIED/DELETED events (and BOOKMARKs, which only
move the version) until the server ends the watch; an expired version (410 Gone) triggers a fresh
list. ``start()`` runs that loop on a daemon thread with capped exponential backoff on errors. Every
pod update is offered to the Deployment's ``LeadTimeTracker`` so cold starts are measured as they
finish. Readers get an immutable snapshot; a failing watch is visible as ``healthy() == False``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from scaler.kube.client import KubeApi, KubeError
from scaler.kube.leadtime import LeadTimeTracker
from scaler.kube.pods import PodState, pod_state

log = logging.getLogger(__name__)
HTTP_GONE = 410
MIN_WATCH_S = 1.0


class PodWatcher:
    """The pods matching ``selector`` in ``namespace``, kept current by list + watch."""

    def __init__(self, api: KubeApi, namespace: str, selector: str, tracker: LeadTimeTracker | None = None,
                 watch_timeout_s: int = 120, max_backoff_s: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.api, self.namespace, self.selector = api, namespace, selector
        self.tracker = tracker if tracker is not None else LeadTimeTracker()
        self.watch_timeout_s = watch_timeout_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.resource_version: str | None = None
        self.error: KubeError | None = None
        self.synced_at: float | None = None
        self._pods: dict[str, PodState] = {}
        self._lock = threading.Lock()
        self._start_lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pods(self) -> list[PodState]:
        """A snapshot of the current pods, by name."""
        with self._lock:
            return sorted(self._pods.values(), key=lambda p: p.name)

    def healthy(self) -> bool:
        """Listed at least once and the last list/watch did not fail."""
        return self.synced_at is not None and self.error is None

    def sync(self) -> None:
        """List the pods and replace the cache (raises ``KubeError``; the cache is kept on failure)."""
        try:
            listing = self.api.list_pods(self.namespace, self.selector)
        except KubeError as exc:
            self.error = exc
            raise
        states = {s.uid: s for s in (pod_state(p) for p in listing.items or [])}
        with self._lock:
            self._pods = states
        for state in states.values():
            self.tracker.observe(state)
        self.resource_version = listing.metadata.resource_version if listing.metadata else None
        self.synced_at = self.clock()
        self.error = None

    def apply(self, event: dict[str, Any]) -> None:
        """Apply one watch event (as ``kubernetes.watch`` yields it) to the cache."""
        kind = event.get("type")
        if kind == "BOOKMARK":
            meta = (event.get("raw_object") or {}).get("metadata") or {}
            self.resource_version = meta.get("resourceVersion") or self.resource_version
            return
        obj = event.get("object")
        if kind not in ("ADDED", "MODIFIED", "DELETED") or obj is None or getattr(obj, "metadata", None) is None:
            log.debug("ignoring watch event %r", kind)
            return
        state = pod_state(obj)
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(state.uid, None)
            else:
                self._pods[state.uid] = state
        if kind != "DELETED":
            self.tracker.observe(state)
        self.resource_version = state.resource_version or self.resource_version

    def watch_once(self, timeout_s: int | None = None) -> int:
        """One watch request from the current version; returns the number of events applied.

        With no version yet (or after 410 Gone) this lists first. Raises ``KubeError`` on other failures.
        """
        if self.resource_version is None:
            self.sync()
        applied = 0
        try:
            for event in self.api.watch_pods(self.namespace, self.selector, self.resource_version or "",
                                             timeout_s or self.watch_timeout_s):
                self.apply(event)
                applied += 1
                if self._stop.is_set():
                    break
        except KubeError as exc:
            if exc.status != HTTP_GONE:
                self.error = exc
                raise
            log.info("watch of %s/%s expired (410): listing again", self.namespace, self.selector)
            self.resource_version = None
            self.sync()
        self.error = None
        return applied

    def _loop(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                started = time.monotonic()
                if self.watch_once() == 0 and time.monotonic() - started < MIN_WATCH_S:
                    self._stop.wait(MIN_WATCH_S)  # a server or proxy that ends watches at once: don't spin
                backoff = 1.0
            except KubeError as exc:
                log.warning("pods of %s/%s: %s (retry in %.0f s)", self.namespace, self.selector, exc, backoff)
                self.resource_version = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2.0, self.max_backoff_s)

    def start(self) -> None:
        """Run list + watch on a daemon thread until ``stop()``."""
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name=f"pods-{self.namespace}", daemon=True)
                self._thread.start()

    def ensure_synced(self, background: bool) -> None:
        """List once if never listed (callers racing here list once), then optionally start the watch."""
        with self._start_lock:
            if self.synced_at is None:
                self.sync()
        if background:
            self.start()

    def stop(self, join_s: float = 0.0) -> None:
        """Ask the loop to end (it ends at the next event or when the current watch times out)."""
        self._stop.set()
        if self._thread is not None and join_s > 0:
            self._thread.join(join_s)
