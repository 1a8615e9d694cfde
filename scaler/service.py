"""The KEDA ``ExternalScaler`` gRPC service: a thin layer over the cached decisions (``scaler.decision_process``
mirrors them from the process that computes them; ``--decision-process false``: the evaluator here).

``GetMetricSpec`` is constant per object (target 1, AverageValue: the metric value *is* the desired
replica count; KEDA writes the HPA target only on reconcile). ``GetMetrics`` returns desired
replicas in both ``metricValue`` and ``metricValueFloat`` (KEDA reads the float only when > 0).
``StreamIsActive`` pushes the current activity, then every change: ``true`` the moment the
evaluator sees demand, which is what lets ``external-push`` start a cold GPU early.

Errors: bad metadata → ``INVALID_ARGUMENT`` (every problem, each naming key, value and what is
allowed); no fresh data → ``UNAVAILABLE`` so KEDA's fallback applies. The standard gRPC health
service and server reflection run on the same port; TLS and mTLS come from PEM files.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from scaler import cpu_affinity, warmup
from scaler._proto import externalscaler_pb2 as pb
from scaler._proto import externalscaler_pb2_grpc as pb_grpc
from scaler.cli_types import comma_separated
from scaler.decision_process import DecisionProcess, DecisionSettings
from scaler.evaluator import Decisions, Evaluator, TooManyObjects, Unavailable, default_source_factory
from scaler.metadata import MetadataError, Problem
from scaler.metadata_values import shorten
from scaler.sources.prometheus_auth import PrometheusAuth
from scaler.telemetry import Telemetry, configure_logging

LOG = logging.getLogger("leadscale.service")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ExternalScaler"].full_name
T = TypeVar("T")
MAX_DETAILS_CHARS = 4096
UNPINNED = "serving threads wherever the kernel puts them"
"""The start-up log's word on placement when nothing was pinned (``--pin-serving-cpu``)."""


class ExternalScalerServicer(pb_grpc.ExternalScalerServicer):
    """KEDA's four RPCs; every answer comes from memory (an ``Evaluator``'s, or the ``DecisionProcess``'s mirror)."""

    def __init__(self, evaluator: Decisions, telemetry: Telemetry, stream_check_s: float = 1.0) -> None:
        self.evaluator, self.telemetry, self.stream_check_s = evaluator, telemetry, stream_check_s
        self.stopping = threading.Event()

    def _answer(self, method: str, context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        """Run ``fn`` timed; map our exceptions to gRPC status codes (abort raises)."""
        started = time.perf_counter()
        code: grpc.StatusCode | None = None
        try:
            return fn()
        except MetadataError as exc:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except Unavailable as exc:
            code, message = grpc.StatusCode.UNAVAILABLE, str(exc)
        except TooManyObjects as exc:
            code, message = grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
        except Exception as exc:
            LOG.exception("%s failed", method)
            code, message = grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
        finally:
            self.telemetry.observe_rpc(method, time.perf_counter() - started, code.name if code else None)
        # details travel as trailing metadata, which clients refuse past 8-16 KiB (they would see
        # RESOURCE_EXHAUSTED instead of our reason)
        context.abort(code, shorten(message, MAX_DETAILS_CHARS))
        raise AssertionError("unreachable: context.abort raises")

    def _moved_or_stopping(self, seen: int) -> bool:
        """A StreamIsActive wake-up: some decision changed since ``seen``, or the server is stopping."""
        return self.evaluator.generation != seen or self.stopping.is_set()

    def _object(self, ref: pb.ScaledObjectRef) -> tuple[str, str, dict[str, str]]:
        if not ref.name:
            raise MetadataError([Problem("scaledObjectRef.name", None, "the ScaledObject's name (KEDA sets it)")])
        return ref.namespace, ref.name, dict(ref.scalerMetadata)

    def IsActive(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext) -> pb.IsActiveResponse:
        return self._answer("IsActive", context, lambda: pb.IsActiveResponse(
            result=self.evaluator.lookup(*self._object(request)).active))

    def GetMetricSpec(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext) -> pb.GetMetricSpecResponse:
        def spec() -> pb.GetMetricSpecResponse:
            config = self.evaluator.config(dict(request.scalerMetadata))
            return pb.GetMetricSpecResponse(
                metricSpecs=[pb.MetricSpec(metricName=config.metric_name, targetSize=1, targetSizeFloat=1.0)])

        return self._answer("GetMetricSpec", context, spec)

    def GetMetrics(self, request: pb.GetMetricsRequest, context: grpc.ServicerContext) -> pb.GetMetricsResponse:
        def metrics() -> pb.GetMetricsResponse:
            answer = self.evaluator.lookup(*self._object(request.scaledObjectRef))
            name = request.metricName or answer.config.metric_name
            value = answer.desired_replicas
            return pb.GetMetricsResponse(
                metricValues=[pb.MetricValue(metricName=name, metricValue=value, metricValueFloat=float(value))])

        return self._answer("GetMetrics", context, metrics)

    def StreamIsActive(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext
                       ) -> Iterator[pb.IsActiveResponse]:
        """Send the current activity, then each change, until the client goes or the server stops.

        While the evaluator has no fresh data nothing is sent (never a guessed ``false``); the open
        stream keeps the object alive in the evaluator.
        """
        namespace, name, metadata = self._answer("StreamIsActive", context, lambda: self._object(request))
        self._answer("StreamIsActive", context, lambda: self.evaluator.config(metadata))
        last: bool | None = None
        changed = self.evaluator.changed
        while context.is_active() and not self.stopping.is_set():
            seen = self.evaluator.generation  # read before the lookup: a change after it still wakes us
            try:
                active: bool | None = self.evaluator.lookup(namespace, name, metadata).active
            except Unavailable:
                active = None
            if active is not None and active != last:
                last = active
                yield pb.IsActiveResponse(result=active)
            with changed:
                changed.wait_for(functools.partial(self._moved_or_stopping, seen), self.stream_check_s)


@dataclass(frozen=True)
class TlsFiles:
    """PEM paths: the server's certificate and key, and optionally a client CA (then mTLS is required)."""

    cert: str
    key: str
    client_ca: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        def read(path: str, what: str) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"{what}={path!r}: cannot read: {exc.strerror}") from None

        ca = read(self.client_ca, "--tls-client-ca") if self.client_ca else None
        return grpc.ssl_server_credentials([(read(self.key, "--tls-key"), read(self.cert, "--tls-cert"))],
                                           root_certificates=ca, require_client_auth=ca is not None)


