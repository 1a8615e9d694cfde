"""The proof benchmark: every policy on both shared traces, as ``checks/policy-quality.sh`` runs them.

Run from the project root: ``python benchmarks/bench_compare.py [--out DIR]``. For each trace it runs
``leadscale compare`` with the check's exact flags, prints the side-by-side table (GPU-hours, p95
TTFT, ratio to the oracle, wall time) as Markdown ready for docs/autoscaling.md, and says whether
leadscale passes the check's rule (meets the SLO, cheapest among those that do, within 1.25x of the
oracle).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
RUNS = (("azure_conv", TRACES / "azure_conv_2023.csv", 16), ("mooncake_synth", TRACES / "mooncake_synthetic.jsonl", 3))
POLICIES = "leadscale,waiting-requests,kv-cache,saturation,oracle"
SLO_S = 2.0


def run_one(name: str, trace: Path, load_scale: float, out: Path) -> tuple[dict, float]:
    """One ``leadscale compare`` exactly as the policy-quality check calls it; (policies, wall seconds)."""
    cmd = [sys.executable, "-m", "leadscale", "compare", "--trace", str(trace), "--load-scale", str(load_scale),
           "--profile", "h100-llama3-8b", "--policies", POLICIES, "--cold-start", "lognormal:p50=120,p90=240",
           "--slo-ttft", str(SLO_S), "--seed", "3", "--out", str(out / name), "--json"]
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"compare on {name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)["policies"], wall


def verdict(policies: dict) -> list[str]:
    """The check's rule, as problems (empty: passes)."""
    ours, oracle = policies["leadscale"], policies["oracle"]
    meets = {k: v["gpu_hours"] for k, v in policies.items()
             if k not in ("leadscale", "oracle") and v.get("ttft_p95") is not None and v["ttft_p95"] <= SLO_S}
    bad = []
    if ours.get("ttft_p95") is None or ours["ttft_p95"] > SLO_S:
        bad.append("misses the SLO")
    if meets and ours["gpu_hours"] > min(meets.values()):
        bad.append("a baseline is cheaper at the SLO")
    if oracle["gpu_hours"] > 0 and ours["gpu_hours"] / oracle["gpu_hours"] > 1.25:
        bad.append(f"x{ours['gpu_hours'] / oracle['gpu_hours']:.2f} the oracle")
    return bad


def table(name: str, policies: dict, wall: float) -> str:
    oracle = policies["oracle"]["gpu_hours"] or float("nan")
    lines = [f"**{name}** (compare took {wall:.0f} s)", "",
             "| policy | GPU-hours | x oracle | p95 TTFT (s) | SLO attainment | mean / max replicas | scale events "
             "| rejected | aborted |", "|---|---|---|---|---|---|---|---|---|"]
    for policy, s in policies.items():
        p95 = s.get("ttft_p95")
        lines.append(f"| {policy} | {s['gpu_hours']:.2f} | {s['gpu_hours'] / oracle:.2f} | "
                     f"{'n/a' if p95 is None else f'{p95:.2f}'} | {s.get('slo_attainment') or 0:.3f} | "
                     f"{s['mean_replicas']:.1f} / {s['max_replicas']} | {s['scale_events']} | {s['rejected']} | "
                     f"{s['aborted']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="keep the reports here (default: a temp dir)")
    parser.add_argument("--only", choices=[r[0] for r in RUNS], default=None, help="run one trace only")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_compare_"))
    failed = False
    for name, trace, scale in RUNS:
        if args.only and name != args.only:
            continue
        policies, wall = run_one(name, trace, scale, out)
        print(table(name, policies, wall), "\n")
        bad = verdict(policies)
        failed |= bool(bad)
        print(f"{name}: {'ok' if not bad else 'FAIL: ' + '; '.join(bad)}\n")
    print(f"reports under {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
