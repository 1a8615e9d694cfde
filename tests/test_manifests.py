"""``simulator.manifests``: what the tuner simulated is what the user deploys.

The ScaledObject validates against KEDA's own CRD schema, the chart values against the chart's
values.schema.json (merged over the chart's defaults, as Helm does), the chart renders the same trigger
and behavior, and the metadata parses (``scaler.metadata``) back to the settings that were simulated.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml
from conftest import ROOT, SCHEMAS, require
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.metadata import parse_metadata
from simulator import manifests
from simulator.manifests import DEFAULT_SETTINGS, Settings

CHART = ROOT / "charts" / "leadscale"
TUNED = Settings(target_utilization=0.67, lead_time_scale=1.3, backlog_drain_s=15.0, scale_down_delay_s=75.0,
                 scale_up_pods=7, scale_down_pods=3, scale_down_period_s=75, scale_down_percent=0,
                 scale_down_window_s=30)
COMMON: dict[str, Any] = dict(model="llama3-8b", profile="a100-llama3-8b", slo_ttft_s=2.0, target="vllm-llama3",
                              min_replicas=1, max_replicas=12)


def crd_schema() -> dict[str, Any]:
    path = SCHEMAS / "keda.sh_scaledobjects.yaml"
    require(path.is_file(), f"KEDA CRD {path}")
    crd = yaml.safe_load(path.read_text())
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")["schema"]["openAPIV3Schema"]


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("tuned", [DEFAULT_SETTINGS, TUNED], ids=["defaults", "tuned"])
def test_scaledobject_validates_against_kedas_crd(tuned: Settings) -> None:
    text = manifests.dump(manifests.scaledobject(tuned, namespace="llm", **COMMON), "a header\n\nline")
    assert text.startswith("# a header\n#\n# line\n")
    doc = yaml.safe_load(text)
    jsonschema.validate(doc, crd_schema())
    trigger = doc["spec"]["triggers"][0]
    assert trigger["type"] == "external-push" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["scalerAddress"] == manifests.DEFAULT_SCALER_ADDRESS
    behavior = doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == tuned.scale_down_window_s
    pods = {"type": "Pods", "value": tuned.scale_down_pods, "periodSeconds": tuned.scale_down_period_s}
    percent = {"type": "Percent", "value": tuned.scale_down_percent, "periodSeconds": tuned.scale_down_period_s}
    assert behavior["scaleDown"]["policies"] == ([percent, pods] if tuned.scale_down_percent else [pods])
    assert behavior["scaleDown"]["selectPolicy"] == "Max"  # the more permissive limit wins
    assert {"type": "Pods", "value": tuned.scale_up_pods, "periodSeconds": 15} in behavior["scaleUp"]["policies"]


def test_a_wrong_scaledobject_is_refused_by_the_crd_schema() -> None:
    """The schema check has teeth: a policy type KEDA does not know fails."""
    doc = manifests.scaledobject(TUNED, **COMMON)
    doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]["policies"][0]["type"] = 7
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, crd_schema())


def test_metadata_parses_back_to_the_simulated_policy() -> None:
    meta = manifests.scaledobject(TUNED, **COMMON)["spec"]["triggers"][0]["metadata"]
    parsed = parse_metadata(meta)
    config = parsed.policy_config()
    assert (config.target_utilization, config.lead_time_scale, config.backlog_drain_s, config.scale_down_delay_s) == \
        (0.67, 1.3, 15.0, 75.0)
    # a tuned ScaledObject keeps following the measured cold start: leadTime stays auto, the scale is tuned
    assert meta["leadTime"] == "auto" and parsed.lead_time_auto
    assert (config.min_replicas, config.max_replicas) == (1, 12)
    simulated = TUNED.policy("a100-llama3-8b", 2.0, 1, 12)
    assert simulated.policy_config() == config
    assert simulated.control.scale_down.stabilization_window_s == 30.0
    assert simulated.control.scale_up.tolerance == pytest.approx(0.01)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.05, 1.0), st.floats(0, 3600), st.floats(1, 3600), st.floats(0, 7200), st.integers(1, 20))
def test_every_setting_survives_the_round_trip_through_metadata(u: float, lead: float, drain: float, delay: float,
                                                                 pods: int) -> None:
    lead = lead / 1200  # a look-ahead scale in [0, 3]
    s = Settings(target_utilization=u, lead_time_scale=lead, backlog_drain_s=drain, scale_down_delay_s=delay,
                 scale_up_pods=pods)
    config = parse_metadata({"model": "m", "profile": "h100-llama3-8b", **s.metadata()}).policy_config()
    assert config.target_utilization == pytest.approx(u, abs=1e-4)
    assert config.lead_time_scale == pytest.approx(lead, abs=1e-4)
    assert config.backlog_drain_s == pytest.approx(drain, abs=1e-4)
    assert config.scale_down_delay_s == pytest.approx(delay, abs=1e-4)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"target_utilization": 0.0}, "target_utilization=0.0"),
    ({"target_utilization": 1.5}, "target_utilization=1.5"),
    ({"scale_down_period_s": 2000}, "scale_down_period_s=2000"),
    ({"scale_up_pods": 2.5}, "scale_up_pods=2.5: must be an integer"),
    ({"lead_time_scale": float("nan")}, "lead_time_scale=nan"),
    ({"lead_time_scale": 11.0}, "lead_time_scale=11.0"),
    ({"tolerance": True}, "tolerance=True"),
])
def test_bad_settings_name_the_field(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Settings(**kwargs)


def test_values_validate_against_the_charts_schema_and_render_the_same_object() -> None:
    values = yaml.safe_load(manifests.dump(manifests.chart_values(TUNED, namespace="llm", **COMMON)))
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(merged(defaults, values), schema)
    bad = merged(values, {"scaledObject": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": -1}}}})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(merged(defaults, bad), schema)
    rendered = helm_python.Chart.load(CHART).render(values, name="leadscale", namespace="keda")
    docs = [d for path, text in rendered.items() if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d and d.get("kind") == "ScaledObject"]
    assert len(docs) == 1
    from_chart, ours = docs[0], manifests.scaledobject(TUNED, namespace="llm", **COMMON)
    jsonschema.validate(from_chart, crd_schema())
    assert from_chart["spec"]["advanced"] == ours["spec"]["advanced"]
    chart_meta = dict(from_chart["spec"]["triggers"][0]["metadata"])
    our_meta = dict(ours["spec"]["triggers"][0]["metadata"])
    chart_meta.pop("scalerAddress"), our_meta.pop("scalerAddress")
    assert chart_meta == our_meta
    for key in ("minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod", "scaleTargetRef"):
        assert from_chart["spec"][key] == ours["spec"][key]


def test_every_policy_field_written_has_a_metadata_key() -> None:
    assert manifests.metadata_key("backlog_drain_s") == "backlogDrainSeconds"
    assert manifests.metadata_key("scale_down_delay_s") == "scaleDownDelay"
    with pytest.raises(KeyError, match="no_such_field"):
        manifests.metadata_key("no_such_field")


def test_the_untuned_defaults_scale_down_as_the_chart_does() -> None:
    """Trial 0 of every tune is what ``helm install`` gives: for any fleet, the default settings let the HPA
    remove as many pods per period as the chart's example ScaledObject does, after the same window."""
    import dataclasses
    import math

    from scaler.policy import PolicyConfig
    from simulator.policies import CHART_SCALE_DOWN

    ours = DEFAULT_SETTINGS.control(1, 500).scale_down

    def allowed(rules: Any, pods: int) -> int:
        return max(p.value if p.type == "Pods" else math.ceil(pods * p.value / 100) for p in rules.policies)

    assert ours.stabilization_window_s == CHART_SCALE_DOWN.stabilization_window_s
    assert {p.period_s for p in ours.policies} == {p.period_s for p in CHART_SCALE_DOWN.policies}
    assert all(allowed(ours, n) == allowed(CHART_SCALE_DOWN, n) for n in range(1, 500))
    policy_default = next(f.default for f in dataclasses.fields(PolicyConfig) if f.name == "headroom_quantile")
    assert DEFAULT_SETTINGS.headroom_quantile == policy_default  # the policy's own default
