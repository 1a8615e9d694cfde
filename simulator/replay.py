"""Replay a trace against real OpenAI-compatible endpoints (vLLM) and measure what happened.

Each request leaves at its trace time (``time_scale`` stretches the clock: 0.5 = twice as fast),
through a concurrency guard (``max_concurrency`` requests in flight; a held request is sent late
and its ``sent_s`` says so), to one endpoint chosen round-robin or by fewest outstanding requests.
Requests stream (completions or chat) with ``max_tokens`` = the trace's output length and vLLM's
``ignore_eos``, so the server generates exactly that many tokens; prompts carry exactly the trace's
input token count (``replay_prompts``). Every endpoint's ``/metrics`` is scraped into a timeline.

Errors, HTTP refusals (429/503, connection refused) and timeouts are counted per request and never
stop the run; cancelling the run (Ctrl-C) still writes what was measured. Output in ``DIR``:
``summary.json`` (simulator keys), ``requests.csv``, ``itl.npy`` (every inter-token gap),
``metrics.jsonl`` (the timeline) and ``replay.json`` (the settings and the servers' cache config).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from simulator.replay_metrics import MetricsRecorder, counter_delta, gauge_stats, load_timeline, server_means
from simulator.replay_prompts import PromptBuilder, fit_lengths
from simulator.replay_records import RequestRecord, summarize, write_records

REFUSAL_CODES = (429, 503)


@dataclass(frozen=True)
class ReplayConfig:
    """How to replay; validated on construction (ValueError naming the field)."""

    endpoints: tuple[str, ...]
    model: str | None = None
    api: str = "completions"
    time_scale: float = 1.0
    start_s: float = 0.0
    max_requests: int | None = None
    max_concurrency: int = 256
    routing: str = "round-robin"
    timeout_s: float = 600.0
    metrics_interval_s: float = 1.0
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.2
    seed: int = 0
    extra_body: tuple[tuple[str, Any], ...] = ()
    """Fields merged into every request body, e.g. (("stream_interval", 16),) for vLLM's per-request
    streaming interval (fewer chunks: less work for a busy frontend; ITL is then per chunk)."""

    def __post_init__(self) -> None:
        problems = []
        if not self.endpoints:
            problems.append("endpoints=(): give at least one URL")
        for url in self.endpoints:
            if not url.startswith(("http://", "https://")):
                problems.append(f"endpoint={url!r}: must start with http:// or https://")
        if self.api not in ("completions", "chat"):
            problems.append(f"api={self.api!r}: allowed 'completions', 'chat'")
        if self.routing not in ("round-robin", "least-outstanding"):
            problems.append(f"routing={self.routing!r}: allowed 'round-robin', 'least-outstanding'")
        for name in ("time_scale", "timeout_s", "metrics_interval_s", "slo_ttft_s", "slo_tpot_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                problems.append(f"{name}={value!r}: must be a finite number > 0")
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            problems.append(f"start_s={self.start_s!r}: must be >= 0")
        if self.max_requests is not None and self.max_requests < 1:
            problems.append(f"max_requests={self.max_requests!r}: must be >= 1")
        if self.max_concurrency < 1:
            problems.append(f"max_concurrency={self.max_concurrency!r}: must be >= 1")
        if problems:
            raise ValueError("invalid replay config: " + "; ".join(problems))


def select_requests(arrival_s: np.ndarray, config: ReplayConfig) -> np.ndarray:
    """Indices of the trace rows to send: from ``start_s`` on, at most ``max_requests``."""
    idx = np.flatnonzero(np.asarray(arrival_s) >= config.start_s)
    return idx[: config.max_requests] if config.max_requests else idx


class Router:
    """Round-robin, or the endpoint with the fewest requests in flight (ties: the first)."""

    def __init__(self, endpoints: tuple[str, ...], policy: str) -> None:
        self.policy, self.endpoints = policy, endpoints
        self.outstanding = dict.fromkeys(endpoints, 0)
        self._cycle = itertools.cycle(endpoints)

    def pick(self) -> str:
        if self.policy == "round-robin":
            return next(self._cycle)
        return min(self.endpoints, key=lambda e: self.outstanding[e])


KEPT_ALIVE_CONNECTIONS = 0
"""Every request on its own connection, none reused. A kept-alive connection can be closed by the server
at the instant the client writes the next request on it (vLLM's API server drops idle ones after
``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s); that request then fails with no response, an error the server never
saw (1 of 30 in CI, twice, the second time with a 2 s client-side expiry). A replayed trace's requests
are independent users anyway, and a loopback TCP connect costs ~44 us (p50 of 2,000 here; p99 88 us)."""


async def discover(client: httpx.AsyncClient, endpoint: str) -> tuple[str, int | None]:
    """The first served model's id and its ``max_model_len`` (vLLM adds it to ``/v1/models``)."""
    resp = await client.get(endpoint + "/v1/models", timeout=30.0)
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data:
        raise RuntimeError(f"{endpoint}/v1/models lists no model")
    return str(data[0]["id"]), data[0].get("max_model_len")


