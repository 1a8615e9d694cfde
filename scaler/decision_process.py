"""Decisions computed in a process of their own, so an RPC never waits for the interpreter behind a round.

Measured on a quiet machine (docs/scaler.md, "what the steady p99 is made of"): with the evaluator's rounds
in the serving process, steady ``GetMetrics`` p99 was 1.5x a peer server's; with the rounds switched off,
1.14x. A round is pure Python (about 0.3 ms per object with an hour of history, ``bench_decide.py``), and
every RPC is several hand-offs between gRPC's threads, each of which waits for the interpreter while a
round holds it. A shorter switch interval only shortens each wait; another process removes them.

The child runs the very same ``Evaluator`` (sources, Kubernetes observer, policy state, idle dropping,
its own evaluation metrics). This process keeps a mirror of each object's latest answer and answers every
RPC from it, with the same freshness rule (``evaluation.fresh``'s): a decision is answered only while the
data behind it is younger than the staleness limit, so a stuck or dead child turns into UNAVAILABLE
within that limit, never into a made-up number; a child that exits makes ``failed`` fire, and
``leadscale serve`` exits non-zero so Kubernetes restarts the pod.

Messages (pickled tuples over two one-way pipes):

- serving -> decisions: ``("ask", oid, namespace, name, metadata)`` for an object this side has not
  seen; ``("touch", [oid, ...])`` once a second for the objects asked about since (idle dropping);
  ``("query", rid, "snapshot" | "metrics")`` for ``/decisions`` and ``/metrics``; ``("stop",)``.
- decisions -> serving: ``("ready",)`` or ``("failed", message)`` at start; ``("update", rows)`` after
  each group of objects is evaluated, a row being ``(oid, desired | None, active | None, data_at, error)``;
  ``("refused", oid, kind, message)``; ``("dropped", [oid, ...])``; ``("reply", rid, payload)``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import multiprocessing
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from scaler import evaluation, warmup
from scaler.cli_types import comma_separated
from scaler.evaluator import (
    Answer,
    Evaluator,
    ObjectKey,
    SourceKey,
    TooManyObjects,
    Unavailable,
    _Entry,
    default_source_factory,
    source_key,
    stale_answer,
    still_first_evaluating,
    too_many_objects,
)
from scaler.metadata import MetadataError, ScalerConfig, parse_metadata
from scaler.sources.base import SignalSource
from scaler.telemetry import Telemetry, configure_logging

LOG = logging.getLogger("leadscale.decisions_process")
ROWS_PER_MESSAGE = 200
"""Updates travel in messages of at most this many rows: unpickling one holds this process's interpreter,
and a thousand rows at once would be a wait an RPC can see."""
TOUCH_EVERY_S = 1.0
QUERY_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class DecisionSettings:
    """What the decision process is built from (picklable: it crosses into the child)."""

    prometheus_url: str | None = None
    scrape_targets: tuple[str, ...] = ()
    interval_s: float = evaluation.DEFAULT_INTERVAL_S
    staleness_limit_s: float = evaluation.DEFAULT_STALENESS_LIMIT_S
    idle_timeout_s: float = 600.0
    max_objects: int = 10_000
    kubernetes: bool = False
    deletion_cost: bool = False
    prometheus_auth_modes: str | None = None
    prometheus_auth_dir: str | None = None
    source_factory: Callable[[SourceKey], SignalSource] | None = None
    """A module-level callable (it is pickled); None: the real sources."""
    log_level: str = "INFO"
    log_format: str = "text"
    gil_switch_ms: float = 0.5
    warm_up_s: float = warmup.DEFAULT_SPAN_S

    @classmethod
    def from_args(cls, args: Any) -> DecisionSettings:
        """From ``serve_cli.resolve``'s namespace (plus an embedder's ``source_factory``)."""
        return cls(prometheus_url=args.prometheus_url, scrape_targets=comma_separated(args.scrape_targets),
                   interval_s=float(args.interval),
                   staleness_limit_s=float(args.staleness_limit), idle_timeout_s=float(args.idle_timeout),
                   max_objects=int(args.max_objects), kubernetes=bool(args.kubernetes),
                   deletion_cost=bool(args.deletion_cost), warm_up_s=float(args.warm_up),
                   prometheus_auth_modes=getattr(args, "prometheus_auth_modes", None),
                   prometheus_auth_dir=getattr(args, "prometheus_auth_dir", None),
                   source_factory=getattr(args, "source_factory", None), log_level=str(args.log_level),
                   log_format=str(args.log_format), gil_switch_ms=float(args.gil_switch_ms))


@dataclass
class _Mirror:
    """One object's latest answer as the decision process last sent it."""

    oid: int
    key: ObjectKey
    config: ScalerConfig
    answer: tuple[int | None, bool | None, float, str | None] = (None, None, -math.inf, None)
    """(desired replicas, active, data_at, error): replaced whole, so a reader never sees half an update."""
    evaluated: threading.Event = field(default_factory=threading.Event)
    refusal: Exception | None = None


