"""The policy suite's ``--baseline`` mode: leadscale runs alone, everything else comes from a kept run.

A settings sweep relies on it to take minutes instead of two hours, so it must never mix a stale
leadscale into the table or hide a missing baseline."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--trace", "builtin:gamma?rate=4&cv=2&duration=300"]


def _suite():
    spec = importlib.util.spec_from_file_location("bench_policy_suite", ROOT / "benchmarks" / "bench_policy_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_baseline_mode_runs_leadscale_and_keeps_the_baselines(tmp_path):
    suite = _suite()
    baseline, out = tmp_path / "full", tmp_path / "sweep"
    baseline.mkdir()
    out.mkdir()
    kept = {"saturation": {"gpu_hours": 1.25, "ttft_p95": 0.5},
            "oracle": {"gpu_hours": 0.5, "oracle_gpu_hours": 0.5, "ttft_p95": 1.0},
            "leadscale": {"gpu_hours": 99.0, "ttft_p95": 99.0}}  # a stale leadscale must not survive
    (baseline / f"{suite.slug('small', 1)}.json").write_text(json.dumps({"policies": kept}))
    result = suite.run_one("small", SMALL, 1, out, ["headroomQuantile=0.8"], reuse=False, baseline=baseline)
    assert "error" not in result, result
    assert result["saturation"] == kept["saturation"] and result["oracle"] == kept["oracle"]
    assert result["leadscale"]["gpu_hours"] != 99.0 and 0 < result["leadscale"]["gpu_hours"] < 10
    # the merged result is kept, so --reuse re-prints it without running anything
    again = suite.run_one("small", SMALL, 1, out, [], reuse=True, baseline=baseline)
    assert again == result


def test_baseline_mode_names_the_missing_file(tmp_path):
    suite = _suite()
    result = suite.run_one("small", SMALL, 2, tmp_path, [], reuse=False, baseline=tmp_path / "none")
    assert "error" in result and f"{suite.slug('small', 2)}.json" in result["error"]


def test_leadscale_only_runs_no_recipe_and_no_oracle(tmp_path, capsys):
    suite = _suite()
    result = suite.run_one("small", SMALL, 1, tmp_path, [], reuse=False, alone=True)
    assert set(result) == {"leadscale"} and 0 < result["leadscale"]["gpu_hours"] < 10
    suite.print_leadscale_alone({"small": SMALL}, [1], {("small", 1): result})
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| small |"))
    assert f"{result['leadscale']['gpu_hours']:.2f}" in line and line.endswith("| yes |") == suite.meets(
        result["leadscale"])


def test_only_takes_a_workload_whose_name_holds_a_comma():
    suite = _suite()
    name = "arxiv lengths, gamma arrivals"
    assert name in suite.SUITE  # the suite's own row, selectable alone
    assert suite.only_names(name, suite.SUITE) == [name]
    assert suite.only_names("builtin default,gamma cv 4", suite.SUITE) == ["builtin default", "gamma cv 4"]
    assert suite.only_names(" diurnal ramp ", suite.SUITE) == ["diurnal ramp"]


def test_static_adds_the_cheapest_fixed_fleet_as_a_column_the_floors_do_not_count(tmp_path, capsys):
    suite = _suite()
    result = suite.run_one("small", SMALL, 1, tmp_path, [], reuse=False, alone=True, static=True)
    assert set(result) == {"leadscale", "static"}
    fleet = result["static"]
    assert suite.meets(fleet) and fleet["static_replicas"] >= 1
    suite.print_leadscale_alone({"small": SMALL}, [1], {("small", 1): result}, static=True)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| small |"))
    assert line.endswith(f"| {fleet['gpu_hours']:.2f} ({fleet['ttft_p95']:.2f}) |")
    # in the full table it is a column, never a baseline: a cheaper static fleet does not fail a floor
    runs = [{**result, "oracle": {"gpu_hours": 1.0, "oracle_gpu_hours": 1.0, "ttft_p95": 1.0},
             "static": {**fleet, "gpu_hours": 0.001},
             **{b: {"gpu_hours": 99.0, "ttft_p95": 99.0} for b in suite.BASELINES}}]
    text, verdict = suite.row("small", runs, static=True)
    assert verdict is not None and verdict["cheaper"]
    assert text.count("|") == 14  # 13 columns: one more than without it


def _row_runs(suite, late: float, causal: float, feasible: bool) -> list[dict]:
    """One seed of a row whose clairvoyant schedule costs 1 GPU-hour and leadscale 1.6 at p95 30 s."""
    return [{"leadscale": {"gpu_hours": 1.6, "ttft_p95": 30.0, "ttft_late_share": late},
             "oracle": {"gpu_hours": 1.0, "oracle_gpu_hours": 1.0, "ttft_p95": 0.5, "causally_feasible": feasible,
                        "causal_min_late_share": causal},
             **{b: {"gpu_hours": 1.2, "ttft_p95": 60.0} for b in suite.BASELINES}}]


def test_a_row_no_causal_policy_can_meet_is_judged_against_the_causal_bound():
    """The 10 -> 50 -> 25 step: the clairvoyant schedule meets the SLO only by knowing the future, so the row's
    floor is the late share beyond the causal minimum (within the 5 % budget), not the ratio to that schedule."""
    suite = _suite()
    text, verdict = suite.row("steps", _row_runs(suite, late=0.12, causal=0.08, feasible=False))
    assert verdict["ok"] and verdict["ratio"] == 1.6  # 1.6x the schedule and a 30 s p95: not what it is judged on
    assert "late first tokens 12.0 % against a causal minimum of 8.0 %" in text and text.endswith("| ok |")
    text, verdict = suite.row("steps", _row_runs(suite, late=0.14, causal=0.08, feasible=False))
    assert not verdict["ok"] and "late beyond the causal minimum by more than 5%" in text and "1.25x" not in text
    # a causally feasible row keeps its floors: the same numbers miss the SLO and exceed 1.25x
    text, verdict = suite.row("azure", _row_runs(suite, late=0.12, causal=0.0, feasible=True))
    assert not verdict["ok"] and "misses the SLO" in text and "> 1.25x" in text
    # without the late shares (an older compare) the infeasible row cannot pass, and says only that it is infeasible
    runs = _row_runs(suite, late=0.12, causal=0.08, feasible=False)
    del runs[0]["oracle"]["causal_min_late_share"]
    text, verdict = suite.row("steps", runs)
    assert not verdict["ok"] and "**no** (causal bound) |" in text
