"""Pods and ScaledObjects read through the real client's deserialization of recorded API JSON."""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.client import ApiClient, V1LabelSelector, V1LabelSelectorRequirement
from support.kube_api import load

from scaler.kube.objects import KubeObjectError, parse_scaled_object, selector_string, with_deployment
from scaler.kube.pods import GONE, READY, STARTING, STUCK, TERMINATING, count_pods, pod_state

NOW = dt.datetime(2026, 11, 30, 10, 26, tzinfo=dt.UTC).timestamp()
STUCK_AFTER = 1800.0
RS = "vllm-llama3-8b-6d5f9b8c7d-"


def deserialize(obj: Any, kind: str) -> Any:
    return ApiClient().deserialize(json.dumps(obj), kind, "application/json")


@pytest.fixture(scope="module")
def pods() -> dict[str, Any]:
    listing = deserialize(load("pods_llama3.json"), "V1PodList")
    return {p.metadata.name.rsplit("-", 1)[-1]: p for p in listing.items}


@pytest.mark.parametrize(("suffix", "expected"), [
    pytest.param("4xk2p", READY, id="clean-start-ready"),
    pytest.param("j9wzt", READY, id="ready-after-oom-restart"),
    pytest.param("r2m8d", STARTING, id="pulling-image"),
    pytest.param("vq5lc", STARTING, id="unschedulable-still-on-its-way"),
    pytest.param("h7t4s", GONE, id="evicted"),
    pytest.param("c5n8x", STUCK, id="crash-loop"),
    pytest.param("p3f6g", STUCK, id="never-ready-for-106-minutes"),
    pytest.param("z8m1k", TERMINATING, id="deleting-while-ready"),
])
def test_each_recorded_pod_gets_the_right_status(pods: dict[str, Any], suffix: str, expected: str) -> None:
    assert pod_state(pods[suffix]).status(NOW, STUCK_AFTER) == expected


def test_phase_timestamps_come_from_the_conditions(pods: dict[str, Any]) -> None:
    state = pod_state(pods["4xk2p"])
    assert state.ready_at - state.created == 195.0
    assert state.scheduled_at - state.created == 1.0
    assert state.containers_ready_at == state.ready_at
    assert state.restarts == 0 and state.ip == "10.244.3.17"
    assert state.metrics_url == "http://10.244.3.17:8000/metrics"


def test_restarts_evictions_and_unschedulable_details(pods: dict[str, Any]) -> None:
    assert pod_state(pods["j9wzt"]).restarts == 1
    evicted = pod_state(pods["h7t4s"])
    assert evicted.reason == "Evicted" and evicted.ip is None and evicted.metrics_url is None
    assert pod_state(pods["vq5lc"]).unschedulable
    assert pod_state(pods["c5n8x"]).waiting_reason == "CrashLoopBackOff"
    assert pod_state(pods["z8m1k"]).deletion_cost == -120


def test_a_pod_that_just_lost_readiness_is_starting_not_stuck(pods: dict[str, Any]) -> None:
    """An old pod that restarts is aged from when it lost readiness, not from its creation."""
    raw = copy.deepcopy(next(p for p in load("watch_scale_up.json")
                             if p["object"]["metadata"].get("name") == RS + "j9wzt")["object"])
    state = pod_state(deserialize(raw, "V1Pod"))
    restart_at = dt.datetime(2026, 11, 30, 10, 30, 2, tzinfo=dt.UTC).timestamp()
    assert state.restarts == 2 and not state.ready and state.not_ready_since == restart_at
    assert state.status(restart_at + 60, STUCK_AFTER) == STARTING
    assert state.status(restart_at + STUCK_AFTER + 1, STUCK_AFTER) == STUCK


def test_counts_over_the_recorded_list(pods: dict[str, Any]) -> None:
    states = [pod_state(p) for name, p in pods.items() if name != "x1v2b"]  # x1v2b: another model's pod
    counts = count_pods(states, NOW, STUCK_AFTER)
    assert (counts.ready, counts.starting, counts.stuck, counts.terminating, counts.gone) == (3, 2, 2, 1, 1)
    assert counts.unschedulable == 1


