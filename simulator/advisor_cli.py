"""``leadscale tune`` and ``leadscale advise``: settings for your traffic, with the evidence.

``leadscale tune --trace T --profile P --slo-ttft 2 [--cold-start SPEC] [--trials N] --out DIR [--json]``
takes every workload, profile, SLO and seed flag of ``simulate``, searches leadscale's settings and
the HPA behavior (``simulator.tuner``), and writes into DIR: ``report.md``, ``report.html`` and PNGs,
``scaledobject.yaml`` (apply it), ``values.yaml`` (``helm install -f`` for charts/leadscale),
``vllm-drain.yaml`` (preStop, grace period and ``--shutdown-timeout`` for the vLLM Deployment) and
``recommendation.json`` (what ``--json`` prints). The report opens with one replica's capacity at the
SLO and a fixed ``--fixed-stage`` (2) replica stage, and ends with the gateway's queue limit.

``leadscale advise --prometheus URL --model NAME [--since 7d] [--step 60] [--span 4h] --out DIR``
rebuilds the workload from that Prometheus' vLLM history (``simulator.history``), keeps its busiest
``--span``, then tunes and reports exactly like ``tune`` (plus what was read: resets, gaps).

Examples::

    leadscale tune --trace ../shared/traces/azure_conv_2023.csv --load-scale 20 --trials 40 --out tuned
    leadscale advise --prometheus http://prometheus.monitoring:9090 --model llama3-8b --since 7d --out advice
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from scaler.cli_types import count, fraction, key_value, number, seconds
from scaler.limits import Limit
from simulator.cli_options import (
    add_cold_start_argument,
    add_fleet_bounds,
    add_jobs_argument,
    add_profile_argument,
    add_seed_argument,
    add_slo_arguments,
    check_fleet_bounds,
    jobs_or_cores,
)
from simulator.results import json_safe


def add_tune_arguments(parser: argparse.ArgumentParser, model_required: bool = False) -> None:
    """The search, robustness and manifest flags shared by tune and advise."""
    g = parser.add_argument_group("search")
    add_cold_start_argument(g)
    g.add_argument("--trials", type=count, default=30, help="optuna trials on the search window (default 30)")
    g.add_argument("--target", type=fraction, default=0.99, help="SLO attainment to meet (default 0.99)")
    g.add_argument("--holdout", type=fraction, default=0.3,
                   help="fraction of the time, at the end, held out from the search (default 0.3)")
    g.add_argument("--seeds", type=count, default=3, help="seeds per shortlisted candidate (default 3)")
    g.add_argument("--top", type=count, default=3, help="candidates re-evaluated for robustness (default 3)")
    g.add_argument("--baselines", default="waiting-requests,kv-cache,saturation,leadscale",
                   help="policies compared on the held-out window ('leadscale' = untuned defaults; also oracle)")
    add_jobs_argument(g)
    g.add_argument("--batch", type=count, default=2,
                   help="trials asked per round (default 2); results depend on it, not on --jobs")
    g.add_argument("--fixed-stage", type=count, default=2,
                   help="replicas of the fixed stage reported before any autoscaling advice (default 2)")
    add_fleet_bounds(g)
    d = parser.add_argument_group("many machines and resume (simulator.tune_jobs, docs/advisor.md)")
    d.add_argument("--backend", choices=("local", "rdb"), default="local",
                   help="who simulates the runs: local processes (default) or workers sharing --storage "
                        "(leadscale tune-worker, e.g. Kubernetes Jobs); the result is the same")
    d.add_argument("--storage", default=None, metavar="URL",
                   help="optuna RDB storage recording every run (sqlite:///tune.db, postgresql://...)")
    d.add_argument("--study", default="leadscale-tune", help="study name in --storage (default leadscale-tune)")
    d.add_argument("--resume", nargs="?", const="yes", choices=("yes", "auto"), default=None,
                   help="continue the stopped --study: recorded runs are not simulated again; --resume=auto "
                        "also starts it when it does not exist (a Job that may be restarted)")
    d.add_argument("--worker-timeout", type=seconds, default=900.0, metavar="S",
                   help="--backend rdb: fail when no worker finishes a run for S seconds (default 900)")
    m = parser.add_argument_group("manifests")
    if model_required:
        m.add_argument("--model", required=True, help="vLLM served model name (the model_name label)")
    else:
        m.add_argument("--model", default="my-model", help="vLLM served model name for the manifests")
    m.add_argument("--deployment", default="vllm", help="the vLLM Deployment to scale (default vllm)")
    m.add_argument("--namespace", default="default", help="its namespace (default default)")
    m.add_argument("--scaler-address", default="leadscale.keda.svc.cluster.local:9090",
                   help="host:port of the leadscale service, as KEDA reaches it")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the report and manifests")
    parser.add_argument("--json", action="store_true", help="print the recommendation and its evidence as JSON")


def register(subparsers: Any) -> None:
    from simulator.cli_options import add_run_arguments

    tune = subparsers.add_parser("tune", help="tune leadscale's settings on a trace (simulated)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(tune)
    add_tune_arguments(tune)
    tune.set_defaults(func=run_tune)
    advise = subparsers.add_parser("advise", help="tune leadscale's settings from Prometheus history",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p = advise.add_argument_group("history")
    p.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus holding the vLLM metrics")
    p.add_argument("--since", default="7d", help="how far back to read (default 7d)")
    p.add_argument("--until", type=number(Limit(0.0)), default=None, metavar="UNIX_S",
                   help="end of the range (default now)")
    p.add_argument("--step", default="60", help="resolution of the range queries (default 60 s)")
    p.add_argument("--span", default="4h", help="simulate the busiest span of this length (default 4h)")
    p.add_argument("--label", action="append", default=[], metavar="NAME=VALUE", type=key_value("namespace=llm"),
                   help="extra label matcher, e.g. namespace=llm (repeatable)")
    add_profile_argument(p)
    add_slo_arguments(p)
    add_seed_argument(p)
    add_tune_arguments(advise, model_required=True)
    advise.set_defaults(func=run_advise)
    worker = subparsers.add_parser("tune-worker", help="simulate the runs of a tune/advise --backend rdb study",
                                   description="Claims runs of --study from --storage one at a time, simulates "
                                   "them, writes their summaries; exits when the study is finished or nothing "
                                   "came for --idle-exit seconds. Start as many as you like (docs/advisor.md: "
                                   "a Kubernetes Job).")
    worker.add_argument("--storage", required=True, metavar="URL", help="the coordinator's --storage")
    worker.add_argument("--study", default="leadscale-tune", help="the coordinator's --study")
    worker.add_argument("--idle-exit", type=number(Limit(0.0), "seconds"), default=300.0, metavar="S",
                        help="exit after S seconds without a run to do (default 300)")
    worker.add_argument("--max-runs", type=count, default=None, metavar="N", help="exit after N runs")
    worker.set_defaults(func=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    from simulator.tune_jobs import StudyError, work

    try:
        done = work(args.storage, args.study, args.idle_exit, args.max_runs,
                    say=lambda m: print(f"leadscale tune-worker: {m}", file=sys.stderr, flush=True))
    except (ValueError, StudyError, KeyError, OSError) as exc:
        print(f"leadscale tune-worker: {exc}", file=sys.stderr)
        return 2
    print(f"leadscale tune-worker: {done} runs done", file=sys.stderr)
    return 0


def run_tune(args: argparse.Namespace) -> int:
    from simulator.cli_options import build_run_inputs

    try:
        inputs = build_run_inputs(args)
        return _tune_and_write(args, inputs.workload, inputs.profile, inputs.slo_ttft_s, inputs.slo_tpot_s,
                               inputs.seed, "leadscale tune", None)
    except (ValueError, KeyError, OSError) as exc:  # tune_jobs.StudyError is a ValueError
        print(f"leadscale tune: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2


def run_advise(args: argparse.Namespace) -> int:
    from scaler.profiles import get_profile
    from simulator import history

    try:
        since = history.parse_duration(args.since, "--since")
        step = history.parse_duration(args.step, "--step")
        span = history.parse_duration(args.span, "--span")
        labels = list(args.label)
        profile = get_profile(args.profile)
        end = args.until if args.until is not None else time.time()
        request = history.HistoryRequest(args.prometheus, args.model, end - since, end, step_s=step,
                                         label_matchers=tuple(labels))
        _say(args, f"reading {args.model} from {args.prometheus}: {since:g} s at {step:g} s steps")
        found = history.fetch_history(request)
        workload = busiest(found.synthesize(seed=args.seed), span)
        report = {**found.report(), "simulated_window": workload.name, "simulated_requests": len(workload)}
        return _tune_and_write(args, workload, profile, args.slo_ttft, args.slo_tpot, args.seed, "leadscale advise",
                               report)
    except (ValueError, KeyError, OSError, history.HistoryError) as exc:
        print(f"leadscale advise: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2


def _runner(args: argparse.Namespace, inputs: Any, baselines: list[str]) -> tuple[Any, Any]:
    """What evaluates the runs: local processes, recorded in (and resumed from) --storage, or its workers."""
    from simulator.tune_jobs import JobStore, Recorded
    from simulator.tuner import Pool

    if args.storage is None:
        for flag, given in (("--backend rdb", args.backend == "rdb"), ("--resume", args.resume)):
            if given:
                raise ValueError(f"{flag} needs --storage URL (an optuna RDB storage, e.g. sqlite:///tune.db or "
                                 "postgresql://user:pass@host/db)")
        return None, None
    store = JobStore(args.storage, args.study)
    store.create(inputs, args.resume, extra={"trials": args.trials, "batch": args.batch, "top": args.top,
                                             "seeds": args.seeds, "baselines": baselines})

    def runner(inp: Any, jobs: int) -> Recorded:
        return Recorded(Pool(inp, jobs), store, queue=args.backend == "rdb", worker_timeout_s=args.worker_timeout)

    if args.backend == "rdb":
        _say(args, f"runs go to study {args.study!r}: start workers with leadscale tune-worker --storage URL "
                   f"--study {args.study}")
    return runner, store


class _TrialBar:
    """tqdm over the search: trials done, the best GPU-hours meeting the target so far, ETA (a terminal
    only; elsewhere the "trial k/N" lines)."""

    def __init__(self, trials: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=trials, desc="tune", unit="trial", file=sys.stderr, disable=None, dynamic_ncols=True)
        self.quiet = bool(self.bar.disable)

    def __enter__(self) -> _TrialBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def update(self, done: int, total: int, best: float | None) -> None:
        self.bar.set_postfix_str(f"best {best:.3f} GPU-h" if best is not None else "best: none meets the target yet",
                                 refresh=False)
        self.bar.update(done - self.bar.n)


def drain_advice(run: Any) -> dict[str, Any]:
    """The drain rule (``scaler.kube.drain.drain_timing``) on a run's p99 end-to-end request time."""
    from dataclasses import asdict

    from scaler.kube.drain import drain_timing

    p99 = float(run.summary.get("e2e_p99") or 0.0) if run is not None else 0.0
    return {"p99_request_s": p99, **asdict(drain_timing(p99))}


