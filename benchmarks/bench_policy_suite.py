"""Policy quality on a suite of workloads: every policy, the clairvoyant schedule and its lower bound.

``checks/policy-quality.sh`` judges leadscale on two traces and warns that the same check runs on
traces we do not have. This suite is how settings are judged here without fitting them to those two:
thirteen workloads (the check's two, other load levels of the same traces, fleets of 20+ replicas, the built-in
shapes, arXiv summaries with a real arrival process, a long-prompt mix, bursty code completion), each
at three seeds, with the check's profile, cold starts and SLO. For each (workload, seed) it runs
``leadscale compare`` with leadscale, the three recipes and the oracle, and prints one Markdown row
per workload (mean over seeds, the spread in brackets):

- every policy's GPU-hours and p95 TTFT; the oracle's lower bound (``oracle_lower_bound_gpu_hours``,
  below every schedule that meets the SLO) and its clairvoyant schedule (``oracle_gpu_hours``, a
  feasible schedule that meets it); leadscale ÷ clairvoyant and ÷ bound;
- whether a causal policy can meet the SLO at all (the oracle's ``causally_feasible``); where none can,
  the row is judged against that causal bound instead of the clairvoyant schedule (which meets the SLO only
  by knowing the future): leadscale's late first tokens beside the causal minimum
  (``causal_min_late_share``), and the floor is that the late tokens beyond that minimum stay within the
  SLO's own budget (5 %);
- the issue's floors: leadscale meets the SLO wherever a causal policy can, uses fewer GPU-hours than
  every baseline that meets it, within 1.25x of the clairvoyant schedule on every row and 1.15x on
  the mean. The mean is printed over every row and over the causally feasible rows alone.

Run from the project root: ``python benchmarks/bench_policy_suite.py [--seeds 1,2,3] [--jobs 2]
[--only a,b] [--leadscale-meta KEY=VALUE ...] [--out DIR] [--reuse] [--baseline DIR]``. Every
compare's JSON is kept in ``--out`` (default a temporary directory); ``--reuse`` reads the ones already
there instead of running them again (to re-print or to add policies). ``--baseline DIR`` (a full run's
``--out``) runs leadscale alone and reads the recipes and the oracle from DIR: they do not depend on
leadscale's settings, and the oracle's window simulations are most of the two hours, so a settings
sweep takes minutes (the baseline must come from the same simulator code). ``--leadscale-only``
runs leadscale alone with no baseline and prints its GPU-hours and p95 TTFT per row (about 4 minutes
for the whole suite here): a quick screen of a setting, to be judged against a full run's oracle.
``--static`` adds the cheapest fixed fleet that meets the SLO (compare's ``static``: several full runs per
row, so the 20+ replica rows take long) as a reference column: what a team would pay without an
autoscaler, sized in hindsight; the floors do not count it as a baseline.
Numbers are from the simulator, deterministic for the seed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from simulator.oracle_run import SLO_SHARE

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
AZURE, MOONCAKE = str(TRACES / "azure_conv_2023.csv"), str(TRACES / "mooncake_synthetic.jsonl")
ARXIV = str(TRACES / "arxiv_summarization_lengths.csv")
SUITE = {
    "azure_conv x16 (check)": ["--trace", AZURE, "--load-scale", "16"],
    "mooncake x3 (check)": ["--trace", MOONCAKE, "--load-scale", "3"],
    "azure_conv x8": ["--trace", AZURE, "--load-scale", "8"],
    "azure_conv x64 (20+ replicas)": ["--trace", AZURE, "--load-scale", "64"],
    "mooncake x2": ["--trace", MOONCAKE, "--load-scale", "2"],
    "builtin default": ["--trace", "builtin:default"],
    "diurnal ramp": ["--trace", "builtin:diurnal?rate=60&duration=3600&amplitude=0.6"],
    "diurnal x400 (20+ replicas)": ["--trace", "builtin:diurnal?rate=400&duration=3600&amplitude=0.6&cv=2"],
    "gamma cv 4": ["--trace", "builtin:gamma?rate=40&cv=4&duration=1800"],
    "steps 10/50/25": ["--trace", "builtin:steps?rates=10,50,25&step_s=600"],
    "arxiv lengths, gamma arrivals": ["--trace", f"builtin:gamma?rate=40&cv=2&duration=1800&lengths={ARXIV}"],
    "chat + 5% 20-30k summaries": ["--trace", "builtin:gamma?rate=60&cv=2&duration=1800&long_share=0.05"],
    "bursty code completion": ["--trace", "builtin:gamma?rate=100&cv=6&duration=1800&in_mean=2048&in_median=1500"
                               "&in_max=7437&out_mean=28&out_median=13&out_max=1000"],
}
FLAGS = ["--profile", "h100-llama3-8b", "--cold-start", "lognormal:p50=120,p90=240", "--slo-ttft", "2", "--json",
         "--fixed-stage", "0", "--rollout", "none"]
POLICIES = "leadscale,waiting-requests,kv-cache,saturation,oracle"
BASELINES = ("waiting-requests", "kv-cache", "saturation")
SLO_S = 2.0
ROW_LIMIT, MEAN_LIMIT = 1.25, 1.15


def slug(name: str, seed: int) -> str:
    return "".join(c if c.isalnum() else "_" for c in name) + f"_seed{seed}"


def run_one(name: str, args: list[str], seed: int, out: Path, meta: list[str], reuse: bool,
            baseline: Path | None = None, alone: bool = False, static: bool = False) -> dict:
    """One ``leadscale compare`` (or its kept JSON): {policy: summary} or {"error": ...}. With
    ``baseline``, only leadscale runs and every other policy comes from the baseline's kept JSON."""
    path = out / f"{slug(name, seed)}.json"
    if reuse and path.exists():
        return json.loads(path.read_text())["policies"]
    others: dict = {}
    if baseline is not None:
        kept = baseline / f"{slug(name, seed)}.json"
        if not kept.exists():
            return {"error": f"--baseline {baseline}: no {kept.name} (run the full suite with --out {baseline} first)"}
        others = {k: v for k, v in json.loads(kept.read_text())["policies"].items() if k != "leadscale"}
    cmd = [sys.executable, "-m", "leadscale", "compare", *args, *FLAGS, "--seed", str(seed),
           "--policies", ("leadscale" if baseline is not None or alone else POLICIES) + (",static" if static else ""),
           "--out", str(out / slug(name, seed))]
    for item in meta:
        cmd += ["--leadscale-meta", item]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:]}
    result = json.loads(done.stdout)
    result["policies"] = {**others, **result["policies"]}
    if not alone:  # a leadscale-only result kept here would later be --reuse'd as a full row
        path.write_text(json.dumps(result))
    return result["policies"]