def _is_token_chunk(obj: dict[str, Any]) -> bool:
    """A streamed chunk that carries generated output (not chat's opening role-only delta)."""
    choices = obj.get("choices") or []
    if not choices:
        return False
    delta = choices[0].get("delta")
    if delta is None:
        return True
    return not ("role" in delta and not delta.get("content"))


class Replayer:
    """One replay run; ``await run(arrival_s, input_tokens, output_tokens)`` returns the summary."""

    def __init__(self, config: ReplayConfig, out_dir: Path) -> None:
        self.config, self.out_dir = config, Path(out_dir)
        self.records: list[RequestRecord] = []
        self.itl: list[float] = []
        self.t0 = 0.0
        self.interrupted = False

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def _send(self, client: httpx.AsyncClient, rec: RequestRecord, body: dict[str, Any],
                    router: Router, guard: asyncio.Semaphore) -> None:
        path = "/v1/chat/completions" if self.config.api == "chat" else "/v1/completions"
        token_times: list[float] = []
        try:
            rec.sent_s = self.now()
            async with client.stream("POST", rec.endpoint + path, json=body) as resp:
                rec.accepted_s = self.now()
                rec.http_status = resp.status_code
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    rec.status = "refused" if resp.status_code in REFUSAL_CODES else "http_error"
                    rec.error = f"HTTP {resp.status_code}: {text[:200]}"
                    return
                status = "error"
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        status = "ok"
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        rec.error = str(obj["error"])[:200]
                        break
                    if _is_token_chunk(obj):
                        token_times.append(self.now())
                    if obj.get("usage"):
                        rec.prompt_tokens = int(obj["usage"].get("prompt_tokens", -1))
                        rec.output_tokens = int(obj["usage"].get("completion_tokens", -1))
                if status == "error" and not rec.error:
                    rec.error = "stream ended without [DONE]"
                rec.status = status if token_times else "error"
        except httpx.TimeoutException as exc:
            rec.status, rec.error = "timeout", type(exc).__name__
        except httpx.ConnectError as exc:
            rec.status, rec.error = "refused", f"ConnectError: {exc}"[:200]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            rec.status, rec.error = "error", f"{type(exc).__name__}: {exc}"[:200]
        except asyncio.CancelledError:
            rec.status, rec.error = "cancelled", "replay interrupted"
            raise
        finally:
            rec.finish_s = self.now()
            router.outstanding[rec.endpoint] -= 1
            guard.release()
            self._token_stats(rec, token_times)

    def _token_stats(self, rec: RequestRecord, token_times: list[float]) -> None:
        rec.chunks = len(token_times)
        if token_times:
            rec.first_token_s = token_times[0]
        if len(token_times) > 1:
            gaps = np.diff(np.asarray(token_times))
            self.itl.extend(gaps.tolist())
            rec.itl_mean_s, rec.itl_max_s = float(gaps.mean()), float(gaps.max())
            rec.itl_p50_s, rec.itl_p90_s = (float(x) for x in np.percentile(gaps, [50, 90]))

    async def run(self, arrival_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray) -> dict[str, Any]:
        cfg = self.config
        rows = select_requests(arrival_s, cfg)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        limits = httpx.Limits(max_connections=cfg.max_concurrency + 2 * len(cfg.endpoints) + 4,
                              max_keepalive_connections=KEPT_ALIVE_CONNECTIONS)
        timeout = httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 60.0))
        info: dict[str, Any] = {"config": asdict(self.config), "trace_rows": [int(rows[0]), int(rows[-1])]
                                if rows.size else []}
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            model, max_len = await discover(client, cfg.endpoints[0])
            model = cfg.model or model

            async def tokenize(body: dict[str, Any]) -> tuple[int, list[int]]:
                resp = await client.post(cfg.endpoints[0] + "/tokenize", json={"model": model, **body})
                resp.raise_for_status()
                answer = resp.json()
                return int(answer["count"]), [int(t) for t in answer.get("tokens") or ()]

            prompts = PromptBuilder(tokenize, api=cfg.api, seed=cfg.seed)
            await prompts.probe()
            info.update(model=model, max_model_len=max_len, prompt_overhead_tokens=prompts.overhead)
            bodies = []
            for i in rows:
                inp, out, clipped = fit_lengths(int(input_tokens[i]), int(output_tokens[i]), max_len,
                                                min_prompt=prompts.overhead + 1)
                body, n_tokens = await prompts.build(inp)
                body.update(model=model, max_tokens=out, ignore_eos=True, stream=True,
                            stream_options={"include_usage": True}, temperature=0.0)
                body.update(dict(cfg.extra_body))  # the user's fields win
                self.records.append(RequestRecord(
                    index=int(i), trace_input_tokens=int(input_tokens[i]), trace_output_tokens=int(output_tokens[i]),
                    sent_input_tokens=n_tokens, requested_output_tokens=out, clipped=clipped,
                    scheduled_s=float(arrival_s[i] - (arrival_s[rows[0]] if rows.size else 0.0)) * cfg.time_scale))
                bodies.append(body)
            info["tokenize_calls"] = prompts.search_calls
            timeline = (self.out_dir / "metrics.jsonl").open("w")
            self.t0 = time.monotonic()
            recorder = MetricsRecorder(client, cfg.endpoints, timeline, self.t0, cfg.metrics_interval_s)
            stop = asyncio.Event()
            scraper = asyncio.create_task(recorder.run(stop))
            tasks: list[asyncio.Task[None]] = []
            try:
                await self._dispatch(client, bodies, tasks)
                await asyncio.gather(*tasks)
            except asyncio.CancelledError:
                self.interrupted = True
                raise
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                wall = self.now()
                stop.set()
                try:  # the last scrape records the final counters, unless the server is too slow to answer
                    await asyncio.wait_for(asyncio.gather(scraper, return_exceptions=True), timeout=15.0)
                except TimeoutError:
                    scraper.cancel()
                timeline.close()
                info["cache_config"] = recorder.cache_config
                info["metrics_scrapes"], info["metrics_failures"] = recorder.scrapes, recorder.failures
                summary = self._write(info, wall)
        return summary

    async def _dispatch(self, client: httpx.AsyncClient, bodies: list[dict[str, Any]],
                        tasks: list[asyncio.Task[None]]) -> None:
        router = Router(self.config.endpoints, self.config.routing)
        guard = asyncio.Semaphore(self.config.max_concurrency)
        for rec, body in zip(self.records, bodies, strict=True):
            delay = rec.scheduled_s - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            await guard.acquire()
            rec.endpoint = router.pick()
            router.outstanding[rec.endpoint] += 1  # counted now, so a burst sent in one instant spreads
            tasks.append(asyncio.create_task(self._send(client, rec, body, router, guard)))

    def _write(self, info: dict[str, Any], wall: float) -> dict[str, Any]:
        """Write every output file; called on success and on interruption alike."""
        write_records(self.out_dir / "requests.csv", self.records)
        np.save(self.out_dir / "itl.npy", np.asarray(self.itl, dtype=np.float64))
        summary = summarize(self.records, wall, len(self.config.endpoints), np.asarray(self.itl),
                            self.config.slo_ttft_s, self.config.slo_tpot_s)
        timeline = load_timeline(self.out_dir / "metrics.jsonl")
        summary.update(server_means(timeline))
        preemptions = counter_delta(timeline, "vllm:num_preemptions_total")
        summary["preemptions"] = int(preemptions) if preemptions is not None else None
        summary["kv_usage_mean"], summary["kv_usage_max"] = gauge_stats(timeline, "vllm:kv_cache_usage_perc")
        hits, queries = (counter_delta(timeline, f"vllm:prefix_cache_{k}_total") for k in ("hits", "queries"))
        summary["prefix_cache_hit_rate"] = hits / queries if hits is not None and queries else None
        summary["interrupted"] = self.interrupted
        summary["model"] = info.get("model")
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (self.out_dir / "replay.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
        return summary
