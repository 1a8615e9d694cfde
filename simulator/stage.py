"""The first steps of the production path: one replica's safe capacity, then a fixed two-replica stage.

A serving team measures what one replica sustains within the SLO, runs a fixed stage of two replicas
(to check routing and drain) and only then autoscales. ``stage_report(workload, profile, slo)``
answers both for a workload, before any autoscaling advice:

- **One replica at the SLO**: the capacity model's rates (``ReplicaCapacity``: prefill and decode
  tokens/s within the SLO, the KV cache, ``max_num_seqs``) and the measured knee: the highest Poisson
  rate of this workload's own length mix one simulated replica serves with p95 TTFT within the SLO
  (``simulator.capacity.sweep``, rates rising by ``STEP_FACTOR`` from half the model's rate, each step
  about ``STEP_SECONDS`` long), in requests/s and tokens/s.
- **The fixed stage** (``replicas``, default 2) serving the whole workload: SLO attainment, p95 TTFT,
  rejections; its **headroom**, ``1 - demand / replicas`` with the demand in replica units from the
  capacity model per 30 s bucket: at the peak bucket (negative: the stage is short) and at the
  median one; and the largest multiple of this traffic the stage carries at its peak
  (``replicas / peak demand``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

STEP_FACTOR = 1.15
STEP_SECONDS = 120.0
"""Each load step lasts about this long at the model's rate: a queue that grows slowly must have time to
show (a few hundred requests at a high rate end before an overload makes first tokens late)."""


@dataclass(frozen=True)
class OneReplica:
    """What one replica sustains within the SLO."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    kv_cache_tokens: int
    max_num_seqs: int
    knee_requests_per_s: float | None
    """The highest rate of this length mix one replica served with p95 TTFT within the SLO."""
    knee_prompt_tokens_per_s: float | None
    knee_generation_tokens_per_s: float | None
    knee_ttft_p95_s: float | None


@dataclass(frozen=True)
class FixedStage:
    """A fixed fleet of ``replicas`` serving the whole workload."""

    replicas: int
    slo_attainment: float | None
    ttft_p95_s: float | None
    rejected: int
    gpu_hours: float
    peak_demand_replicas: float
    median_demand_replicas: float
    headroom_at_peak: float
    """1 - peak demand / replicas: the stage's spare capacity at the busiest 30 s (negative: short)."""
    headroom_median: float
    load_multiple: float | None
    """How many times this traffic the stage carries at its peak (replicas / peak demand)."""
    meets_slo: bool


