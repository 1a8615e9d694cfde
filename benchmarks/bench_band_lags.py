"""Which lags the headroom band should weigh, and where a kept suite run's fleet stands against a fixed one.

Two readings of the decision logs a suite run keeps (``bench_policy_suite.py --out DIR``), no new simulation:

1. **The band by lag.** ``forecast.level_headroom`` weighs a rise at lag ``s`` by ``P(T > s)``: how often the
   fleet decided now is still the whole fleet then (a pod ordered now lands after its cold start ``T``). A
   scale-up order only serves from its pod's landing on, so an order could instead be sized on the lags where
   pods land (weights ``P(s - 15 < T <= s)``, lag 0 weighing nothing). This prints both weighted ``q``
   quantiles of the raw demand's rises over each row's last hour, and the rises' ``q`` quantile at each lag.
   If rises grow with lag, orders sized where pods land would be larger, not smaller.
2. **The fleet against static.** Mean replicas (ready, starting and draining) over each run's second half, when
   the band's prior no longer speaks, beside the cheapest fixed fleet that met the SLO over the run (the
   ``static`` column of ``bench_policy_suite.py --static``, or ``--static-dir`` with ``leadscale compare
   --policies static`` summaries named like the suite's rows).

    python benchmarks/bench_band_lags.py DIR [--seed 1] [--static-dir DIR2] [--lags "bursty code completion"]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_policy_suite import FLAGS, SUITE, slug  # noqa: E402

from scaler import forecast, lead_time  # noqa: E402
from scaler.policy import HISTORY_SPACING_S  # noqa: E402
from simulator.coldstart import parse_cold_start  # noqa: E402

RATE_WINDOW_S = 60.0


def cold_start_survival(draws: int = 2000, seed: int = 0) -> lead_time.Survival:
    """The survival function of the suite's cold start (its ``--cold-start`` flag), from ``draws`` samples."""
    cold_start = parse_cold_start(FLAGS[FLAGS.index("--cold-start") + 1])
    rng = np.random.default_rng(seed)
    survival = lead_time.survival(tuple(cold_start.sample(rng) for _ in range(draws)), window=draws)
    assert survival is not None
    return survival


def weighted_quantile(rises: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The policy's own weighted quantile (``forecast._Pool``), with no prior pooled in."""
    return forecast._Pool(weights, 0.0, 0.0, 0, 0).quantile(rises, q)


def demand_history(run_dir: Path) -> tuple[np.ndarray, np.ndarray, float]:
    """Nominal demand every 15 s from leadscale's decision log, and the longest lead time it used."""
    with (run_dir / "decisions_leadscale.csv").open() as f:
        rows = list(csv.DictReader(f))
    t = np.array([float(r["t"]) for r in rows])
    v = np.array([float(r["nominal_demand_replicas"]) for r in rows])
    step = max(1, round(HISTORY_SPACING_S / float(np.median(np.diff(t)))))
    return t[::step], v[::step], max(float(r["lead_time_s"]) for r in rows)


def band_by_lag(run_dir: Path, survival: lead_time.Survival, q: float) -> tuple[float, float, dict[float, float]]:
    """(survival-weighted band, landing-weighted band, q quantile per lag) over the run's last hour."""
    t, v, lead = demand_history(run_dir)
    # the policy's history holds an hour and starts one rate window after its first look (a 60 s rate that
    # began before the run is a ramp from nothing)
    keep = (t >= t[-1] - 3600.0) & (t > t[0] + RATE_WINDOW_S)
    t, v = t[keep], v[keep]
    # horizons from levels like the run's typical one (the policy selects by the level at each decision); the
    # rise table itself, not horizon_rises, because the weights here need each rise's lag
    table = forecast._rise_table(t, v, lead, (), float(np.median(v)), forecast.RISE_FLOOR)
    if table is None:
        raise ValueError(f"{run_dir}: no complete lead time in the history")
    rises = table.rises(None, forecast.RISE_FLOOR)
    lags = table.lags
    staying = np.where(lags > 0, survival(lags), 1.0)
    landing = np.where(lags > 0, survival(np.maximum(lags - HISTORY_SPACING_S, 0.0)) - survival(lags), 0.0)
    per_lag = {float(lag): float(np.quantile(rises[lags == lag], q)) for lag in np.unique(lags)}
    return weighted_quantile(rises, staying, q), weighted_quantile(rises, landing, q), per_lag


def second_half_fleet(run_dir: Path) -> float:
    """Mean replicas (ready + starting + draining) over the run's second half."""
    with (run_dir / "timeline_leadscale.csv").open() as f:
        rows = list(csv.DictReader(f))
    t = np.array([float(r["t"]) for r in rows])
    fleet = np.array([float(r["ready"]) + float(r["starting"]) + float(r["draining"]) for r in rows])
    return float(fleet[t >= t[-1] / 2].mean())


def static_fleet(out: Path, static_dir: Path | None, name: str, seed: int) -> int | None:
    """The cheapest fixed fleet that met the SLO on this row and seed, where one was measured."""
    candidates = [out / slug(name, seed) / "summary.json"]
    if static_dir is not None:
        candidates.insert(0, static_dir / f"{slug(name, seed)}.json")
    for path in candidates:
        if path.exists():
            static = json.loads(path.read_text()).get("policies", {}).get("static")
            if static is not None:
                return int(static["static_replicas"])
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a suite run's --out DIR")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quantile", type=float, default=0.8, help="the band's level (headroomQuantile)")
    parser.add_argument("--static-dir", type=Path, help="leadscale compare --policies static summaries")
    parser.add_argument("--lags", action="append", default=[], help="also print this row's quantile per lag")
    args = parser.parse_args(argv)
    survival = cold_start_survival()

    print(f"seed {args.seed}, q {args.quantile}: the raw demand's band over the last hour, weighted by "
          f"P(T > s) (today) and by P(T lands in (s - 15, s]); mean fleet over the second half against static")
    print(f"{'workload':32s} {'P(T > s)':>9} {'landing':>9} {'2nd half':>9} {'static':>7}")
    for name in SUITE:
        run_dir = args.out / slug(name, args.seed)
        if not (run_dir / "decisions_leadscale.csv").exists():
            print(f"{name:32s} (no run in {args.out})")
            continue
        staying, landing, per_lag = band_by_lag(run_dir, survival, args.quantile)
        static = static_fleet(args.out, args.static_dir, name, args.seed)
        print(f"{name:32s} {staying:>9.3f} {landing:>9.3f} {second_half_fleet(run_dir):>9.2f} "
              f"{static if static is not None else '-':>7}")
        if name in args.lags:
            print("    " + ", ".join(f"{lag:.0f} s: {rise:+.3f}" for lag, rise in per_lag.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
