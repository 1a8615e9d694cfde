"""``leadscale compare``'s report walks the production path: one replica and a fixed stage first,
then the policies, then a model rollout with leadscale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TRACES, require

from leadscale.cli import main


@pytest.mark.slow
def test_compare_reports_the_fixed_stage_first_and_the_rollout_scenarios(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    trace = TRACES / "azure_conv_2023.csv"
    require(trace.is_file(), f"the shared trace {trace}")
    out = tmp_path / "cmp"
    code = main(["compare", "--trace", str(trace), "--duration", "600", "--load-scale", "4", "--policies",
                 "fixed:3,leadscale", "--cold-start", "fixed:40", "--out", str(out), "--json", "--jobs", "2"])
    assert code == 0, capsys.readouterr().err
    payload = json.loads(capsys.readouterr().out)
    assert json.loads((out / "summary.json").read_text()) == payload
    headings = [line for line in (out / "report.md").read_text().splitlines() if line.startswith("## ")]
    assert headings == ["## Before autoscaling: one replica and a fixed 2-replica stage", "## Autoscaling policies",
                        "## A model rollout with leadscale"]
    stage = payload["fixed_stage"]["fixed_stage"]
    assert stage["replicas"] == 2 and 0 <= stage["slo_attainment"] <= 1
    assert payload["fixed_stage"]["one_replica"]["knee_requests_per_s"] > 0
    rollouts = payload["rollouts"]
    assert list(rollouts) == ["rollout 0-10-50-100 %", "rollout 0-10-50 %, rollback"]
    for name, r in rollouts.items():
        assert [p["canary_weight"] for p in r["phases"]] == ([0, 0.1, 0.5, 1.0] if "100" in name else [0, 0.1, 0.5, 0])
        assert r["summary"]["gpu_hours"] == pytest.approx(sum(p["gpu_hours"] for p in r["phases"]))
        assert r["summary"]["phases_meeting_slo"] == 4, r["phases"]  # no SLO breach from the shifts
    assert (out / "rollout.png").stat().st_size > 0
    html = (out / "report.html").read_text()
    assert "A model rollout with leadscale" in html and "rollout.png" in html and "<table>" in html


def test_compare_can_skip_both_and_names_a_bad_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["compare", "--trace", "builtin:poisson?rate=2&duration=120", "--policies", "fixed:1", "--cold-start",
            "fixed:10", "--jobs", "1"]
    assert main([*base, "--rollout", "none", "--fixed-stage", "0", "--out", str(tmp_path / "a"), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"policies"}
    assert "## " not in (tmp_path / "a" / "report.md").read_text()  # the plain report, as before
    assert main([*base, "--rollout", "60:10,30:50", "--out", str(tmp_path / "b")]) == 2
    assert "times must increase" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # the flag's type refuses it (scaler.cli_types)
        main([*base, "--drain-grace", "-1", "--out", str(tmp_path / "c")])
    assert exited.value.code == 2 and "argument --drain-grace: '-1': must be a number >= 0" in capsys.readouterr().err
