"""Overload rejection: the gateway's waiting-token limit at which accepted requests meet the SLO.

A gateway that answers 429 beyond a queue limit trades rejected requests for on-time ones: while
replicas start, everything accepted waits behind what is already queued. ``candidates`` spans the
limit around its natural scale, the prompt tokens one replica prefills within the wait the SLO
leaves a request (``wait budget × prefill rate``, the budget as the policy computes it:
``max(TTFT − own prefill, TTFT/10)`` at the workload's mean prompt length). ``recommend`` picks,
from one simulated run per candidate (the gateway's limit in ``EngineConfig.waiting_tokens_limit``):

- the **largest** limit whose accepted requests that arrived *while replicas were starting* met the
  SLO at the target attainment (as few rejections as that allows);
- none meets it: the smallest limit tried (flagged ``meets=False``);
- every one does, unlimited included: no limit is needed on this traffic; the largest candidate is
  still given as a guard against surges beyond the trace (flagged ``needed=False``).

The runs start from half the warm fleet the first minutes need (at least one replica), so replicas
are starting at once and the limit is tested exactly where it matters.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np

from scaler.profiles import PerformanceProfile

FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
MIN_STARTING_REQUESTS = 20
"""Fewer accepted requests than this arriving while replicas start: the run cannot judge a limit."""


@dataclass(frozen=True)
class LimitRun:
    """One candidate limit (None: no limit) and what its run did."""

    limit_tokens_per_replica: float | None
    rejected_share: float
    attainment_accepted: float | None
    """Share of accepted requests whose first token came within the TTFT SLO (the wait a limit bounds)."""
    attainment_while_starting: float | None
    """The same for accepted requests that arrived while a replica was starting."""
    requests_while_starting: int
    ttft_p95_accepted: float | None
    gpu_hours: float


@dataclass(frozen=True)
class LimitAdvice:
    """The recommended limit and the evidence (every candidate's run)."""

    limit_tokens_per_replica: float
    limit_requests_per_replica: float
    """The same limit in waiting requests per replica (÷ the mean prompt), for gateways that count requests."""
    natural_tokens_per_replica: float
    meets: bool
    needed: bool
    target: float
    runs: tuple[LimitRun, ...]

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "runs"}, "runs": [asdict(r) for r in self.runs]}

    def lines(self) -> list[str]:
        verdict = ("Accepted requests meet the target while replicas start" if self.meets else
                   "WARNING: even the smallest limit tried leaves accepted requests late while replicas start")
        if not self.needed:
            verdict = ("No limit was needed on this traffic (unlimited also met the target); the largest candidate "
                       "is a guard against surges beyond it")
        rows = [f"Recommended gateway limit: {self.limit_tokens_per_replica:.0f} waiting prompt tokens per ready "
                f"replica (about {self.limit_requests_per_replica:.1f} waiting requests per replica at this mean "
                f"prompt); the gateway answers 429 beyond it. {verdict} (target {self.target:g}).", "",
                "| limit (tokens/replica) | rejected share | accepted with TTFT <= SLO | the same while replicas start "
                "(requests) | p95 TTFT accepted (s) | GPU-hours |", "|---|---|---|---|---|---|"]
        for r in self.runs:
            name = "none" if r.limit_tokens_per_replica is None else f"{r.limit_tokens_per_replica:.0f}"
            rows.append(f"| {name} | {r.rejected_share:.4f} | {_num(r.attainment_accepted)} | "
                        f"{_num(r.attainment_while_starting)} ({r.requests_while_starting}) | "
                        f"{_num(r.ttft_p95_accepted, '.2f')} | {r.gpu_hours:.2f} |")
        return rows


def _num(value: float | None, fmt: str = ".4f") -> str:
    return "n/a" if value is None else format(value, fmt)


def natural_limit(workload: Any, profile: PerformanceProfile, slo_ttft_s: float) -> float:
    """Prompt tokens one replica prefills within the wait budget of the SLO at the mean prompt."""
    capacity = profile.capacity(slo_ttft_s)
    mean_prompt = float(np.mean(workload.input_tokens)) if len(workload) else 0.0
    own = mean_prompt * capacity.prefill_cost_factor(mean_prompt) / capacity.prefill_tokens_per_s
    budget = max(slo_ttft_s - own, slo_ttft_s / 10.0)
    return budget * capacity.prefill_tokens_per_s / capacity.prefill_cost_factor(mean_prompt)


