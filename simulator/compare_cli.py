"""``leadscale compare``: the same workload, cluster and KEDA/HPA loop under several policies.

``leadscale compare --policies leadscale,waiting-requests,kv-cache,saturation,oracle --out DIR
[--json]`` takes every workload, profile, SLO, cold-start and seed flag of ``simulate`` (the core's
``add_run_arguments``/``build_run_inputs``), runs each policy (in parallel processes, one per core),
writes ``DIR/report.md``, ``DIR/report.html``, the PNGs and ``DIR/summary.json``, and with ``--json``
prints ``{"policies": {name: summary}, "fixed_stage": ..., "rollouts": ...}`` on stdout (plus ``"oracle"``:
its headline figures, when it ran).

The report walks the production path: first one replica's capacity at the SLO and a fixed
``--fixed-stage`` (2) replica stage (``simulator.stage``), then the policies, then a model rollout
with leadscale (``simulator.rollout``; ``--rollout auto``: 0 -> 10 % -> 50 % -> 100 % and the same
with a rollback at 50 %, steps at fifths of the workload; ``--rollout 0:0,600:10,...`` your own
steps; ``--rollout none`` skips it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaler.cli_types import integer, key_value, number
from scaler.limits import Limit
from simulator.cli_options import (
    add_cold_start_argument,
    add_fleet_bounds,
    add_jobs_argument,
    add_run_arguments,
    build_run_inputs,
    check_fleet_bounds,
    jobs_or_cores,
)
from simulator.results import json_safe

if TYPE_CHECKING:
    from simulator.report import Section

DEFAULT_POLICIES = "leadscale,waiting-requests,kv-cache,saturation,oracle"
ORACLE_KEYS = ("oracle_gpu_hours", "oracle_lower_bound_gpu_hours", "oracle_bound_gap_gpu_hours", "oracle_meets_slo",
               "causal_min_late_share", "causally_feasible")
"""The oracle's headline figures, repeated at the top level of ``--json`` (the full set is in its summary)."""


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags ``compare`` adds to the shared run flags (``simulator.cli_options``)."""
    parser.add_argument("--policies", default=DEFAULT_POLICIES,
                        help=f"comma-separated policies (default {DEFAULT_POLICIES}); also fixed:N and static")
    add_cold_start_argument(parser)
    parser.add_argument("--out", required=True, help="directory for report.md, report.html, PNGs, summary.json")
    parser.add_argument("--json", action="store_true", help='print {"policies": {name: summary}} on stdout')
    add_fleet_bounds(parser)
    parser.add_argument("--drain-grace", type=number(Limit(0.0), "seconds"), default=None,
                        help="termination grace period of a deleted pod, seconds (default: the chart's rule, "
                             "preStop 10 s + p99 request duration + 5 s, on the warm fleet's first five minutes)")
    add_jobs_argument(parser)
    parser.add_argument("--fixed-stage", type=integer(0), default=2, metavar="N",
                        help="replicas of the fixed stage reported first (default 2; 0 skips it)")
    parser.add_argument("--rollout", default="auto", metavar="auto|none|T:PCT,...",
                        help="rollout scenarios with leadscale: auto (0-10-50-100 %% and a rollback at 50 %%), "
                             "none, or canary weight steps in seconds:percent (default auto)")
    parser.add_argument("--rollout-gate", choices=("on", "off"), default="on",
                        help="on: the route moves once the version gaining traffic is available (default); "
                             "off: at each step's time")
    parser.add_argument("--leadscale-meta", action="append", default=[], metavar="KEY=VALUE",
                        type=key_value("targetUtilization=0.9", value_required=False),
                        help="extra trigger metadata for leadscale (repeatable), e.g. targetUtilization=0.9")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("compare", help="compare autoscaling policies on one workload",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    add_compare_arguments(parser)
    parser.set_defaults(func=run)


def _one(job: tuple[Any, ...]) -> tuple[str, Any]:
    from simulator.autoscale import run_autoscaled

    name, workload, profile, cold_start, slo, seed, kwargs = job
    started = time.perf_counter()
    result = run_autoscaled(workload, profile, name, cold_start, slo, seed, **kwargs)
    result.summary["wall_seconds"] = time.perf_counter() - started
    return name, result


def compare(workload: Any, profile: Any, policies: Sequence[str], cold_start: str, slo_ttft_s: float, seed: int,
            jobs: int = 0, **kwargs: Any) -> dict[str, Any]:
    """Run every policy on the same inputs; returns {name: AutoscaleResult} in the given order."""
    from simulator.coldstart import parse_cold_start
    from simulator.policies import parse_policies

    names = parse_policies(",".join(policies))
    parse_cold_start(cold_start)  # fail before any work, in this process (worker errors pickle badly)
    if "leadscale" in names:
        from simulator.autoscale import profile_keys
        from simulator.policies import make_policy

        make_policy("leadscale", profile_keys(profile, slo_ttft_s), slo_ttft_s,
                    leadscale_extra=kwargs.get("leadscale_metadata"))
    work = [(n, workload, profile, cold_start, slo_ttft_s, seed, kwargs) for n in names]
    # the oracle re-simulates several times: start it first so it overlaps with the others
    work.sort(key=lambda job: job[0] != "oracle")
    workers = min(len(work), jobs_or_cores(jobs))
    if workers <= 1:
        done = dict(_one(job) for job in work)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            done = dict(pool.map(_one, work))
    return {n: done[n] for n in names}


def rollout_scenarios(text: str, duration_s: float) -> dict[str, Any]:
    """``--rollout``: auto, none or a schedule -> {scenario name: steps}."""
    from simulator.rollout import parse_schedule, standard_schedules

    choice = text.strip()
    if choice == "none":
        return {}
    if choice == "auto":
        return standard_schedules(duration_s)
    return {f"rollout {choice}": parse_schedule(choice)}


def _extra(job: tuple[Any, ...]) -> tuple[str, Any]:
    """One of the report's other scenarios, in a worker process: the fixed stage or a rollout."""
    kind, name, workload, profile, slo, seed, options = job
    if kind == "stage":
        from simulator.stage import stage_report

        return name, stage_report(workload, profile, slo, options["slo_tpot_s"], seed, options["replicas"])
    from simulator.rollout import RolloutConfig, run_rollout

    config = RolloutConfig(options["schedule"], gate=options["gate"])
    return name, run_rollout(workload, profile, config, options["cold_start"], slo, seed,
                             max_replicas=options["max_replicas"], drain_grace_s=options["drain_grace_s"],
                             leadscale_extra=options["leadscale_metadata"],
                             backend_options={"slo_tpot_s": options["slo_tpot_s"]}, name=name)


