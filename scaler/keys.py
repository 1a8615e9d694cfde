"""Every trigger metadata key, declared once: name, kind, default, allowed range, the field it sets.

Like KEDA's scalers (a struct with ``keda:"name=...,order=triggerMetadata,default=...,range=..."``
tags), the parser (``scaler.metadata``), its error messages, the policy-field map the tuner writes
through (``simulator.manifests.metadata_key``) and the docs' key table (``docs/scaler.md``; a test
compares them) all come from ``KEYS``. Keys whose ``policy_field`` is a ``PolicyConfig`` tunable take
their default from the policy itself and its validation speaks for their range.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from scaler.limits import Limit


@dataclass(frozen=True)
class Key:
    """One metadata key. ``kind``: text, url, urls, label, labels, profile, number, integer, duration."""

    name: str
    kind: str
    default: float | int | None = None
    """What an unset key means (None: not set; the docs say what stands in)."""
    limit: Limit | None = None
    """Allowed values of a numeric key (a tunable's come from ``scaler.policy.FIELD_LIMITS``)."""
    policy_field: str | None = None
    """The ``PolicyConfig`` field it sets, if any."""
    tunable: bool = False
    """Passed to ``PolicyConfig`` as given: its default and range are the policy's own."""
    allowed: str = ""
    """What a non-numeric key accepts; for a numeric one, what is allowed beyond its range."""


def _n(low: float | None = None, high: float | None = None, low_open: bool = False) -> Limit:
    return Limit(low, high, low_open)


def _i(low: int, high: int | None = None) -> Limit:
    return Limit(low, high, integer=True)


EXPLICIT_ONLY = "explicit capacity only"
LABELS = "`name=value,name2=value2` (label names unique, values non-empty)"
KEYS: tuple[Key, ...] = (
    Key("model", "text", allowed="a non-empty string"),
    Key("prometheusAddress", "url", allowed="an `http(s)://host[:port][/path]` URL, no query"),
    Key("profile", "profile", policy_field="capacity",
        allowed="a built-in profile name (the error lists them; file paths are refused)"),
    Key("prefillTokensPerSecond", "number", limit=_n(0.0, low_open=True), allowed="required without `profile`"),
    Key("decodeTokensPerSecond", "number", limit=_n(0.0, low_open=True), allowed="required without `profile`"),
    Key("maxNumSeqs", "integer", limit=_i(1), allowed=EXPLICIT_ONLY),
    Key("kvCacheTokens", "integer", limit=_i(1), allowed=EXPLICIT_ONLY),
    Key("prefillAttentionTokens", "number", limit=_n(0.0, low_open=True), allowed=EXPLICIT_ONLY),
    Key("decodeContextTokens", "number", limit=_n(0.0, low_open=True), allowed=EXPLICIT_ONLY),
    Key("ttftSeconds", "number", 2.0, _n(0.0, 3600.0, low_open=True), policy_field="ttft_slo_s"),
    Key("targetUtilization", "number", 1.0, _n(0.0, 1.0, low_open=True), policy_field="target_utilization"),
    Key("leadTime", "duration", 180.0, _n(0.0, 86400.0), policy_field="lead_time_s", allowed="or `auto`"),
    Key("scaleDownDelay", "duration", 300.0, _n(0.0, 7 * 86400.0), policy_field="scale_down_delay_s"),
    Key("minReplicas", "integer", None, _i(0, 100000), policy_field="min_replicas"),
    Key("maxReplicas", "integer", None, _i(1, 100000), policy_field="max_replicas",
        allowed="and >= `minReplicas`"),
    Key("activationQuery", "text", allowed="a PromQL expression"),
    Key("activationThreshold", "number", 0.0, _n(0.0), policy_field="activation_threshold",
        allowed="only with `activationQuery`"),
    Key("namespaceLabel", "label", allowed="a Prometheus label name"),
    Key("labelSelector", "labels", allowed=LABELS),
    Key("rateWindow", "duration", 60.0, _n(1.0, 86400.0), policy_field="rate_window_s"),
    Key("scrapeTargets", "urls", allowed="comma-separated `http(s)://` URLs of pods' `/metrics`"),
    Key("trafficWeight", "number", None, _n(0.0, 100.0),
        allowed="with `routeSelector`, Prometheus sources only"),
    Key("routeSelector", "labels", allowed=LABELS + ", with `trafficWeight`, not equal to `labelSelector`"),
    Key("leadTimeScale", "number", policy_field="lead_time_scale", tunable=True),
    Key("backlogDrainSeconds", "number", policy_field="backlog_drain_s", tunable=True),
    Key("headroomQuantile", "number", policy_field="headroom_quantile", tunable=True),
    Key("headroomHistorySeconds", "number", policy_field="headroom_history_s", tunable=True),
    Key("trendWindowSeconds", "number", policy_field="trend_window_s", tunable=True),
    Key("trendConfidence", "number", policy_field="trend_confidence", tunable=True),
)
BY_NAME: dict[str, Key] = {key.name: key for key in KEYS}


def default(name: str) -> Any:
    """The default of key ``name``: the table's, or for a tunable the ``PolicyConfig`` field's."""
    key = BY_NAME[name]
    return policy_defaults()[str(key.policy_field)] if key.tunable else key.default


@functools.cache
def policy_defaults() -> dict[str, Any]:
    """``PolicyConfig``'s field defaults (imported late: the policy imports the capacity model)."""
    from scaler.policy import PolicyConfig

    return {f.name: f.default for f in dataclasses.fields(PolicyConfig) if f.default is not dataclasses.MISSING}


def core_names() -> tuple[str, ...]:
    """The keys ``scaler.metadata`` parses itself, in table order."""
    return tuple(key.name for key in KEYS if not key.tunable)


def tunables() -> dict[str, tuple[str, type]]:
    """Tunable key -> (``PolicyConfig`` field, type)."""
    return {key.name: (str(key.policy_field), int if key.kind == "integer" else float) for key in KEYS if key.tunable}


def policy_fields() -> dict[str, str]:
    """``PolicyConfig`` field -> the key that sets it (translates the policy's errors; the tuner writes by it)."""
    return {str(key.policy_field): key.name for key in KEYS if key.policy_field is not None}


def limit(name: str) -> Limit | None:
    """Key ``name``'s allowed numbers: the table's, or for a tunable the ``PolicyConfig`` field's."""
    key = BY_NAME[name]
    if not key.tunable:
        return key.limit
    from scaler.policy import FIELD_LIMITS

    return FIELD_LIMITS[str(key.policy_field)]


def allowed(name: str) -> str:
    """What key ``name`` accepts, in words: the parser's error says this and so does the docs' key table."""
    key = BY_NAME[name]
    bounds = limit(name)
    if bounds is None:
        return key.allowed
    text = bounds.text(key.kind)
    if not key.allowed:
        return text
    return f"{text}, {key.allowed}" if key.allowed.startswith(("or ", "and ")) else f"{text}; {key.allowed}"


KEDA_KEYS = ("scalerAddress", "enableTLS", "unsafeSsl", "caCert", "tlsCertFile", "tlsClientCert", "tlsClientKey")
"""KEDA's own external-scaler keys: KEDA forwards the whole trigger metadata, these included."""
FROM_ENV = "FromEnv"
_TEXT_PATTERNS = {
    "number": r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
    "integer": r"[+-]?[0-9]{1,12}",
    "duration": r"(?:[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(?:ms|s|m|h)?",
}


def metadata_json_schema() -> dict[str, Any]:
    """The JSON Schema of a trigger's metadata map, for the chart's ``values.schema.json``: every key by name
    (a typo fails ``helm install``), numbers within their range, strings that must read as one. An empty
    string stands for an unset key (the chart leaves it out)."""
    properties: dict[str, Any] = {}
    for key in KEYS:
        bounds = limit(key.name)
        entry: dict[str, Any] = {"description": allowed(key.name)}
        if bounds is None:
            entry["type"] = "string"
        else:
            text = _TEXT_PATTERNS[key.kind] + ("|auto" if key.name == "leadTime" else "")
            entry["anyOf"] = [bounds.json_schema(), {"type": "string", "pattern": rf"^\s*(?:{text})?\s*$"}]
        properties[key.name] = entry
    keda = {name: {"type": ["string", "boolean"], "description": "KEDA's own key (forwarded, ignored)"}
            for name in KEDA_KEYS}
    from_env = "^(?:" + "|".join(key.name for key in KEYS) + ")" + FROM_ENV + "$"
    return {"type": "object", "additionalProperties": False, "properties": {**properties, **keda},
            "patternProperties": {from_env: {"type": "string", "description": "the key's value from the target's "
                                                                             "environment (KEDA resolves it)"}},
            "description": "trigger metadata passed to the scaler as scalerMetadata (scaler/keys.py)"}