class DecisionProcess:
    """``Evaluator``'s RPC side (``config``, ``lookup``, ``changed``/``generation``, ``snapshot``) for an
    evaluator running in a child process."""

    def __init__(self, settings: DecisionSettings, telemetry: Telemetry | None = None,
                 first_call_timeout_s: float = 2.0, start_timeout_s: float = 60.0) -> None:
        self.settings = settings
        self.prometheus_url = settings.prometheus_url.rstrip("/") if settings.prometheus_url else None
        self.first_call_timeout_s, self.start_timeout_s = first_call_timeout_s, start_timeout_s
        self.telemetry = telemetry or Telemetry()
        self.telemetry.watch(self.snapshot)
        self.telemetry.delegate_evaluator_metrics(lambda: self._query("metrics"))
        self.changed = threading.Condition()
        self.generation = 0
        self.failed = threading.Event()
        """Set when the decision process exits on its own: nothing will refresh the answers any more."""
        self._mirrors: dict[ObjectKey, _Mirror] = {}
        self._by_oid: dict[int, _Mirror] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._touched: set[int] = set()
        self._touch_lock = threading.Lock()
        self._oids = itertools.count(1)
        self._replies: dict[int, list[Any]] = {}
        self._reply_ready = threading.Condition()
        self._stopping = threading.Event()
        self._started = False
        context = multiprocessing.get_context("spawn")  # no fork of a process that holds gRPC's threads
        child_commands, self._commands = context.Pipe(duplex=False)
        self._updates, child_updates = context.Pipe(duplex=False)
        self._process = context.Process(target=child_main, args=(settings, child_commands, child_updates),
                                        name="leadscale-decisions", daemon=True)
        self._child_ends = (child_commands, child_updates)

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the child and wait until it evaluates; raises ``RuntimeError`` with its reason if it cannot.
        Once started, a no-op (``leadscale serve`` starts it before the servers, then starts everything)."""
        if self._started:
            return
        self._started = True
        self._process.start()
        for end in self._child_ends:  # the child has its own copies; ours would hide its exit (no EOF)
            end.close()
        if not self._updates.poll(self.start_timeout_s):
            self._process.kill()
            raise RuntimeError(f"the decision process did not start within {self.start_timeout_s:g} s")
        try:
            first = self._updates.recv()
        except EOFError:
            self._process.join(5)
            raise RuntimeError(f"the decision process exited at start (code {self._process.exitcode})") from None
        if first[0] != "ready":
            self._process.join(5)
            raise RuntimeError(str(first[1]))
        threading.Thread(target=self._receive, name="leadscale-decisions-receive", daemon=True).start()
        threading.Thread(target=self._touch_loop, name="leadscale-decisions-touch", daemon=True).start()

    def stop(self) -> None:
        """Tell the child to stop and wait for it (killed after 5 s)."""
        if not self._started:
            return
        self._stopping.set()
        with contextlib.suppress(OSError, ValueError):  # the child is gone already
            self._send(("stop",))
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)

    # --- the RPC side: memory only ------------------------------------------------------------------
    def config(self, metadata: Mapping[str, str]) -> ScalerConfig:
        """Parsed metadata (cached); raises ``MetadataError`` also when no source can serve it."""
        config = parse_metadata(metadata)
        source_key(config, self.prometheus_url, self.settings.scrape_targets, self.settings.kubernetes)
        return config

    def lookup(self, namespace: str, name: str, metadata: Mapping[str, str]) -> Answer:
        """The latest decision for one object; raises ``MetadataError``, ``TooManyObjects`` or ``Unavailable``."""
        key = (namespace, name, frozenset(metadata.items()))
        mirror = self._mirrors.get(key)
        if mirror is None:
            mirror = self._register(key, namespace, name, metadata)
        else:
            with self._touch_lock:  # not lost to the swap in _touch_loop
                self._touched.add(mirror.oid)
        if not mirror.evaluated.wait(self.first_call_timeout_s):
            raise still_first_evaluating(namespace, name, self.first_call_timeout_s)
        if mirror.refusal is not None:
            raise mirror.refusal
        desired, active, data_at, error = mirror.answer
        now = time.time()
        age = now - data_at
        if desired is None or active is None or not evaluation.is_fresh(data_at, now, self.settings.staleness_limit_s):
            why = error or ("the decision process has exited" if self.failed.is_set() else f"data is {age:.0f} s old")
            raise stale_answer(namespace, name, self.settings.staleness_limit_s, why)
        return Answer(mirror.config, desired, active, max(age, 0.0))

    def _register(self, key: ObjectKey, namespace: str, name: str, metadata: Mapping[str, str]) -> _Mirror:
        config = self.config(metadata)
        if self.failed.is_set():  # nothing would ever evaluate it
            raise Unavailable(f"{namespace}/{name}: the decision process has exited; the scaler is restarting")
        with self._lock:
            mirror = self._mirrors.get(key)
            if mirror is not None:
                return mirror
            if len(self._mirrors) >= self.settings.max_objects:
                raise too_many_objects(namespace, name, len(self._mirrors), self.settings.max_objects,
                                       self.settings.idle_timeout_s)
            mirror = _Mirror(next(self._oids), key, config)
            self._mirrors[key] = mirror
            self._by_oid[mirror.oid] = mirror
        self._send(("ask", mirror.oid, namespace, name, dict(metadata)))
        return mirror

    def snapshot(self) -> list[dict[str, Any]]:
        """The decision process's ``/decisions`` view; raises ``RuntimeError`` when it does not answer."""
        result: list[dict[str, Any]] = self._query("snapshot")
        return result

    # --- plumbing -----------------------------------------------------------------------------------
    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._commands.send(message)

    def _query(self, what: str) -> Any:
        if self.failed.is_set():
            raise RuntimeError("the decision process has exited")
        rid = next(self._oids)
        with self._reply_ready:
            self._replies[rid] = []
        self._send(("query", rid, what))
        with self._reply_ready:
            answered = self._reply_ready.wait_for(lambda: bool(self._replies[rid]) or self.failed.is_set(),
                                                  QUERY_TIMEOUT_S)
            reply = self._replies.pop(rid)
        if not answered or not reply:
            raise RuntimeError(f"the decision process did not answer {what!r} within {QUERY_TIMEOUT_S:g} s")
        return reply[0]

    def _touch_loop(self) -> None:
        """Tell the child which objects were asked about, once a second (its idle dropping counts on it)."""
        while not self._stopping.wait(TOUCH_EVERY_S):
            with self._touch_lock:
                touched, self._touched = self._touched, set()
            if touched:
                try:
                    self._send(("touch", sorted(touched)))
                except (OSError, ValueError):
                    return

    def _receive(self) -> None:
        while True:
            try:
                message = self._updates.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "update":
                self._apply(message[1])
            elif kind == "dropped":
                with self._lock:
                    for oid in message[1]:
                        mirror = self._by_oid.pop(oid, None)
                        if mirror is not None and self._mirrors.get(mirror.key) is mirror:
                            del self._mirrors[mirror.key]
            elif kind == "refused":
                self._refused(*message[1:])
            elif kind == "reply":
                with self._reply_ready:
                    if message[1] in self._replies:
                        self._replies[message[1]].append(message[2])
                    self._reply_ready.notify_all()
        if not self._stopping.is_set():
            self._process.join(1)
            LOG.error("the decision process exited (code %s): answers go UNAVAILABLE as their data ages past "
                      "%g s", self._process.exitcode, self.settings.staleness_limit_s)
        self.failed.set()
        with self._reply_ready:
            self._reply_ready.notify_all()

    def _apply(self, rows: list[tuple[int, int | None, bool | None, float, str | None]]) -> None:
        moved = False
        for oid, desired, active, data_at, error in rows:
            mirror = self._by_oid.get(oid)
            if mirror is None:
                continue
            before = mirror.answer
            mirror.answer = (desired, active, data_at, error)
            if not mirror.evaluated.is_set():  # set() takes a lock even when set: once per object, not per round
                mirror.evaluated.set()
            moved = moved or (desired is not None and (before[0], before[1]) != (desired, active))
        if moved:
            with self.changed:
                self.generation += 1
                self.changed.notify_all()

    def _refused(self, oid: int, kind: str, message: str) -> None:
        with self._lock:
            mirror = self._by_oid.pop(oid, None)
            if mirror is None:
                return
            if self._mirrors.get(mirror.key) is mirror:
                del self._mirrors[mirror.key]  # the next call asks again
        mirror.refusal = TooManyObjects(message) if kind == "too_many" else Unavailable(message)
        mirror.evaluated.set()


