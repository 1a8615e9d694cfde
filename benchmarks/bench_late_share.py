"""How well vLLM's TTFT buckets tell the share of late first tokens: each 60 s window's own TTFTs against what
the window's bucket counts say, read with Prometheus' uniform assumption and with the exponential tail that
``scaler.histograms.share_above`` uses.

The efficiency rule (``scaler.efficiency``) reads the late share once per rate window from the buckets, and
vLLM's (1, 2.5] s bucket straddles the usual 2 s SLO, so how the inside of that bucket is read decides
whether a window counts as late. This runs leadscale on suite workloads (``bench_policy_suite.SUITE``) in the
simulator, bins the requests' first tokens into 60 s windows, and prints per workload: the mean error of
each reading against the truth, and the share of windows each calls over the 5 % budget against the share
truly over it.

    python benchmarks/bench_late_share.py                                  # mooncake x3, code completion, azure x16
    python benchmarks/bench_late_share.py --only "mooncake x2" --seed 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_policy_suite import SUITE  # noqa: E402

from scaler.histograms import TTFT_BUCKETS, share_above  # noqa: E402

WINDOW_S = 60.0
BUDGET = 0.05
DEFAULT = ("mooncake x3 (check)", "bursty code completion", "azure_conv x16 (check)")


def uniform_share_above(ttfts: np.ndarray, threshold: float) -> float:
    """Prometheus' reading: observations uniform inside the bucket holding ``threshold``."""
    edges = np.array((0.0, *TTFT_BUCKETS, np.inf))
    k = int(np.searchsorted(edges, threshold, side="left"))
    lo, hi = edges[k - 1], edges[k]
    above_lo, above_hi = np.mean(ttfts > lo), np.mean(ttfts > hi)
    inside = 0.0 if np.isinf(hi) else (threshold - lo) / (hi - lo)
    return float(above_lo - inside * (above_lo - above_hi))


def bucket_rates(ttfts: np.ndarray) -> dict[float, float]:
    """Cumulative counts per bucket bound, as vLLM's histogram (``le`` inclusive) would hold them."""
    rates = {float(le): float(np.sum(ttfts <= le)) for le in TTFT_BUCKETS}
    rates[float("inf")] = float(ttfts.size)
    return rates


def windows(name: str, seed: int, slo_s: float) -> np.ndarray:
    """Rows of (true share, uniform reading, exponential reading) per 60 s window of leadscale's run."""
    from scaler.profiles import get_profile
    from simulator import workload as wl
    from simulator.autoscale import run_autoscaled
    from simulator.synthetic import load_workload

    args = SUITE[name]
    w = load_workload(args[1], seed=seed)
    if "--load-scale" in args:
        w = wl.load_scale(w, float(args[args.index("--load-scale") + 1]), np.random.default_rng([seed, 2]))
    run = run_autoscaled(w, get_profile("h100-llama3-8b"), "leadscale", "lognormal:p50=120,p90=240", slo_s, seed)
    ttft = np.asarray(run.ttft_s)
    done = np.isfinite(ttft)
    first = np.asarray(w.arrival_s)[: ttft.size][done] + ttft[done]
    ttft = ttft[done]
    rows = []
    for end in np.arange(5 * WINDOW_S, first.max(initial=0.0), WINDOW_S):
        x = ttft[(first > end - WINDOW_S) & (first <= end)]
        if x.size < 20:
            continue
        rows.append((float(np.mean(x > slo_s)), uniform_share_above(x, slo_s), share_above(bucket_rates(x), slo_s)))
    return np.array(rows, dtype=float).reshape(-1, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="a suite workload (repeatable); default three")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slo-ttft", type=float, default=2.0)
    args = parser.parse_args(argv)
    names = args.only or list(DEFAULT)
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        parser.error(f"--only {unknown[0]!r}: not a suite workload; allowed {', '.join(SUITE)}")
    print(f"| workload (seed {args.seed}) | windows | true late | uniform: error | exponential: error "
          f"| windows over {BUDGET:.0%}: true / uniform / exponential |")
    print("|---|---|---|---|---|---|")
    for name in names:
        rows = windows(name, args.seed, args.slo_ttft)
        if rows.size == 0:
            print(f"| {name} | 0 | | | | |")
            continue
        true, uniform, exponential = rows.T
        over = [float(np.mean(c > BUDGET)) for c in (true, uniform, exponential)]
        print(f"| {name} | {len(rows)} | {true.mean():.2%} | {np.mean(uniform - true):+.2%} "
              f"| {np.mean(exponential - true):+.2%} | {over[0]:.0%} / {over[1]:.0%} / {over[2]:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
