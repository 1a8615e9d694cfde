"""A fake vLLM pod's ``/metrics``: the exact metric names and labels of vLLM's v1 engine, driven by a test.

NOTE: names, label names (``model_name``, ``engine``, ``finished_reason``) and histogram buckets follow
vLLM v1's ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py); rendering is prometheus_client's, as in
vLLM. Left out: LoRA, speculative decoding, prefix-cache and iteration histograms.

    with VllmExporter(model="tiny") as pod:        # serves http://127.0.0.1:<port>/metrics
        pod.set_load(prompt_tokens_per_s=2000, generation_tokens_per_s=500)   # counters grow in a thread
        pod.set_queue(waiting=8, running=16, kv_usage=0.7)
        pod.restart()                               # counters back to zero, like a new pod
        pod.set_serving(False)                      # /metrics answers 503, like a pod still loading
        pod.set_gauge("gateway_pending_requests", 5, model="tiny")   # any other series a test needs
"""

from __future__ import annotations

import contextlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from scaler.histograms import vllm_token_buckets

LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: the scaler's own copy (``tests/test_histograms.py`` pins it)."""
    return vllm_token_buckets(max_model_len)


class _Metrics:
    """One process lifetime of vLLM metrics (a restart makes a new one, so counters start at 0)."""

    def __init__(self, model: str, engines: int, max_model_len: int, num_gpu_blocks: int, block_size: int) -> None:
        self.registry = CollectorRegistry()
        r, names = self.registry, ["model_name", "engine"]
        self.prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", names, registry=r)
        self.generation = Counter("vllm:generation_tokens", "Number of generation tokens processed.", names,
                                  registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*names, "finished_reason"], registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", names,
                                   registry=r)
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", names,
                             registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", names,
                             registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", names, registry=r)
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     ["block_size", "cache_dtype", "num_gpu_blocks", "engine"], registry=r)
        tokens = token_buckets(max_model_len)
        self.prompt_hist = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", names,
                                     buckets=tokens, registry=r)
        self.output_hist = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                     names, buckets=tokens, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              names, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             names, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             names, buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for "
                               "request.", names, buckets=LATENCY_BUCKETS, registry=r)
        self.labels = [(model, str(e)) for e in range(engines)]
        for model_name, engine in self.labels:  # vLLM creates every child up front, so all series exist at 0
            for metric in (self.prompt, self.generation, self.preemptions, self.running, self.waiting, self.kv,
                           self.prompt_hist, self.output_hist, self.ttft, self.itl, self.e2e, self.queue):
                metric.labels(model_name, engine)
            for reason in ("stop", "length", "abort"):
                self.success.labels(model_name, engine, reason)
            info.labels(str(block_size), "auto", str(num_gpu_blocks), engine).set(1)


