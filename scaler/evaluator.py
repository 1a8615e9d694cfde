"""Keeps a fresh decision for every scaled object so RPCs answer from memory in milliseconds.

KEDA calls ``GetMetrics``/``IsActive`` with a 3 s timeout on every poll and HPA sync; Prometheus
queries take longer than that budget allows when many objects ask at once. So one background thread
evaluates every known object each ``interval_s``: objects are grouped by signal source and each
source is asked *once* per round for all of its targets (one PromQL per signal serves them all),
then ``policy.decide`` runs per object and the decision is cached. An object is identified by
namespace/name plus its metadata (a changed trigger is a new object; the old one idles out).

- First call for an unknown object: evaluated once synchronously (new objects arriving together
  share one fetch), bounded by ``first_call_timeout_s`` (2 s); past that the caller gets
  ``Unavailable`` and the loop carries on.
- Failure semantics: a failed fetch (or data older than ``staleness_limit_s``) keeps the last good
  decision only while the data behind it is younger than the limit; after that ``Unavailable`` so
  KEDA's own fallback applies. Nothing here ever invents a 0.
- Warm-up (``warm_up_s``, an hour by default): a new object whose source keeps history (Prometheus)
  has the last hour replayed through the same step in the background (``scaler.warmup``); the next
  round decides from the state that replay ended in, so a restarted scaler sizes as one that never
  stopped instead of from the policy's first-minute defaults. Until then it decides as a new one.
- Idle objects (not asked about for ``idle_timeout_s``; an open StreamIsActive counts as asking) are
  dropped with their metrics.
- The optional Kubernetes observer (``kube``) refines each snapshot, bounds, drains and discovers
  pods to scrape: see ``scaler.evaluator_kube``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from scaler import evaluation, evaluator_kube, warmup
from scaler.evaluator_kube import KubeObserver
from scaler.metadata import MetadataError, Problem, ScalerConfig, parse_metadata
from scaler.signals import Signals
from scaler.sources.base import SignalSource, SourceError, Target
from scaler.telemetry import Telemetry

LOG = logging.getLogger("leadscale.evaluator")
SourceKey = tuple[str, str | tuple[str, ...]]
"""("prometheus", url), ("scrape", urls) or ("kube", (namespace, name)): equal keys share a source and its fetch."""
ObjectKey = tuple[str, str, frozenset[tuple[str, str]]]
FIRST_CALL_GATHER_S = 0.02
"""New objects arriving within this many seconds share their first fetch (KEDA polls all objects at once)."""


class Unavailable(Exception):
    """No trustworthy decision for this object now; the service answers UNAVAILABLE."""


def _describe(key: SourceKey) -> str:
    """Where a source's numbers come from, for messages."""
    kind, where = key
    if kind == "prometheus":
        return f"Prometheus {where}"
    if kind == "scrape":
        return "the pods' /metrics (" + ", ".join(where) + ")"
    return "the pods the Kubernetes observer found (" + "/".join(where) + ")"


def source_key(config: ScalerConfig, prometheus_url: str | None, scrape_targets: tuple[str, ...], kube: bool,
               namespace: str = "", name: str = "") -> SourceKey:
    """Where an object's signals come from: its metadata first, then the server's defaults, then pods
    discovered through Kubernetes. Raises ``MetadataError`` when none can serve it."""
    key = _find_source(config, prometheus_url, scrape_targets, kube, namespace, name)
    if config.traffic_weight is not None and key[0] != "prometheus":
        raise MetadataError([Problem("trafficWeight", f"{config.traffic_weight * 100:g}",
                                     "only with a Prometheus source (prometheusAddress or --prometheus-url): "
                                     f"the route is read through routeSelector's label matchers; this object "
                                     f"would read {_describe(key)}")])
    return key


def _find_source(config: ScalerConfig, prometheus_url: str | None, scrape_targets: tuple[str, ...], kube: bool,
                 namespace: str, name: str) -> SourceKey:
    if config.scrape_targets:
        return ("scrape", config.scrape_targets)
    if config.prometheus_address:
        return ("prometheus", prometheus_url or config.prometheus_address)
    if scrape_targets:
        return ("scrape", scrape_targets)
    if prometheus_url:
        return ("prometheus", prometheus_url)
    if kube:
        return ("kube", (namespace, name))
    raise MetadataError([Problem("prometheusAddress", None, "a Prometheus URL or scrapeTargets (this scaler runs "
                                                            "without --prometheus-url, --scrape-targets and "
                                                            "--kubernetes)")])


