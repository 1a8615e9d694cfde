"""The chart's examples: a vLLM Deployment whose drain follows the rule, and a rollout's two ScaledObjects."""

from __future__ import annotations

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml
from test_chart import CHART, KUBE_VERSIONS, crd_schema

from scaler.kube.drain import PRE_STOP_SLEEP_S, drain_timing
from scaler.metadata import parse_metadata

EXAMPLES = CHART / "examples"


def load(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def test_the_example_vllm_deployment_drains_by_the_rule() -> None:
    (dep,) = load("vllm-deployment.yaml")
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(dep, version, strict=True)
    p99 = float(dep["metadata"]["annotations"]["leadscale.dev/p99-request-seconds"])
    timing = drain_timing(p99)
    pod = dep["spec"]["template"]["spec"]
    (vllm,) = pod["containers"]
    assert pod["terminationGracePeriodSeconds"] == timing.termination_grace_period_s
    assert vllm["lifecycle"] == {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_S}}}
    assert f"--shutdown-timeout={timing.shutdown_timeout_s}" in vllm["args"]


def test_the_rollout_example_is_two_valid_scaledobjects_sharing_one_route() -> None:
    stable, canary = load("rollout-scaledobjects.yaml")
    schema = crd_schema("keda.sh_scaledobjects.yaml")
    configs = []
    for so in (stable, canary):
        jsonschema.validate(so, schema)
        configs.append(parse_metadata(so["spec"]["triggers"][0]["metadata"]))
    a, b = configs
    assert a.traffic_weight + b.traffic_weight == pytest.approx(1.0)
    assert a.route_target("llm") == b.route_target("llm")  # one route: both versions' series
    assert dict(a.target("llm").label_matchers)["version"] == "stable"
    assert dict(b.target("llm").label_matchers)["version"] == "canary"
    assert a.capacity is None and a.capacity_keys is not None  # the engine's limits come from vLLM itself
    assert stable["spec"]["scaleTargetRef"]["name"] != canary["spec"]["scaleTargetRef"]["name"]


def test_examples_do_not_disturb_the_chart() -> None:
    report = helm_python.lint(CHART, {}, strict=True, namespace="keda")
    assert report["errors"] == []
    rendered = helm_python.Chart.load(CHART).render({}, name="leadscale", namespace="keda")
    assert not any("examples" in path for path in rendered)


def test_the_tune_jobs_example_is_valid_and_runs_our_own_flags() -> None:
    import shlex

    from leadscale.cli import build_parser

    docs = load("tune-jobs.yaml")
    for doc in docs:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}
    (coordinator,) = jobs["leadscale-tune"]["spec"]["template"]["spec"]["containers"]
    (worker,) = jobs["leadscale-tune-workers"]["spec"]["template"]["spec"]["containers"]
    parser = build_parser()
    tune = parser.parse_args(shlex.split(coordinator["args"][0].replace('"$STORAGE"', "postgresql://x"))[1:])
    work = parser.parse_args(shlex.split(worker["args"][0].replace('"$STORAGE"', "postgresql://x"))[1:])
    assert (tune.backend, tune.resume, tune.study) == ("rdb", "auto", work.study)
    assert tune.storage == work.storage == "postgresql://x"
