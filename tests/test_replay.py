"""Replay client against a tiny in-test OpenAI-compatible server on 127.0.0.1 (error paths, timing, routing).

The fake server's tokenizer makes one token per word (its id a hash of the word) plus a BOS, and a
token-id prompt is as many tokens as ids. ``max_tokens`` picks the behaviour, so a trace's output column
scripts each request: 429 refuses, 500 fails, 777 hangs (timeout), 666 drops the stream, 555 sends
garbage; anything else streams that many tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from hypothesis import given
from hypothesis import strategies as st

from simulator.replay import ReplayConfig, Replayer, Router, select_requests
from simulator.replay_metrics import load_timeline, parse_vllm_metrics, server_means
from simulator.replay_prompts import PromptBuilder, PromptError, fit_lengths
from simulator.replay_records import read_records

FIXTURE = ROOT / "tests" / "fixtures" / "vllm_metrics_cpu.txt"
METRICS = '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="fake"} 0.0\n'


class FakeOpenAI(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    token_gap_s = 0.002

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, code: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"data": [{"id": "fake", "max_model_len": 1000}]})
        elif self.path == "/metrics":
            data = METRICS.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._json(404, {"error": "no such path"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path == "/tokenize":
            text = body.get("prompt") if "prompt" in body else body["messages"][0]["content"] + " x x"
            tokens = [1] + [3 + sum(map(ord, w)) % 500 for w in text.split()]
            self._json(200, {"count": len(tokens), "tokens": tokens})
            return
        n = int(body["max_tokens"])
        if n in (429, 500):
            self._json(n, {"error": "scripted"})
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        if n == 777:
            time.sleep(6.0)
            return
        if n == 555:
            self.wfile.write(b"data: {not json\n\n")
            return
        for _i in range(n if n != 666 else 3):
            self.wfile.write(b'data: {"choices": [{"index": 0, "text": " w"}]}\n\n')
            self.wfile.flush()
            time.sleep(self.token_gap_s)
        if n == 666:
            return
        prompt = len(body["prompt"]) if isinstance(body["prompt"], list) else len(body["prompt"].split()) + 1
        usage = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()


def _serve() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    server, url = _serve()
    yield url
    server.shutdown()


def _run(config: ReplayConfig, out: Path, arrival: list[float], inp: list[int], outp: list[int]) -> dict:
    replayer = Replayer(config, out)
    return asyncio.run(replayer.run(np.array(arrival, float), np.array(inp), np.array(outp)))


def test_happy_path_records_timing_and_server_counts(fake_url: str, tmp_path: Path) -> None:
    cfg = ReplayConfig(endpoints=(fake_url,), metrics_interval_s=0.2)
    summary = _run(cfg, tmp_path, [0.0, 0.1, 0.3], [50, 10, 300], [5, 20, 8])
    assert summary["completed"] == 3 and summary["requests"] == 3
    assert summary["prompt_token_mismatch"] == 0 and summary["model"] == "fake"
    records = read_records(tmp_path / "requests.csv")
    for rec in records:
        assert rec.status == "ok"
        assert rec.sent_s <= rec.accepted_s <= rec.first_token_s <= rec.finish_s
        assert rec.sent_s >= rec.scheduled_s - 0.01  # never early
        assert rec.output_tokens == rec.trace_output_tokens == rec.chunks
        assert rec.prompt_tokens == rec.trace_input_tokens == rec.sent_input_tokens
    assert [r.scheduled_s for r in records] == pytest.approx([0.0, 0.1, 0.3])
    assert np.load(tmp_path / "itl.npy").size == sum(n - 1 for n in (5, 20, 8))
    assert summary["output_tokens"] == 33 and summary["ttft_p50"] > 0
    assert 0 <= summary["send_lag_p90_s"] <= summary["accept_lag_p90_s"] < 1.0  # the fake server keeps up
    assert all(v is None or math.isfinite(v) for v in summary.values() if isinstance(v, float))
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["completed"] == 3 and saved["interrupted"] is False
    timeline = load_timeline(tmp_path / "metrics.jsonl")
    assert len(timeline) >= 2 and all(line["ok"] for line in timeline)


def test_errors_are_counted_never_raised(fake_url: str, tmp_path: Path) -> None:
    cfg = ReplayConfig(endpoints=(fake_url,), timeout_s=2.0)  # the scripted hang lasts 6 s
    summary = _run(cfg, tmp_path, [0.0] * 6, [10] * 6, [429, 500, 777, 666, 555, 4])
    assert (summary["completed"], summary["refused"], summary["http_error"]) == (1, 1, 1)
    assert (summary["timeout"], summary["error"]) == (1, 2)
    by_index = {r.index: r for r in read_records(tmp_path / "requests.csv")}
    assert by_index[0].http_status == 429 and "HTTP 429" in by_index[0].error
    assert by_index[3].error == "stream ended without [DONE]"
    assert "JSONDecodeError" in by_index[4].error


def test_dead_endpoint_is_refused_and_round_robin_spreads(fake_url: str, tmp_path: Path) -> None:
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    cfg = ReplayConfig(endpoints=(fake_url, dead), metrics_interval_s=0.2)
    summary = _run(cfg, tmp_path, [0.0, 0.0, 0.0, 0.0], [10] * 4, [3] * 4)
    assert summary["completed"] == 2 and summary["refused"] == 2
    timeline = load_timeline(tmp_path / "metrics.jsonl")
    assert any(not line["ok"] and line["endpoint"] == dead for line in timeline)


def test_least_outstanding_spreads_a_burst(fake_url: str, tmp_path: Path) -> None:
    second, url2 = _serve()
    try:
        cfg = ReplayConfig(endpoints=(fake_url, url2), routing="least-outstanding")
        summary = _run(cfg, tmp_path, [0.0] * 6, [10] * 6, [30] * 6)
    finally:
        second.shutdown()
    assert summary["completed"] == 6
    ends = [r.endpoint for r in read_records(tmp_path / "requests.csv")]
    assert ends.count(fake_url) == ends.count(url2) == 3


def test_concurrency_guard_delays_sends(fake_url: str, tmp_path: Path) -> None:
    cfg = ReplayConfig(endpoints=(fake_url,), max_concurrency=1)
    _run(cfg, tmp_path, [0.0, 0.0, 0.0], [10] * 3, [20] * 3)
    recs = sorted(read_records(tmp_path / "requests.csv"), key=lambda r: r.sent_s)
    for before, after in itertools.pairwise(recs):
        assert after.sent_s >= before.finish_s - 1e-3


def test_time_scale_start_and_max_requests(fake_url: str, tmp_path: Path) -> None:
    cfg = ReplayConfig(endpoints=(fake_url,), time_scale=0.5, start_s=1.0, max_requests=2)
    summary = _run(cfg, tmp_path, [0.0, 1.0, 1.4, 2.0], [10] * 4, [2] * 4)
    recs = read_records(tmp_path / "requests.csv")
    assert summary["requests"] == 2 and [r.index for r in recs] == [1, 2]
    assert [r.scheduled_s for r in recs] == pytest.approx([0.0, 0.2])


def _chars_tokenizer(per_token: int, framing: int, vocab: int = 300):
    """A tokenizer no English BPE resembles: one token per ``per_token`` characters, ids from the
    characters, ``framing`` tokens of template (BOS included) around any text."""
    async def tokenize(body: dict) -> tuple[int, list[int]]:
        text = body["prompt"] if "prompt" in body else body["messages"][0]["content"]
        chunks = [text[k:k + per_token] for k in range(0, len(text), per_token)]
        tokens = [1] * framing + [10 + sum(map(ord, c)) % vocab for c in chunks]
        return len(tokens), tokens
    return tokenize


def test_completions_prompts_are_token_ids_of_exactly_the_length() -> None:
    builder = PromptBuilder(_chars_tokenizer(3, framing=1), seed=3)
    asyncio.run(builder.probe())
    body, n = asyncio.run(builder.build(257))
    assert n == 257 and len(body["prompt"]) == 257 and builder.overhead == 0
    assert 1 not in body["prompt"]  # the BOS the framing adds is not a filler id
    assert builder.search_calls == 0  # no /tokenize call per request


@given(st.integers(1, 7), st.integers(0, 6), st.integers(1, 3000))
def test_chat_prompts_hit_the_count_for_any_monotone_tokenizer(per_token: int, framing: int, target: int) -> None:
    builder = PromptBuilder(_chars_tokenizer(per_token, framing), api="chat", seed=per_token)
    asyncio.run(builder.probe())
    body, n = asyncio.run(builder.build(target))
    assert n == asyncio.run(_chars_tokenizer(per_token, framing)(body))[0]  # the count reported is the server's
    assert n == max(target, framing + 1)  # exact, or one character when the framing alone is longer


def test_a_tokenizer_with_too_few_ordinary_ids_is_refused_by_name() -> None:
    with pytest.raises(PromptError, match="distinct ordinary token ids"):
        asyncio.run(PromptBuilder(_chars_tokenizer(3, framing=1, vocab=4)).probe())


def test_prompts_differ_so_the_prefix_cache_cannot_help() -> None:
    builder = PromptBuilder(_chars_tokenizer(2, framing=1), seed=3)
    asyncio.run(builder.probe())
    prompts = {tuple(asyncio.run(builder.build(100))[0]["prompt"][:20]) for _ in range(50)}
    assert len(prompts) == 50
    chat = PromptBuilder(_chars_tokenizer(2, framing=1), api="chat", seed=3)
    asyncio.run(chat.probe())
    texts = {asyncio.run(chat.build(100))[0]["messages"][0]["content"][:40] for _ in range(20)}
    assert len(texts) == 20


@pytest.mark.parametrize(("field", "value"), [
    ("endpoints", ()), ("api", "grpc"), ("routing", "random"), ("time_scale", 0.0), ("timeout_s", float("nan")),
    ("start_s", -1.0), ("max_requests", 0), ("max_concurrency", 0), ("metrics_interval_s", -1.0),
], ids=lambda v: str(v))
def test_config_errors_name_the_field(field: str, value: object) -> None:
    kwargs: dict = {"endpoints": ("http://127.0.0.1:1",), field: value}
    with pytest.raises(ValueError, match=field if field != "endpoints" else "endpoint"):
        ReplayConfig(**kwargs)


def test_least_outstanding_routing() -> None:
    router = Router(("a", "b", "c"), "least-outstanding")
    router.outstanding.update(a=2, b=0, c=1)
    assert router.pick() == "b"
    rr = Router(("a", "b"), "round-robin")
    assert [rr.pick() for _ in range(4)] == ["a", "b", "a", "b"]


def test_select_requests_from_start() -> None:
    cfg = ReplayConfig(endpoints=("http://x",), start_s=2.0, max_requests=2)
    assert select_requests(np.array([0.0, 1.0, 2.0, 3.0, 4.0]), cfg).tolist() == [2, 3]


@given(st.integers(-5, 50_000), st.integers(-5, 50_000), st.one_of(st.none(), st.integers(2, 40_000)),
       st.integers(1, 30))
def test_fit_lengths_stays_in_context(inp: int, out: int, max_len: int | None, min_prompt: int) -> None:
    i, o, clipped = fit_lengths(inp, out, max_len, min_prompt)
    assert i >= min_prompt and o >= 1
    if max_len is not None and max_len > min_prompt:
        assert i + o <= max_len
    assert clipped == (max_len is not None and max(min_prompt, inp) + max(1, out) > max_len)


def test_parse_captured_vllm_metrics() -> None:
    samples, cache = parse_vllm_metrics(FIXTURE.read_text())
    assert samples['vllm:num_requests_waiting{model_name="tiny-llama"}'] > 0
    assert int(cache["num_gpu_blocks"]) > 0 and int(cache["block_size"]) > 0
    assert not any(k.endswith(("_bucket", "_created")) or ("{" in k and "engine=" in k) for k in samples)


def test_server_means_from_first_and_last_scrape() -> None:
    def line(s: float, c: float) -> dict:
        return {"ok": True, "endpoint": "e", "samples": {"vllm:time_to_first_token_seconds_sum{m=\"x\"}": s,
                                                          "vllm:time_to_first_token_seconds_count{m=\"x\"}": c}}
    means = server_means([line(1.0, 2), {"ok": False, "endpoint": "e"}, line(4.0, 8)])
    assert means["server_ttft_mean"] == pytest.approx(0.5) and means["server_itl_mean"] is None


def test_ctrl_c_writes_partial_results(fake_url: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0.0,10,5\n0.0,10,777\n30.0,10,5\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "leadscale", "replay", "--endpoint", fake_url, "--trace",
                             str(trace), "--out", str(out), "--timeout", "20"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE,
                            # a runner started in the background ignores SIGINT, and children inherit that
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 20
    while not (out / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err.decode()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert (summary["completed"], summary["cancelled"], summary["not_sent"]) == (1, 1, 1)


def test_summary_has_every_simulator_key(fake_url: str, tmp_path: Path) -> None:
    from scaler.profiles import get_profile
    from simulator.engine import simulate
    from simulator.workload import Workload

    w = Workload(np.array([0.0, 0.5]), np.array([10, 20]), np.array([5, 6]))
    simulated = set(simulate(w, get_profile("h100-llama3-8b")).summary()) - {"profile"}
    replayed = _run(ReplayConfig(endpoints=(fake_url,)), tmp_path, [0.0, 0.1], [10, 20], [5, 6])
    assert simulated <= set(replayed), sorted(simulated - set(replayed))


@pytest.mark.parametrize("extra", ["[1]", "{not json"], ids=["not-object", "not-json"])
def test_cli_rejects_bad_extra_body(extra: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from leadscale.cli import main

    rc = main(["replay", "--endpoint", "http://127.0.0.1:9", "--trace", "builtin:default", "--extra-body", extra,
               "--out", str(tmp_path)])
    assert rc == 2 and "--extra-body" in capsys.readouterr().err


def test_extra_body_reaches_every_request(fake_url: str, tmp_path: Path) -> None:
    cfg = ReplayConfig(endpoints=(fake_url,), extra_body=(("max_tokens", 429),))  # the fake refuses 429s
    summary = _run(cfg, tmp_path, [0.0, 0.0], [10, 10], [3, 3])
    assert summary["refused"] == 2 and json.loads((tmp_path / "replay.json").read_text())["config"]["extra_body"]


class DropsReusedConnections(FakeOpenAI):
    """Closes a connection, unanswered, when a second request arrives on it: the race of a server closing
    a kept-alive connection the instant the client writes on it, made certain."""

    def setup(self) -> None:
        super().setup()
        self.requests_here = 0

    def _first_on_connection(self) -> bool:
        self.requests_here += 1
        if self.requests_here > 1:
            type(self).dropped += 1
            self.close_connection = True
            return False
        return True

    dropped = 0

    def do_GET(self) -> None:
        if self._first_on_connection():
            super().do_GET()

    def do_POST(self) -> None:
        if self._first_on_connection():
            super().do_POST()


def test_the_client_never_writes_on_a_connection_the_server_may_be_closing(tmp_path: Path) -> None:
    """Model discovery, /tokenize calls, /metrics scrapes and completions each get a fresh connection, so a
    server closing an idle one (vLLM after 5 s) can never turn a replayed request into an error."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), DropsReusedConnections)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = ReplayConfig(endpoints=(f"http://127.0.0.1:{server.server_address[1]}",), metrics_interval_s=0.05)
        summary = _run(cfg, tmp_path, [0.0, 0.05, 0.1, 0.3, 0.31, 0.5], [20, 30, 5, 60, 8, 12], [4, 3, 6, 2, 5, 3])
    finally:
        server.shutdown()
    assert (summary["completed"], summary["error"], DropsReusedConnections.dropped) == (6, 0, 0)