# --- the child ------------------------------------------------------------------------------------
def _row(entry: _Entry) -> tuple[Any, int | None, bool | None, float, str | None]:
    with entry.lock:
        held, error = entry.held, entry.error
    decision = held.decision
    if decision is None:
        return entry.tag, None, None, held.data_at, error
    return entry.tag, int(decision.desired_replicas), bool(decision.active), held.data_at, error


def _build_evaluator(settings: DecisionSettings, send: Callable[[tuple[Any, ...]], None],
                     entries: dict[int, _Entry]) -> Evaluator:
    """The evaluator ``leadscale serve`` would run in-process, reporting to the serving process."""
    from scaler.sources.prometheus_auth import PrometheusAuth

    kube = None
    if settings.kubernetes:
        from scaler.sources.kube import KubeObserver

        try:
            kube = KubeObserver(deletion_cost=settings.deletion_cost)
        except Exception as exc:  # no in-cluster config and no kubeconfig, RBAC, ...
            raise RuntimeError(f"--kubernetes: cannot reach the Kubernetes API: {type(exc).__name__}: {exc}") from exc
    auth = PrometheusAuth.from_flags(settings.prometheus_auth_modes, settings.prometheus_auth_dir)
    own = ("prometheus", (settings.prometheus_url or "").rstrip("/"))
    factory = settings.source_factory or (lambda key: default_source_factory(key, auth if key == own else None))

    def on_evaluated(members: list[_Entry]) -> None:
        rows = [_row(e) for e in members if e.tag is not None]
        for start in range(0, len(rows), ROWS_PER_MESSAGE):
            send(("update", rows[start:start + ROWS_PER_MESSAGE]))

    def on_dropped(dropped: list[_Entry]) -> None:
        gone = [e.tag for e in dropped if e.tag is not None and entries.get(e.tag) is e]
        for oid in gone:
            del entries[oid]
        if gone:
            send(("dropped", gone))

    return Evaluator(prometheus_url=settings.prometheus_url, scrape_targets=settings.scrape_targets,
                     interval_s=settings.interval_s, staleness_limit_s=settings.staleness_limit_s,
                     idle_timeout_s=settings.idle_timeout_s, source_factory=factory, kube=kube,
                     max_objects=settings.max_objects, on_evaluated=on_evaluated, on_dropped=on_dropped,
                     warm_up_s=settings.warm_up_s, serves_rpcs=False)