def only_names(item: str, known: dict) -> list[str]:
    """One ``--only`` value as workload names: the whole value when it names a workload (some names hold
    a comma), else its comma-separated parts."""
    return [item.strip()] if item.strip() in known else [w.strip() for w in item.split(",") if w.strip()]


def meets(summary: dict) -> bool:
    return summary.get("ttft_p95") is not None and summary["ttft_p95"] <= SLO_S


def cell(values: list[float], fmt: str = "{:.2f}") -> str:
    """Mean, and the spread over seeds when there is one."""
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1 or max(values) - min(values) < 5e-3:
        return fmt.format(mean)
    return f"{fmt.format(mean)} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def judge(runs: list[dict]) -> dict:
    """The floors for one workload over its seeds, and the numbers behind them.

    Where no causal policy can meet the SLO (the oracle's causal bound), the clairvoyant schedule is not a
    point a causal policy can reach, so the row is judged against the causal bound instead: at every seed
    leadscale's late first tokens may exceed the causal minimum by at most the SLO's own budget (the misses
    no causal policy avoids are not charged, the rest get the budget a feasible row gets)."""
    ours = [r["leadscale"] for r in runs]
    oracle = [r["oracle"] for r in runs]
    clairvoyant = [o.get("oracle_gpu_hours", o["gpu_hours"]) for o in oracle]
    bound = [o.get("oracle_lower_bound_gpu_hours") for o in oracle]
    feasible = all(o.get("causally_feasible", True) for o in oracle)
    ratios = [s["gpu_hours"] / c for s, c in zip(ours, clairvoyant, strict=True) if c > 0]
    cheaper = all(all(s["gpu_hours"] <= r[b]["gpu_hours"] for b in BASELINES if b in r and meets(r[b]))
                  for s, r in zip(ours, runs, strict=True))
    met = all(meets(s) for s in ours)
    ratio = statistics.fmean(ratios) if ratios else math.inf
    late = [s.get("ttft_late_share") for s in ours]
    causal = [o.get("causal_min_late_share") for o in oracle]
    known = all(x is not None for x in (*late, *causal))
    within_causal = known and all(a - c <= SLO_SHARE for a, c in zip(late, causal, strict=True))
    ok = cheaper and ((met and ratio <= ROW_LIMIT) if feasible else within_causal)
    return {"ratio": ratio, "bound_ratio": [s["gpu_hours"] / b for s, b in zip(ours, bound, strict=True) if b],
            "met": met, "feasible": feasible, "cheaper": cheaper, "ok": ok, "clairvoyant": clairvoyant,
            "bound": [b for b in bound if b is not None], "late": late if known else [],
            "causal_late": causal if known else [], "within_causal": within_causal}


