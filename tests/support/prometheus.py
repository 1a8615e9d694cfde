"""A real Prometheus for tests: ``/usr/bin/prometheus`` on 127.0.0.1, a temp config and TSDB, torn down after.

    with PrometheusServer(scrape_targets=[pod.address], scrape_interval_s=1) as prom:
        prom.wait_until_up(1)                       # every target scraped at least once and up
        prom.query('sum(vllm:num_requests_running)')  # -> [{"metric": {...}, "value": [t, "v"]}]
        prom.set_targets([a.address, b.address])    # file-based discovery: picked up within ~1 s
        prom.url                                    # http://127.0.0.1:<port>

Targets come from a file_sd JSON file, so a test can add and remove "pods" while Prometheus runs.
Prometheus 2.42 hands discovered targets to its scrapers at most every 5 s, so the first scrape (and
any ``set_targets`` change) lands ~5 s later: call ``wait_until_up`` rather than sleeping.
Each target may carry extra labels: ``("127.0.0.1:8000", {"namespace": "llm"})``. A missing binary
skips the test locally and fails it in CI (``conftest.require``).

``PrometheusServer(data_dir=path)`` starts on an existing TSDB (say one that ``promtool tsdb
create-blocks-from openmetrics`` filled) instead of an empty temporary one; the caller owns ``path``,
so ``stop()`` leaves it in place.

Faults: ``kill()`` ends the process with SIGKILL (no clean shutdown: the TSDB keeps its WAL) and
``restart()`` starts it again on the same port and TSDB, so clients see the same URL and history.
``web_config`` is Prometheus's ``--web.config.file`` (``tls_server_config``, ``basic_auth_users``);
with TLS the URL is ``https://`` and the helper's own requests use ``client_verify``/``client_auth``.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from conftest import require

T = TypeVar("T")

DEFAULT_BINARY = "/usr/bin/prometheus"
ScrapeTarget = str | tuple[str, Mapping[str, str]]


def free_port() -> int:
    """A port that was free a moment ago on 127.0.0.1 (the caller retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrometheusServer:
    """Start, query and stop one Prometheus process (see the module docstring for usage)."""

    def __init__(self, scrape_targets: Sequence[ScrapeTarget] = (), scrape_interval_s: float = 1.0,
                 binary: str = DEFAULT_BINARY, extra_args: Sequence[str] = (), ready_timeout_s: float = 60.0,
                 data_dir: str | Path | None = None, web_config: Mapping[str, Any] | None = None,
                 client_verify: str | bool = True, client_auth: tuple[str, str] | None = None,
                 client_cert: tuple[str, str] | None = None, port: int = 0) -> None:
        if any(arg.startswith("--storage.tsdb.path") for arg in extra_args):
            raise ValueError("PrometheusServer extra_args: pass data_dir=... instead of --storage.tsdb.path")
        self.binary, self.scrape_interval_s = binary, scrape_interval_s
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.extra_args, self.ready_timeout_s = list(extra_args), ready_timeout_s
        self._initial_targets = list(scrape_targets)
        self.web_config = dict(web_config) if web_config else None
        verify: ssl.SSLContext | bool = client_verify if isinstance(client_verify, bool) else \
            ssl.create_default_context(cafile=client_verify)
        if client_cert is not None:
            verify = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
            verify.load_cert_chain(*client_cert)
        self.client: dict[str, Any] = {"verify": verify, "auth": client_auth}
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.fixed_port = port
        """Non-zero: listen there (a client may be pointed at it before Prometheus starts)."""
        self.port = port

    @property
    def url(self) -> str:
        scheme = "https" if self.web_config and "tls_server_config" in self.web_config else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> PrometheusServer:
        require(shutil.which(self.binary) is not None,
                f"the Prometheus binary {self.binary} (apt-get install prometheus)")
        self._dir = Path(tempfile.mkdtemp(prefix="leadscale-prom-"))
        self.set_targets(self._initial_targets)
        interval = f"{round(self.scrape_interval_s * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "scrape_configs": [{"job_name": "vllm", "file_sd_configs": [
                {"files": [str(self._dir / "targets.json")], "refresh_interval": "1s"}]}],
        }
        (self._dir / "prometheus.yml").write_text(json.dumps(config))  # JSON is valid YAML
        if self.web_config:
            (self._dir / "web.yml").write_text(json.dumps(self.web_config))
        last_error = ""
        for _attempt in range(3):  # the free port may be taken between free_port() and bind
            self.port = self.fixed_port or free_port()
            if self._launch():
                return self
            last_error = self._log_tail()
            self._terminate()
        self.stop()
        raise RuntimeError(f"Prometheus did not become ready within {self.ready_timeout_s}s:\n{last_error}")

    def _launch(self) -> bool:
        assert self._dir is not None
        web = [f"--web.config.file={self._dir / 'web.yml'}"] if self.web_config else []
        with (self._dir / "prometheus.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [self.binary, f"--config.file={self._dir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.data_dir or self._dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", *web,
                 "--web.enable-lifecycle", "--log.level=warn", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self._wait_ready()

    def kill(self) -> None:
        """SIGKILL, like an OOM kill or a node loss: no clean shutdown; config and TSDB stay for ``restart``."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._proc = None

    def restart(self) -> None:
        """Start again on the same port and TSDB (after ``kill``, or a running one is killed first)."""
        self.kill()
        deadline = time.monotonic() + 30
        while not self._launch():  # the port may linger a moment after the kill
            self._terminate()
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not restart on port {self.port}:\n{self._log_tail()}")
            time.sleep(0.5)

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                return False
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1.0, **self.client).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        return False

    def _log_tail(self, chars: int = 3000) -> str:
        path = self._dir / "prometheus.log" if self._dir else None
        return path.read_text(errors="replace")[-chars:] if path and path.exists() else ""

    def _terminate(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self._proc = None

    def stop(self) -> None:
        """Stop the process and delete its config and temporary TSDB (a caller's ``data_dir`` stays)."""
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what a test does ----------------------------------------------------------------------
    def set_targets(self, targets: Sequence[ScrapeTarget]) -> None:
        """Replace the scrape targets (``host:port`` or ``(host:port, labels)``); atomic file swap."""
        assert self._dir is not None, "start() Prometheus first"
        groups = []
        for target in targets:
            address, labels = (target, {}) if isinstance(target, str) else (target[0], dict(target[1]))
            groups.append({"targets": [address], "labels": labels})
        tmp = self._dir / "targets.json.tmp"
        tmp.write_text(json.dumps(groups))
        tmp.replace(self._dir / "targets.json")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's ``result`` list; raises on any Prometheus error."""
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=15.0, **self.client)
        response.raise_for_status()
        body = response.json()
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus query {promql!r} failed: {body}")
        return list(body["data"]["result"])

    def wait_until(self, promql: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 60.0,
                   poll_s: float = 0.25) -> list[dict[str, Any]]:
        """Poll ``promql`` until ``predicate(result)`` holds; AssertionError with the last result otherwise."""
        deadline = time.monotonic() + timeout_s
        result: list[dict[str, Any]] = []
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"after {timeout_s}s, {promql!r} still gives {result!r}")
            time.sleep(poll_s)

    def wait_until_observed(self, window_s: float, timeout_s: float = 60.0) -> None:
        """Wait until this Prometheus has samples older than half of ``window_s`` (else the scaler says
        "warming up": ``rate()`` over a window it has only partly seen understates)."""
        half = f"{round(window_s * 500)}ms"
        self.wait_until(f"count(count_over_time(up[{half}] offset {half}))", bool, timeout_s)

    def wait_until_up(self, n_targets: int, timeout_s: float = 60.0) -> None:
        """Wait until ``n_targets`` targets have been scraped successfully (``up == 1``)."""
        self.wait_until("sum(up)", lambda r: bool(r) and float(r[0]["value"][1]) >= n_targets, timeout_s)


def eventually(check: Callable[[], T], timeout_s: float = 60.0, poll_s: float = 0.25) -> T:
    """Call ``check`` until it returns without an AssertionError; after ``timeout_s`` re-raise its last one.

    For real services on a loaded CI box: scrapes and rate windows land late, never wrong, so a test
    asserts the exact behaviour and only waits longer for it (a wrong number never passes).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(poll_s)