class Decisions(Protocol):
    """What the gRPC service asks of whatever holds the decisions: an ``Evaluator`` in this process or a
    ``scaler.decision_process.DecisionProcess`` in front of one in another."""

    changed: threading.Condition
    generation: int
    failed: threading.Event

    def config(self, metadata: Mapping[str, str]) -> ScalerConfig: ...

    def lookup(self, namespace: str, name: str, metadata: Mapping[str, str]) -> Answer: ...

    def snapshot(self) -> list[dict[str, Any]]: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class TooManyObjects(Exception):
    """``max_objects`` are already evaluated; the service answers RESOURCE_EXHAUSTED (KEDA's fallback applies)."""


def still_first_evaluating(namespace: str, name: str, timeout_s: float) -> Unavailable:
    """The refusal for an object whose first evaluation outlasted the first call's wait (both processes)."""
    return Unavailable(f"{namespace}/{name}: first evaluation still running after {timeout_s:g} s; retry shortly")


def stale_answer(namespace: str, name: str, staleness_limit_s: float, why: str) -> Unavailable:
    """The refusal for an object whose latest data is older than the staleness limit (both processes)."""
    return Unavailable(f"{namespace}/{name}: no fresh signal within the staleness limit "
                       f"({staleness_limit_s:g} s): {why}")


def too_many_objects(namespace: str, name: str, count: int, max_objects: int, idle_timeout_s: float) -> TooManyObjects:
    """The refusal for a new object past ``--max-objects`` (both processes)."""
    return TooManyObjects(f"{namespace}/{name}: this scaler already evaluates {count} scaled objects "
                          f"(--max-objects {max_objects}); objects not asked about for {idle_timeout_s:g} s "
                          "are dropped")


def default_source_factory(key: SourceKey, prometheus_auth: Any = None) -> SignalSource:
    """Build the real source for a key (imported here: they pull in HTTP clients); ``prometheus_auth`` is
    a ``PrometheusAuth`` for the server's ``--prometheus-url``."""
    kind, where = key
    if kind == "prometheus":
        from scaler.sources.prometheus import PrometheusSource

        return PrometheusSource(str(where), auth=prometheus_auth)
    from scaler.sources.scrape import ScrapeSource

    return ScrapeSource(list(where))


@dataclass
class _Entry:
    namespace: str
    name: str
    config: ScalerConfig
    target: Target
    source_key: SourceKey
    last_asked: float
    route_target: Target | None = None
    """The whole route's series when the trigger names a ``trafficWeight`` (``scaler.route``)."""
    held: evaluation.Held = field(default_factory=evaluation.Held)
    """Its decision, policy state and cached config (``scaler.evaluation``)."""
    error: str | None = None
    evaluated: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    tag: Any = None
    """The owner's handle for it (``scaler.decision_process`` keeps its object id here)."""
    warm: warmup.Replayed | None = None
    """A replay of its history waiting to be taken up by the next round (``scaler.warmup``)."""
    warmed_from: int = 0
    """Snapshots of history the state it decides from was replayed over (0: none, it started from nothing)."""


def _route_label(entry: _Entry) -> str:
    """How messages name the route a route member's decision needs ("" for any other object)."""
    return str(dict(entry.route_target.label_matchers)) if entry.route_target is not None else ""


@dataclass(frozen=True)
class Answer:
    """What an RPC needs: the cached decision and the config it was made under."""

    config: ScalerConfig
    desired_replicas: int
    active: bool
    data_age_s: float


