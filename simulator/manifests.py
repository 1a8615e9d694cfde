"""Tuned settings as the objects a user applies: trigger metadata, HPA behavior, ScaledObject, chart values.

``Settings`` is one point of the tuner's search space: the policy's tunables (written as the trigger
metadata keys ``scaler.metadata`` parses) and the HPA ``behavior`` KEDA passes to its HPA. The same
object builds the simulated policy (``Settings.policy``) and renders the manifests, so what was
simulated is exactly what gets deployed:

- ``scaledobject(...)``: a ``keda.sh/v1alpha1`` ScaledObject, one external trigger (``scalerAddress``
  and the metadata), ``AverageValue`` target 1, the behavior under
  ``advanced.horizontalPodAutoscalerConfig.behavior`` (tolerance needs Kubernetes >= 1.33 with
  ``HPAConfigurableTolerance``; older clusters ignore it and use 10 %);
- ``chart_values(...)``: the ``scaledObject`` section of ``charts/leadscale/values.yaml``, rendering
  the same object through the chart (``helm install -f values.yaml``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, cast

import yaml

SCALE_UP_PERIOD_S = 15
DEFAULT_SCALER_ADDRESS = "leadscale.keda.svc.cluster.local:9090"


def metadata_key(field_name: str) -> str:
    """The trigger metadata key that sets ``PolicyConfig.<field_name>`` (``scaler.keys`` declares them)."""
    from scaler import keys

    try:
        return keys.policy_fields()[field_name]
    except KeyError:
        raise KeyError(f"PolicyConfig field {field_name!r} has no trigger metadata key") from None


def _number(value: float) -> str:
    """A metadata string that parses back to the same number (no exponent for ordinary values)."""
    text = f"{round(float(value), 4):.4f}".rstrip("0").rstrip(".")
    return text or "0"


@dataclass(frozen=True)
class Settings:
    """One candidate: the policy's tunables and the HPA behavior (defaults: the policy's and the chart's)."""

    headroom_quantile: float = 0.8
    """The conformal level of the lead-time headroom (``headroomQuantile``): what ``tune`` searches."""
    target_utilization: float = 1.0
    lead_time_scale: float = 1.0
    """Look-ahead horizon as a multiple of the measured lead time (``leadTimeScale``; the manifest keeps
    ``leadTime: auto``, so a tuned ScaledObject follows the measured cold start when it changes)."""
    backlog_drain_s: float = 60.0
    scale_down_delay_s: float = 300.0
    scale_up_pods: int = 4
    """HPA scaleUp: at most max(+this many pods, +100 %) per 15 s."""
    scale_down_pods: int = 1
    scale_down_period_s: int = 15
    """HPA scaleDown: at most ``scale_down_pods`` pods removed per this many seconds ..."""
    scale_down_percent: int = 100
    """... or this percentage of the fleet in the same period, whichever is more (``selectPolicy: Max``); 0
    leaves the pods limit alone. The default, 100 % per 15 s, is Kubernetes' own rate and the chart's: the
    policy sizes each removal, and a pods-only limit does not scale with the fleet (docs/autoscaling.md)."""
    scale_down_window_s: int = 60
    """HPA scaleDown stabilization window (on top of the policy's own ``scale_down_delay_s``)."""
    tolerance: float = 0.01

    def __post_init__(self) -> None:
        problems = []
        checks = (("headroom_quantile", 0.01, 0.99), ("target_utilization", 0.0, 1.0), ("lead_time_scale", 0.0, 10.0),
                  ("backlog_drain_s", 1e-9, 1e6),
                  ("scale_down_delay_s", 0.0, 7 * 86400.0), ("scale_up_pods", 1, 1000), ("scale_down_pods", 1, 1000),
                  ("scale_down_period_s", 1, 1800), ("scale_down_percent", 0, 100), ("scale_down_window_s", 0, 3600),
                  ("tolerance", 0.0, 0.99))
        for name, low, high in checks:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
                problems.append(f"{name}={value!r}: must be a number in [{low:g}, {high:g}]")
            elif isinstance(low, int) and not isinstance(value, int):
                problems.append(f"{name}={value!r}: must be an integer in [{low}, {high}]")
        if not problems and self.target_utilization <= 0:
            problems.append(f"target_utilization={self.target_utilization!r}: must be > 0")
        if problems:
            raise ValueError("invalid Settings: " + "; ".join(problems))

    def metadata(self) -> dict[str, str]:
        """The policy's trigger metadata keys for these settings (strings, as KEDA sends them)."""
        return {
            metadata_key("headroom_quantile"): _number(self.headroom_quantile),
            metadata_key("target_utilization"): _number(self.target_utilization),
            metadata_key("lead_time_s"): "auto",
            metadata_key("lead_time_scale"): _number(self.lead_time_scale),
            metadata_key("backlog_drain_s"): _number(self.backlog_drain_s),
            metadata_key("scale_down_delay_s"): _number(self.scale_down_delay_s),
        }

    def behavior(self) -> dict[str, Any]:
        """The HPA ``behavior`` (Kubernetes' field names), tolerance as a quantity string."""
        tolerance = _number(self.tolerance)
        return {
            "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "tolerance": tolerance, "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": SCALE_UP_PERIOD_S},
                {"type": "Pods", "value": self.scale_up_pods, "periodSeconds": SCALE_UP_PERIOD_S}]},
            "scaleDown": {"stabilizationWindowSeconds": self.scale_down_window_s, "selectPolicy": "Max",
                          "tolerance": tolerance, "policies": [
                              {"type": kind, "value": value, "periodSeconds": self.scale_down_period_s}
                              for kind, value in self._scale_down_limits()]},
        }

    def _scale_down_limits(self) -> list[tuple[str, int]]:
        """(policy type, value) of the scale-down policies: the percentage (when set) and the pods."""
        percent = [("Percent", self.scale_down_percent)] if self.scale_down_percent > 0 else []
        return [*percent, ("Pods", self.scale_down_pods)]

    def control(self, min_replicas: int, max_replicas: int) -> Any:
        """The simulator's KEDA/HPA config for this behavior (``simulator.control``)."""
        from simulator.control import ControlConfig, ScalingPolicy, ScalingRules

        up = ScalingRules(0.0, (ScalingPolicy("Percent", 100, SCALE_UP_PERIOD_S),
                                ScalingPolicy("Pods", self.scale_up_pods, SCALE_UP_PERIOD_S)), "Max", self.tolerance)
        down = ScalingRules(float(self.scale_down_window_s),
                            tuple(ScalingPolicy(kind, value, float(self.scale_down_period_s))
                                  for kind, value in self._scale_down_limits()), "Max", self.tolerance)
        return ControlConfig(min_replicas=min_replicas, max_replicas=max_replicas, scale_up=up, scale_down=down)

    def policy(self, profile: str, slo_ttft_s: float, min_replicas: int, max_replicas: int) -> Any:
        """A fresh simulated ``leadscale`` trigger with these settings (``simulator.policies.Leadscale``)."""
        from simulator.policies import Leadscale, leadscale_metadata

        meta = leadscale_metadata(profile, slo_ttft_s, self.metadata())
        return Leadscale(meta, self.control(min_replicas, max_replicas))

    def params(self) -> dict[str, Any]:
        return asdict(self)


