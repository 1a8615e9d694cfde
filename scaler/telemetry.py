"""The scaler reports itself: its decisions, their terms, data age, RPC latency and errors.

Everything lives in one ``CollectorRegistry`` per ``Telemetry`` (tests build several side by side).
``serve_http`` exposes it at ``/metrics`` next to ``/decisions``, a JSON view of every scaled object's
latest decision and the terms behind it. A decision *change* (desired replicas or activity) is also
written as one structured JSON log line on the ``leadscale.decisions`` logger, so a simulated run
and a production run can be laid side by side.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

DECISION_LOG = logging.getLogger("leadscale.decisions")
# RPC latency buckets: KEDA allows 3 s; we aim for single milliseconds
RPC_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class DecisionCollector(Collector):
    """Reads the latest decisions at scrape time: nothing to update per evaluation, no ghost series.

    ``snapshot()`` returns dicts with ``namespace``, ``name``, ``metric_name``, ``desired_replicas``,
    ``active``, ``data_age_s`` and ``terms`` (the evaluator's ``/decisions`` view); ``None`` values are skipped.
    """

    def __init__(self, snapshot: Callable[[], list[dict[str, Any]]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        obj = ["namespace", "name", "metric"]
        desired = GaugeMetricFamily("leadscale_desired_replicas", "Desired replicas sent to KEDA (GetMetrics).",
                                    labels=obj)
        active = GaugeMetricFamily("leadscale_active", "1 when the scaled object is active (IsActive).", labels=obj)
        age = GaugeMetricFamily("leadscale_data_age_seconds", "Age of the data behind the latest good decision.",
                                labels=obj)
        term = GaugeMetricFamily("leadscale_decision_term", "Each number behind the latest decision, by term.",
                                 labels=[*obj, "term"])
        seen: set[tuple[str, ...]] = set()
        for item in self.snapshot():
            key = [item["namespace"], item["name"], item.get("metric_name", "")]
            if item.get("desired_replicas") is None or tuple(key) in seen:
                continue  # no decision yet, or an older copy of a trigger whose metadata changed
            seen.add(tuple(key))
            desired.add_metric(key, float(item["desired_replicas"]))
            active.add_metric(key, 1.0 if item.get("active") else 0.0)
            if item.get("data_age_s") is not None:
                age.add_metric(key, float(item["data_age_s"]))
            for name, value in sorted(item.get("terms", {}).items()):
                if isinstance(value, (int, float)) and math.isfinite(value):
                    term.add_metric([*key, name], float(value))
        yield from (desired, active, age, term)


class _Delegated(Collector):
    """Families collected elsewhere, yielded as they come (no ``describe``: nothing is asked at registration)."""

    def __init__(self, families: Callable[[], list[Metric]]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families()


class Telemetry:
    """Metrics of one scaler process; ``Telemetry().registry`` is what ``/metrics`` serves."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.evaluation_errors = Counter("leadscale_evaluation_errors_total",
                                         "Evaluations without a usable signal, by reason.",
                                         ["namespace", "name", "reason"], registry=self.registry)
        self.rpc_latency = Histogram("leadscale_rpc_duration_seconds", "gRPC handling time by method.",
                                     ["method"], buckets=RPC_BUCKETS, registry=self.registry)
        self.rpc_errors = Counter("leadscale_rpc_errors_total", "gRPC calls answered with an error, by code.",
                                  ["method", "code"], registry=self.registry)
        self.objects = Gauge("leadscale_scaled_objects", "Scaled objects being evaluated.", registry=self.registry)
        self.evaluation_seconds = Histogram("leadscale_evaluation_round_seconds",
                                            "Duration of one evaluation round (all objects).",
                                            registry=self.registry)
        self._watching = False
        self._rpc_children: dict[str, Any] = {}
        self._failure_reasons: dict[tuple[str, str], set[str]] = {}
        self._failure_lock = threading.Lock()

    def evaluator_families(self) -> list[Metric]:
        """The evaluator's own metrics as collected now (the decision process sends them to the serving one)."""
        return [family for metric in (self.evaluation_errors, self.objects, self.evaluation_seconds)
                for family in metric.collect()]

    def delegate_evaluator_metrics(self, families: Callable[[], list[Metric]]) -> None:
        """Serve the evaluator metrics another process keeps (``families()`` at scrape time) instead of this
        one's, which stay empty when the decisions are computed elsewhere."""
        for metric in (self.evaluation_errors, self.objects, self.evaluation_seconds):
            self.registry.unregister(metric)
        self.registry.register(_Delegated(families))

    def watch(self, snapshot: Callable[[], list[dict[str, Any]]]) -> None:
        """Export the decisions ``snapshot()`` lists (called at scrape time); once per Telemetry."""
        if self._watching:
            raise ValueError("this Telemetry already exports an evaluator's decisions")
        self.registry.register(DecisionCollector(snapshot))
        self._watching = True

    @staticmethod
    def log_decision(namespace: str, name: str, desired: int, active: bool, terms: Mapping[str, float],
                     data_age_s: float, reason: str) -> None:
        """One structured JSON line per decision change, with every term behind it."""
        clean = {k: float(v) for k, v in terms.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        fields = {"event": "decision", "namespace": namespace, "name": name, "desired_replicas": desired,
                  "active": active, "reason": reason, "data_age_s": round(data_age_s, 3), "terms": clean}
        DECISION_LOG.info(json.dumps(fields, sort_keys=True), extra={"fields": fields})

    def record_failure(self, namespace: str, name: str, reason: str) -> None:
        """Count an evaluation without usable data (``reason`` is a short class, not free text)."""
        with self._failure_lock:
            self._failure_reasons.setdefault((namespace, name), set()).add(reason)
            self.evaluation_errors.labels(namespace, name, reason).inc()

    def forget_object(self, namespace: str, name: str) -> None:
        """Drop a gone object's error series (the evaluator calls it when the object idles out)."""
        with self._failure_lock:
            for reason in self._failure_reasons.pop((namespace, name), ()):
                self.evaluation_errors.remove(namespace, name, reason)

    def observe_rpc(self, method: str, seconds: float, code: str | None) -> None:
        """Record one RPC; ``code`` is the gRPC status name when it failed."""
        child = self._rpc_children.get(method)
        if child is None:
            child = self._rpc_children[method] = self.rpc_latency.labels(method)
        child.observe(seconds)
        if code is not None:
            self.rpc_errors.labels(method, code).inc()


class JsonLines(logging.Formatter):
    """One JSON object per log line (``leadscale serve``'s default): time, level, logger, then either the
    record's structured ``fields`` (decision lines) or its ``message``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
                                "level": record.levelname, "logger": record.name}
        fields = getattr(record, "fields", None)
        line.update(fields if isinstance(fields, dict) else {"message": record.getMessage()})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, sort_keys=False, default=str)


def configure_logging(level: str, log_format: str) -> None:
    """``leadscale serve``'s logging, the same in the serving and the decision process: ``text`` lines or
    ``json`` objects (``JsonLines``) on stderr at ``level``."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if log_format == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=str(level).upper(), handlers=[handler], force=True)


def serve_http(telemetry: Telemetry, decisions: Callable[[], list[dict[str, Any]]], host: str,
               port: int) -> ThreadingHTTPServer:
    """Start ``/metrics`` and ``/decisions`` on a daemon thread; ``server.server_address`` has the port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path == "/metrics":
                    body, kind = generate_latest(telemetry.registry), CONTENT_TYPE_LATEST
                elif path == "/decisions":
                    body, kind = json.dumps(decisions(), indent=1, sort_keys=True).encode(), "application/json"
                elif path in ("/", "/healthz"):
                    body, kind = b"leadscale: /metrics /decisions\n", "text/plain"
                else:
                    self.send_error(404, "not found: try /metrics or /decisions")
                    return
            except RuntimeError as exc:  # the decision process did not answer: say so, serve nothing stale
                self.send_error(503, f"{path}: {exc}")
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: scrapes every few seconds
            return

    server_class = ThreadingHTTPServer
    if ":" in host:  # an IPv6 address such as "::"
        class V6(ThreadingHTTPServer):
            address_family = socket.AF_INET6

        server_class = V6
    server = server_class((host.strip("[]"), port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="leadscale-metrics-http", daemon=True).start()
    return server