class Evaluator:
    """Background evaluation of every scaled object; ``lookup`` answers from the cache."""

    def __init__(self, prometheus_url: str | None = None, scrape_targets: tuple[str, ...] = (),
                 interval_s: float = evaluation.DEFAULT_INTERVAL_S,
                 staleness_limit_s: float = evaluation.DEFAULT_STALENESS_LIMIT_S, idle_timeout_s: float = 600.0,
                 first_call_timeout_s: float = 2.0,
                 source_factory: Callable[[SourceKey], SignalSource] = default_source_factory,
                 kube: KubeObserver | None = None, telemetry: Telemetry | None = None,
                 clock: Callable[[], float] = time.time, max_objects: int = 10_000,
                 on_evaluated: Callable[[list[_Entry]], None] | None = None,
                 on_dropped: Callable[[list[_Entry]], None] | None = None,
                 warm_up_s: float = warmup.DEFAULT_SPAN_S, serves_rpcs: bool = True) -> None:
        for label, value in (("interval_s", interval_s), ("staleness_limit_s", staleness_limit_s),
                             ("idle_timeout_s", idle_timeout_s), ("first_call_timeout_s", first_call_timeout_s)):
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"Evaluator {label}={value!r}: must be a finite number of seconds > 0")
        if not (isinstance(warm_up_s, (int, float)) and 0 <= warm_up_s < float("inf")):
            raise ValueError(f"Evaluator warm_up_s={warm_up_s!r}: must be a finite number of seconds >= 0 "
                             "(0: no warm-up)")
        self.warm_up_s = float(warm_up_s)
        self.serves_rpcs = serves_rpcs
        """Whether RPCs run in this interpreter: then an evaluation yields the GIL after each object (and a
        warm-up after each replay), or every RPC arriving meanwhile waits a switch interval. The decision
        process has no RPCs to let in (its short switch interval bounds how long its pipe waits), and there
        each yield (a system call and a trip through the scheduler) cost about 75 us of CPU an object, over a
        fifth of a round at an hour of history (docs/scaler.md)."""
        if not (isinstance(max_objects, int) and max_objects >= 1):
            raise ValueError(f"Evaluator max_objects={max_objects!r}: must be an integer >= 1")
        self.max_objects = max_objects
        """Every object costs memory and a share of each round until it idles out: a client inventing names
        (or a trigger's metadata changing in a loop) must not grow them without bound."""
        self.prometheus_url = prometheus_url.rstrip("/") if prometheus_url else None
        self.scrape_targets = tuple(scrape_targets)
        self.interval_s, self.staleness_limit_s = interval_s, staleness_limit_s
        self.idle_timeout_s, self.first_call_timeout_s = idle_timeout_s, first_call_timeout_s
        self.source_factory, self.kube, self.clock = source_factory, kube, clock
        self.on_evaluated, self.on_dropped = on_evaluated, on_dropped
        """Told after each group of objects is evaluated and when idle objects are dropped: how the decision
        process (``scaler.decision_process``) sends its answers on to the serving process."""
        self.telemetry = telemetry or Telemetry()
        self.telemetry.watch(self.snapshot)
        self.changed = threading.Condition()
        """Notified after every evaluation that changed an object's decision (StreamIsActive waits on it)."""
        self.generation = 0
        """Counts those changes (read it before looking, then wait until it moves: no lost wake-ups)."""
        self.failed = threading.Event()
        """Never set here (the loop survives any round); ``DecisionProcess`` sets its own when its child exits."""
        self._entries: dict[ObjectKey, _Entry] = {}
        self._sources: dict[SourceKey, SignalSource] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="leadscale-fetch")
        self._warm_ups = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leadscale-warmup")
        """Warm-ups run one at a time, beside the rounds: a restart's (a minute or two of CPU for a thousand
        objects) must never take the workers the rounds fetch with, or the answers would go stale meanwhile."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: list[_Entry] = []
        self._batch_scheduled = False

    # --- the RPC side: memory only, except the first call for an unknown object -----------------
    def config(self, metadata: Mapping[str, str]) -> ScalerConfig:
        """Parsed metadata (cached); raises ``MetadataError`` also when no source can serve it."""
        config = parse_metadata(metadata)
        self._source_key(config)
        return config

    def lookup(self, namespace: str, name: str, metadata: Mapping[str, str]) -> Answer:
        """The latest decision for one object; raises ``MetadataError`` or ``Unavailable``."""
        entry = self._entry(namespace, name, metadata)
        if not entry.evaluated.wait(self.first_call_timeout_s):
            raise still_first_evaluating(namespace, name, self.first_call_timeout_s)
        with entry.lock:
            held, error = entry.held, entry.error
        now = self.clock()
        decision, age = evaluation.fresh(held, now, self.staleness_limit_s), now - held.data_at
        if decision is None:
            raise stale_answer(namespace, name, self.staleness_limit_s, error or f"data is {age:.0f} s old")
        return Answer(entry.config, int(decision.desired_replicas), bool(decision.active), max(age, 0.0))

    def register(self, namespace: str, name: str, metadata: Mapping[str, str], tag: Any) -> _Entry:
        """The object's entry, created (its first evaluation scheduled) when unknown, with ``tag`` set before
        anything can evaluate it; counts as asking about it. Raises ``MetadataError`` or ``TooManyObjects``."""
        return self._entry(namespace, name, metadata, tag)

    def _entry(self, namespace: str, name: str, metadata: Mapping[str, str], tag: Any = None) -> _Entry:
        key = (namespace, name, frozenset(metadata.items()))
        now = self.clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.last_asked = now
                entry.tag = tag if tag is not None else entry.tag
                return entry
        config = self.config(metadata)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.last_asked = now
                entry.tag = tag if tag is not None else entry.tag
                return entry
            if len(self._entries) >= self.max_objects:
                raise too_many_objects(namespace, name, len(self._entries), self.max_objects, self.idle_timeout_s)
            entry = _Entry(namespace, name, config, config.target(namespace), self._source_key(config, namespace, name),
                           now, config.route_target(namespace), tag=tag)
            self._entries[key] = entry
            self.telemetry.objects.set(len(self._entries))
            self._pending.append(entry)
            schedule, self._batch_scheduled = not self._batch_scheduled, True
        if schedule:
            self._pool.submit(self._first_batch)
        return entry

    def _first_batch(self) -> None:
        """First evaluations of new objects, gathered for a moment so a restart's burst shares fetches."""
        time.sleep(FIRST_CALL_GATHER_S)
        with self._lock:
            batch, self._pending, self._batch_scheduled = self._pending, [], False
        try:
            groups: dict[SourceKey, list[_Entry]] = defaultdict(list)
            for entry in batch:
                groups[entry.source_key].append(entry)
            for key, members in groups.items():  # in this thread: no pool job waits on another
                self._evaluate_group(key, members)
        finally:  # never leave a caller waiting on an entry the loop would skip
            for entry in batch:
                entry.evaluated.set()
        if self.warm_up_s > 0:
            for key, members in groups.items():
                self._warm_ups.submit(self._warm_up, key, members)

    def _warm_up(self, key: SourceKey, members: list[_Entry]) -> None:
        """Replay the new objects' history (``scaler.warmup``) and leave each result for its next round."""
        try:
            self._replay_history(key, members)
        except Exception:  # on an executor nobody reads the result of: say it here, and the objects stay new
            LOG.exception("warm-up from %s failed; %d objects start from nothing", _describe(key), len(members))

    def _replay_history(self, key: SourceKey, members: list[_Entry]) -> None:
        history = getattr(self._source(key), "history", None)
        if not callable(history):  # scraping pods directly: nothing was kept
            return
        for first in range(0, len(members), warmup.TARGETS_PER_READ):
            if self._stop.is_set():
                return
            chunk = members[first:first + warmup.TARGETS_PER_READ]
            start, end = warmup.window(self.clock(), self.warm_up_s)
            targets = [e.target for e in chunk] + [e.route_target for e in chunk if e.route_target is not None]
            try:
                answers = history(targets, start, end, warmup.SPACING_S)
            except Exception as exc:  # a source must not raise; if it does, these objects start from nothing
                LOG.warning("warm-up: reading %s's history failed (%s: %s); %d objects start from nothing",
                            _describe(key), type(exc).__name__, exc, len(chunk))
                continue
            for entry in chunk:
                try:
                    replayed = warmup.replay(self._replay_settings(entry, answers),
                                             warmup.snapshots_of(answers, entry.target, entry.route_target))
                except Exception:
                    LOG.exception("warm-up of %s/%s failed; it starts from nothing", entry.namespace, entry.name)
                    continue
                if replayed.used:
                    with entry.lock:
                        entry.warm = replayed
                if self.serves_rpcs:
                    time.sleep(0)  # a replay is pure Python: let RPCs and the rounds in

    def _replay_settings(self, entry: _Entry, answers: list[tuple[float, dict[Target, Signals | SourceError]]],
                         ) -> warmup.Replay:
        """How ``entry``'s history is replayed: with the cold starts, lead time and bounds known now."""
        how = warmup.Replay(entry.config, _describe(entry.source_key), self.staleness_limit_s,
                            route_label=_route_label(entry))
        seen = next((a[entry.target] for _, a in reversed(answers) if isinstance(a.get(entry.target), Signals)), None)
        if self.kube is None or not isinstance(seen, Signals):
            return how
        try:
            merged = evaluator_kube.merge(self.kube, entry.namespace, entry.name, seen, entry.config.lead_time_auto)
        except Exception as exc:  # replayed as without --kubernetes: the configured lead time, no bounds
            self._kube_failed(entry, "observe", exc)
            return how
        return dataclasses.replace(how, bounds=(merged.min_replicas, merged.max_replicas), current=merged.signals)

    def _source_key(self, config: ScalerConfig, namespace: str = "", name: str = "") -> SourceKey:
        return source_key(config, self.prometheus_url, self.scrape_targets, self.kube is not None, namespace, name)

    def _source(self, key: SourceKey) -> SignalSource:
        with self._lock:
            source = self._sources.get(key)
            if source is None:
                kind, where = key
                source = (evaluator_kube.DiscoveredScrape(self.kube, *where) if kind == "kube" and self.kube
                          else self.source_factory(key))
                self._sources[key] = source
            return source

    # --- the loop side --------------------------------------------------------------------------
    def start(self) -> None:
        """Run ``run_once`` every ``interval_s`` on a daemon thread until ``stop``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="leadscale-evaluator", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._warm_ups.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # never let one bad round kill the loop
                LOG.exception("evaluation round failed")
            next_at = max(next_at + self.interval_s, time.monotonic())
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def run_once(self) -> None:
        """One round: drop idle objects, then evaluate all the others (one fetch per source)."""
        started = time.perf_counter()
        now = self.clock()
        with self._lock:
            idle = [k for k, e in self._entries.items() if now - e.last_asked > self.idle_timeout_s]
            dropped = [self._entries.pop(k) for k in idle]
            entries = [e for e in self._entries.values() if e.evaluated.is_set()]
            used = {e.source_key for e in self._entries.values()}
            for key in [k for k in self._sources if k not in used]:  # a gone object's scrape history, say
                del self._sources[key]
            self.telemetry.objects.set(len(self._entries))
            alive = {(e.namespace, e.name) for e in self._entries.values()}
        for entry in dropped:
            LOG.info("dropping idle scaled object %s/%s", entry.namespace, entry.name)
            if (entry.namespace, entry.name) not in alive:  # its error series go too: names churn, labels must not
                self.telemetry.forget_object(entry.namespace, entry.name)
        if dropped and self.on_dropped is not None:
            self.on_dropped(dropped)
        self._evaluate_round(entries)
        self.telemetry.evaluation_seconds.observe(time.perf_counter() - started)

    def _evaluate_round(self, entries: list[_Entry]) -> None:
        groups: dict[SourceKey, list[_Entry]] = defaultdict(list)
        for entry in entries:
            groups[entry.source_key].append(entry)
        jobs = [self._pool.submit(self._evaluate_group, key, members) for key, members in groups.items()]
        for job in jobs:
            job.result()

    def _evaluate_group(self, key: SourceKey, members: list[_Entry]) -> None:
        now = self.clock()
        targets = [e.target for e in members] + [e.route_target for e in members if e.route_target is not None]
        try:
            source = self._source(key)
            results: dict[Target, Signals | SourceError] = source.fetch(targets, now)
        except Exception as exc:  # a source must not raise, but a broken one must not stop the others
            LOG.warning("source %s failed: %s: %s", key, type(exc).__name__, exc)
            results = {t: SourceError(f"source {key[0]} failed: {type(exc).__name__}: {exc}") for t in targets}
        try:
            for entry in members:
                try:
                    nothing = SourceError("the source returned nothing")
                    route = results.get(entry.route_target, nothing) if entry.route_target is not None else None
                    self._apply(entry, results.get(entry.target, nothing), route, now)
                except Exception as exc:
                    LOG.exception("evaluating %s/%s failed", entry.namespace, entry.name)
                    self._fail(entry, f"evaluation failed: {type(exc).__name__}: {exc}", "internal")
                finally:
                    entry.evaluated.set()
                # a round is pure Python (~0.25 ms per object with an hour of history, benchmarks/bench_decide.py):
                # without a yield it holds the GIL for a switch interval at a time, and every RPC arriving
                # meanwhile waits (p99 15 ms over 1000 objects)
                if self.serves_rpcs:
                    time.sleep(0)
        finally:
            if self.on_evaluated is not None:
                self.on_evaluated(members)

    def _apply(self, entry: _Entry, result: Signals | SourceError, route: Signals | SourceError | None,
               now: float) -> None:
        """``route``: the route's answer for a route member, None for any other object."""
        """One ``scaler.evaluation`` step for ``entry``, with the Kubernetes view merged in when there is one."""
        try:
            result, whole = evaluation.inputs(result, route, self.staleness_limit_s, _route_label(entry))
        except evaluation.Skipped as exc:
            self._fail(entry, str(exc), exc.reason)
            return
        merged = evaluator_kube.Merged(result)
        if self.kube is not None:
            try:
                merged = evaluator_kube.merge(self.kube, entry.namespace, entry.name, result,
                                              entry.config.lead_time_auto)
            except Exception as exc:
                self._kube_failed(entry, "observe", exc)
        signals = merged.signals
        # only one evaluation of an entry runs at a time (rounds skip entries whose first one is running)
        with entry.lock:
            previous, warm = entry.held, entry.warm
        # a replay of its history, once it is ready, replaces what the object learned alone since it was new
        warm = warm if warm is not None and warm.last_at < now else None
        try:
            held = evaluation.step(entry.config, warm.held if warm is not None else previous, signals, now,
                                   (merged.min_replicas, merged.max_replicas), _describe(entry.source_key), whole)
        except evaluation.Skipped as exc:
            self._fail(entry, str(exc), exc.reason)
            return
        decision = held.decision
        assert decision is not None
        with entry.lock:
            entry.held, entry.error = held, None
            if warm is not None:
                entry.warm, entry.warmed_from = None, warm.used
        if warm is not None:
            LOG.info("%s/%s: warmed up from %d of %d snapshots of %s's history (the last %.0f s); efficiency %.3g",
                     entry.namespace, entry.name, warm.used, warm.offered, _describe(entry.source_key),
                     self.warm_up_s, held.state.capacity.efficiency if held.state is not None else 1.0)
        changed = previous.decision is None or (previous.decision.desired_replicas, previous.decision.active) != (
            decision.desired_replicas, decision.active)
        if self.kube is not None and merged.seen and decision.desired_replicas < signals.ready_replicas:
            try:
                evaluator_kube.before_scale_down(self.kube, entry.namespace, entry.name, entry.config.model)
            except Exception as exc:
                self._kube_failed(entry, "before_scale_down", exc)
        if changed:
            self.telemetry.log_decision(entry.namespace, entry.name, decision.desired_replicas, decision.active,
                                        decision.terms, signals.data_age_s, decision.reason)
            with self.changed:
                self.generation += 1
                self.changed.notify_all()

    def _kube_failed(self, entry: _Entry, what: str, exc: Exception) -> None:
        LOG.warning("kube %s failed for %s/%s: %s: %s", what, entry.namespace, entry.name, type(exc).__name__, exc)
        self.telemetry.record_failure(entry.namespace, entry.name, "kube")

    def _fail(self, entry: _Entry, message: str, reason: str) -> None:
        with entry.lock:
            entry.error = message
        self.telemetry.record_failure(entry.namespace, entry.name, reason)
        LOG.warning("%s/%s: %s", entry.namespace, entry.name, message)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every object's latest decision and its terms, for ``/decisions``; most recently asked first among
        objects sharing namespace, name and metric (a trigger whose metadata just changed)."""
        now = self.clock()
        with self._lock:
            entries = list(self._entries.values())
        out = []
        for e in entries:
            with e.lock:
                d, data_at = e.held.decision, e.held.data_at
                out.append({
                    "namespace": e.namespace, "name": e.name, "model": e.config.model,
                    "metric_name": e.config.metric_name, "error": e.error,
                    "data_age_s": None if d is None else round(now - data_at, 3),
                    "desired_replicas": None if d is None else d.desired_replicas,
                    "active": None if d is None else d.active, "reason": None if d is None else d.reason,
                    "terms": {} if d is None else dict(d.terms), "last_asked": e.last_asked,
                    "warmed_up_from": e.warmed_from,
                })
        return sorted(out, key=lambda item: (item["namespace"], item["name"], item["metric_name"],
                                             -item["last_asked"]))
