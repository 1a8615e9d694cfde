"""The Helm chart, rendered by real Helm (helm-python-sdk embeds Helm v4) and validated offline.

Every rendered object is checked against Kubernetes' own OpenAPI schemas (kubernetes-validate,
strict: unknown fields fail) and KEDA objects against KEDA's CRDs from ../shared/schemas. The RBAC
the chart grants is compared with the API calls the scaler really makes, recorded by running the
Kubernetes observer against the recorded API server (``support.kube_api``).
"""

from __future__ import annotations

import ast
import datetime as dt
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import psutil
import pytest
import yaml
from conftest import ROOT, SCHEMAS, require
from support.kube_api import FakeKubeApi, load
from test_kube_drain import E2E, vllm_page

from leadscale.cli import build_parser
from scaler import serve_cli
from scaler.kube.client import KubeApi
from scaler.metadata import parse_metadata
from scaler.sources.kube import KubeObserver

CHART = ROOT / "charts" / "leadscale"
KUBE_VERSIONS = ("1.30.0", "1.37.0")
KEDA_KINDS = {"ScaledObject": "keda.sh_scaledobjects.yaml",
              "TriggerAuthentication": "keda.sh_triggerauthentications.yaml"}
CAPACITY = {"prefillTokensPerSecond": "20000", "decodeTokensPerSecond": "2500", "maxNumSeqs": "256",
            "kvCacheTokens": "400000"}
