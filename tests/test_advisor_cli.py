"""``leadscale tune`` and ``leadscale advise`` end to end: files, manifests, evidence, errors.

The tune workload is a daily cycle squeezed into 30 minutes whose held-out last 9 minutes climb
toward the peak: exactly where a reactive trigger (``waiting-requests``) falls behind the cold start.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from support.prometheus import free_port
from test_history import MODEL, SPAN, prometheus_with_history  # noqa: F401  (the fixture)
from test_manifests import CHART, crd_schema, merged

from leadscale.cli import main
from scaler.profiles import get_profile
from simulator.autoscale import run_autoscaled
from simulator.manifests import Settings
from simulator.synthetic import load_workload
from simulator.tuner import Run, beats
from simulator.workload import select_window

RAMP = "builtin:diurnal?rate=6&duration=1800&period_s=1200&amplitude=0.8"
PROFILE = "a100-llama3-8b"
SMALL = ["--trials", "4", "--top", "2", "--seeds", "2", "--baselines", "waiting-requests", "--jobs", "2"]


@pytest.mark.slow
def test_tune_writes_valid_manifests_and_beats_waiting_requests_on_the_held_out_window(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tuned"
    code = main(["tune", "--trace", RAMP, "--profile", PROFILE, "--slo-ttft", "2", *SMALL, "--model", "llama3-8b",
                 "--deployment", "vllm-llama3", "--namespace", "llm", "--out", str(out), "--json"])
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    for name in ("report.md", "report.html", "trials.png", "replicas.png", "scaledobject.yaml", "values.yaml",
                 "recommendation.json", "queue_limit.png", "vllm-drain.yaml"):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "recommendation.json").read_text()) == payload
    # before any autoscaling advice: one replica at the SLO and the fixed two-replica stage
    report = (out / "report.md").read_text()
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Before autoscaling: one replica and a fixed 2-replica stage", sections
    stage = payload["stage"]
    assert stage["fixed_stage"]["replicas"] == 2 and stage["one_replica"]["knee_requests_per_s"] > 0
    assert stage["fixed_stage"]["headroom_at_peak"] == pytest.approx(
        1 - stage["fixed_stage"]["peak_demand_replicas"] / 2)
    # the gateway's 429 limit, with every candidate's rejected share (and the plot)
    limit = payload["queue_limit"]
    assert limit["limit_tokens_per_replica"] in [r["limit_tokens_per_replica"] for r in limit["runs"]]
    shares = [r["rejected_share"] for r in limit["runs"] if r["limit_tokens_per_replica"] is not None]
    assert shares == sorted(shares, reverse=True) and "## Overload" in report
    # the drain rule on the simulated p99 request duration, as a patch for the vLLM Deployment
    drain = payload["drain"]
    assert drain["termination_grace_period_s"] == drain["pre_stop_sleep_s"] + drain["shutdown_timeout_s"] + 5
    patch = yaml.safe_load((out / "vllm-drain.yaml").read_text())
    pod = patch["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == drain["termination_grace_period_s"]
    assert pod["containers"][0]["args"] == [f"--shutdown-timeout={drain['shutdown_timeout_s']}"]
    so = yaml.safe_load((out / "scaledobject.yaml").read_text())
    jsonschema.validate(so, crd_schema())
    assert so["spec"]["scaleTargetRef"]["name"] == "vllm-llama3" and so["metadata"]["namespace"] == "llm"
    assert so["spec"]["triggers"][0]["metadata"]["model"] == "llama3-8b"
    values = yaml.safe_load((out / "values.yaml").read_text())
    jsonschema.validate(merged(yaml.safe_load((CHART / "values.yaml").read_text()), values),
                        json.loads((CHART / "values.schema.json").read_text()))
    evidence = payload["evidence"]
    assert evidence["trials"] == 4 and len(evidence["candidates"]) == 2
    assert evidence["beats"] == {"waiting-requests": True}
    assert "held-out window" in (out / "report.md").read_text()
    # the claim, checked again by an independent simulation of the held-out window
    workload = load_workload(RAMP, None, seed=0)
    start, end = evidence["holdout_window_s"]
    held_out = select_window(workload, start, None)
    assert end == pytest.approx(workload.duration_s) and start > 0.6 * end
    settings = Settings(**payload["recommendation"]["settings"])
    profile = get_profile(PROFILE)
    options = {"slo_tpot_s": 0.1}
    ours = run_autoscaled(held_out, profile, settings.policy(PROFILE, 2.0, 1, 100), "lognormal:p50=120,p90=240",
                          2.0, 0, backend_options=options)
    theirs = run_autoscaled(held_out, profile, "waiting-requests", "lognormal:p50=120,p90=240", 2.0, 0,
                            backend_options=options)
    a, b = Run("holdout", 0, ours.summary), Run("holdout", 0, theirs.summary)
    assert a.summary["gpu_hours"] == pytest.approx(evidence["recommended_holdout"]["gpu_hours"])  # deterministic
    assert beats(a, b, 0.99), (a.summary, b.summary)


@pytest.mark.parametrize(("argv", "message"), [
    (["--cold-start", "sometimes"], "sometimes"),
    (["--holdout", "0.9"], "holdout=0.9"),
    (["--baselines", "waiting"], "'waiting' is not a policy"),
    (["--min-replicas", "5", "--max-replicas", "2"], "--max-replicas 2"),
], ids=["cold-start", "holdout", "baseline", "bounds"])
def test_tune_refuses_bad_flags_naming_them(argv: list[str], message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", "--trace", "builtin:poisson?rate=2&duration=300", "--trials", "1", *argv,
                 "--out", str(tmp_path)])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "scaledobject.yaml").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--since", "seven days"], "--since 'seven days'"),
    (["--step", "0"], "--step '0'"),
    (["--label", "namespace"], "argument --label: 'namespace': must be NAME=VALUE"),
    (["--slo-ttft", "-1"], "argument --slo-ttft: '-1': must be a number > 0"),
], ids=["since", "step", "label", "slo"])
def test_advise_refuses_bad_flags_naming_them(argv: list[str], message: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Refused by the flag's type (argparse exits 2) or when resolved (the command returns 2)."""
    try:
        code = main(["advise", "--prometheus", "http://127.0.0.1:9", "--model", "m", *argv, "--out", str(tmp_path)])
    except SystemExit as exited:
        code = exited.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_advise_without_prometheus_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["advise", "--prometheus", f"http://127.0.0.1:{free_port()}", "--model", "m", "--since", "1h",
                 "--out", str(tmp_path)])
    assert code == 2
    assert "range query" in capsys.readouterr().err


@pytest.mark.slow
def test_advise_tunes_on_history_from_a_real_prometheus(prometheus_with_history: tuple[str, int],  # noqa: F811
                                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, start = prometheus_with_history
    out = tmp_path / "advice"
    code = main(["advise", "--prometheus", url, "--model", MODEL, "--since", "3h", "--until", str(start + SPAN),
                 "--span", "20m", "--trials", "2", "--top", "1", "--seeds", "1", "--baselines", "waiting-requests",
                 "--out", str(out), "--json"])
    assert code == 0, capsys.readouterr().err
    payload = json.loads(capsys.readouterr().out)
    history = payload["history"]
    assert history["requests"]["resets"] == 1 and history["requests"]["gaps"] == 1
    assert history["simulated_requests"] > 1000
    assert payload["evidence"]["workload"].startswith(f"prometheus:{MODEL}")
    jsonschema.validate(yaml.safe_load((out / "scaledobject.yaml").read_text()), crd_schema())
    assert "Prometheus history" in (out / "report.md").read_text()
