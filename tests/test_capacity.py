"""The capacity sweep: judging steps, finding the knee, the scaler metadata split, and a profile sweep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from leadscale.cli import main as leadscale
from simulator import capacity
from simulator.capacity import Step, SweepConfig


def _step(rate: float, ok: bool, share: float | None = 0.25) -> Step:
    return Step(rate, 100.0 * rate, 50.0 * rate, 0.1 if ok else 9.0, 0.01, 10, 10, ok, share)


@pytest.mark.parametrize(("summary", "expected"), [
    ({"ttft_p90": 0.5, "tpot_p90": 0.05, "requests": 10, "completed": 10}, True),
    ({"ttft_p90": 2.5, "tpot_p90": 0.05, "requests": 10, "completed": 10}, False),
    ({"ttft_p90": 0.5, "tpot_p90": 0.30, "requests": 10, "completed": 10}, False),
    ({"ttft_p90": 0.5, "tpot_p90": 0.05, "requests": 10, "completed": 9}, False),
    ({"ttft_p90": None, "tpot_p90": None, "requests": 10, "completed": 0}, False),
], ids=["within", "ttft-over", "tpot-over", "one-failed", "nothing-finished"])
def test_judge(summary: dict, expected: bool) -> None:
    config = SweepConfig(slo_ttft_s=2.0, slo_tpot_s=0.1)
    step = capacity.judge(1.0, {**summary, "throughput_tokens_per_s": 300.0, "output_tokens_per_s": 100.0}, config)
    assert step.meets_slo is expected
    assert (step.prompt_tokens_per_s, step.generation_tokens_per_s) == (200.0, 100.0)


@pytest.mark.parametrize(("field", "value"), [
    ("slo_ttft_s", 0.0), ("slo_tpot_s", float("inf")), ("percentile", 75), ("factor", 1.0), ("max_steps", 0),
    ("requests", 2), ("start_rate", -1.0)], ids=lambda v: str(v))
def test_config_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SweepConfig(**{"slo_ttft_s": 1.0, field: value})


def test_sweep_stops_after_two_failures_and_picks_the_knee() -> None:
    seen: list[float] = []

    def run(w):  # passes below 4 req/s
        rate = len(w) / max(float(w.arrival_s[-1]), 1e-9)
        seen.append(rate)
        ok = len(seen) <= 3
        return {"ttft_p90": 0.1 if ok else 5.0, "requests": len(w), "completed": len(w),
                "prompt_tokens_per_s": 10.0 * len(seen), "generation_tokens_per_s": 5.0 * len(seen)}, 0.5

    config = SweepConfig(slo_ttft_s=1.0, start_rate=1.0, factor=2.0, max_steps=10, requests=20)
    steps = capacity.sweep(run, np.array([100, 200]), np.array([10, 20]), config)
    assert [s.rate for s in steps] == [1.0, 2.0, 4.0, 8.0, 16.0]
    best = capacity.knee(steps)
    assert best is not None and best.rate == 4.0
    assert capacity.metadata_for(best) == {"prefillTokensPerSecond": 60.0, "decodeTokensPerSecond": 30.0}
    assert capacity.knee([_step(1.0, False)]) is None


@given(st.floats(0.01, 0.99), st.floats(1.0, 1e5), st.floats(1.0, 1e5))
def test_metadata_makes_the_knee_exactly_one_replica(share: float, prompt: float, gen: float) -> None:
    step = Step(1.0, prompt, gen, 0.1, 0.01, 5, 5, True, share)
    meta = capacity.metadata_for(step)
    assert meta is not None
    demand = prompt / meta["prefillTokensPerSecond"] + gen / meta["decodeTokensPerSecond"]
    assert demand == pytest.approx(1.0, rel=1e-3)


def test_step_workload_is_seeded_and_resamples_the_mix() -> None:
    inp, out = np.array([10, 20, 30]), np.array([1, 2, 3])
    a = capacity.step_workload(inp, out, 2.0, 50, seed=4)
    b = capacity.step_workload(inp, out, 2.0, 50, seed=4)
    assert np.array_equal(a.arrival_s, b.arrival_s) and set(a.input_tokens.tolist()) <= {10, 20, 30}
    assert len(a) / a.arrival_s[-1] == pytest.approx(2.0, rel=0.4)


def test_profile_sweep_cli_finds_a_knee_and_plots_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = leadscale(["capacity", "--profile", "h100-llama3-8b", "--trace", "builtin:default", "--slo-ttft", "1",
                    "--start-rate", "4", "--factor", "2", "--max-steps", "6", "--requests", "120",
                    "--out", str(tmp_path)])
    result = json.loads((tmp_path / "capacity.json").read_text())
    assert rc == 0 and result["knee"] is not None
    steps = result["steps"]
    assert steps[0]["meets_slo"] and result["knee"]["generation_tokens_per_s"] > 0
    assert set(result["scaler_metadata"]) == {"prefillTokensPerSecond", "decodeTokensPerSecond"}
    assert (tmp_path / "knee.png").stat().st_size > 1000
    assert '"knee"' in capsys.readouterr().out


def test_capacity_cli_bad_flag_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:  # the flag's type refuses it (scaler.cli_types)
        leadscale(["capacity", "--profile", "h100-llama3-8b", "--slo-ttft", "-1", "--out", str(tmp_path)])
    assert exited.value.code == 2 and "argument --slo-ttft: '-1': must be a number > 0" in capsys.readouterr().err