def child_main(settings: DecisionSettings, commands: Connection, updates: Connection) -> None:
    """The decision process: an ``Evaluator`` driven by the serving process's messages until it says stop
    or goes away (its pipe closes)."""
    # Ctrl-C and a process group's SIGTERM (timeout(1), a shell) reach us too: the serving process stops us
    # with a message, and its death closes our pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.setswitchinterval(settings.gil_switch_ms / 1000.0)  # queries wait on rounds too
    configure_logging(settings.log_level, settings.log_format)
    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            updates.send(message)

    entries: dict[int, _Entry] = {}
    try:
        evaluator = _build_evaluator(settings, send, entries)
    except Exception as exc:
        send(("failed", str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"))
        return
    send(("ready",))
    evaluator.start()
    try:
        while True:
            try:
                message = commands.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "stop":
                break
            if kind == "ask":
                _ask(evaluator, entries, send, *message[1:])
            elif kind == "touch":
                now = evaluator.clock()
                for oid in message[1]:
                    entry = entries.get(oid)
                    if entry is not None:
                        entry.last_asked = now
            elif kind == "query":
                rid, what = message[1], message[2]
                payload = evaluator.snapshot() if what == "snapshot" else evaluator.telemetry.evaluator_families()
                send(("reply", rid, payload))
    finally:
        evaluator.stop()
        if evaluator.kube is not None and hasattr(evaluator.kube, "close"):
            evaluator.kube.close()


def _ask(evaluator: Evaluator, entries: dict[int, _Entry], send: Callable[[tuple[Any, ...]], None], oid: int,
         namespace: str, name: str, metadata: dict[str, str]) -> None:
    try:
        entry = evaluator.register(namespace, name, metadata, tag=oid)
    except TooManyObjects as exc:
        send(("refused", oid, "too_many", str(exc)))
        return
    except MetadataError as exc:  # the serving side checked the same: only a disagreement lands here
        send(("refused", oid, "metadata", str(exc)))
        return
    if entry.evaluated.is_set():  # known already (asked again after the serving side forgot it): answer now
        for stale in [o for o, e in entries.items() if e is entry]:
            del entries[stale]
        entries[oid] = entry
        send(("update", [_row(entry)]))
    else:
        entries[oid] = entry