def candidates(workload: Any, profile: Any, slo_ttft_s: float) -> list[float]:
    """Limits around the natural one, two significant figures."""
    base = natural_limit(workload, profile, slo_ttft_s)
    return [float(f"{base * f:.2g}") for f in FACTORS]


def judge(limit: float | None, result: Any, slo_ttft_s: float) -> LimitRun:
    """A candidate's numbers from its ``AutoscaleResult`` (accepted = not rejected)."""
    s = result.summary
    arrival, ttft = np.asarray(result.arrival_s), np.asarray(result.ttft_s)
    tl = result.timeline
    starting_at = np.interp(arrival, tl["t"], tl["starting"]) if len(tl["t"]) else np.zeros_like(arrival)
    rejected = _rejected_mask(result)
    while_starting = (starting_at > 0) & ~rejected
    on_time = np.nan_to_num(ttft, nan=np.inf) <= slo_ttft_s
    accepted_ttft = ttft[~rejected & np.isfinite(ttft)]
    accepted = ~rejected
    return LimitRun(limit, float(s.get("rejected_share") or 0.0),
                    float(on_time[accepted].mean()) if accepted.any() else None,
                    float(on_time[while_starting].mean()) if while_starting.any() else None,
                    int(while_starting.sum()), float(np.percentile(accepted_ttft, 95)) if accepted_ttft.size else None,
                    float(s.get("gpu_hours") or 0.0))


def _rejected_mask(result: Any) -> np.ndarray:
    """Requests the run rejected (the result keeps them as NaN TTFT with a status the summary counted)."""
    status = getattr(result, "status", None)
    if status is not None:
        from simulator.results import REJECTED

        return cast(np.ndarray, np.asarray(status) == REJECTED)
    return np.zeros(len(result.arrival_s), dtype=bool)


def recommend(runs: list[LimitRun], workload: Any, profile: Any, slo_ttft_s: float, target: float) -> LimitAdvice:
    """The largest limit whose accepted requests met ``target`` while replicas started (module docstring)."""
    limited = sorted((r for r in runs if r.limit_tokens_per_replica is not None),
                     key=lambda r: r.limit_tokens_per_replica or 0.0)
    if not limited:
        raise ValueError("recommend(): no run with a limit")

    def ok(r: LimitRun) -> bool:
        if r.requests_while_starting < MIN_STARTING_REQUESTS:
            return r.attainment_accepted is not None and r.attainment_accepted >= target
        return r.attainment_while_starting is not None and r.attainment_while_starting >= target

    passing = [r for r in limited if ok(r)]
    unlimited = [r for r in runs if r.limit_tokens_per_replica is None]
    needed = not (unlimited and ok(unlimited[0]))
    pick = passing[-1] if passing else limited[0]
    limit = float(pick.limit_tokens_per_replica or 0.0)
    mean_prompt = float(np.mean(workload.input_tokens)) if len(workload) else 1.0
    return LimitAdvice(limit, limit / max(mean_prompt, 1.0), natural_limit(workload, profile, slo_ttft_s),
                       bool(passing), needed, target, tuple(limited + unlimited))


def plot(advice: LimitAdvice, path: Any) -> None:
    """Rejected share and accepted attainment while replicas start, against the limit; the pick marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limited = [r for r in advice.runs if r.limit_tokens_per_replica is not None]
    x = [r.limit_tokens_per_replica for r in limited if r.limit_tokens_per_replica is not None]  # all: typed float
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [r.rejected_share for r in limited], "o-", color="tab:red", label="rejected share (429)")
    ax.set_xscale("log")
    ax.set_xlabel("gateway limit (waiting prompt tokens per ready replica)")
    ax.set_ylabel("rejected share")
    twin = ax.twinx()
    twin.plot(x, [r.attainment_while_starting if r.attainment_while_starting is not None else math.nan
                  for r in limited], "s--", color="tab:blue", label="accepted on time while replicas start")
    twin.axhline(advice.target, color="tab:blue", ls=":", lw=0.8)
    twin.set_ylabel("SLO attainment of accepted requests")
    unlimited = [r for r in advice.runs if r.limit_tokens_per_replica is None]
    if unlimited and unlimited[0].attainment_while_starting is not None:
        twin.axhline(unlimited[0].attainment_while_starting, color="grey", ls="--", lw=0.8, label="no limit")
    ax.axvline(advice.limit_tokens_per_replica, color="green", ls=":", label="recommended")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
