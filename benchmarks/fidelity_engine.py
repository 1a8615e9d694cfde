"""vLLM's engine in this process, replaying requests with the engine's own per-request timestamps.

Why: on the CPU build the HTTP frontend (one Python process tokenizing, streaming and serialising every
token, on the same two cores) puts seconds into every client-side first token, and vLLM's histograms
resolve engine-side quantiles only to their buckets (20 ms apart near a CPU TTFT, 0.5 s for E2E): neither
measures the engine the simulator models (docs/real-vllm.md). vLLM's ``LLMEngine`` run in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) returns, with each finished request, the engine core's own
monotonic timestamps (``RequestStateStats``: queued, scheduled, first token, last token), on this
process's clock. Requests go in at their (scaled) trace times as token ids (no tokenizer, no sharing
between prompts: the simulator's workload without prefix blocks), and the run is written as a replay
directory (``requests.csv``, ``summary.json``, ``replay.json``, and a ``metrics.jsonl`` whose two "scrapes"
hold the exact sums and counts vLLM's histograms would) that ``leadscale calibrate`` and
``simulator.calibrate.load_replay`` read as they read ``leadscale replay``'s.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.step_log import COLUMNS as STEP_COLUMNS

FIRST_ID, VOCAB = 3, 512
"""Prompt token ids are drawn from [3, 512): the tiny model's vocabulary less its special tokens."""


@dataclass
class EngineRun:
    """One in-process replay: per-request engine times (seconds since the run began) and the queue."""

    scheduled: np.ndarray
    queued: np.ndarray
    started: np.ndarray
    first: np.ndarray
    last: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    preemptions: np.ndarray
    token_gaps: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    steps: np.ndarray = field(default_factory=lambda: np.empty((0, len(STEP_COLUMNS))))
    """One row per engine step, in ``simulator.step_log.COLUMNS`` order (the step-time model's inputs, then seconds)."""

    @property
    def max_waiting(self) -> int:
        """Most requests queued in the engine and not yet scheduled at once (vllm:num_requests_waiting)."""
        events = sorted([(t, 1) for t in self.queued] + [(t, -1) for t in self.started])
        depth = best = 0
        for _, step in events:
            depth += step
            best = max(best, depth)
        return best

    def records(self) -> list[Any]:
        """Per-request replay records (``simulator.replay_records``): engine arrival = queued, first token and
        finish = the engine's."""
        from simulator.replay_records import RequestRecord

        records = []
        for i in range(len(self.queued)):
            gaps_ok = math.isfinite(self.first[i]) and self.output[i] > 1
            records.append(RequestRecord(
                index=i, endpoint="in-process", scheduled_s=float(self.scheduled[i]), sent_s=float(self.queued[i]),
                accepted_s=float(self.queued[i]), first_token_s=float(self.first[i]), finish_s=float(self.last[i]),
                status="ok" if math.isfinite(self.last[i]) else "error", trace_input_tokens=int(self.prompt[i]),
                trace_output_tokens=int(self.output[i]), sent_input_tokens=int(self.prompt[i]),
                requested_output_tokens=int(self.output[i]), prompt_tokens=int(self.prompt[i]),
                output_tokens=int(self.output[i]), chunks=int(self.output[i]),
                itl_mean_s=float((self.last[i] - self.first[i]) / (self.output[i] - 1)) if gaps_ok else math.nan))
        return records

    def summary(self) -> dict[str, Any]:
        """The replay summary of these records (``replay_records.summarize``), ITL from every token's gap."""
        from simulator.replay_records import summarize

        return summarize(self.records(), self.wall_s, 1, itl=np.asarray(self.token_gaps, dtype=float))

    def metrics(self) -> dict[str, float | None]:
        """The fidelity table's metrics, per request (no histogram buckets)."""
        summary = self.summary()
        keys = ("ttft_p50", "ttft_p95", "itl_p50", "e2e_p50", "e2e_p95", "output_tokens_per_s")
        return {**{k: summary[k] for k in keys}, "max_waiting": float(self.max_waiting)}