def feasibility(verdict: dict) -> str:
    """The "causally feasible" cell: yes, or no with leadscale's late first tokens beside the causal minimum."""
    if verdict["feasible"]:
        return "yes"
    if not verdict["late"]:
        return "**no** (causal bound)"
    percent = "{:.1f}"
    return (f"**no** (causal bound): late first tokens {cell([100 * x for x in verdict['late']], percent)} % "
            f"against a causal minimum of {cell([100 * x for x in verdict['causal_late']], percent)} %")


def row(name: str, runs: list[dict], static: bool = False) -> tuple[str, dict | None]:
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        return f"| {name} | error: {errors[0][:100]} |" + " |" * (12 if static else 11), None
    verdict = judge(runs)
    cells = [name, cell([r["leadscale"].get("mean_replicas", 0.0) for r in runs], "{:.1f}")]
    for policy in ("leadscale", *BASELINES, *(("static",) if static else ())):
        gpu = cell([r[policy]["gpu_hours"] for r in runs])
        p95 = cell([r[policy]["ttft_p95"] for r in runs if r[policy].get("ttft_p95") is not None])
        cells.append(f"{gpu} ({p95} s)")
    cells += [cell(verdict["bound"]),
              f"{cell(verdict['clairvoyant'])} ({cell([r['oracle']['ttft_p95'] for r in runs])} s)",
              cell([verdict["ratio"]] if len(runs) == 1 else [
                  r["leadscale"]["gpu_hours"] / c for r, c in zip(runs, verdict["clairvoyant"], strict=True)]),
              cell(verdict["bound_ratio"]),
              feasibility(verdict),
              "ok" if verdict["ok"] else "no: " + ", ".join(
                  w for w, bad in (("misses the SLO", verdict["feasible"] and not verdict["met"]),
                                   ("a baseline is cheaper", not verdict["cheaper"]),
                                   (f"> {ROW_LIMIT}x", verdict["feasible"] and verdict["ratio"] > ROW_LIMIT),
                                   (f"late beyond the causal minimum by more than {SLO_SHARE:.0%}",
                                    not verdict["feasible"] and not verdict["within_causal"])) if bad)]
    return "| " + " | ".join(cells) + " |", verdict