def extras(workload: Any, profile: Any, slo_ttft_s: float, slo_tpot_s: float, seed: int, cold_start: str,
           fixed_stage: int, rollouts: dict[str, Any], gate: bool = True, jobs: int = 0, max_replicas: int = 100,
           drain_grace_s: float | None = None, leadscale_metadata: dict[str, str] | None = None,
           ) -> tuple[Any, dict[str, Any]]:
    """The fixed stage (None when ``fixed_stage`` is 0) and each rollout scenario, in parallel processes."""
    common: dict[str, object] = {"slo_tpot_s": slo_tpot_s}
    work = [("stage", "stage", workload, profile, slo_ttft_s, seed, {**common, "replicas": fixed_stage})
            ] if fixed_stage else []
    work += [("rollout", name, workload, profile, slo_ttft_s, seed,
              {**common, "schedule": steps, "gate": gate, "cold_start": cold_start, "max_replicas": max_replicas,
               "drain_grace_s": drain_grace_s, "leadscale_metadata": leadscale_metadata})
             for name, steps in rollouts.items()]
    workers = min(len(work), jobs_or_cores(jobs))
    if workers <= 1:
        done = dict(_extra(job) for job in work)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            done = dict(pool.map(_extra, work))
    return done.pop("stage", None), done


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def write_timelines(results: dict[str, Any], out: Path) -> None:
    """Per policy ``timeline_<name>.csv`` (replicas by phase and demand every 10 s) and, for leadscale,
    ``decisions_leadscale.csv`` (every term of every decision: the numbers to tune against)."""
    import csv

    for name, result in results.items():
        tl = result.timeline
        columns = [c for c in ("t", "ready", "starting", "draining", "demand") if c in tl]
        with open(out / f"timeline_{_slug(name)}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows(zip(*(tl[c].tolist() for c in columns), strict=True))
        if result.decisions:
            terms = list(result.decisions[0][2])
            with open(out / f"decisions_{_slug(name)}.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["t", "desired_replicas", *terms])
                for t, desired, values in result.decisions:
                    writer.writerow([t, desired, *(values.get(k) for k in terms)])


def run(args: argparse.Namespace) -> int:
    from simulator.report import write_report

    try:
        meta = dict(args.leadscale_meta)
        check_fleet_bounds(args)
        inputs = build_run_inputs(args)
        workload, profile, slo, seed = inputs.workload, inputs.profile, inputs.slo_ttft_s, inputs.seed
        scenarios = rollout_scenarios(args.rollout, float(workload.duration_s))
        results = compare(workload, profile, args.policies.split(","), args.cold_start, slo, seed, jobs=args.jobs,
                          min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                          drain_grace_s=args.drain_grace, backend_options={"slo_tpot_s": inputs.slo_tpot_s},
                          leadscale_metadata=meta or None)
        stage, rollouts = extras(workload, profile, slo, inputs.slo_tpot_s, seed, args.cold_start, args.fixed_stage,
                                 scenarios, gate=args.rollout_gate == "on", jobs=args.jobs,
                                 max_replicas=args.max_replicas, drain_grace_s=args.drain_grace,
                                 leadscale_metadata=meta or None)
    except (ValueError, KeyError, FileNotFoundError) as exc:  # MetadataError is a ValueError
        print(f"leadscale compare: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # policies in the order asked for; each summary's keys sorted
    payload: dict[str, Any] = {"policies": {name: dict(sorted(json_safe(r.summary).items()))
                                            for name, r in results.items()}}
    before: list[Section] = []
    after: list[Section] = []
    if stage is not None:
        payload["fixed_stage"] = json_safe(stage.to_json())
        before.append((f"Before autoscaling: one replica and a fixed {stage.fixed.replicas}-replica stage",
                       stage.lines(), []))
    if rollouts:
        from simulator import rollout as rollout_mod

        rollout_mod.plot(rollouts, out / "rollout.png")
        payload["rollouts"] = {name: json_safe({"summary": dict(sorted(r.summary.items())), "phases": r.phases,
                                             "route_weight": r.route_weight}) for name, r in rollouts.items()}
        after.append(("A model rollout with leadscale", rollout_mod.section_lines(rollouts, slo), ["rollout.png"]))
    notes = [f"workload {workload.name}, {len(workload.arrival_s)} requests; profile "
             f"{profile.name}; cold start {args.cold_start}; TTFT SLO p95 <= {slo:g} s; "
             f"seed {seed}."]
    if "oracle" in results:
        o = results["oracle"].summary
        payload["oracle"] = {k: json_safe(o.get(k)) for k in ORACLE_KEYS if k in o}
    write_report(results, out, "leadscale compare", slo, notes, before=before, after=after)
    (out / "summary.json").write_text(json.dumps(payload, indent=2) + "\n")
    write_timelines(results, out)
    if args.json:
        print(json.dumps(payload))
    else:
        from simulator.report import markdown_table
        from simulator.report_oracle import oracle_notes

        print(markdown_table(results))
        if "oracle" in results:
            print("\n" + "\n".join(oracle_notes(results["oracle"].summary, slo)))
        print(f"\nreport: {out / 'report.html'}")
    return 0