@dataclass
class RunningScaler:
    """A started gRPC server; ``port`` is the bound one (useful with port 0)."""

    server: grpc.Server
    port: int
    servicer: ExternalScalerServicer
    health: health.HealthServicer

    def stop(self, grace_s: float = 2.0) -> None:
        """Report NOT_SERVING, end open streams, and stop (in-flight RPCs get ``grace_s``)."""
        self.health.enter_graceful_shutdown()
        self.servicer.stopping.set()
        with self.servicer.evaluator.changed:
            self.servicer.evaluator.changed.notify_all()
        self.server.stop(grace_s).wait()


def start_server(evaluator: Decisions, telemetry: Telemetry, host: str = "127.0.0.1", port: int = 0,
                 max_workers: int = 256, tls: TlsFiles | None = None) -> RunningScaler:
    """Build and start the gRPC server: ExternalScaler, health and reflection on one port."""
    options: list[tuple[str, Any]] = [
        ("grpc.keepalive_time_ms", 30_000),  # pings keep idle StreamIsActive connections open through proxies
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    server = grpc.server(ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="leadscale-rpc"),
                         options=options)
    servicer = ExternalScalerServicer(evaluator, telemetry)
    pb_grpc.add_ExternalScalerServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return RunningScaler(server, bound, servicer, health_servicer)