def test_metrics_port_prefers_named_ports_and_formats_ipv6(pods: dict[str, Any]) -> None:
    raw = load("pods_llama3.json")["items"][0]
    raw["spec"]["containers"][0]["ports"] = [{"name": "grpc", "containerPort": 50051, "protocol": "TCP"},
                                             {"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    raw["status"]["podIP"] = "fd00:10:244::17"
    assert pod_state(deserialize(raw, "V1Pod")).metrics_url == "http://[fd00:10:244::17]:9400/metrics"
    raw["spec"]["containers"][0]["ports"] = []
    assert pod_state(deserialize(raw, "V1Pod")).metrics_port == 8000


def test_scaled_object_and_deployment_give_bounds_and_selector() -> None:
    target = parse_scaled_object(load("scaledobject_llama3.json"))
    assert (target.deployment, target.min_replicas, target.max_replicas) == ("vllm-llama3-8b", 1, 8)
    full = with_deployment(target, deserialize(load("deployment_llama3.json"), "V1Deployment"))
    assert full.selector == "app.kubernetes.io/instance=llama3-8b,app.kubernetes.io/name=vllm"
    assert full.termination_grace_period_s == 60 and full.spec_replicas == 7


def test_keda_defaults_apply_and_statefulsets_are_refused() -> None:
    obj = load("scaledobject_statefulset.json")
    with pytest.raises(KubeObjectError, match=r"scaleTargetRef.kind='StatefulSet'.*Deployment"):
        parse_scaled_object(obj)
    obj["spec"]["scaleTargetRef"] = {"name": "vllm-embedder"}
    target = parse_scaled_object(obj)
    assert (target.min_replicas, target.max_replicas) == (0, 100)


@pytest.mark.parametrize(("spec", "match"), [
    pytest.param({"scaleTargetRef": {}}, "scaleTargetRef.name", id="no-target-name"),
    pytest.param({"scaleTargetRef": {"name": "x"}, "minReplicaCount": -1}, "minReplicaCount=-1", id="negative-min"),
    pytest.param({"scaleTargetRef": {"name": "x"}, "minReplicaCount": 3, "maxReplicaCount": 2},
                 r"maxReplicaCount=2: must be >= minReplicaCount \(3\)", id="max-below-min"),
    pytest.param({"scaleTargetRef": {"name": "x", "apiVersion": "argoproj.io/v1alpha1"}}, "apiVersion",
                 id="foreign-api"),
    pytest.param(None, r"spec=None", id="no-spec"),
])
def test_bad_scaled_objects_name_the_field(spec: Any, match: str) -> None:
    with pytest.raises(KubeObjectError, match=match):
        parse_scaled_object({"metadata": {"namespace": "llm", "name": "so"}, "spec": spec})


def test_selector_expressions_and_empty_selector() -> None:
    sel = V1LabelSelector(match_labels={"app": "vllm"}, match_expressions=[
        V1LabelSelectorRequirement(key="tier", operator="In", values=["b", "a"]),
        V1LabelSelectorRequirement(key="canary", operator="DoesNotExist"),
        V1LabelSelectorRequirement(key="gpu", operator="Exists"),
        V1LabelSelectorRequirement(key="zone", operator="NotIn", values=["z1"])])
    assert selector_string(sel) == "app=vllm,tier in (a,b),!canary,gpu,zone notin (z1)"
    with pytest.raises(KubeObjectError, match="must select"):
        selector_string(V1LabelSelector())


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(spec=st.dictionaries(st.sampled_from(["scaleTargetRef", "minReplicaCount", "maxReplicaCount", "x"]),
                            json_values, max_size=4))
def test_any_scaled_object_spec_parses_or_names_a_field(spec: dict[str, Any]) -> None:
    try:
        target = parse_scaled_object({"metadata": {"namespace": "n", "name": "s"}, "spec": spec})
    except KubeObjectError as exc:
        assert "ScaledObject n/s.spec" in str(exc)
    else:
        assert 0 <= target.min_replicas <= target.max_replicas and target.deployment


OPTIONAL_PATHS = [
    ("status", "conditions"), ("status", "containerStatuses"), ("status", "podIP"), ("status", "phase"),
    ("status",), ("spec", "containers", 0, "ports"), ("metadata", "annotations"), ("metadata", "uid"),
    ("metadata", "creationTimestamp"), ("metadata", "labels"), ("status", "reason"),
]


def _drop(obj: Any, path: tuple) -> None:
    for key in path[:-1]:
        try:
            obj = obj[key]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(obj, dict):
        obj.pop(path[-1], None)


@settings(max_examples=150, deadline=None)
@given(index=st.integers(min_value=0, max_value=9), drops=st.sets(st.sampled_from(OPTIONAL_PATHS)),
       cost=st.one_of(st.none(), st.text(max_size=12), st.integers().map(str)))
def test_partial_pods_from_watch_events_never_crash(index: int, drops: set, cost: str | None) -> None:
    """Watch events can carry sparse objects (a fresh ADDED pod has no status): the reader copes."""
    raw = copy.deepcopy(load("pods_llama3.json")["items"][index])
    for path in drops:
        _drop(raw, path)
    if cost is not None:
        raw["metadata"].setdefault("annotations", {})["controller.kubernetes.io/pod-deletion-cost"] = cost
    state = pod_state(deserialize(raw, "V1Pod"))
    assert state.status(NOW, STUCK_AFTER) in (READY, STARTING, STUCK, TERMINATING, GONE)
    assert state.deletion_cost is None or isinstance(state.deletion_cost, int)
    assert state.metrics_port > 0