def print_leadscale_alone(workloads: dict, seeds: list[int], results: dict, static: bool = False) -> None:
    """One row per workload: leadscale's GPU-hours and p95 TTFT over the seeds, and whether every seed met the SLO
    (with ``static``, the cheapest fixed fleet's GPU-hours and p95 beside them)."""
    print(f"Seeds {', '.join(map(str, seeds))}; leadscale alone; mean over seeds [min–max].\n")
    print("| workload | leadscale GPU-h | p95 TTFT (s) | SLO met at every seed |"
          + (" static GPU-h (p95 s) |" if static else ""))
    print("|---|---|---|---|" + ("---|" if static else ""))
    for name in workloads:
        runs = [results[(name, s)] for s in seeds]
        errors = [r["error"] for r in runs if "error" in r]
        if errors:
            print(f"| {name} | error: {errors[0][:100]} | | |")
            continue
        ours = [r["leadscale"] for r in runs]
        p95 = [s["ttft_p95"] for s in ours if s.get("ttft_p95") is not None]
        extra = ""
        if static:
            fleets = [r["static"] for r in runs]
            extra = f" {cell([f['gpu_hours'] for f in fleets])} ({cell([f['ttft_p95'] for f in fleets])}) |"
        print(f"| {name} | {cell([s['gpu_hours'] for s in ours])} | {cell(p95)} | "
              f"{'yes' if all(meets(s) for s in ours) else '**no**'} |{extra}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    parser.add_argument("--jobs", type=int, default=2, help="compares run at once (default 2)")
    parser.add_argument("--only", action="append", default=[], metavar="NAMES",
                        help="workload names, comma-separated or repeated (a name with a comma in it, "
                             "e.g. 'arxiv lengths, gamma arrivals', whole; default: all)")
    parser.add_argument("--leadscale-meta", action="append", default=[], metavar="KEY=VALUE",
                        help="extra leadscale trigger metadata, as for leadscale compare")
    parser.add_argument("--out", type=Path, default=None, help="keep every compare (JSON and report) here")
    parser.add_argument("--reuse", action="store_true", help="read compares already kept in --out")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="run leadscale alone; read the recipes and the oracle from a full run's --out DIR")
    parser.add_argument("--leadscale-only", action="store_true",
                        help="run leadscale alone, no recipes or oracle; print its GPU-hours and p95 per row")
    parser.add_argument("--static", action="store_true",
                        help="also run 'static', the cheapest fixed fleet that meets the SLO (hindsight; several "
                             "full runs per row), as a reference column: not a baseline the floors count")
    args = parser.parse_args()
    if args.leadscale_only and (args.baseline or args.reuse):
        parser.error("--leadscale-only runs leadscale alone: it takes neither --baseline nor --reuse")
    workloads = dict(SUITE)
    if args.only:
        wanted = [w for item in args.only for w in only_names(item, workloads)]
        unknown = [w for w in wanted if w not in workloads]
        if unknown:
            parser.error(f"--only {unknown}: allowed {sorted(workloads)}")
        workloads = {w: workloads[w] for w in wanted}
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    out = args.out or Path(tempfile.mkdtemp(prefix="leadscale-suite-"))
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(name, seed) for name in workloads for seed in seeds]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = list(pool.map(lambda job: run_one(job[0], workloads[job[0]], job[1], out, args.leadscale_meta,
                                                 args.reuse, args.baseline, args.leadscale_only, args.static),
                              jobs))
    results = dict(zip(jobs, done, strict=True))
    if args.leadscale_only:
        print_leadscale_alone(workloads, seeds, results, args.static)
        print(f"\ncompares: {out}")
        return 0
    print(f"Seeds {', '.join(map(str, seeds))}; mean over seeds [min–max]. GPU-hours (p95 TTFT).\n")
    print("| workload | leadscale mean replicas | leadscale | waiting-requests | kv-cache | saturation |"
          + (" static (hindsight) |" if args.static else "") + " lower bound "
          "| clairvoyant schedule | leadscale ÷ clairvoyant | leadscale ÷ bound | causally feasible | floors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.static else ""))
    verdicts = {}
    for name in workloads:
        line, verdict = row(name, [results[(name, s)] for s in seeds], args.static)
        print(line)
        if verdict is not None:
            verdicts[name] = verdict
    if verdicts:
        mean = statistics.fmean(v["ratio"] for v in verdicts.values())
        feasible = {k: v for k, v in verdicts.items() if v["feasible"]}
        worst = max(feasible.items() or verdicts.items(), key=lambda kv: kv[1]["ratio"])
        passed = sum(v["ok"] for v in verdicts.values())
        on_feasible = (f"{statistics.fmean(v['ratio'] for v in feasible.values()):.3f} over the "
                       f"{len(feasible)} causally feasible rows" if feasible else "no causally feasible row")
        print(f"\nleadscale ÷ clairvoyant: mean {mean:.3f} over all {len(verdicts)} rows, {on_feasible} "
              f"(floor {MEAN_LIMIT}), worst feasible row {worst[1]['ratio']:.3f} ({worst[0]}; floor {ROW_LIMIT} on "
              f"every row); rows meeting every floor: {passed} of {len(verdicts)}")
    print(f"\ncompares: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
