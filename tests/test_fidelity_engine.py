"""The in-process fidelity replay's bookkeeping (``benchmarks/fidelity_engine.py``), without vLLM: the queue
depth and the metrics it reports, and the replay directory calibration reads back."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("fidelity_engine", ROOT / "benchmarks" / "fidelity_engine.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fidelity_engine"] = module
    spec.loader.exec_module(module)
    return module


def _run(fe, queued, started):
    n = len(queued)
    queued, started = np.array(queued, float), np.array(started, float)
    return fe.EngineRun(scheduled=queued.copy(), queued=queued, started=started, first=started + 0.1,
                        last=started + 1.0, prompt=np.full(n, 100), output=np.full(n, 10), preemptions=np.zeros(n),
                        token_gaps=[0.1] * (9 * n), wall_s=10.0)


def test_the_queue_depth_counts_requests_queued_and_not_yet_scheduled() -> None:
    fe = _module()
    run = _run(fe, [0.0, 0.1, 0.2, 0.3, 2.0], [0.05, 0.5, 0.6, 0.7, 2.1])
    assert run.max_waiting == 3  # at 0.3 s: requests 1, 2 and 3 wait
    m = run.metrics()
    # each request's own TTFT and E2E from its queueing (no buckets): [0.15, 0.5, 0.5, 0.5, 0.2], [1.05, 1.4 x3, 1.1]
    assert m["ttft_p50"] == pytest.approx(0.5) and m["e2e_p95"] == pytest.approx(1.4)
    assert m["itl_p50"] == pytest.approx(0.1) and m["output_tokens_per_s"] == pytest.approx(5.0)
    assert m["max_waiting"] == 3.0


def test_the_run_reads_back_as_a_replay_calibration_accepts(tmp_path: Path) -> None:
    fe = _module()
    from simulator.calibrate import load_replay

    engine = fe.InProcessEngine.__new__(fe.InProcessEngine)  # no vLLM: only the writer is exercised
    engine.model_dir, engine.max_model_len = tmp_path / "model", 2048
    engine.cache_config = lambda: {"block_size": "16", "num_gpu_blocks": "4096"}
    run = _run(fe, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5], [0.0, 0.5, 1.0, 1.6, 2.2, 2.8])
    measured = load_replay(engine.write_replay(run, tmp_path / "slice0"))
    assert len(measured.workload) == 6
    assert measured.workload.arrival_s.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])  # engine arrivals
    assert measured.cache["num_gpu_blocks"] == "4096"
    assert measured.summary["ttft_p50"] == pytest.approx(0.1 + np.median([0.0, 0.0, 0.0, 0.1, 0.2, 0.3]))
    # calibration's objective reads the engine means, exact here: queue [0, 0, 0, .1, .2, .3], ITL 0.1
    assert measured.engine["server_queue_mean"] == pytest.approx(0.1)
    assert measured.engine["server_ttft_mean"] == pytest.approx(0.2)
    assert measured.engine["server_itl_mean"] == pytest.approx(0.1)
    assert measured.steps is not None and measured.steps.shape == (0, 6)  # this run timed no steps


def test_the_run_s_timed_steps_travel_to_calibration(tmp_path: Path) -> None:
    fe = _module()
    from simulator.calibrate import load_replay, step_time_method

    engine = fe.InProcessEngine.__new__(fe.InProcessEngine)
    engine.model_dir, engine.max_model_len = tmp_path / "model", 2048
    engine.cache_config = lambda: {"block_size": "16", "num_gpu_blocks": "4096"}
    run = _run(fe, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5], [0.0, 0.5, 1.0, 1.6, 2.2, 2.8])
    rng = np.random.default_rng(0)
    run.steps = np.column_stack([rng.integers(1, 512, 30), rng.integers(1, 9, 30), rng.uniform(0, 4000, 30),
                                 rng.uniform(0, 9e4, 30), rng.integers(0, 3, 30), rng.uniform(1e-3, 2e-2, 30)]
                                ).astype(float)
    measured = load_replay(engine.write_replay(run, tmp_path / "slice0"))
    assert np.array_equal(measured.steps, run.steps)  # exactly: repr() round-trips a float
    assert step_time_method(measured, "auto") == "steps"


def test_the_retest_spread_is_the_largest_move_of_a_repeat_from_the_first_run() -> None:
    spec = importlib.util.spec_from_file_location("bench_fidelity", ROOT / "benchmarks" / "bench_fidelity.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    first = {k: 1.0 for k in bench.METRICS} | {"itl_p50": 0.002, "max_waiting": 0.0}
    repeats = [first | {"ttft_p50": 1.1, "itl_p50": 0.0019}, first | {"ttft_p50": 0.8, "e2e_p95": None}]
    spread = bench.retest_spread(first, repeats)
    assert spread["ttft_p50"] == pytest.approx(0.2)  # |0.8 / 1 - 1| beats |1.1 / 1 - 1|
    assert spread["itl_p50"] == pytest.approx(0.05) and spread["e2e_p50"] == 0.0
    assert spread["e2e_p95"] == 0.0  # a missing repeat value is skipped, not counted as a move
    assert spread["max_waiting"] is None  # no relative move from a first run of 0
    row = bench.load_row(0.5, {k: (v, None) for k, v in first.items()}, dict(first), spread)
    assert row["metrics"]["ttft_p50"]["retest"] == pytest.approx(0.2) and row["metrics"]["ttft_p50"]["error"] == 0.0


def _bench():
    spec = importlib.util.spec_from_file_location("bench_fidelity", ROOT / "benchmarks" / "bench_fidelity.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


class _SaturatingEngine:
    """An engine that serves at most ``cap_rps`` requests/s of ``out`` output tokens each; its p90 TTFT passes
    ``slo`` from ``knee_rps`` on, well before it saturates (as the CPU build's does)."""

    def __init__(self, knee_rps: float, cap_rps: float, out: int) -> None:
        self.knee_rps, self.cap_rps, self.out = knee_rps, cap_rps, out
        self.rates: list[float] = []

    def run(self, arrivals, prompts, outputs):
        rate = (len(arrivals) - 1) / float(arrivals[-1] - arrivals[0])
        self.rates.append(rate)
        ttft = 0.05 if rate <= self.knee_rps else 2.0
        tps = min(rate, self.cap_rps) * self.out

        class Run:
            queued = np.zeros(len(arrivals))
            first = np.full(len(arrivals), ttft)

            def metrics(self):
                return {"output_tokens_per_s": tps}

        return Run()


def test_the_overload_rate_comes_from_the_saturation_not_the_ttft_knee(tmp_path: Path) -> None:
    """130 % of a TTFT knee held 2-5 waiting on the real engine: the sweep goes on past the knee until the output
    tokens/s stops growing, and the overload load is a share of that rate."""
    bench = _bench()

    class Trace:
        arrival_s = np.arange(40, dtype=float) / bench.TRACE_RATE  # the trace's own pace: 10 req/s
        input_tokens = np.full(40, 100)
        output_tokens = np.full(40, 50)

    engine = _SaturatingEngine(knee_rps=2.0, cap_rps=3.5, out=50)
    knee, saturation = bench.engine_capacity_rps(engine, Trace(), 40, 1.0, 0.6, tmp_path)
    assert knee == pytest.approx(0.6 * 1.4 ** 3)  # 1.65: the last rate within the TTFT target
    assert saturation == pytest.approx(3.5)  # the throughput's plateau, in requests/s
    assert engine.rates[-1] > 3.5 and len(engine.rates) == 7  # one step past the plateau, then stop
    assert bench.OVERLOAD in dict(bench.LOADS)
    with pytest.raises(ValueError, match="mean_output_tokens"):
        bench.saturated_rps([{"output_tokens_per_s": 1.0}], 0.0)


def test_sweep_steps_that_scatter_around_their_own_fit_stay_out_of_the_pooled_fit(tmp_path: Path) -> None:
    from simulator.step_log import write_steps

    rng = np.random.default_rng(5)
    n = 400
    batch = np.column_stack([rng.integers(1, 512, n), rng.integers(1, 9, n), rng.uniform(0, 4000, n),
                             rng.uniform(0, 9e4, n), rng.integers(0, 3, n)]).astype(float)
    seconds = 1e-3 + 5e-6 * batch[:, 0] + 3e-5 * batch[:, 1] + 1.5e-3 * batch[:, 4]
    clean = write_steps(tmp_path / "steps-00.csv", np.column_stack([batch, seconds * rng.normal(1, 0.03, n)]))
    # another job on the cores: a third of the steps take 1.5-3x as long
    shared = seconds * np.where(rng.random(n) < 0.35, rng.uniform(1.5, 3.0, n), 1.0)
    noisy = write_steps(tmp_path / "steps-01.csv", np.column_stack([batch, shared]))
    kept = _bench().clean_step_files([clean, noisy], "8x512")
    assert list(kept) == [clean] and np.array_equal(kept[clean][:, :5], batch)


def test_a_runs_step_speed_is_its_real_time_over_the_fits() -> None:
    from simulator.step_log import fit_step_time

    rng = np.random.default_rng(9)
    n = 300
    batch = np.column_stack([rng.integers(1, 512, n), rng.integers(1, 9, n), rng.uniform(0, 4000, n),
                             rng.uniform(0, 9e4, n), rng.integers(0, 3, n)]).astype(float)
    seconds = 1e-3 + 5e-6 * batch[:, 0] + 3e-5 * batch[:, 1] + 1.5e-3 * batch[:, 4]
    model, _ = fit_step_time(np.column_stack([batch, seconds]))
    bench = _bench()
    assert bench.step_speed(model, np.column_stack([batch, seconds])) == pytest.approx(1.0, abs=1e-6)
    # the same batches on a machine 12 % slower
    assert bench.step_speed(model, np.column_stack([batch, 1.12 * seconds])) == pytest.approx(1.12, abs=1e-6)


def test_reanalysis_rebuilds_the_tables_from_kept_runs_without_vllm(tmp_path: Path) -> None:
    """``bench_fidelity --reanalyse ROOT``: the real side read back from the kept replays exactly as the run
    measured it, the simulated side recomputed by this checkout, with or without the measured step jitter."""
    fe, bench = _module(), _bench()
    engine = fe.InProcessEngine.__new__(fe.InProcessEngine)  # no vLLM: only the writer is exercised
    engine.model_dir, engine.max_model_len = tmp_path / "model", 2048
    engine.cache_config = lambda: {"block_size": "16", "num_gpu_blocks": "4096"}
    out = tmp_path / "root" / "4x256-in-process"
    rng = np.random.default_rng(3)

    def timed_run(shift: float):
        queued = np.arange(40) * 0.5
        run = _run(fe, queued, queued + np.where(np.arange(40) == 3, shift, 0.0))
        batch = np.column_stack([rng.integers(1, 256, 400), rng.integers(1, 5, 400), rng.uniform(0, 4000, 400),
                                 rng.uniform(0, 9e4, 400), rng.random(400) < 0.2]).astype(float)
        seconds = (1e-3 + 5e-6 * batch[:, 0] + 3e-5 * batch[:, 1] + 1.5e-3 * batch[:, 4]) * np.exp(
            rng.normal(0.0, 0.35, 400))  # skewed like the CPU build's decode steps on a busy host
        run.steps = np.column_stack([batch, seconds])
        return run

    runs = {f"slice{i}": timed_run(0.1 * i) for i in range(len(bench.LOADS))}
    runs["slice1-repeat1"] = timed_run(0.5)
    for name, run in runs.items():
        engine.write_replay(run, out / name)
        assert bench.metrics_on_disk(out / name) == pytest.approx(run.metrics())
    (out / "capacity").mkdir()
    (out / "capacity" / "capacity.json").write_text('{"knee": 1.5, "saturation": 3.0}')
    with_jitter, = bench.reanalyse(tmp_path / "root")
    without, = bench.reanalyse(tmp_path / "root", jitter=False)
    assert with_jitter["setting"] == "4x256" and with_jitter["capacity_rps"] == 1.5
    fits = {t["fit"]: t for t in (with_jitter, *with_jitter["other_fits"])}
    assert list(fits) == ["outcomes", "steps"]  # no sweep steps kept: no pooled fit
    half = fits["steps"]["loads"]["50 %"]["metrics"]
    assert half["itl_p50"]["real"] == pytest.approx(runs["slice1"].metrics()["itl_p50"])
    assert half["itl_p50"]["retest"] == pytest.approx(abs(runs["slice1-repeat1"].metrics()["itl_p50"]
                                                          / runs["slice1"].metrics()["itl_p50"] - 1))
    plain = {t["fit"]: t for t in (without, *without["other_fits"])}["steps"]["loads"]["50 %"]["metrics"]
    assert plain["itl_p50"]["real"] == half["itl_p50"]["real"]
    assert half["itl_p50"]["simulated"] < plain["itl_p50"]["simulated"]  # the skewed steps' median
    assert "error_at_speed" in half["ttft_p50"]  # the step fits also simulate each slice at its own speed
    assert "error_at_speed" not in fits["outcomes"]["loads"]["50 %"]["metrics"]["ttft_p50"]  # (no steps timed)
    with pytest.raises(SystemExit, match="no SETTING-in-process directory"):
        bench.reanalyse(tmp_path / "model")


def test_a_profile_at_a_runs_speed_takes_every_step_that_much_longer() -> None:
    """``at_speed``: an engine 20 % slower is the model with every coefficient 1.2x, so a lone request's
    latencies are 1.2x (its steps are all the model's; no queue)."""
    from scaler.profiles import get_profile
    from simulator.engine import simulate
    from simulator.workload import Workload

    bench = _bench()
    profile = get_profile("h100-llama3-8b")
    lone = Workload(np.array([0.0]), np.array([3000]), np.array([400]))
    base, slow = simulate(lone, profile).log, simulate(lone, bench.at_speed(profile, 1.2)).log
    assert slow.first_token_s[0] == pytest.approx(1.2 * base.first_token_s[0], rel=1e-9)
    assert slow.finish_s[0] == pytest.approx(1.2 * base.finish_s[0], rel=1e-9)
    assert bench.at_speed(profile, 1.0) == profile


def test_the_engine_runs_bfloat16_only_where_the_cpu_has_a_bfloat16_matmul() -> None:
    """Without avx512_bf16 or amx_bf16 the CPU build's bfloat16 linear falls back to torch (about 1.7x slower
    steps, docs/real-vllm.md): the fidelity bench's ``--dtype auto`` takes float32 there."""
    from support.vllm_server import host_dtype

    avx2_host = "flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2"
    assert host_dtype(avx2_host) == "float32"
    assert host_dtype(avx2_host + " avx512f avx512bw") == "float32"  # AVX-512 alone has no bfloat16 matmul
    assert host_dtype(avx2_host + " avx512f avx512_bf16") == "bfloat16"
    assert host_dtype(avx2_host + " amx_tile amx_bf16") == "bfloat16"
    assert host_dtype("flags\t\t: avx512_bf16x") == "float32"  # a whole flag, not a prefix
