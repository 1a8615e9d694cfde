"""A loopback HTTP proxy in front of a real service, for faults and access checks.

    with HttpProxy(prom.url) as proxy:          # http://127.0.0.1:<port> forwards to Prometheus
        proxy.delay_s = 5.0                     # every answer 5 s late (a Prometheus under load)
        proxy.rewrite = lambda query: "empty" if "_bucket" in query else None   # partial results
        proxy.bearer = "s3cret"                 # 401 unless ``Authorization: Bearer s3cret``
        proxy.seen                              # (path, headers) of each request, for "what did we send"

``rewrite(query)`` sees each PromQL query and returns None (forward it), ``"empty"`` (a successful answer
with no series, as Prometheus gives for a selector that matches nothing) or ``"error"`` (HTTP 503 with
Prometheus's error body). Only loopback; forwarding goes through httpx.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx


class HttpProxy:
    """Forwards every request to ``upstream``; the knobs above change what comes back."""

    def __init__(self, upstream: str, verify: Any = True) -> None:
        self.upstream = upstream.rstrip("/")
        self.delay_s = 0.0
        self.rewrite: Callable[[str], str | None] | None = None
        self.bearer: str | None = None
        self.seen: list[tuple[str, dict[str, str]]] = []
        self._client = httpx.Client(verify=verify, timeout=30.0)
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the proxy first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> HttpProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy._handle(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                proxy._handle(self, self.rfile.read(length))

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="http-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self._client.close()

    def __enter__(self) -> HttpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handle(self, request: BaseHTTPRequestHandler, body: bytes | None) -> None:
        headers = {k: v for k, v in request.headers.items()}
        self.seen.append((request.path, headers))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.bearer is not None and headers.get("Authorization") != f"Bearer {self.bearer}":
            self._reply(request, 401, b"Unauthorized\n", "text/plain")
            return
        form = parse_qs(urlsplit(request.path).query) | (parse_qs(body.decode()) if body else {})
        query = (form.get("query") or [""])[0]
        verdict = self.rewrite(query) if self.rewrite and query else None
        if verdict == "empty":
            self._reply(request, 200, json.dumps({"status": "success", "data": {"resultType": "vector",
                                                                                "result": []}}).encode())
            return
        if verdict == "error":
            self._reply(request, 503, json.dumps({"status": "error", "errorType": "unavailable",
                                                  "error": "injected by the test proxy"}).encode())
            return
        forward = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length", "authorization")}
        try:
            answer = self._client.request(request.command, self.upstream + request.path, content=body,
                                          headers=forward)
        except httpx.HTTPError as exc:
            self._reply(request, 502, f"upstream: {type(exc).__name__}\n".encode(), "text/plain")
            return
        self._reply(request, answer.status_code, answer.content, answer.headers.get("content-type", "text/plain"))

    @staticmethod
    def _reply(request: BaseHTTPRequestHandler, status: int, body: bytes, kind: str = "application/json") -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up first (timeouts)
            request.send_response(status)
            request.send_header("Content-Type", kind)
            request.send_header("Content-Length", str(len(body)))
            request.end_headers()
            request.wfile.write(body)
