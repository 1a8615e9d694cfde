"""A replay's timed engine steps: the file, its errors, the fit on them, and calibration's choice of fit."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import calibrate
from simulator.step_log import COLUMNS, StepLogError, fit_step_time, read_steps, write_steps
from tests.test_calibrate import _fake_replay, _truth, _workload

TRUE = {"overhead_s": 1e-3, "per_token_s": 2e-5, "per_seq_s": 3e-4, "per_context_token_s": 1e-8,
        "prefill_attention_s": 2e-9, "per_prefill_seq_s": 2e-3}
SECONDS = COLUMNS.index("seconds")


def _steps(n: int, seed: int, noise: float = 0.02) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tokens, seqs = rng.integers(1, 512, n).astype(float), rng.integers(1, 9, n).astype(float)
    prefill = rng.random(n) < 0.3
    context, attention = rng.uniform(0, 8000, n), rng.uniform(0, 60000, n) * prefill
    prefills = prefill * rng.integers(1, 3, n)
    seconds = (TRUE["overhead_s"] + TRUE["per_token_s"] * tokens + TRUE["per_seq_s"] * seqs
               + TRUE["per_context_token_s"] * context + TRUE["prefill_attention_s"] * attention
               + TRUE["per_prefill_seq_s"] * prefills)
    return np.column_stack([tokens, seqs, context, attention, prefills, seconds * (1 + rng.normal(0, noise, n))])


def test_the_fit_recovers_a_known_step_time_and_reports_its_residuals() -> None:
    model, residuals = fit_step_time(_steps(400, seed=3))
    for name in ("overhead_s", "per_token_s", "per_seq_s", "per_prefill_seq_s"):
        assert getattr(model, name) == pytest.approx(TRUE[name], rel=0.1), name
    assert model.intercept_s == 0
    assert residuals.steps == 400 and 0.005 < residuals.abs_rel_p50 < 0.03 < residuals.abs_rel_p95 < 0.06
    assert "400 timed steps" in residuals.describe()


def test_the_fit_finds_the_batch_size_below_which_a_step_costs_the_same() -> None:
    """Small decode steps cost the weights' read, large prefill chunks their tokens: a straight line fitted
    through both would time the large ones short."""
    steps = _steps(600, seed=5, noise=0.01)
    tokens = steps[:, 0]
    steps[:, SECONDS] += TRUE["per_token_s"] * (np.maximum(tokens, 160) - tokens)  # flat below 160 tokens
    model, residuals = fit_step_time(steps)
    assert residuals.knee_tokens == pytest.approx(160, abs=25)
    assert model.per_token_s == pytest.approx(TRUE["per_token_s"], rel=0.1)
    assert model.floor_s == pytest.approx(TRUE["per_token_s"] * 160, rel=0.15) and model.intercept_s == 0
    assert residuals.abs_rel_p95 < 0.03
    big = steps[tokens > 400]
    assert np.median([model.step_time(*row[:SECONDS]) / row[SECONDS] for row in big]) == pytest.approx(1.0, abs=0.01)
    linear, _ = fit_step_time(_steps(400, seed=3))  # and where there is no knee, none is invented
    assert linear.floor_s < 0.1 * TRUE["overhead_s"]


def test_the_fit_refuses_too_few_or_impossible_steps() -> None:
    with pytest.raises(ValueError, match="need at least 10"):
        fit_step_time(np.ones((3, 6)))
    with pytest.raises(ValueError, match=r"expected \(n, 6\)"):
        fit_step_time(np.ones((20, 5)))
    bad = _steps(20, seed=1)
    bad[4, SECONDS] = 0.0
    with pytest.raises(ValueError, match="seconds > 0"):
        fit_step_time(bad)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4096), st.integers(1, 256), st.floats(0, 1e7), st.floats(0, 1e9),
                          st.integers(0, 8), st.floats(1e-6, 10.0)), min_size=10, max_size=60))
def test_any_valid_steps_give_a_model_that_times_every_step_finite_and_positive(rows: list[tuple]) -> None:
    model, residuals = fit_step_time(np.array(rows, dtype=float))
    for n, s, c, a, p, _ in rows:
        t = model.step_time(n, s, c, a, p)
        assert math.isfinite(t) and t > 0
    assert math.isfinite(residuals.abs_rel_p95) and math.isfinite(residuals.mean_rel)


def test_the_file_round_trips_exactly(tmp_path: Path) -> None:
    steps = _steps(50, seed=2)
    assert np.array_equal(read_steps(write_steps(tmp_path / "steps.csv", steps)), steps)
    assert (tmp_path / "steps.csv").read_text().splitlines()[0] == ",".join(COLUMNS)
    with pytest.raises(ValueError, match=r"shape \(50, 5\); expected \(n, 6\)"):  # never reshaped into other rows
        write_steps(tmp_path / "old.csv", steps[:, 1:])


@pytest.mark.parametrize(("text", "message"), [
    ("tokens,seqs\n1,2\n",
     r"line 1: header .*expected tokens,seqs,decode_context,prefill_attention,prefill_seqs,seconds"),
    ("tokens,seqs,decode_context,prefill_attention,seconds\n1,1,0,0,0.01\n",
     r"line 1: header .*prefill_seqs.* needs to be run again"),
    ("", "line 1: header None"),
    (",".join(COLUMNS) + "\n1,1,0,0,0,0.01\n1,1,0,0,0\n", r"line 3: 5 fields; expected 6"),
    (",".join(COLUMNS) + "\n1,1,0,0,0,0.01\n2,x,0,0,0,0.01\n", r"line 3, column 'seqs': 'x' is not a number >= 1"),
    (",".join(COLUMNS) + "\n1,1,nan,0,0,0.01\n", r"line 2, column 'decode_context': 'nan' is not a finite number >= 0"),
    (",".join(COLUMNS) + "\n1,1,0,-5,0,0.01\n", r"line 2, column 'prefill_attention': '-5' is not"),
    (",".join(COLUMNS) + "\n1,1,0,0,1.5,0.01\n", r"line 2, column 'prefill_seqs': '1.5' is not a whole number >= 0"),
    (",".join(COLUMNS) + "\n1,1,0,0,0,0\n", r"line 2, column 'seconds': '0' is not a finite number > 0"),
    (",".join(COLUMNS) + "\n1,0,0,0,0,0.01\n", r"line 2, column 'seqs': '0' is not a number >= 1"),
])
def test_a_bad_file_names_its_line_column_and_value(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "steps.csv"
    path.write_text(text)
    with pytest.raises(StepLogError, match=message) as info:
        read_steps(path)
    assert str(path) in str(info.value)


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("steplog") / "a"
    _fake_replay(path, _truth(), _workload(1, n=40))
    return path


def test_calibration_fits_on_the_timed_steps_when_the_replay_has_them(replay: Path, tmp_path: Path) -> None:
    timed = tmp_path / "timed"
    shutil.copytree(replay, timed)
    steps = _steps(300, seed=4)
    write_steps(timed / "steps.csv", steps)
    m = calibrate.load_replay(timed)
    assert calibrate.step_time_method(m, "auto") == "steps"
    profile = calibrate.fit(m, max_num_seqs=8, max_num_batched_tokens=512)
    assert profile.step_time == fit_step_time(steps)[0]  # the fit on the steps, not a simulated search
    assert "fitted on the replay's 300 timed steps" in profile.source
    with pytest.raises(ValueError, match="expected one of auto, steps, outcomes"):
        calibrate.fit(m, step_time="guess")


def test_calibration_without_timed_steps_fits_outcomes_and_says_why_steps_cannot(replay: Path) -> None:
    m = calibrate.load_replay(replay)
    assert m.steps is None and calibrate.step_time_method(m, "auto") == "outcomes"
    with pytest.raises(ValueError, match=r"has 0 timed steps in steps.csv \(need at least 10; only an in-process"):
        calibrate.fit(m, step_time="steps")


def test_a_bad_steps_file_stops_calibration_with_its_line(replay: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(replay, broken)
    (broken / "steps.csv").write_text(",".join(COLUMNS) + "\n1,1,0,0,0,-1\n")
    with pytest.raises(StepLogError, match="line 2, column 'seconds'"):
        calibrate.load_replay(broken)


def test_calibration_pools_more_timed_steps_given_with_the_replay(replay: Path, tmp_path: Path) -> None:
    """``leadscale calibrate --steps FILE``: a sweep's steps of the same requests join the replay's, so the fit
    measures batches the replay never ran; a bad file is named, and ``--check`` refuses them (no fit there)."""
    from leadscale.cli import main

    timed = tmp_path / "timed"
    shutil.copytree(replay, timed)
    light, busy = _steps(200, seed=4), _steps(200, seed=9)
    write_steps(timed / "steps.csv", light)
    extra = write_steps(tmp_path / "sweep-steps.csv", busy)
    pooled = calibrate.with_steps(calibrate.load_replay(timed), [extra])
    assert pooled.steps is not None and np.array_equal(pooled.steps, np.concatenate([light, busy]))
    assert calibrate.with_steps(calibrate.load_replay(replay), [extra]).steps.shape == busy.shape  # none of its own
    out = tmp_path / "pooled.yaml"
    assert main(["calibrate", "--replay", str(timed), "--steps", str(extra), "--out", str(out), "--max-num-seqs",
                 "8", "--max-num-batched-tokens", "512"]) == 0
    assert "400 timed steps" in out.read_text()
    (tmp_path / "bad.csv").write_text("tokens\n1\n")
    with pytest.raises(StepLogError, match=r"bad\.csv"):
        calibrate.with_steps(calibrate.load_replay(timed), [tmp_path / "bad.csv"])
    assert main(["calibrate", "--replay", str(timed), "--steps", str(extra), "--check", str(out)]) == 2
