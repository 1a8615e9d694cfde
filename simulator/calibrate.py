"""Fit the simulator to a replay: a performance profile whose simulation reproduces what was measured.

What is fitted, and from what:
- Scheduler limits: KV blocks and block size from ``vllm:cache_config_info`` (exact); ``max_num_seqs``
  from the most requests ever seen running (exact only if a scrape caught the scheduler full while
  others waited; vLLM does not export it, so pass the flag); ``max_num_batched_tokens`` from the
  largest step-size bucket of ``vllm:iteration_tokens_total`` that saw a step: an upper bound only (a
  frontend that lags merges iterations into one record; we saw 2048-token "steps" under a 512
  budget), so pass the flag too.
- Step time (``LinearStepTime``), from the replay's timed engine steps when it has them (``steps.csv``,
  written by an in-process run: ``simulator.step_log``; every coefficient, the floor as a knee and the
  intercept 0, by bounded least squares on each step's batch; and how the steps scatter around that fit as
  the profile's ``step_jitter``, ``simulator.step_jitter``), else ``overhead_s``, ``per_token_s``, ``per_seq_s`` and
  ``per_context_token_s`` by simulating the replayed requests (their actual send times and the
  server's token counts) and minimising the squared log-ratio of simulated to measured engine-side
  means (TTFT, E2E, queue and inter-token latency: exact sums/counts of vLLM's own histograms) and
  throughput (Nelder-Mead in log space, from a start read off those histograms). Engine-side, because
  that is what the simulator models; client percentiles are compared in the table, not fitted.
  ``floor_s``, ``intercept_s`` and ``prefill_attention_s`` stay 0: one replay's outcomes rarely separate
  them. ``--step-time`` chooses (``auto``: the steps where there are at least ``step_log.MIN_STEPS``).

NOTE: the simulator models the engine, not the HTTP frontend. What the client sees beyond the engine
(request parsing, tokenisation, streaming) is reported as ``frontend_overhead_s`` (client minus
engine mean TTFT) in the profile's ``source`` and in the table; the fit absorbs what it can of it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scaler.kv_memory import GIB, MemoryLedger
from scaler.profiles import PerformanceProfile
from scaler.step_time import LinearStepTime
from simulator.replay_metrics import histogram_delta, histogram_quantile, load_timeline, metric_sum, server_means
from simulator.replay_records import RequestRecord, read_records
from simulator.step_jitter import jitter_table
from simulator.step_log import (
    MIN_STEPS,
    PREFILL_SEQS,
    SECONDS,
    STEP_TIME_METHODS,
    STEPS_FILE,
    fit_step_time,
    modelled_seconds,
    read_steps,
)
from simulator.workload import Workload

MIN_JITTER_STEPS = 30
"""Timed steps of one kind (with or without a prefill chunk) below which calibration writes no jitter table."""
FIT_PARAMS = ("overhead_s", "per_token_s", "per_seq_s", "per_context_token_s")
# (simulator summary key, measured key): engine means come from vLLM's histograms, the rest from the client
OBJECTIVE = (("ttft_mean", "server_ttft_mean"), ("e2e_mean", "server_e2e_mean"), ("queue_mean", "server_queue_mean"),
             ("itl_mean", "server_itl_mean"), ("throughput_tokens_per_s", "throughput_tokens_per_s"))
TABLE = (("ttft_p50", "ttft_p50"), ("ttft_p90", "ttft_p90"), ("ttft_p99", "ttft_p99"), ("itl_p50", "itl_p50"),
         ("itl_p90", "itl_p90"), ("e2e_p50", "e2e_p50"), ("e2e_p90", "e2e_p90"),
         ("throughput_tokens_per_s", "throughput_tokens_per_s"), *OBJECTIVE[:4])


@dataclass(frozen=True)
class Measured:
    """A replay reduced to what calibration reads."""

    path: Path
    workload: Workload
    summary: dict[str, Any]
    engine: dict[str, float | None]
    cache: dict[str, str]
    max_running: int
    saw_waiting: bool
    max_step_tokens: int | None
    model: str
    max_model_len: int
    steps: np.ndarray | None = None
    """The timed engine steps (``step_log.COLUMNS``) when the replay has ``steps.csv``."""


def _engine_arrival(rec: RequestRecord) -> float:
    """When the engine got the request: its response headers' time (``accepted_s``), else (a replay
    written before that was recorded) when it was sent. Not the trace's time and not the send time: a
    client or frontend that falls behind hands the engine another arrival process, and the engine's
    queueing, which calibration fits, follows the arrivals it saw."""
    return rec.accepted_s if math.isfinite(rec.accepted_s) else rec.sent_s


def load_replay(path: str | Path) -> Measured:
    """Read ``summary.json``, ``requests.csv``, ``metrics.jsonl`` and ``replay.json`` of a replay dir."""
    path = Path(path)
    for name in ("summary.json", "requests.csv", "replay.json"):
        if not (path / name).is_file():
            raise ValueError(f"replay {path}: {name} is missing (run `leadscale replay --out {path}` first)")
    summary = json.loads((path / "summary.json").read_text())
    info = json.loads((path / "replay.json").read_text())
    ok = [r for r in read_records(path / "requests.csv") if r.status == "ok" and r.output_tokens > 0]
    if len(ok) < 5:
        raise ValueError(f"replay {path}: only {len(ok)} completed requests; calibration needs at least 5")
    arrival = np.array([_engine_arrival(r) for r in ok])
    order = np.argsort(arrival, kind="stable")
    ok = [ok[i] for i in order]
    workload = Workload(arrival[order] - arrival[order][0], np.array([max(1, r.prompt_tokens) for r in ok]),
                        np.array([r.output_tokens for r in ok]), name=f"replay:{path.name}")
    timeline = load_timeline(path / "metrics.jsonl")
    running = [metric_sum(x["samples"], "vllm:num_requests_running") or 0.0 for x in timeline if x.get("ok")]
    waiting = [metric_sum(x["samples"], "vllm:num_requests_waiting") or 0.0 for x in timeline if x.get("ok")]
    busy = [r for r, w in zip(running, waiting, strict=True) if w > 0]
    engine: dict[str, float | None] = dict(server_means(timeline))
    itl_hist = histogram_delta(timeline, "vllm:inter_token_latency_seconds")
    ttft_hist = histogram_delta(timeline, "vllm:time_to_first_token_seconds")
    for q in (50, 90):
        engine[f"itl_p{q}"] = histogram_quantile(q / 100, *itl_hist)
        engine[f"ttft_p{q}"] = histogram_quantile(q / 100, *ttft_hist)
    bounds, cumulative = histogram_delta(timeline, "vllm:iteration_tokens_total")
    seen = bounds[np.flatnonzero(np.diff(np.concatenate([[0.0], cumulative])) > 0)] if bounds.size else bounds
    finite = seen[np.isfinite(seen)][-1:]
    caches = list((info.get("cache_config") or {}).values())
    return Measured(path=path, workload=workload, summary=summary, engine=engine, cache=caches[0] if caches else {},
                    max_running=int(max(running or [1])), saw_waiting=bool(busy),
                    max_step_tokens=int(finite[0]) if finite.size else None, model=str(info.get("model", "")),
                    max_model_len=int(info.get("max_model_len") or 4096),
                    steps=read_steps(path / STEPS_FILE) if (path / STEPS_FILE).is_file() else None)


def with_steps(measured: Measured, paths: Sequence[str | Path]) -> Measured:
    """``measured`` with the timed steps in ``paths`` (``steps.csv`` files of the same replica and settings)
    pooled with its own for the step-time fit; each file is checked as ``read_steps`` checks the replay's."""
    if not paths:
        return measured
    pooled = [measured.steps] if measured.steps is not None else []
    pooled += [read_steps(path) for path in paths]
    return dataclasses.replace(measured, steps=np.concatenate(pooled))