@dataclass(frozen=True)
class StageReport:
    """Both answers; ``lines()`` is the report's first section."""

    slo_ttft_s: float
    one: OneReplica
    fixed: FixedStage

    def to_json(self) -> dict[str, Any]:
        return {"slo_ttft_s": self.slo_ttft_s, "one_replica": asdict(self.one), "fixed_stage": asdict(self.fixed)}

    def lines(self) -> list[str]:
        """Markdown: one replica's capacity, then the fixed stage (shared by advise, tune and compare)."""
        one, fixed = self.one, self.fixed
        knee = (f"{one.knee_requests_per_s:.3g} requests/s of this length mix ({one.knee_prompt_tokens_per_s:.0f} "
                f"prompt + {one.knee_generation_tokens_per_s:.0f} generated tokens/s, p95 TTFT "
                f"{one.knee_ttft_p95_s:.2f} s)" if one.knee_requests_per_s is not None and one.knee_ttft_p95_s
                is not None else "not reached: one replica misses the SLO even at the lightest load tried")
        verdict = "meets" if fixed.meets_slo else "MISSES"
        multiple = f"{fixed.load_multiple:.2f}x" if fixed.load_multiple is not None else "n/a"
        return [
            f"One replica at the SLO (p95 TTFT <= {self.slo_ttft_s:g} s): capacity model "
            f"{one.prefill_tokens_per_s:.0f} prefill and {one.decode_tokens_per_s:.0f} decode tokens/s, KV cache "
            f"{one.kv_cache_tokens} tokens, max_num_seqs {one.max_num_seqs}; measured knee: {knee}.",
            "",
            "| fixed stage | replicas | SLO attainment | p95 TTFT (s) | rejected | GPU-hours | peak demand (replicas) "
            "| headroom at peak | median headroom | carries up to |",
            "|---|---|---|---|---|---|---|---|---|---|",
            f"| {verdict} the SLO | {fixed.replicas} | {_num(fixed.slo_attainment, '.4f')} | "
            f"{_num(fixed.ttft_p95_s, '.2f')} | {fixed.rejected} | {fixed.gpu_hours:.2f} | "
            f"{fixed.peak_demand_replicas:.2f} | {fixed.headroom_at_peak:+.0%} | {fixed.headroom_median:+.0%} | "
            f"{multiple} this traffic |",
        ]


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def one_replica(workload: Any, profile: Any, slo_ttft_s: float, slo_tpot_s: float | None = None,
                seed: int = 0) -> OneReplica:
    """The capacity model's numbers and the simulated knee on this workload's length mix."""
    from simulator import oracle
    from simulator.capacity import SweepConfig, knee, profile_runner, sweep

    capacity = profile.capacity(slo_ttft_s)
    work = oracle.request_work(workload.input_tokens, workload.output_tokens, capacity, profile)
    estimate = 1.0 / max(float(np.mean(work)), 1e-9)  # requests/s the capacity model says one replica carries
    requests = int(min(max(estimate * STEP_SECONDS, 400), 20_000))
    config = SweepConfig(slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, percentile=95, start_rate=estimate * 0.5,
                         factor=STEP_FACTOR, max_steps=12, requests=requests, seed=seed)
    best = knee(sweep(profile_runner(profile, config), workload.input_tokens, workload.output_tokens, config))
    return OneReplica(capacity.prefill_tokens_per_s, capacity.decode_tokens_per_s, capacity.kv_cache_tokens,
                      capacity.max_num_seqs, best.rate if best else None,
                      best.prompt_tokens_per_s if best else None, best.generation_tokens_per_s if best else None,
                      best.ttft if best else None)


def fixed_stage(workload: Any, profile: Any, slo_ttft_s: float, slo_tpot_s: float = 0.1, seed: int = 0,
                replicas: int = 2) -> FixedStage:
    """``replicas`` fixed replicas serving ``workload``, and their headroom against its demand."""
    from simulator.autoscale import run_autoscaled
    from simulator.oracle import BUCKET_S, bucket_need, request_work

    if not (isinstance(replicas, int) and replicas >= 1):
        raise ValueError(f"replicas={replicas!r}: the fixed stage needs an integer >= 1")
    run = run_autoscaled(workload, profile, f"fixed:{replicas}", "fixed:1", slo_ttft_s, seed,
                         initial_replicas=replicas, drain_grace_s=0.0, backend_options={"slo_tpot_s": slo_tpot_s})
    work = request_work(workload.input_tokens, workload.output_tokens, profile.capacity(slo_ttft_s), profile)
    need = bucket_need(workload.arrival_s, work, max(float(workload.duration_s), BUCKET_S))
    peak, median = float(need.max()) if need.size else 0.0, float(np.median(need)) if need.size else 0.0
    p95 = run.summary.get("ttft_p95")
    meets = p95 is not None and math.isfinite(p95) and p95 <= slo_ttft_s
    return FixedStage(replicas, run.summary.get("slo_attainment"), p95, int(run.summary.get("rejected") or 0),
                      float(run.summary["gpu_hours"]), peak, median, 1.0 - peak / replicas, 1.0 - median / replicas,
                      replicas / peak if peak > 0 else None, meets)


def stage_report(workload: Any, profile: Any, slo_ttft_s: float, slo_tpot_s: float = 0.1, seed: int = 0,
                 replicas: int = 2) -> StageReport:
    """One replica's capacity and the fixed stage for ``workload`` (see the module docstring)."""
    return StageReport(slo_ttft_s, one_replica(workload, profile, slo_ttft_s, slo_tpot_s, seed),
                       fixed_stage(workload, profile, slo_ttft_s, slo_tpot_s, seed, replicas))