SO = {"enabled": True, "targetDeployment": "vllm-llama3-8b", "namespace": "llm",
      "metadata": {"model": "llama3-8b", "ttftSeconds": 2, **CAPACITY}}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything": {
        "scaledObject": SO, "kubernetes": {"deletionCost": {"enabled": True}},
        "tls": {"enabled": True, "certManager": {"enabled": True, "issuerRef": {"name": "internal-ca"}},
                "mtls": {"enabled": True}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "service": {"headless": True}, "rbac": {"clusterWide": False},
        "scaler": {"prometheusUrl": "http://prometheus-operated.monitoring:9090", "extraArgs": ["--max-workers=64"],
                   "warmUp": 900, "extraEnv": [{"name": "TZ", "value": "UTC"}]},
        "nodeSelector": {"kubernetes.io/os": "linux"}, "podAnnotations": {"team": "inference"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
        "imagePullSecrets": [{"name": "registry"}],
        "networkPolicy": {"enabled": True, "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]},
        "prometheusAuth": {"authModes": "bearer", "secretTargetRef": [
            {"parameter": "bearerToken", "name": "prometheus-credentials", "key": "token"},
            {"parameter": "ca", "name": "prometheus-ca", "key": "ca.crt"}]},
    },
    "tls-existing-secret": {
        "tls": {"enabled": True, "existingSecret": "leadscale-tls"},
        "scaledObject": {**SO, "triggerType": "external", "tolerance": "", "fallback": {"enabled": False},
                         "authentication": {"secretName": "keda-leadscale-ca"}},
    },
    "no-kubernetes-direct-scrape": {
        "kubernetes": {"enabled": False}, "replicaCount": 1,
        "scaler": {"scrapeTargets": ["http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"]},
        "serviceAccount": {"create": False, "name": "existing"},
    },
}


def render(values: dict[str, Any], name: str = "leadscale", namespace: str = "keda") -> list[dict[str, Any]]:
    out = helm_python.Chart.load(CHART).render(values, name=name, namespace=namespace)
    docs = []
    for path, text in out.items():
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def notes(values: dict[str, Any]) -> str:
    return helm_python.Chart.load(CHART).render(values, name="leadscale", namespace="keda")[
        "leadscale/templates/NOTES.txt"]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def crd_schema(filename: str) -> dict[str, Any]:
    require((SCHEMAS / filename).is_file(), f"KEDA CRD {SCHEMAS / filename}")
    crd = yaml.safe_load((SCHEMAS / filename).read_text())
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")["schema"]["openAPIV3Schema"]


def test_lint_is_clean() -> None:
    for values in VALUE_SETS.values():
        report = helm_python.lint(CHART, values, strict=True, namespace="keda")
        assert report["errors"] == [], report
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_every_object_validates(values: dict[str, Any]) -> None:
    docs = render(values)
    assert docs
    for doc in docs:
        kind = doc["kind"]
        if kind in KEDA_KINDS:
            jsonschema.validate(doc, crd_schema(KEDA_KINDS[kind]))
        elif doc["apiVersion"] in ("cert-manager.io/v1", "monitoring.coreos.com/v1"):
            # no offline schema for these CRDs: check the fields the operators require
            assert doc["metadata"]["name"] and doc["spec"]
            if kind == "Certificate":
                assert doc["spec"]["secretName"] and doc["spec"]["issuerRef"]["name"]
            else:
                assert doc["spec"]["endpoints"][0]["port"] == "metrics"
        else:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def test_scaler_pod_is_locked_down_and_probed_over_grpc() -> None:
    (dep,) = of_kind(render({}), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (box,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    ctx = box["securityContext"]
    assert ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"] and ctx["capabilities"]["drop"] == [
        "ALL"]
    assert box["readinessProbe"]["grpc"]["port"] == 9090 and box["livenessProbe"]["grpc"]["port"] == 9090
    assert box["resources"]["requests"] and box["resources"]["limits"]["memory"]
    assert {m["mountPath"] for m in box["volumeMounts"]} == {"/tmp"}


def test_tls_mounts_the_secret_and_probes_http() -> None:
    (dep,) = of_kind(render(VALUE_SETS["everything"]), "Deployment")
    box = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--tls-client-ca=/etc/leadscale/tls/ca.crt" in box["args"]
    assert box["readinessProbe"]["httpGet"]["path"] == "/healthz"  # kubelet gRPC probes cannot speak TLS
    (secret,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert secret["secret"]["secretName"] == "leadscale-tls"


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_container_args_are_real_serve_flags(values: dict[str, Any]) -> None:
    (dep,) = of_kind(render(values), "Deployment")
    box = dep["spec"]["template"]["spec"]["containers"][0]
    assert box["command"] == ["leadscale"]
    args = build_parser().parse_args(box["args"])  # an unknown flag exits here
    resolved = serve_cli.resolve(args)
    assert resolved.port == 9090 and resolved.metrics_port == 9091
    assert resolved.kubernetes is values.get("kubernetes", {}).get("enabled", True)
    assert resolved.warm_up == values.get("scaler", {}).get("warmUp", 3600)
    env = {e["name"]: e.get("value") for e in box["env"]}
    assert env["LEADSCALE_DELETION_COST"] == str(values.get("kubernetes", {}).get("deletionCost", {}).get(
        "enabled", False)).lower()


def test_scaled_object_carries_bounds_behavior_and_the_scaler_address() -> None:
    docs = render(VALUE_SETS["everything"])
    (so,) = of_kind(docs, "ScaledObject")
    (auth,) = of_kind(docs, "TriggerAuthentication")
    spec = so["spec"]
    assert so["metadata"]["namespace"] == "llm" and spec["scaleTargetRef"]["name"] == "vllm-llama3-8b"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 8)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0 and behavior["scaleUp"]["tolerance"] == "0.01"
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "external-push" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["scalerAddress"] == "leadscale.keda.svc.cluster.local:9090"
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert {p["parameter"] for p in auth["spec"]["secretTargetRef"]} == {"caCert", "tlsClientCert", "tlsClientKey"}
    (server_cert, client_cert) = of_kind(docs, "Certificate")
    assert "leadscale.keda.svc.cluster.local" in server_cert["spec"]["dnsNames"]
    assert client_cert["metadata"]["namespace"] == "llm"
    assert client_cert["spec"]["secretName"] == auth["spec"]["secretTargetRef"][0]["name"]


def test_the_scaler_accepts_the_metadata_keda_really_sends() -> None:
    """KEDA forwards the whole trigger metadata, scalerAddress included: the parser must take it as is."""
    (so,) = of_kind(render(VALUE_SETS["everything"]), "ScaledObject")
    config = parse_metadata(so["spec"]["triggers"][0]["metadata"])
    assert config.model == "llama3-8b" and config.lead_time_auto


def test_headless_service_and_optional_objects() -> None:
    docs = render(VALUE_SETS["everything"])
    assert of_kind(docs, "Service")[0]["spec"]["clusterIP"] == "None"
    assert of_kind(docs, "ServiceMonitor")[0]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    plain = render({})
    assert not of_kind(plain, "ScaledObject") and not of_kind(plain, "ServiceMonitor")
    assert "clusterIP" not in of_kind(plain, "Service")[0]["spec"]
    bare = render(VALUE_SETS["no-kubernetes-direct-scrape"])
    assert not of_kind(bare, "ClusterRole") and not of_kind(bare, "ServiceAccount")
    assert not of_kind(bare, "PodDisruptionBudget")  # one replica: a PDB would block node drains
    assert bare[0]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize(("values", "match"), [
    pytest.param({"replicaCount": -1}, "/replicaCount", id="negative-replicas"),
    pytest.param({"replicas": 2}, "replicas", id="unknown-key"),
    pytest.param({"scaler": {"prometheusUrl": "prometheus:9090"}}, "/scaler/prometheusUrl", id="url-without-scheme"),
    pytest.param({"scaledObject": {"enabled": True}}, "/scaledObject/targetDeployment", id="so-without-target"),
    pytest.param({"scaledObject": {"enabled": True, "targetDeployment": "vllm"}}, "/scaledObject/metadata/model",
                 id="so-without-model"),
    pytest.param({"scaledObject": {"tolerance": "10%"}}, "/scaledObject/tolerance", id="tolerance-percent"),
    pytest.param({"tls": {"enabled": True}}, "tls.existingSecret or tls.certManager.enabled", id="tls-no-secret"),
    pytest.param({"prometheusAuth": {"authModes": "oauth"}}, "/prometheusAuth/authModes", id="auth-mode-unknown"),
    pytest.param({"prometheusAuth": {"secretTargetRef": [{"parameter": "token", "name": "s", "key": "k"}]}},
                 "/prometheusAuth/secretTargetRef/0/parameter", id="auth-parameter-unknown"),
    pytest.param({"serviceMonitor": {"enabled": True}, "scaler": {"metricsHost": "127.0.0.1"}},
                 "serviceMonitor.enabled needs /metrics reachable", id="monitor-loopback-metrics"),
    pytest.param({"tls": {"enabled": True, "existingSecret": "s"}, "scaledObject": SO},
                 "scaledObject.authentication.secretName", id="so-tls-no-ca-secret"),
])
def test_bad_values_are_refused_naming_the_field(values: dict[str, Any], match: str) -> None:
    with pytest.raises(helm_python.HelmError, match=match):
        render(values)


def test_notes_say_what_to_check_next() -> None:
    text = notes(VALUE_SETS["everything"])
    assert "kubectl -n llm get scaledobject vllm-llama3-8b" in text and "/decisions" in text
    assert "pod-deletion-cost" in text
    assert "prometheusAddress" in notes({})


# --- RBAC grants exactly what the code calls -----------------------------------------------------------
def granted(values: dict[str, Any]) -> set[tuple[str, str, str]]:
    rules = [r for d in render(values) if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]
    return {(g, res, verb) for r in rules for g in r["apiGroups"] for res in r["resources"] for verb in r["verbs"]}


def recorded_calls(deletion_cost: bool) -> set[tuple[str, str, str]]:
    """Drive every code path of the observer against the recorded API and return what it asked for."""
    now = dt.datetime(2026, 11, 30, 10, 26, tzinfo=dt.UTC).timestamp()
    with FakeKubeApi() as api:
        api.add("scaledobjects", load("scaledobject_llama3.json"))
        api.add("deployments", load("deployment_llama3.json"))
        api.set_pods(load("pods_llama3.json"))
        obs = KubeObserver(KubeApi.for_host(api.url), watch=False, clock=lambda: now, deletion_cost=deletion_cost,
                           http_get=lambda url: vllm_page(2, 1, (1000, 10), (500, 10), E2E))
        obs.observe("llm", "llama3-8b")
        api.queue_watch(load("watch_scale_up.json"))
        obs.watcher(obs.target("llm", "llama3-8b")).watch_once(timeout_s=5)
        obs.before_scale_down("llm", "llama3-8b")
        obs.shutdown_advice("llm", "llama3-8b")
        return api.rbac_calls()


@pytest.mark.parametrize("deletion_cost", [False, True], ids=["read-only", "deletion-cost"])
@pytest.mark.parametrize("cluster_wide", [True, False], ids=["cluster", "namespaced"])
def test_rbac_grants_exactly_what_the_code_calls(deletion_cost: bool, cluster_wide: bool) -> None:
    values = {"kubernetes": {"deletionCost": {"enabled": deletion_cost}}, "rbac": {"clusterWide": cluster_wide}}
    calls = recorded_calls(deletion_cost)
    assert ("", "pods", "patch") in calls if deletion_cost else ("", "pods", "patch") not in calls
    assert granted(values) == calls


def test_only_the_client_module_talks_to_the_api_server() -> None:
    """Every other module goes through ``scaler.kube.client.KubeApi``, whose calls the RBAC test records."""
    api_classes = {"CoreV1Api", "AppsV1Api", "CustomObjectsApi", "Watch", "ApiClient"}
    offenders = []
    for path in sorted((ROOT / "scaler").rglob("*.py")):
        if path == ROOT / "scaler" / "kube" / "client.py" or "_proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = {a.name for a in node.names} if isinstance(node, ast.ImportFrom) else set()
            module = node.module if isinstance(node, ast.ImportFrom) else ""
            if (module or "").startswith("kubernetes") and names & (api_classes | {"client", "watch"}):
                offenders.append(f"{Path(path).relative_to(ROOT)}: from {module} import {sorted(names)}")
            if isinstance(node, ast.Attribute) and node.attr in api_classes:
                offenders.append(f"{Path(path).relative_to(ROOT)}: .{node.attr}")
    assert offenders == []


# --- access: who reaches the scaler, and what it holds ----------------------------------------------------------------
def test_network_policy_admits_only_keda_to_grpc_and_only_metrics_from_to_metrics() -> None:
    (policy,) = of_kind(render(VALUE_SETS["everything"]), "NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "leadscale",
                                                  "app.kubernetes.io/instance": "leadscale"}
    grpc_rule, metrics_rule = spec["ingress"]
    assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    (keda,) = grpc_rule["from"]  # one peer: namespace AND pod labels (both in one entry)
    assert keda == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "keda-operator"}}}
    assert metrics_rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert metrics_rule["from"] == VALUE_SETS["everything"]["networkPolicy"]["metricsFrom"]
    only_keda = render({"networkPolicy": {"enabled": True}})
    assert len(of_kind(only_keda, "NetworkPolicy")[0]["spec"]["ingress"]) == 1  # metrics: nobody from outside
    assert not of_kind(render({}), "NetworkPolicy")


