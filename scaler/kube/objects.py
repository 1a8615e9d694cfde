"""From a ScaledObject and its Deployment to what the scaler needs: which pods, and the bounds.

KEDA does not send ``scaleTargetRef`` or min/max over gRPC, so the scaler reads the ScaledObject it
serves: ``spec.scaleTargetRef`` names the Deployment (``kind`` defaults to Deployment, as in KEDA),
the Deployment's ``spec.selector`` picks its pods, and ``minReplicaCount``/``maxReplicaCount`` (KEDA's
defaults 0 and 100) bound the decision so users need not repeat them in trigger metadata.
NOTE: only Deployments are followed; a StatefulSet or custom target is reported as an error that
names the field, rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client import V1Deployment, V1LabelSelector

KEDA_DEFAULT_MIN = 0
KEDA_DEFAULT_MAX = 100
SUPPORTED_KINDS = ("Deployment",)


class KubeObjectError(ValueError):
    """A ScaledObject or Deployment that cannot be followed; the message names the field and value."""


@dataclass(frozen=True)
class ScaleTarget:
    """The Deployment behind one ScaledObject, with KEDA's replica bounds."""

    namespace: str
    scaled_object: str
    deployment: str
    min_replicas: int = KEDA_DEFAULT_MIN
    max_replicas: int = KEDA_DEFAULT_MAX
    selector: str = ""
    """Label selector in the API's query syntax, e.g. ``app=vllm,model in (llama3-8b)``."""
    spec_replicas: int | None = None
    termination_grace_period_s: int | None = None


def _int_field(spec: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = spec.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KubeObjectError(f"{where}.spec.{key}={value!r}: must be an integer >= 0")
    return value


def parse_scaled_object(obj: Mapping[str, Any]) -> ScaleTarget:
    """Read a ScaledObject (as the API returns it, a dict) into a ``ScaleTarget`` without a selector."""
    meta = obj.get("metadata") or {}
    where = f"ScaledObject {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise KubeObjectError(f"{where}.spec={spec!r}: must be an object with scaleTargetRef")
    ref = spec.get("scaleTargetRef")
    if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str) or not ref["name"]:
        raise KubeObjectError(f"{where}.spec.scaleTargetRef={ref!r}: must name the target (scaleTargetRef.name)")
    kind = ref.get("kind") or "Deployment"
    if kind not in SUPPORTED_KINDS:
        raise KubeObjectError(f"{where}.spec.scaleTargetRef.kind={kind!r}: leadscale follows only "
                              f"{', '.join(SUPPORTED_KINDS)}")
    api_version = ref.get("apiVersion") or "apps/v1"
    if api_version != "apps/v1":
        raise KubeObjectError(f"{where}.spec.scaleTargetRef.apiVersion={api_version!r}: must be apps/v1")
    low = _int_field(spec, "minReplicaCount", KEDA_DEFAULT_MIN, where)
    high = _int_field(spec, "maxReplicaCount", KEDA_DEFAULT_MAX, where)
    if high < low:
        raise KubeObjectError(f"{where}.spec.maxReplicaCount={high}: must be >= minReplicaCount ({low})")
    return ScaleTarget(namespace=meta.get("namespace") or "", scaled_object=meta.get("name") or "",
                       deployment=ref["name"], min_replicas=low, max_replicas=high)


def selector_string(selector: V1LabelSelector | None, where: str = "Deployment") -> str:
    """A ``V1LabelSelector`` in query syntax; an empty selector is refused (it would match every pod)."""
    if selector is None or not (selector.match_labels or selector.match_expressions):
        raise KubeObjectError(f"{where}.spec.selector={selector!r}: must select the Deployment's pods")
    parts = [f"{k}={v}" for k, v in sorted((selector.match_labels or {}).items())]
    for expr in selector.match_expressions or []:
        values = ",".join(sorted(expr.values or []))
        op = expr.operator
        if op == "In":
            parts.append(f"{expr.key} in ({values})")
        elif op == "NotIn":
            parts.append(f"{expr.key} notin ({values})")
        elif op == "Exists":
            parts.append(expr.key)
        elif op == "DoesNotExist":
            parts.append(f"!{expr.key}")
        else:
            raise KubeObjectError(f"{where}.spec.selector.matchExpressions operator={op!r}: "
                                  "must be In, NotIn, Exists or DoesNotExist")
    return ",".join(parts)


def with_deployment(target: ScaleTarget, deployment: V1Deployment) -> ScaleTarget:
    """Complete a ``ScaleTarget`` with the Deployment's selector, replicas and grace period."""
    where = f"Deployment {target.namespace}/{target.deployment}"
    spec = deployment.spec
    if spec is None:
        raise KubeObjectError(f"{where}.spec=None: the Deployment has no spec")
    pod_spec = spec.template.spec if spec.template is not None else None
    grace = pod_spec.termination_grace_period_seconds if pod_spec is not None else None
    return ScaleTarget(namespace=target.namespace, scaled_object=target.scaled_object,
                       deployment=target.deployment, min_replicas=target.min_replicas,
                       max_replicas=target.max_replicas, selector=selector_string(spec.selector, where),
                       spec_replicas=spec.replicas, termination_grace_period_s=grace)
