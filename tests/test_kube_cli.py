"""``leadscale kube-status`` against the recorded API and ``leadscale shutdown-advice`` against a local page."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from support.kube_api import FakeKubeApi, load
from test_kube_drain import E2E, vllm_page

from leadscale.cli import main


@pytest.fixture
def metrics_url() -> Iterator[str]:
    page = vllm_page(2, 1, (1000, 10), (500, 10), E2E).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(page if self.path == "/metrics" else b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_kube_status_prints_the_view_and_cold_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeKubeApi() as api:
        api.add("scaledobjects", load("scaledobject_llama3.json"))
        api.add("deployments", load("deployment_llama3.json"))
        api.set_pods(load("pods_llama3.json"))
        assert main(["kube-status", "llm/llama3-8b", "--api-server", api.url]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["view"]["deployment"] == "vllm-llama3-8b" and out["view"]["max_replicas"] == 8
    assert sorted(s["total_s"] for s in out["cold_starts"]) == [150.0, 161.0, 195.0]
    assert {"scheduling_s", "container_start_s", "readiness_s"} <= set(out["cold_starts"][0])


def test_kube_status_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeKubeApi() as api:
        assert main(["kube-status", "llm/missing", "--api-server", api.url]) == 1
    assert "ScaledObject llm/missing not found" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="NAMESPACE/NAME='llama3-8b'"):
        main(["kube-status", "llama3-8b", "--api-server", "http://127.0.0.1:9"])


def test_shutdown_advice_from_a_metrics_page(metrics_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shutdown-advice", f"{metrics_url}/metrics", "--grace-period", "30"]) == 0
    text = capsys.readouterr().out
    assert "--shutdown-timeout=60" in text and "terminationGracePeriodSeconds to 75" in text and "shorter" in text
    assert main(["shutdown-advice", f"{metrics_url}/nope"]) == 1
    assert "404" in capsys.readouterr().err
