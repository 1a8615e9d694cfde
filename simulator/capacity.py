"""One replica's safe capacity: sweep offered load until the latency SLO breaks, report the knee.

Each step replays ``requests`` requests with lengths resampled from a trace (its length mix) at a
Poisson rate; rates rise geometrically (``factor``) from ``start_rate``. A step *meets* the SLO when
its TTFT (and TPOT, if given) at the chosen percentile is within the SLO and every request completed.
The sweep stops after two failing steps. The knee is the highest-rate step that met the SLO; the
prompt and generated tokens/s it served are the replica's capacity at that mix.

Two targets, the same sweep: a real endpoint (each step is a ``leadscale replay``) or a profile (each
step is a simulation), so the model's answer and the server's can be laid side by side.

The scaler's policy adds two utilisations, ``prompt rate / prefillTokensPerSecond`` and ``generated
rate / decodeTokensPerSecond``; at the knee that sum should be one replica. So the suggested metadata
splits the replica's time by phase: ``prefillTokensPerSecond = P / share_prefill`` and
``decodeTokensPerSecond = G / share_decode``. The shares come from vLLM's own per-request prefill and
decode time histograms (endpoint) or from the step-time model (profile). An approximation: batched
steps mix both phases, which no split describes exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from simulator.workload import Workload


@dataclass(frozen=True)
class SweepConfig:
    """The sweep; validated on construction (ValueError naming the field)."""

    slo_ttft_s: float
    slo_tpot_s: float | None = None
    percentile: int = 90
    start_rate: float = 0.5
    factor: float = 1.5
    max_steps: int = 10
    requests: int = 60
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        for name in ("slo_ttft_s", "start_rate"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                problems.append(f"{name}={value!r}: must be a finite number > 0")
        if self.slo_tpot_s is not None and not (math.isfinite(self.slo_tpot_s) and self.slo_tpot_s > 0):
            problems.append(f"slo_tpot_s={self.slo_tpot_s!r}: must be a finite number > 0")
        if self.percentile not in (50, 90, 95, 99):
            problems.append(f"percentile={self.percentile!r}: allowed 50, 90, 95, 99")
        if not (math.isfinite(self.factor) and self.factor > 1):
            problems.append(f"factor={self.factor!r}: must be > 1")
        if not (isinstance(self.max_steps, int) and 1 <= self.max_steps <= 100):
            problems.append(f"max_steps={self.max_steps!r}: must be an integer in [1, 100]")
        if not (isinstance(self.requests, int) and self.requests >= 5):
            problems.append(f"requests={self.requests!r}: must be an integer >= 5")
        if problems:
            raise ValueError("invalid capacity sweep: " + "; ".join(problems))


@dataclass(frozen=True)
class Step:
    """One load level and what the replica did at it."""

    rate: float
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    ttft: float | None
    tpot: float | None
    completed: int
    requests: int
    meets_slo: bool
    prefill_share: float | None = None


def step_workload(input_tokens: np.ndarray, output_tokens: np.ndarray, rate: float, n: int, seed: int) -> Workload:
    """``n`` Poisson arrivals at ``rate`` req/s, lengths resampled (with replacement) from the trace's."""
    rng = np.random.default_rng([seed, int(rate * 1000)])
    pick = rng.integers(len(input_tokens), size=n)
    arrival = np.cumsum(rng.exponential(1.0 / rate, size=n))
    return Workload(arrival - arrival[0], input_tokens[pick], output_tokens[pick], name=f"capacity@{rate:.3g}rps")


def judge(rate: float, summary: dict[str, Any], config: SweepConfig, prefill_share: float | None = None) -> Step:
    """A ``Step`` from a replay or simulation summary (simulator keys)."""
    q = config.percentile
    ttft, tpot = summary.get(f"ttft_p{q}"), summary.get(f"tpot_p{q}")
    requests, completed = int(summary.get("requests") or 0), int(summary.get("completed") or 0)
    ok = ttft is not None and ttft <= config.slo_ttft_s and completed == requests
    if config.slo_tpot_s is not None:
        ok = ok and tpot is not None and tpot <= config.slo_tpot_s
    prompt = summary.get("prompt_tokens_per_s")
    gen = summary.get("generation_tokens_per_s", summary.get("output_tokens_per_s"))
    if prompt is None:  # the simulator reports total and output throughput
        prompt = float(summary.get("throughput_tokens_per_s") or 0.0) - float(gen or 0.0)
    return Step(rate, float(prompt or 0.0), float(gen or 0.0), ttft, tpot, completed, requests, bool(ok),
                prefill_share)


