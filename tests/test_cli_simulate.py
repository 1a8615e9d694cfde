"""``leadscale simulate`` and ``leadscale profiles`` end to end (in-process, through leadscale.cli)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leadscale.cli import main
from simulator.cli_options import _window, add_run_arguments, build_run_inputs
from tests.conftest import TRACES, require

SMALL = "builtin:poisson?rate=5&duration=60"
KEYS = ["requests", "completed", "ttft_p50", "ttft_p95", "ttft_p99", "tpot_p50", "tpot_p95", "itl_p50", "e2e_p95",
        "slo_attainment", "throughput_tokens_per_s", "gpu_hours", "wall_seconds"]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["simulate", "--json", *argv]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # no progress bar with --json
    return json.loads(out)


def test_json_summary_keys_and_determinism(capsys: pytest.CaptureFixture[str]) -> None:
    a = run_json(capsys, "--trace", SMALL, "--replicas", "2", "--seed", "3")
    b = run_json(capsys, "--trace", SMALL, "--replicas", "2", "--seed", "3")
    for key in KEYS:
        assert key in a
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b
    assert a["requests"] == a["completed"] > 200


def test_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--trace", SMALL, "--out", str(tmp_path / "run"), "--profile", "a100-llama3-8b"]) == 0
    text = capsys.readouterr().out
    assert "ttft_p95" in text
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = (tmp_path / "run" / "requests.csv").read_text().splitlines()
    assert len(rows) == summary["requests"] + 1 and summary["profile"] == "a100-llama3-8b"


@pytest.mark.parametrize(("argv", "message"), [
    (["--profile", "tpu-llama"], "unknown profile 'tpu-llama'"),
    (["--trace", "builtin:nosuch"], "nosuch"),
    (["--router", "fastest"], "router='fastest'"),
    (["--trace", "/nonexistent/trace.csv"], "trace.csv"),
])
def test_bad_input_exits_2_with_a_message(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(["simulate", "--json", "--trace", SMALL, *argv] if "--trace" not in argv
                else ["simulate", "--json", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(("argv", "allowed"), [
    (["--window", "10:5"], "0 <= START < END"), (["--rate-scale", "0"], "must be a number > 0"),
    (["--slo-ttft", "nan"], "must be a number > 0 (seconds)"), (["--replicas", "0"], "must be an integer >= 1"),
    (["--seed", "-1"], "must be an integer >= 0"),
])
def test_bad_flag_values_are_argparse_errors(capsys: pytest.CaptureFixture[str], argv: list[str],
                                             allowed: str) -> None:
    """A flag's type refuses its value naming the flag, the value and what is allowed (scaler.cli_types)."""
    with pytest.raises(SystemExit) as exited:
        main(["simulate", *argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"argument {argv[0]}" in err and repr(argv[1]) in err and allowed in err


def test_run_inputs_window_and_scales() -> None:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    base = build_run_inputs(parser.parse_args(["--trace", SMALL]))
    windowed = build_run_inputs(parser.parse_args(["--trace", SMALL, "--window", "10:30"]))
    faster = build_run_inputs(parser.parse_args(["--trace", SMALL, "--rate-scale", "2"]))
    assert windowed.workload.arrival_s.max() < 20.0 and len(windowed.workload) < len(base.workload)
    assert faster.workload.duration_s == pytest.approx(base.workload.duration_s / 2)
    assert base.profile.name == "h100-llama3-8b" and base.slo_ttft_s == 2.0 and base.seed == 0


def test_trace_file(capsys: pytest.CaptureFixture[str]) -> None:
    path = TRACES / "sharegpt_300_at_10rps.csv"
    require(path.is_file(), f"trace {path}")
    s = run_json(capsys, "--trace", str(path), "--duration", "10")
    assert 50 < s["requests"] < 150


def test_profiles_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles"]) == 0
    assert "h200-llama3-8b" in capsys.readouterr().out
    assert main(["profiles", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"a100-llama3-8b", "h100-llama3-8b", "h200-llama3-8b", "a100-llama2-70b-tp4"}
    assert all(r["source"] and r["capacity"]["prefill_tokens_per_s"] > 0 for r in rows)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=12), st.builds(lambda a, b: f"{a}:{b}", st.floats(allow_nan=True),
                                                       st.floats(allow_nan=True))))
def test_window_parser_accepts_or_explains(text: str) -> None:
    try:
        start, end = _window(text)
    except argparse.ArgumentTypeError as exc:
        assert "--window" in str(exc) and "START:END" in str(exc)
        return
    assert math.isfinite(start) and start >= 0
    assert end is None or (math.isfinite(end) and end > start)