def test_prometheus_credentials_are_mounted_files_never_env_or_args() -> None:
    (dep,) = of_kind(render(VALUE_SETS["everything"]), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    box = pod["containers"][0]
    assert "--prometheus-auth-modes=bearer" in box["args"]
    assert "--prometheus-auth-dir=/etc/leadscale/prometheus-auth" in box["args"]
    assert not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"] for e in box["env"])
    (mount,) = [m for m in box["volumeMounts"] if m["name"] == "prometheus-auth"]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == "prometheus-auth"]
    files = {item["path"]: (source["secret"]["name"], item["key"]) for source in volume["projected"]["sources"]
             for item in source["secret"]["items"]}
    assert files == {"bearerToken": ("prometheus-credentials", "token"), "ca": ("prometheus-ca", "ca.crt")}
    assert volume["projected"]["defaultMode"] == 0o440  # readable by the pod's group (fsGroup), nobody else


def test_with_tls_and_metrics_inside_the_pod_the_probes_use_the_port() -> None:
    values = {**VALUE_SETS["tls-existing-secret"], "scaler": {"metricsHost": "127.0.0.1"}}
    (dep,) = of_kind(render(values), "Deployment")
    box = dep["spec"]["template"]["spec"]["containers"][0]
    assert box["readinessProbe"]["tcpSocket"]["port"] == "grpc" and "httpGet" not in box["livenessProbe"]
    assert "--metrics-host=127.0.0.1" in box["args"]


@pytest.mark.prometheus
def test_metrics_and_decisions_listen_where_the_chart_says(tmp_path: Path) -> None:
    """The chart's own container args, run by the real ``leadscale serve``: which address holds which port."""
    from support.scaler_process import ScalerProcess

    values = {"kubernetes": {"enabled": False}, "scaler": {"host": "127.0.0.1", "metricsHost": "127.0.0.2",
                                                           "prometheusUrl": "http://127.0.0.1:9"}}
    (dep,) = of_kind(render(values), "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "serve"
    scaler = ScalerProcess(args[1:], tmp_path)
    with scaler:
        assert scaler.proc is not None
        listening = {(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)  # gRPC binds IPv4 as v4-mapped v6
                     for c in psutil.Process(scaler.proc.pid).net_connections("inet") if c.status == psutil.CONN_LISTEN}
    assert ("127.0.0.1", scaler.port) in listening
    assert ("127.0.0.2", scaler.metrics_port) in listening
    assert ("127.0.0.1", scaler.metrics_port) not in listening and ("0.0.0.0", scaler.metrics_port) not in listening