def busiest(workload: Any, span_s: float) -> Any:
    """The ``span_s`` window with the most requests (the whole workload when shorter)."""
    import numpy as np

    from simulator.workload import select_window

    if workload.duration_s <= span_s:
        return workload
    starts = workload.arrival_s
    counts = np.searchsorted(starts, starts + span_s, side="left") - np.arange(starts.size)
    first = float(starts[int(np.argmax(counts))])
    first = min(first, float(workload.duration_s) - span_s)
    return select_window(workload, max(first, 0.0), max(first, 0.0) + span_s)


def _say(args: argparse.Namespace, message: str) -> None:
    """Progress on stderr (stdout stays one JSON object with --json)."""
    print(f"leadscale {getattr(args, 'command', None) or 'tune'}: {message}", file=sys.stderr, flush=True)


def _tune_and_write(args: argparse.Namespace, workload: Any, profile: Any, slo_ttft_s: float, slo_tpot_s: float,
                    seed: int, title: str, history_report: dict[str, Any] | None) -> int:
    from simulator import manifests, queue_limit
    from simulator.advisor_report import write_report
    from simulator.policies import parse_policies
    from simulator.stage import stage_report
    from simulator.tuner import TuneInputs, limit_runs, tune

    check_fleet_bounds(args)
    baselines = parse_policies(args.baselines) if args.baselines.strip() else []
    inputs = TuneInputs(workload, profile, args.cold_start, slo_ttft_s, slo_tpot_s, seed, args.target, args.holdout,
                        args.min_replicas, args.max_replicas)
    started = time.perf_counter()
    jobs = jobs_or_cores(args.jobs)
    runner, store = _runner(args, inputs, baselines)
    _say(args, f"one replica at the SLO and a fixed {args.fixed_stage}-replica stage")
    stage = stage_report(workload, profile, slo_ttft_s, slo_tpot_s, seed, replicas=args.fixed_stage)
    with _TrialBar(args.trials) as bar:
        result = tune(inputs, trials=args.trials, jobs=jobs, batch=args.batch, top=args.top, seeds=args.seeds,
                      baselines=baselines, progress=lambda m: _say(args, m) if bar.quiet else None,
                      runner=runner, on_trial=bar.update)
    limits = queue_limit.candidates(workload, profile, slo_ttft_s)
    _say(args, f"gateway queue limits {', '.join(f'{x:g}' for x in limits)} tokens/replica and none")
    limit_results = limit_runs(inputs, result.best.settings, [*limits, None], jobs, runner=runner)
    if store is not None:
        store.finish()  # workers exit
        _say(args, f"study {args.study!r} in {args.storage}: {store.reused} runs taken from the record")
    limit = queue_limit.recommend([queue_limit.judge(x, r, slo_ttft_s) for x, r in zip([*limits, None], limit_results,
                                                                                       strict=True)],
                                  workload, profile, slo_ttft_s, args.target)
    drain = drain_advice(result.details["recommended"])
    out = Path(args.out)
    write_report(result, out, title, history_report, stage=stage, limit=limit, drain=drain)
    best = result.best.settings
    profile_name = profile.name
    common = dict(model=args.model, profile=profile_name, slo_ttft_s=slo_ttft_s, target=args.deployment,
                  min_replicas=args.min_replicas, max_replicas=args.max_replicas)
    header = (f"{title}: trial {result.best.trial} of {len(result.trials)}, "
              f"{'holds up' if result.holds_up else 'DOES NOT hold up'} (see report.md)\n"
              f"model: set to your vLLM --served-model-name if {args.model!r} is not it")
    (out / "scaledobject.yaml").write_text(manifests.dump(manifests.scaledobject(
        best, namespace=args.namespace, scaler_address=args.scaler_address, **common), header))
    (out / "values.yaml").write_text(manifests.dump(manifests.chart_values(
        best, namespace=args.namespace, **common), header + "\nhelm install leadscale charts/leadscale -f values.yaml"))
    (out / "vllm-drain.yaml").write_text(manifests.dump(manifests.drain_patch(drain, args.deployment, args.namespace),
                                                         f"{title}: merge into the vLLM Deployment (kubectl patch "
                                                         "--type strategic, or your manifests)"))
    payload = json_safe({**result.to_json(), "history": history_report, "stage": stage.to_json(),
                         "queue_limit": limit.to_json(), "drain": drain,
                         "wall_seconds": time.perf_counter() - started})
    (out / "recommendation.json").write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(payload, sort_keys=True))
    else:
        print(json.dumps(payload["recommendation"], indent=2))
        print(f"report: {out / 'report.html'}; apply: {out / 'scaledobject.yaml'} or helm -f {out / 'values.yaml'}")
    return 0