def sweep(run_step: Callable[[Workload], tuple[dict[str, Any], float | None]], input_tokens: np.ndarray,
          output_tokens: np.ndarray, config: SweepConfig, log: Callable[[Step], None] | None = None) -> list[Step]:
    """Rising load until two steps fail (or ``max_steps``); ``run_step`` returns (summary, prefill share)."""
    steps: list[Step] = []
    failures = 0
    rate = config.start_rate
    for _ in range(config.max_steps):
        summary, share = run_step(step_workload(input_tokens, output_tokens, rate, config.requests, config.seed))
        step = judge(rate, summary, config, share)
        steps.append(step)
        if log:
            log(step)
        failures = 0 if step.meets_slo else failures + 1
        if failures >= 2:
            break
        rate *= config.factor
    return steps


def knee(steps: list[Step]) -> Step | None:
    """The highest-rate step that met the SLO (None when even the lightest load missed it)."""
    passing = [s for s in steps if s.meets_slo]
    return max(passing, key=lambda s: s.rate) if passing else None


def metadata_for(step: Step) -> dict[str, float] | None:
    """``prefillTokensPerSecond``/``decodeTokensPerSecond`` that make the knee one replica of demand."""
    share = step.prefill_share
    if share is None or not 0 < share < 1 or step.prompt_tokens_per_s <= 0 or step.generation_tokens_per_s <= 0:
        return None
    return {"prefillTokensPerSecond": float(f"{step.prompt_tokens_per_s / share:.4g}"),
            "decodeTokensPerSecond": float(f"{step.generation_tokens_per_s / (1.0 - share):.4g}")}


def report(steps: list[Step], config: SweepConfig) -> dict[str, Any]:
    best = knee(steps)
    return {"config": asdict(config), "steps": [asdict(s) for s in steps],
            "knee": asdict(best) if best else None, "scaler_metadata": metadata_for(best) if best else None}


def plot(steps: list[Step], config: SweepConfig, path: str) -> None:
    """Offered load against TTFT percentile and served tokens/s, with the SLO and the knee marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [s.rate for s in steps]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(rates, [s.ttft if s.ttft is not None else np.nan for s in steps], "o-")
    ax1.axhline(config.slo_ttft_s, color="red", linestyle="--", label=f"TTFT SLO {config.slo_ttft_s:g} s")
    ax1.set(xlabel="offered load (requests/s)", ylabel=f"TTFT p{config.percentile} (s)", yscale="log")
    ax2.plot(rates, [s.prompt_tokens_per_s for s in steps], "o-", label="prompt tokens/s")
    ax2.plot(rates, [s.generation_tokens_per_s for s in steps], "s-", label="generated tokens/s")
    ax2.set(xlabel="offered load (requests/s)", ylabel="served tokens/s")
    best = knee(steps)
    if best:
        for ax in (ax1, ax2):
            ax.axvline(best.rate, color="green", linestyle=":", label=f"knee {best.rate:.3g} req/s")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def profile_runner(profile: Any, config: SweepConfig) -> Callable[[Workload], tuple[dict[str, Any], float | None]]:
    """Steps simulated on one replica of ``profile``; the prefill share from its step-time model."""
    from simulator.engine import simulate

    st = profile.step_time

    def run(w: Workload) -> tuple[dict[str, Any], float | None]:
        summary = simulate(w, profile, replicas=1, seed=config.seed).summary(
            slo_ttft_s=config.slo_ttft_s, slo_tpot_s=config.slo_tpot_s or 1e9)
        batch = profile.max_num_seqs
        context = float(w.input_tokens.mean() + w.output_tokens.mean() / 2)
        prompt_mean = max(float(w.input_tokens.mean()), 1.0)
        chunks = math.ceil(prompt_mean / profile.max_num_batched_tokens)  # each runs one prefill
        per_prompt = (st.per_token_s + st.prefill_attention_s * prompt_mean / 2
                      + st.per_prefill_seq_s * chunks / prompt_mean)
        per_generated = st.step_time(batch, batch, batch * context, 0.0) / batch
        gen = float(summary.get("output_tokens_per_s") or 0.0)
        prompt = float(summary.get("throughput_tokens_per_s") or 0.0) - gen
        busy = prompt * per_prompt + gen * per_generated
        return summary, (prompt * per_prompt / busy) if busy > 0 else None

    return run


def endpoint_runner(replay_config: Any, out_dir: Any) -> Callable[[Workload], tuple[dict[str, Any], float | None]]:
    """Steps replayed against real endpoints (one replay folder per step under ``out_dir``); the
    prefill share from vLLM's ``request_prefill_time`` / ``request_decode_time`` histograms."""
    import asyncio
    from pathlib import Path

    from simulator.replay import Replayer

    def run(w: Workload) -> tuple[dict[str, Any], float | None]:
        step_dir = Path(out_dir) / w.name.replace("@", "-")
        summary = asyncio.run(Replayer(replay_config, step_dir).run(w.arrival_s, w.input_tokens, w.output_tokens))
        prefill, decode = summary.get("server_prefill_mean"), summary.get("server_decode_mean")
        share = prefill / (prefill + decode) if prefill and decode else None
        return summary, share

    return run