def memory_from_cache(cache: dict[str, str], replicas_kv_tokens_floor: int) -> MemoryLedger:
    """A ledger whose ``num_gpu_blocks`` equals the server's; falls back to ``replicas_kv_tokens_floor``."""
    block = int(cache.get("block_size") or 16)
    blocks = int(cache.get("num_gpu_blocks") or 0) or -(-replicas_kv_tokens_floor // block)
    kv_bytes = int(float(cache.get("kv_cache_memory_bytes") or 0))
    tokens = int(cache.get("kv_cache_size_tokens") or 0) or blocks * block
    per_token = max(1, kv_bytes // tokens) if kv_bytes and tokens else 2048
    kv_gib = blocks * block * per_token / GIB
    weights = 0.001  # the ledger needs weights > 0; the KV budget is what matters here
    return MemoryLedger(gpu_memory_gib=(kv_gib + weights) * (1 + 1e-9) + 1e-12, gpu_memory_utilization=1.0,
                        weights_gib=weights, activation_gib=0.0, kv_bytes_per_token=int(per_token), block_size=block)


def scheduler_limits(m: Measured, max_num_seqs: int | None, max_num_batched_tokens: int | None) -> tuple[int, int, str]:
    """(max_num_seqs, max_num_batched_tokens, how each was found)."""
    seqs = max_num_seqs or max(1, m.max_running)
    how_seqs = "given" if max_num_seqs else f"most running seen ({m.max_running}, a lower bound)"
    budget = max_num_batched_tokens or max(m.max_step_tokens or 2048, 16)
    how_budget = "given" if max_num_batched_tokens else (
        f"largest vllm:iteration_tokens_total bucket used ({m.max_step_tokens}, an upper bound)"
        if m.max_step_tokens else "vLLM's default 2048")
    return int(seqs), int(budget), f"max_num_seqs: {how_seqs}; max_num_batched_tokens: {how_budget}"


def initial_step_time(m: Measured, seqs: int) -> LinearStepTime:
    """A start for the fit from the engine's histograms: ITL = one decode step at a typical batch."""
    itl = m.engine.get("server_itl_mean") or m.summary.get("itl_p50") or 0.01
    batch = max(1.0, min(float(seqs), float(m.max_running)))
    prompt = float(np.mean(m.workload.input_tokens))
    prefill = m.engine.get("server_prefill_mean") or 2 * itl
    return LinearStepTime(overhead_s=0.7 * itl, floor_s=0.0, intercept_s=0.0,
                          per_token_s=max(1e-8, (prefill - itl) / max(prompt, 1.0)),
                          per_seq_s=0.3 * itl / batch, per_context_token_s=1e-9, prefill_attention_s=0.0)


def build_profile(m: Measured, step: LinearStepTime, seqs: int, budget: int, note: str,
                  name: str = "calibrated", how: str = "fitted by simulation (simulator/calibrate.py)"
                  ) -> PerformanceProfile:
    memory = memory_from_cache(m.cache, m.max_model_len)
    front = None
    server_ttft = m.engine.get("server_ttft_mean")
    if m.summary.get("ttft_p50") is not None and server_ttft is not None:
        front = float(np.mean([m.summary["ttft_p50"]])) - float(server_ttft)
    source = (f"calibrated by `leadscale calibrate` on replay {m.path} ({len(m.workload)} requests). {note}. "
              f"KV: vllm:cache_config_info (num_gpu_blocks {memory.num_gpu_blocks}, block {memory.block_size}). "
              f"Step time {how}."
              + (f" Client TTFT p50 minus engine mean TTFT (frontend, not modelled): {front:.3f} s." if front else ""))
    return PerformanceProfile(name=name, gpu="measured", model=m.model, step_time=step, memory=memory,
                              max_num_seqs=seqs, max_num_batched_tokens=budget,
                              max_model_len=min(m.max_model_len, memory.kv_cache_tokens), source=source)


def simulate_replay(profile: PerformanceProfile, m: Measured) -> dict[str, Any]:
    """The simulator's summary for the replayed requests on one replica of ``profile`` (+ ``itl_mean``)."""
    from simulator.engine import simulate

    result = simulate(m.workload, profile, replicas=1, seed=0)
    summary = result.summary(slo_ttft_s=float(m.summary.get("slo_ttft_s") or 2.0),
                             slo_tpot_s=float(m.summary.get("slo_tpot_s") or 0.2))
    hist = result.itl
    hist.percentile(50)  # bins the runs still pending
    counts = hist.counts[1:-1]
    centers = np.sqrt(hist.edges[:-1] * hist.edges[1:])
    summary["itl_mean"] = float((counts * centers).sum() / counts.sum()) if counts.sum() > 0 else None
    return summary


def measured_value(m: Measured, key: str) -> float | None:
    """A client-side summary value, or an engine-side one (``server_*`` keys)."""
    value = m.engine.get(key) if key.startswith("server_") else m.summary.get(key)
    return float(value) if value is not None else None


def step_resolution(m: Measured) -> float:
    """The shortest time the measurement resolves: one engine step (the mean inter-token latency)."""
    itl = m.engine.get("server_itl_mean") or m.summary.get("itl_mean") or m.summary.get("itl_p50")
    return float(itl) if itl is not None and itl > 0 else 0.0


def _loss(sim: dict[str, Any], m: Measured) -> float:
    """Sum of squared log ratios, simulated over measured. Latencies below one engine step are compared at
    that step: a queue of 20 us against one of 100 us is no difference a replay measures (both mean "scheduled
    in the step it arrived"), yet as a log ratio it outweighed a threefold error in the inter-token latency
    and pulled the fit's step time down to shorten it (measured in-process: ITL -70 %, queue mean +400 %)."""
    total, floor = 0.0, step_resolution(m)
    for sim_key, key in OBJECTIVE:
        want, got = measured_value(m, key), sim.get(sim_key)
        if want is None or want <= 0:
            continue
        if got is None or got <= 0:
            total += 25.0
            continue
        if key not in ("throughput_tokens_per_s", "server_itl_mean"):  # (the step itself is what is resolved)
            want, got = max(want, floor), max(got, floor)
        total += math.log(got / want) ** 2
    return total


def measured_jitter(model: LinearStepTime, steps: np.ndarray) -> dict[str, tuple[tuple[float, ...], str]]:
    """The profile's two jitter tables (``step_jitter``: steps without a prefill chunk; ``prefill_step_jitter``:
    steps with one), each from the real / modelled times of its own steps, and a note on each for the source. A
    kind with fewer than ``MIN_JITTER_STEPS`` steps gets none (its steps take the model's time): a hundred
    quantiles of a handful of steps would be the handful."""
    ratios = steps[:, SECONDS] / modelled_seconds(model, steps)
    prefill = steps[:, PREFILL_SEQS] > 0
    out: dict[str, tuple[tuple[float, ...], str]] = {}
    for key, kind, mask in (("step_jitter", "decode", ~prefill), ("prefill_step_jitter", "prefill", prefill)):
        mine = ratios[mask]
        if mine.size < MIN_JITTER_STEPS:
            out[key] = ((), f"{kind} steps: {mine.size} timed, too few for a jitter table (need {MIN_JITTER_STEPS})")
            continue
        p10, p50, p90 = np.quantile(mine / mine.mean(), [0.1, 0.5, 0.9])
        out[key] = (jitter_table(mine), f"{kind} step jitter over {mine.size} steps: real / modelled p10 {p10:.3f}, "
                                        f"p50 {p50:.3f}, p90 {p90:.3f} of its mean")
    return out


def step_time_method(m: Measured, method: str) -> str:
    """``steps`` or ``outcomes``: what ``fit`` fits the step time on, given ``--step-time`` (``method``)."""
    if method not in STEP_TIME_METHODS:
        raise ValueError(f"step_time={method!r}: expected one of {', '.join(STEP_TIME_METHODS)}")
    have = 0 if m.steps is None else int(m.steps.shape[0])
    if method == "steps" and have < MIN_STEPS:
        raise ValueError(f"step_time='steps': replay {m.path} has {have} timed steps in {STEPS_FILE} (need at least "
                         f"{MIN_STEPS}; only an in-process engine run writes them); use 'outcomes' or 'auto'")
    if method == "auto":
        return "steps" if have >= MIN_STEPS else "outcomes"
    return method


def fit(m: Measured, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
        max_evals: int = 120, step_time: str = "auto") -> PerformanceProfile:
    """The calibrated profile: the step time fitted on the replay's timed steps (``step_time_method``), else
    by Nelder-Mead over its coefficients (log space) on the simulated replay's outcomes."""
    from scipy.optimize import minimize

    seqs, budget, note = scheduler_limits(m, max_num_seqs, max_num_batched_tokens)
    if step_time_method(m, step_time) == "steps":
        assert m.steps is not None
        model, residuals = fit_step_time(m.steps)
        jitter = measured_jitter(model, m.steps)
        profile = build_profile(m, model, seqs, budget, note, how=(
            f"fitted on the replay's {residuals.describe()} (simulator/step_log.py); "
            + "; ".join(note for _, note in jitter.values()) + " (simulator/step_jitter.py)"))
        return dataclasses.replace(profile, step_jitter=jitter["step_jitter"][0],
                                   prefill_step_jitter=jitter["prefill_step_jitter"][0])
    start = initial_step_time(m, seqs)
    base = start.to_dict()

    def profile_of(x: np.ndarray) -> PerformanceProfile:
        coeffs = {**base, **{k: float(math.exp(v)) for k, v in zip(FIT_PARAMS, x, strict=True)}}
        return build_profile(m, LinearStepTime(**coeffs), seqs, budget, note)

    def objective(x: np.ndarray) -> float:
        if np.any(np.abs(x) > 40):
            return 1e6
        return _loss(simulate_replay(profile_of(x), m), m)

    x0 = np.log([max(base[k], 1e-12) for k in FIT_PARAMS])
    best = minimize(objective, x0, method="Nelder-Mead",
                    options={"maxfev": max_evals, "xatol": 0.02, "fatol": 1e-4, "initial_simplex": None})
    return profile_of(best.x)


def fidelity(m: Measured, sim: dict[str, Any]) -> list[tuple[str, float | None, float | None, float | None]]:
    """(metric, measured, simulated, relative error) for the table; error None when undefined."""
    rows = []
    for sim_key, key in TABLE:
        want, got = measured_value(m, key), sim.get(sim_key)
        err = (got - want) / want if want and got is not None else None
        rows.append((sim_key + (" (engine)" if key.startswith("server_") else ""), want, got, err))
    return rows


def format_table(rows: list[tuple[str, float | None, float | None, float | None]]) -> str:
    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.4g}"

    lines = [f"{'metric':<28}{'measured':>12}{'simulated':>12}{'rel. error':>12}"]
    for name, want, got, err in rows:
        lines.append(f"{name:<28}{cell(want):>12}{cell(got):>12}{'-' if err is None else f'{err:+.1%}':>12}")
    return "\n".join(lines)
