"""How the evaluator uses the optional Kubernetes observer (``leadscale serve --kubernetes``).

The observer (``scaler.sources.kube.KubeObserver``, or any object with the same methods) answers
``observe(namespace, name)`` with a view whose attributes are read here, each optional:
``ready_replicas`` and ``starting_replicas`` (override the load source's counts: the API server
knows pods that do not answer ``/metrics`` yet), ``lead_time_s`` (the measured p90 cold start, used
only with ``leadTime: auto``), ``min_replicas``/``max_replicas`` (the ScaledObject's, used when
metadata leaves them unset) and ``scrape_urls`` (ready pods' ``/metrics``, for discovery below).

- ``merge``: the view folded into a ``Signals`` snapshot, plus the bounds.
- ``before_scale_down``: when a decision wants fewer replicas than are ready, the observer may
  mark the least busy pods for deletion (its ``before_scale_down``; rate-limited there).
- ``DiscoveredScrape``: direct-scrape mode without a static URL list: a ``SignalSource`` that
  scrapes the pods the observer currently lists as ready for one ScaledObject.

Observer failures never block a decision: the caller logs them, counts them (``reason="kube"``)
and uses the load source's view unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from scaler.signals import Signals
from scaler.sources.base import SignalSource, SourceError, Target


class KubeObserver(Protocol):
    """The one method the evaluator needs; ``before_scale_down`` is optional."""

    def observe(self, namespace: str, name: str) -> Any: ...


@dataclass(frozen=True)
class Merged:
    """The snapshot the policy sees, the ScaledObject's bounds, and whether a view was there."""

    signals: Signals
    min_replicas: int | None = None
    max_replicas: int | None = None
    seen: bool = False


def _count(view: Any, attr: str) -> int | None:
    value = getattr(view, attr, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def merge(kube: KubeObserver, namespace: str, name: str, signals: Signals, lead_time_auto: bool) -> Merged:
    """Fold the observer's view into ``signals`` (raises whatever ``observe`` raises)."""
    view = kube.observe(namespace, name)
    if view is None:
        return Merged(signals)
    changes: dict[str, Any] = {attr: value for attr in ("ready_replicas", "starting_replicas")
                               if (value := _count(view, attr)) is not None}
    lead = getattr(view, "lead_time_s", None)
    if lead_time_auto and isinstance(lead, (int, float)) and 0 <= lead < float("inf"):
        changes["lead_time_s"] = float(lead)
        starts = getattr(view, "cold_starts_s", ())
        if isinstance(starts, tuple) and all(isinstance(s, float) and 0 <= s < float("inf") for s in starts):
            changes["cold_starts_s"] = starts
    return Merged(replace(signals, **changes), _count(view, "min_replicas"), _count(view, "max_replicas"), True)


def before_scale_down(kube: KubeObserver, namespace: str, name: str, model: str) -> None:
    """Call the observer's optional drain hook (raises whatever it raises)."""
    hook = getattr(kube, "before_scale_down", None)
    if hook is not None:
        hook(namespace, name, model)


class DiscoveredScrape:
    """Scrapes the ready pods the observer lists for one ScaledObject; follows them as they change.

    ``make_source(urls)`` builds the scraping source (by default a ``ScrapeSource`` that reports each
    pod's first answered scrape to the observer's ``note_scrape``, ending its cold start there). When
    the pod set changes the source keeps its history through ``set_urls`` if it has one; otherwise a
    new source is built (``ScrapeSource`` then takes a quick second scrape, so the first rate is not lost).
    """

    def __init__(self, kube: KubeObserver, namespace: str, name: str,
                 make_source: Callable[[tuple[str, ...]], SignalSource] | None = None) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.make_source = make_source or functools.partial(_scrape_source,
                                                            on_scrape=getattr(kube, "note_scrape", None))
        self.urls: tuple[str, ...] = ()
        self.source: SignalSource | None = None

    def fetch(self, targets: Sequence[Target], now: float) -> dict[Target, Signals | SourceError]:
        try:
            view = self.kube.observe(self.namespace, self.name)
        except Exception as exc:
            return self._all(targets, f"no data: Kubernetes observer failed: {type(exc).__name__}: {exc}")
        urls = tuple(getattr(view, "scrape_urls", ()) or ())
        if not urls:
            return self._all(targets, f"no data: no ready pod of {self.namespace}/{self.name} to scrape")
        if urls != self.urls or self.source is None:
            setter = getattr(self.source, "set_urls", None)
            if setter is not None:
                setter(urls)
            else:
                self.source = self.make_source(urls)
            self.urls = urls
        assert self.source is not None  # set just above when missing
        return self.source.fetch(targets, now)

    @staticmethod
    def _all(targets: Sequence[Target], message: str) -> dict[Target, Signals | SourceError]:
        return {t: SourceError(message) for t in targets}


def _scrape_source(urls: tuple[str, ...], on_scrape: Callable[[str, float], None] | None = None) -> SignalSource:
    from scaler.sources.scrape import ScrapeSource

    return ScrapeSource(list(urls), on_scrape=on_scrape)
