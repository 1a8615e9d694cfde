"""What one decision costs as its history fills, and what that means for a scaler holding many objects.

The evaluator re-decides every scaled object each round (5 s); the soak (``bench_getmetrics.py --soak``)
measures the whole server, this isolates ``scaler.evaluation.step`` for one object on a steady load with
the policy's windows at 0, 10, 60 and 90 minutes of history, and prints the cores 1,000 objects would take
at one round per 5 s. The headroom history is an hour of samples recorded from the end of the first rate
window, so it is full from 61 minutes: the 90-minute row is the one whose bands are measured once per rate
window (``policy._band_holds``), the others at every sample. A steady load: the level never selects other
horizons, which on a noisy load makes rounds dearer (docs/autoscaling.md, "2026-12-07, fourth session").
Peer, side by side: the Theil–Sen fit the policy makes per decision, ours (``forecast.theil_sen``) against
``scipy.stats.theilslopes`` on the same ten points (the call that used to be half of a decision).

    python benchmarks/bench_decide.py
"""

from __future__ import annotations

import argparse
import sys
import timeit
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scaler import evaluation
from scaler.forecast import theil_sen
from scaler.lead_time import rolling_lead_time
from scaler.metadata import parse_metadata
from scaler.signals import Signals

META = {"model": "model-0007", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000",
        "maxNumSeqs": "256", "kvCacheTokens": "200000"}
INTERVAL_S = 5.0
CYCLE = round(parse_metadata(META).rate_window_s / INTERVAL_S)
"""Rounds per band refresh: the bands are measured again once per rate window (``policy._band_holds``), so the
mean over ``CYCLE`` rounds is a steady decision's cost (one in three of them also adds a history sample)."""
COLD_STARTS_S = tuple(float(s) for s in np.exp(np.log(120.0) + 0.54 * np.random.default_rng(3).standard_normal(20)))
"""Twenty measured cold starts (lognormal p50 120 s, p90 240 s), as ``leadTime: auto`` hands the policy: both
lead-time bands weigh their lags by them, and the KV cache's band runs on the wobbling usage above."""
LEAD_TIME_S = rolling_lead_time(COLD_STARTS_S)
"""Their p90 (201 s), the lead time ``leadTime: auto`` measures from them."""


def steps(held: evaluation.Held, first: int, count: int) -> evaluation.Held:
    """``count`` decisions 5 s apart on a load that wobbles ±20 % (the trend and headroom stay busy)."""
    config = parse_metadata(META)
    for k in range(first, first + count):
        now = INTERVAL_S * k
        level = 7.0 + (k % 40) / 10
        signals = Signals(at=now, prompt_tokens_per_s=500.0 * level, generation_tokens_per_s=120.0 * level,
                          requests_waiting=float(k % 3), requests_running=7.0, ready_replicas=1, data_age_s=2.0,
                          kv_cache_usage=0.2 + 0.05 * (k % 7), lead_time_s=LEAD_TIME_S,
                          cold_starts_s=COLD_STARTS_S)
        held = evaluation.step(config, held, signals, now, (None, None), "bench")
    return held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=1000, help="timed decisions per history length")
    parser.add_argument("--objects", type=int, default=1000, help="objects for the cores estimate")
    args = parser.parse_args(argv)

    print(f"{'history':>10} {'us/decision':>12} {'band round':>11} {'cores for ' + str(args.objects) + ' objects':>24}")
    held, done = evaluation.Held(), 0
    for minutes in (0, 10, 60, 90):
        target = int(minutes * 60 / INTERVAL_S)
        if target > done:
            held, done = steps(held, done, target - done), target
        # from the same state each time (decide is pure), so the history stays this long: the mean over one
        # refresh cycle of rounds (one measures the bands again, the rest reuse them), and a round that measures
        # them (from the state without its bands)
        rounds = args.decisions // CYCLE
        cost_s = min(timeit.repeat(lambda held=held, done=done: steps(held, done, CYCLE), number=rounds,
                                   repeat=3)) / (rounds * CYCLE)
        unbanded = replace(held, state=replace(held.state, bands=())) if held.state is not None else held
        push_s = min(timeit.repeat(lambda held=unbanded, done=done: steps(held, done, 1), number=args.decisions,
                                   repeat=3)) / args.decisions
        cores = args.objects * cost_s / INTERVAL_S
        print(f"{minutes:>7} min {cost_s * 1e6:>12.0f} {push_s * 1e6:>11.0f} {cores:>24.3f}")

    from scipy import stats

    rng = np.random.default_rng(7)
    t = np.arange(11, dtype=float) * 60.0
    y = 7.0 + rng.normal(0, 0.5, t.size)
    ours = min(timeit.repeat(lambda: theil_sen(t, y, 0.8), number=2000, repeat=5)) / 2000
    scipys = min(timeit.repeat(lambda: stats.theilslopes(y, t, alpha=0.8), number=2000, repeat=5)) / 2000
    print(f"\nTheil-Sen on 11 points: ours {ours * 1e6:.0f} us, scipy.stats.theilslopes {scipys * 1e6:.0f} us "
          f"(ratio {ours / scipys:.2f}x; same slope and bound: tests/test_forecast.py)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