class InProcessEngine:
    """``LLMEngine`` for the tiny model with the given scheduler limits (CPU build, prefix caching on)."""

    def __init__(self, model_dir: Path, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int = 2048, dtype: str = "bfloat16") -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: one clock
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.model_dir, self.max_model_len = Path(model_dir), max_model_len
        self.engine = LLMEngine.from_engine_args(EngineArgs(
            model=str(model_dir), max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len, dtype=dtype, disable_log_stats=False, gpu_memory_utilization=0.3))
        self.served = 0
        self._batch: tuple[float, float, float, float, float] | None = None
        scheduler = self.engine.engine_core.engine_core.scheduler  # the in-process core's own scheduler
        schedule = scheduler.schedule

        def schedule_and_record(*args: Any, **kwargs: Any) -> Any:
            """What the step about to run holds, in the step-time model's terms (``scaler.step_time``)."""
            out = schedule(*args, **kwargs)
            context = attention = 0.0
            prefills = 0
            for rid, k in out.num_scheduled_tokens.items():
                req = scheduler.requests[rid]
                before = req.num_computed_tokens - k  # (after schedule() it counts this step's tokens)
                if k == 1 and before >= req.num_prompt_tokens:
                    context += before
                else:
                    attention += k * (before + k / 2.0)
                    prefills += 1
            self._batch = (float(out.total_num_scheduled_tokens), float(len(out.num_scheduled_tokens)), context,
                           attention, float(prefills))
            return out

        scheduler.schedule = schedule_and_record

    def cache_config(self) -> dict[str, str]:
        """What vllm:cache_config_info would say (calibration reads num_gpu_blocks and block_size)."""
        cache = self.engine.vllm_config.cache_config
        return {"block_size": str(cache.block_size), "num_gpu_blocks": str(cache.num_gpu_blocks or 0),
                "enable_prefix_caching": str(bool(cache.enable_prefix_caching))}

    def run(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
            seed: int = 0) -> EngineRun:
        """Send request ``i`` at ``arrival_s[i]`` seconds from now; step the engine until all finish."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        n = len(arrival_s)
        rng = np.random.default_rng([seed, self.served])  # no two runs share a prompt (no prefix-cache hits)
        prompts = [rng.integers(FIRST_ID, VOCAB, int(min(p, self.max_model_len - o - 1))).tolist()
                   for p, o in zip(prompt_tokens, output_tokens, strict=True)]
        stats: dict[int, Any] = {}
        seen: dict[int, tuple[float, int]] = {}  # request -> (time of its latest tokens, tokens so far)
        gaps: list[float] = []
        steps: list[tuple[float, ...]] = []
        t0 = time.monotonic()
        sent = 0
        while len(stats) < n:
            now = time.monotonic() - t0
            while sent < n and arrival_s[sent] <= now:
                self.engine.add_request(f"r{self.served + sent}", TokensPrompt(prompt_token_ids=prompts[sent]),
                                        SamplingParams(max_tokens=int(output_tokens[sent]), ignore_eos=True))
                sent += 1
            if not self.engine.has_unfinished_requests():
                time.sleep(max(0.0, min(arrival_s[sent] - now, 0.05)) if sent < n else 0.0)
                continue
            began = time.monotonic()
            outputs = self.engine.step()
            stamp = time.monotonic() - t0
            if self._batch is not None and self._batch[1] > 0:
                steps.append((*self._batch, stamp + t0 - began))
            self._batch = None
            for out in outputs:
                i = int(out.request_id[1:]) - self.served
                count = len(out.outputs[0].token_ids) if out.outputs else 0
                before = seen.get(i)
                if before is not None and count > before[1]:
                    gaps.extend([(stamp - before[0]) / (count - before[1])] * (count - before[1]))
                if before is None or count > before[1]:
                    seen[i] = (stamp, count)
                if out.finished:
                    stats[i] = (out.metrics, count)
        wall = time.monotonic() - t0
        self.served += n

        def col(name: str) -> np.ndarray:
            return np.array([getattr(stats[i][0], name) - t0 if stats[i][0] is not None else math.nan
                             for i in range(n)])

        return EngineRun(scheduled=np.asarray(arrival_s, dtype=float), queued=col("queued_ts"),
                         started=col("scheduled_ts"), first=col("first_token_ts"), last=col("last_token_ts"),
                         prompt=np.array([len(p) for p in prompts]), output=np.array([stats[i][1] for i in range(n)]),
                         preemptions=np.array([getattr(stats[i][0], "num_preemptions", 0) for i in range(n)]),
                         token_gaps=gaps, wall_s=wall, steps=np.array(steps).reshape(-1, len(STEP_COLUMNS)))

    def write_replay(self, run: EngineRun, out: Path) -> Path:
        """The run as a replay directory (``records``, its ``summary``, the engine means and the token gaps)."""
        from simulator.replay_records import write_records
        from simulator.step_log import STEPS_FILE, write_steps

        out.mkdir(parents=True, exist_ok=True)
        write_records(out / "requests.csv", run.records())
        np.save(out / "token_gaps.npy", np.asarray(run.token_gaps, dtype=float))  # the per-token ITLs, kept
        write_steps(out / STEPS_FILE, run.steps)  # every step's batch and time: calibration fits on them
        (out / "summary.json").write_text(json.dumps(run.summary(), indent=1))
        # the engine histograms' sums and counts (what calibration's objective reads as server_* means), exact
        ok = np.isfinite(run.last)
        sums = {"vllm:time_to_first_token_seconds": (run.first - run.queued)[ok],
                "vllm:e2e_request_latency_seconds": (run.last - run.queued)[ok],
                "vllm:request_queue_time_seconds": (run.started - run.queued)[ok],
                "vllm:request_prefill_time_seconds": (run.first - run.started)[ok],
                "vllm:request_decode_time_seconds": (run.last - run.first)[ok],
                "vllm:inter_token_latency_seconds": np.asarray(run.token_gaps, dtype=float)}
        samples = {f"{name}_{kind}": float(values.sum() if kind == "sum" else values.size)
                   for name, values in sums.items() for kind in ("sum", "count")}
        samples["vllm:num_requests_waiting"] = float(run.max_waiting)
        with (out / "metrics.jsonl").open("w") as fh:
            for t, scrape in ((0.0, {}), (run.wall_s, samples)):
                fh.write(json.dumps({"t": t, "endpoint": "in-process", "ok": True, "samples": scrape}) + "\n")
        (out / "replay.json").write_text(json.dumps({
            "model": str(self.model_dir), "max_model_len": self.max_model_len, "endpoint": "in-process",
            "cache_config": {"in-process": self.cache_config()}}, indent=1))
        return out
