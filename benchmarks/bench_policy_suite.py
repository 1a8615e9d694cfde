"""Policy quality beyond the two traces of the check: every policy on a suite of other workloads.

``checks/policy-quality.sh`` judges leadscale on two traces and warns that the same check runs on
traces we do not have. This suite is how settings are judged here without fitting them to those two:
other load levels of the same traces, the built-in workloads (gamma bursts, a diurnal ramp, steps)
and the arXiv summarization lengths (long prompts), all with the check's profile, cold starts, SLO
and seed. For each workload it runs ``leadscale compare`` with leadscale, the three recipes and the
oracle, and prints one Markdown row: leadscale's GPU-hours and p95 TTFT, its ratio to the oracle,
the cheapest baseline that meets the SLO, and the check's verdict (``ok``: meets the SLO, no baseline
that meets it is cheaper, within 1.25x of the oracle). ``--include-check`` adds the check's two.

Run from the project root: ``python benchmarks/bench_policy_suite.py [--jobs 2] [--only a,b]
[--leadscale-meta KEY=VALUE ...] [--out DIR]`` (about 15 minutes on 2 cores, the oracle's
verification runs dominate). Numbers are from the simulator, deterministic for the seed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
SUITE = {
    "azure_conv x8": ["--trace", str(TRACES / "azure_conv_2023.csv"), "--load-scale", "8"],
    "mooncake x2": ["--trace", str(TRACES / "mooncake_synthetic.jsonl"), "--load-scale", "2"],
    "builtin default": ["--trace", "builtin:default"],
    "diurnal ramp": ["--trace", "builtin:diurnal?rate=60&duration=3600&amplitude=0.6"],
    "gamma cv 4": ["--trace", "builtin:gamma?rate=40&cv=4&duration=1800"],
    "steps 10/50/25": ["--trace", "builtin:steps?rates=10,50,25&step_s=600"],
    "arxiv lengths": ["--trace", str(TRACES / "arxiv_summarization_lengths.csv")],
}
CHECK = {
    "azure_conv x16": ["--trace", str(TRACES / "azure_conv_2023.csv"), "--load-scale", "16"],
    "mooncake x3": ["--trace", str(TRACES / "mooncake_synthetic.jsonl"), "--load-scale", "3"],
}
FLAGS = ["--profile", "h100-llama3-8b", "--cold-start", "lognormal:p50=120,p90=240", "--slo-ttft", "2",
         "--seed", "3", "--json"]
POLICIES = "leadscale,waiting-requests,kv-cache,saturation,oracle"
SLO_S = 2.0


def run_one(name: str, args: list[str], out: Path, meta: list[str]) -> tuple[str, dict]:
    """One ``leadscale compare``; (name, {policy: summary}) or (name, {"error": ...})."""
    cmd = [sys.executable, "-m", "scaler.cli", "compare", *args, *FLAGS, "--policies", POLICIES,
           "--out", str(out / name.replace(" ", "_").replace("/", "-"))]
    for item in meta:
        cmd += ["--leadscale-meta", item]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        return name, {"error": done.stderr.strip()[-500:]}
    return name, json.loads(done.stdout)["policies"]


def row(name: str, policies: dict) -> str:
    """The Markdown row for one workload, with the check's verdict."""
    if "error" in policies:
        return f"| {name} | error: {policies['error'][:80]} | | | | |"
    ours, oracle = policies["leadscale"], policies["oracle"]
    meets = [k for k, v in policies.items() if k not in ("leadscale", "oracle") and v["ttft_p95"] is not None
             and v["ttft_p95"] <= SLO_S]
    cheapest = min(meets, key=lambda k: policies[k]["gpu_hours"]) if meets else None
    ratio = ours["gpu_hours"] / oracle["gpu_hours"] if oracle["gpu_hours"] > 0 else float("inf")
    ok = (ours["ttft_p95"] is not None and ours["ttft_p95"] <= SLO_S and ratio <= 1.25
          and (cheapest is None or ours["gpu_hours"] <= policies[cheapest]["gpu_hours"]))
    rival = f"{cheapest} {policies[cheapest]['gpu_hours']:.2f}" if cheapest else "none"
    oracle_note = "" if oracle.get("oracle_meets_slo", True) else " (misses)"
    return (f"| {name} | {ours['gpu_hours']:.2f} ({ours['ttft_p95']:.2f} s) | {oracle['gpu_hours']:.2f} "
            f"({oracle['ttft_p95']:.2f} s){oracle_note} | {ratio:.2f} | {rival} | {'ok' if ok else 'no'} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="workloads run at once (default 2)")
    parser.add_argument("--only", default="", help="comma-separated workload names (default: all)")
    parser.add_argument("--include-check", action="store_true", help="also the check's two traces")
    parser.add_argument("--leadscale-meta", action="append", default=[], metavar="KEY=VALUE",
                        help="extra leadscale trigger metadata, as for leadscale compare")
    parser.add_argument("--out", type=Path, default=None, help="keep every report here")
    args = parser.parse_args()
    workloads = {**(CHECK if args.include_check else {}), **SUITE}
    if args.only:
        wanted = [w.strip() for w in args.only.split(",")]
        unknown = [w for w in wanted if w not in workloads]
        if unknown:
            parser.error(f"--only {unknown}: allowed {sorted(workloads)}")
        workloads = {w: workloads[w] for w in wanted}
    out = args.out or Path(tempfile.mkdtemp(prefix="leadscale-suite-"))
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = dict(pool.map(lambda item: run_one(item[0], item[1], out, args.leadscale_meta), workloads.items()))
    print("| workload | leadscale GPU-h (p95 TTFT) | oracle GPU-h (p95) | x oracle | cheapest baseline meeting "
          "the SLO | check's rule |")
    print("|---|---|---|---|---|---|")
    for name in workloads:
        print(row(name, results[name]))
    print(f"\nreports: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