DEFAULT_SETTINGS = Settings()


def trigger_metadata(settings: Settings, model: str, profile: str, slo_ttft_s: float, min_replicas: int,
                     max_replicas: int) -> dict[str, str]:
    """Every metadata key the scaler needs for this model (without KEDA's ``scalerAddress``)."""
    return {"model": model, "profile": profile, "ttftSeconds": _number(slo_ttft_s), **settings.metadata(),
            "minReplicas": str(min_replicas), "maxReplicas": str(max_replicas)}


def scaledobject(settings: Settings, *, model: str, profile: str, slo_ttft_s: float, target: str,
                 name: str | None = None, namespace: str = "default", min_replicas: int = 1, max_replicas: int = 100,
                 scaler_address: str = DEFAULT_SCALER_ADDRESS, trigger_type: str = "external-push") -> dict[str, Any]:
    """The ScaledObject for ``target`` (a Deployment); KEDA's polling/cooldown as simulated (defaults)."""
    control = settings.control(min_replicas, max_replicas)
    meta = {"scalerAddress": scaler_address,
            **trigger_metadata(settings, model, profile, slo_ttft_s, min_replicas, max_replicas)}
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name or target, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "leadscale-tune"}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicaCount": min_replicas,
            "maxReplicaCount": max_replicas,
            "pollingInterval": int(control.polling_interval_s),
            "cooldownPeriod": int(control.cooldown_period_s),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": settings.behavior()}},
            "triggers": [{"type": trigger_type, "name": "leadscale", "metricType": "AverageValue",
                          "metadata": meta}],
        },
    }


def chart_values(settings: Settings, *, model: str, profile: str, slo_ttft_s: float, target: str,
                 namespace: str = "", min_replicas: int = 1, max_replicas: int = 100,
                 trigger_type: str = "external-push") -> dict[str, Any]:
    """Values for ``charts/leadscale`` whose example ScaledObject is the one ``scaledobject`` renders."""
    control = settings.control(min_replicas, max_replicas)
    behavior = settings.behavior()
    for rules in behavior.values():
        rules.pop("tolerance")  # the chart takes one tolerance for both directions
    return {"scaledObject": {
        "enabled": True, "targetDeployment": target, "namespace": namespace, "triggerType": trigger_type,
        "minReplicaCount": min_replicas, "maxReplicaCount": max_replicas,
        "pollingInterval": int(control.polling_interval_s), "cooldownPeriod": int(control.cooldown_period_s),
        "metadata": trigger_metadata(settings, model, profile, slo_ttft_s, min_replicas, max_replicas),
        "behavior": behavior, "tolerance": _number(settings.tolerance),
    }}


def dump(document: dict[str, Any], header: str = "") -> str:
    """YAML with keys in the order written and a comment header."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + cast(str, yaml.safe_dump(document, sort_keys=False, default_flow_style=False))


def drain_patch(drain: dict[str, Any], deployment: str, namespace: str = "default",
                container: str = "vllm") -> dict[str, Any]:
    """A strategic-merge patch for the vLLM Deployment: the drain rule's grace period and preStop sleep,
    and vLLM's ``--shutdown-timeout`` (add it to the container's args)."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": deployment, "namespace": namespace},
        "spec": {"template": {"spec": {
            "terminationGracePeriodSeconds": int(drain["termination_grace_period_s"]),
            "containers": [{"name": container,
                            "lifecycle": {"preStop": {"sleep": {"seconds": int(drain["pre_stop_sleep_s"])}}},
                            "args": [f"--shutdown-timeout={int(drain['shutdown_timeout_s'])}"]}]}}},
    }
