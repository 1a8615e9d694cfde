"""How right the policy's capacity model is, per length mix: the simulator's truth against the model.

For each length mix, the highest Poisson rate at which ``--replicas`` fixed replicas keep p95 TTFT
within the SLO is found by bisection (the simulator's own answer: what the fleet really sustains).
That rate's token work is then counted in the policy's replica units (``scaler.capacity``: prefill
with the attention term, decode with and without the decode-context term). A perfect model gives
1.00 replica unit per replica on every mix; the spread across mixes is what the online efficiency
correction has to absorb.

Run from the project root: ``python benchmarks/bench_capacity_model.py [--profile h100-llama3-8b]
[--replicas 4] [--only azure,arxiv]`` (about a minute on 2 cores). The arXiv mix reads
``../shared/traces/arxiv_summarization_lengths.csv``.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
MIXES = {
    "azure": "in_mean=1155&in_median=1020&out_mean=211&out_median=129",
    "code": "in_mean=2048&in_median=1500&in_max=7437&out_mean=28&out_median=13",
    "arxiv": f"lengths={TRACES / 'arxiv_summarization_lengths.csv'}",
    "long-output": "in_mean=300&in_median=200&out_mean=800&out_median=600",
    "chat+5%-summaries": "in_mean=1155&in_median=1020&out_mean=211&out_median=129&long_share=0.05",
    "8k-prompts": "in_mean=8000&in_median=7000&in_max=32000&out_mean=200&out_median=150",
}
DURATION_S = 600.0


def p95_at(mix: str, rate: float, profile_name: str, replicas: int, slo: float) -> float:
    from scaler.profiles import get_profile
    from simulator.engine import simulate
    from simulator.synthetic import from_spec

    w = from_spec(f"builtin:poisson?rate={rate}&duration={DURATION_S}&{MIXES[mix]}", seed=1)
    p95 = simulate(w, get_profile(profile_name), replicas=replicas).summary(slo_ttft_s=slo)["ttft_p95"]
    return float("inf") if p95 is None else float(p95)


def units(mix: str, rate: float, profile_name: str, replicas: int, slo: float) -> tuple[float, float, float]:
    """(replica units per replica without / with the decode-context term, mean decode context)."""
    from scaler.profiles import get_profile
    from simulator.synthetic import from_spec

    w = from_spec(f"builtin:poisson?rate={rate}&duration={DURATION_S}&{MIXES[mix]}", seed=1)
    cap = get_profile(profile_name).capacity(slo)
    inp, out = w.input_tokens.astype(float), w.output_tokens.astype(float)
    prefill = inp.sum() * cap.prefill_cost_factor(float((inp ** 2).sum() / inp.sum())) / cap.prefill_tokens_per_s
    context = float(inp.mean() + out.mean() / 2.0)
    decode = out.sum() / cap.decode_tokens_per_s
    per = DURATION_S * replicas
    return (prefill + decode) / per, (prefill + decode * cap.decode_cost_factor(context)) / per, context


def knee(job: tuple[str, str, int, float]) -> tuple[str, float, tuple[float, float, float]]:
    mix, profile_name, replicas, slo = job
    low, high = 0.5, 1000.0
    for _ in range(12):  # geometric bisection: 0.3 % resolution
        mid = (low * high) ** 0.5
        if p95_at(mix, mid, profile_name, replicas, slo) <= slo:
            low = mid
        else:
            high = mid
    return mix, low, units(mix, low, profile_name, replicas, slo)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="h100-llama3-8b")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--slo-ttft", type=float, default=2.0)
    parser.add_argument("--only", default="", help=f"comma-separated mixes (default all: {', '.join(MIXES)})")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    names = [m.strip() for m in args.only.split(",") if m.strip()] or list(MIXES)
    unknown = [m for m in names if m not in MIXES]
    if unknown:
        parser.error(f"--only {unknown}: allowed {list(MIXES)}")
    print(f"| mix | rate at p95 TTFT = {args.slo_ttft:g} s on {args.replicas} replicas | replica units per replica, "
          "prefill + decode | with the decode-context term | mean decode context (tokens) |")
    print("|---|---|---|---|---|")
    jobs = [(m, args.profile, args.replicas, args.slo_ttft) for m in names]
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for mix, rate, (flat, with_context, context) in pool.map(knee, jobs):
            print(f"| {mix} | {rate:.1f} req/s | {flat:.2f} | {with_context:.2f} | {context:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