class VllmExporter:
    """Serves vLLM-format metrics on 127.0.0.1 that a test changes at will (see the module docstring)."""

    def __init__(self, model: str = "tiny", engines: int = 1, max_model_len: int = 4096, num_gpu_blocks: int = 1024,
                 block_size: int = 16, tick_s: float = 0.05, vllm: bool = True) -> None:
        self.model, self.engines, self.tick_s, self.vllm = model, engines, tick_s, vllm
        self.extra = CollectorRegistry()  # other series a test adds (e.g. a gateway's queue); survive restarts
        self._extra_gauges: dict[str, Gauge] = {}
        self._shape = (max_model_len, num_gpu_blocks, block_size)
        self._lock = threading.Lock()
        self.metrics = _Metrics(model, engines, *self._shape)
        self.serving = True
        self._load = (0.0, 0.0, 1000.0, 200.0)  # prompt tok/s, generation tok/s, prompt len, output len
        self._carry = [0.0, 0.0, 0.0]  # fractional prompt tokens, generation tokens, finished requests
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> VllmExporter:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body, status, ctype = exporter._render(self.path)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the scraper timed out first
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._threads = [threading.Thread(target=self._server.serve_forever, daemon=True, name="vllm-exporter-http"),
                         threading.Thread(target=self._drive, daemon=True, name="vllm-exporter-load")]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> VllmExporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, the form a Prometheus scrape target takes."""
        assert self._server is not None, "start() the exporter first"
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def _render(self, path: str) -> tuple[bytes, int, str]:
        if not self.serving:
            return b"engine is starting\n", 503, "text/plain"
        if path.split("?")[0] == "/health":
            return b"", 200, "text/plain"
        if path.split("?")[0] != "/metrics":
            return b"not found\n", 404, "text/plain"
        with self._lock:
            body = generate_latest(self.metrics.registry) if self.vllm else b""
            return body + generate_latest(self.extra), 200, CONTENT_TYPE_LATEST

    # --- what a test drives --------------------------------------------------------------------
    def set_serving(self, serving: bool) -> None:
        """False: /metrics answers 503 like a pod whose engine is still loading."""
        self.serving = serving

    def set_gauge(self, name: str, value: float, **labels: str) -> None:
        """Any other gauge, e.g. ``set_gauge("gateway_pending_requests", 5, model="tiny")``; ``vllm=False``
        in the constructor makes an exporter that serves only these (a gateway, not a pod)."""
        with self._lock:
            if name not in self._extra_gauges:
                self._extra_gauges[name] = Gauge(name, f"test gauge {name}", sorted(labels), registry=self.extra)
            gauge = self._extra_gauges[name]
            (gauge.labels(**labels) if labels else gauge).set(value)

    def restart(self) -> None:
        """A pod restart: every counter and histogram starts again from zero."""
        with self._lock:
            self.metrics = _Metrics(self.model, self.engines, *self._shape)
            self._carry = [0.0, 0.0, 0.0]

    def set_queue(self, waiting: int = 0, running: int = 0, kv_usage: float = 0.0) -> None:
        """Gauges, whole requests spread over engines as vLLM's per-engine gauges would be."""
        with self._lock:
            for i, labels in enumerate(self.metrics.labels):
                self.metrics.waiting.labels(*labels).set(waiting // self.engines + (i < waiting % self.engines))
                self.metrics.running.labels(*labels).set(running // self.engines + (i < running % self.engines))
                self.metrics.kv.labels(*labels).set(kv_usage)

    def set_load(self, prompt_tokens_per_s: float = 0.0, generation_tokens_per_s: float = 0.0,
                 prompt_len: float = 1000.0, output_len: float = 200.0) -> None:
        """Counters grow at these rates from now on; requests finish at ``prompt_tokens_per_s / prompt_len``."""
        with self._lock:
            self._load = (prompt_tokens_per_s, generation_tokens_per_s, prompt_len, output_len)

    def record_requests(self, n: int, prompt_len: float, output_len: float, ttft_s: float = 0.1) -> None:
        """``n`` finished requests at once: counters, success and every request histogram."""
        with self._lock:
            self._finish(n, prompt_len, output_len, ttft_s)
            for labels in self.metrics.labels:
                self.metrics.prompt.labels(*labels).inc(n * prompt_len / self.engines)
                self.metrics.generation.labels(*labels).inc(n * output_len / self.engines)

    def _finish(self, n: int, prompt_len: float, output_len: float, ttft_s: float) -> None:
        m = self.metrics
        for i in range(n):
            labels = m.labels[i % self.engines]
            m.success.labels(*labels, "stop").inc()
            m.prompt_hist.labels(*labels).observe(prompt_len)
            m.output_hist.labels(*labels).observe(output_len)
            m.ttft.labels(*labels).observe(ttft_s)
            m.itl.labels(*labels).observe(0.02)
            m.e2e.labels(*labels).observe(ttft_s + 0.02 * output_len)
            m.queue.labels(*labels).observe(0.0)

    def _drive(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.tick_s):
            now = time.monotonic()
            dt, last = now - last, now
            with self._lock:
                prompt_tps, gen_tps, prompt_len, output_len = self._load
                self._carry[0] += prompt_tps * dt
                self._carry[1] += gen_tps * dt
                self._carry[2] += prompt_tps * dt / prompt_len if prompt_len > 0 else 0.0
                whole = [int(c) for c in self._carry]
                self._carry = [c - w for c, w in zip(self._carry, whole, strict=True)]
                for labels in self.metrics.labels:
                    self.metrics.prompt.labels(*labels).inc(whole[0] / self.engines)
                    self.metrics.generation.labels(*labels).inc(whole[1] / self.engines)
                self._finish(whole[2], prompt_len, output_len, 0.1)