def serve_forever(args: Any) -> int:
    """``leadscale serve``: start evaluator, gRPC and metrics servers; stop cleanly on SIGTERM/SIGINT.

    ``args`` is ``serve_cli.resolve``'s namespace; embedders (the benchmark, the Kubernetes wiring) may
    add ``kube`` (a ``KubeObserver``) and ``source_factory`` attributes to it.
    """
    from scaler.telemetry import serve_http

    # Whatever else runs in this process (the evaluator without --decision-process, the metrics server, the
    # decisions' receiver) holds the interpreter lock while RPC threads wait for it; a waiting thread asks
    # for it only after the switch interval (5 ms by default). 0.5 ms keeps an answer from memory a memory read.
    sys.setswitchinterval(float(args.gil_switch_ms) / 1000.0)
    configure_logging(args.log_level, args.log_format)
    telemetry = Telemetry()
    evaluator: Decisions
    placed = UNPINNED
    if getattr(args, "decision_process", False):
        if getattr(args, "kube", None) is not None:
            LOG.error("cannot start: an embedded Kubernetes observer runs only with --decision-process false")
            return 1
        decisions = DecisionProcess(DecisionSettings.from_args(args), telemetry)
        try:
            decisions.start()
        except RuntimeError as exc:
            LOG.error("cannot start: %s", exc)
            return 1
        # after the child started (it keeps every CPU) and before gRPC's threads start (they inherit this)
        placed = _pin_serving(args)
        evaluator, kube = decisions, None
    else:
        built = _in_process_evaluator(args, telemetry)
        if built is None:
            return 1
        evaluator, kube = built
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    try:
        running = start_server(evaluator, telemetry, args.host, args.port, args.max_workers, tls)
    except (OSError, ValueError, RuntimeError) as exc:
        LOG.error("cannot start the gRPC server: %s", exc)
        evaluator.stop()
        return 1
    metrics_host = getattr(args, "metrics_host", None) or args.host
    try:
        http = serve_http(telemetry, evaluator.snapshot, metrics_host, args.metrics_port)
    except OSError as exc:
        LOG.error("cannot start the metrics server on %s:%d: %s", metrics_host, args.metrics_port, exc)
        running.stop(0)
        evaluator.stop()
        return 1
    evaluator.start()
    LOG.info("serving ExternalScaler on %s:%d (%s), metrics on %s:%d; decisions %s; %s", args.host,
             running.port, "mTLS" if tls and tls.client_ca else "TLS" if tls else "plaintext", metrics_host,
             http.server_address[1], "in a process of their own" if isinstance(evaluator, DecisionProcess)
             else "in this process", placed)
    # A handler runs between two bytecodes of the main thread, possibly inside a lock the main thread holds
    # (an Event's, the log handler's), and a second signal can land inside the first handler: it only
    # appends to a list, which takes no lock. (Setting an Event here deadlocked on a process group's SIGTERMs.)
    signals_seen: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: signals_seen.append(signum))
    code = 0
    while not signals_seen:
        if evaluator.failed.is_set():
            LOG.error("stopping: the decision process is gone, so no answer would stay fresh")
            code = 1
            break
        time.sleep(0.2)
    LOG.info("shutting down")
    running.stop()
    evaluator.stop()
    http.shutdown()
    if kube is not None and hasattr(kube, "close"):
        kube.close()
    return code


def _pin_serving(args: Any) -> str:
    """``--pin-serving-cpu``: every thread of this process on one CPU (``scaler.cpu_affinity``); says where they run."""
    if not getattr(args, "pin_serving_cpu", False):
        return UNPINNED
    allowed = cpu_affinity.allowed_cpus()
    cpu = cpu_affinity.serving_cpu(allowed) if allowed is not None else None
    if cpu is None:
        return UNPINNED + (" (this platform cannot pin threads)" if allowed is None else
                         f" (--pin-serving-cpu: only {len(allowed)} CPU may be used, so nothing is pinned)")
    if not cpu_affinity.pin_or_warn(cpu, "serving"):
        return UNPINNED
    return f"serving threads on CPU {cpu_affinity.describe(cpu)}, the decision process wherever the kernel puts it"


def _in_process_evaluator(args: Any, telemetry: Telemetry) -> tuple[Evaluator, Any] | None:
    """The evaluator and Kubernetes observer in this process (``--decision-process false``); None after
    logging why they cannot start."""
    kube = getattr(args, "kube", None)
    if kube is None and args.kubernetes:
        from scaler.sources.kube import KubeObserver

        try:
            kube = KubeObserver(deletion_cost=bool(args.deletion_cost))
        except Exception as exc:  # no in-cluster config and no kubeconfig, RBAC, ...
            LOG.error("--kubernetes: cannot reach the Kubernetes API: %s: %s", type(exc).__name__, exc)
            return None
    scrape = comma_separated(args.scrape_targets)
    try:
        auth = PrometheusAuth.from_flags(getattr(args, "prometheus_auth_modes", None),
                                         getattr(args, "prometheus_auth_dir", None))
    except ValueError as exc:
        LOG.error("cannot start: %s", exc)
        return None
    own = ("prometheus", (args.prometheus_url or "").rstrip("/"))
    evaluator = Evaluator(prometheus_url=args.prometheus_url, scrape_targets=scrape, interval_s=args.interval,
                          staleness_limit_s=args.staleness_limit, idle_timeout_s=args.idle_timeout,
                          telemetry=telemetry, kube=kube, max_objects=args.max_objects,
                          warm_up_s=float(getattr(args, "warm_up", warmup.DEFAULT_SPAN_S)),
                          source_factory=getattr(args, "source_factory", None) or (
                              lambda key: default_source_factory(key, auth if key == own else None)))
    return evaluator, kube
