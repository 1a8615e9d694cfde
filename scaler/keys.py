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


@dataclass(frozen=True)
class Key:
    """One metadata key. ``kind``: text, url, urls, label, labels, profile, number, integer, duration."""

    name: str
    kind: str
    default: float | int | None = None
    """What an unset key means (None: not set; the docs say what stands in)."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    policy_field: str | None = None
    """The ``PolicyConfig`` field it sets, if any."""
    tunable: bool = False
    """Passed to ``PolicyConfig`` as given: its default and range are the policy's own."""


KEYS: tuple[Key, ...] = (
    Key("model", "text"),
    Key("prometheusAddress", "url"),
    Key("profile", "profile", policy_field="capacity"),
    Key("prefillTokensPerSecond", "number", low=0.0, low_open=True),
    Key("decodeTokensPerSecond", "number", low=0.0, low_open=True),
    Key("maxNumSeqs", "integer", low=1),
    Key("kvCacheTokens", "integer", low=1),
    Key("prefillAttentionTokens", "number", low=0.0, low_open=True),
    Key("decodeContextTokens", "number", low=0.0, low_open=True),
    Key("ttftSeconds", "number", 2.0, 0.0, 3600.0, low_open=True, policy_field="ttft_slo_s"),
    Key("targetUtilization", "number", 1.0, 0.0, 1.0, low_open=True, policy_field="target_utilization"),
    Key("leadTime", "duration", 180.0, 0.0, 86400.0, policy_field="lead_time_s"),
    Key("scaleDownDelay", "duration", 300.0, 0.0, 7 * 86400.0, policy_field="scale_down_delay_s"),
    Key("minReplicas", "integer", None, 0, 100000, policy_field="min_replicas"),
    Key("maxReplicas", "integer", None, 1, 100000, policy_field="max_replicas"),
    Key("activationQuery", "text"),
    Key("activationThreshold", "number", 0.0, 0.0, policy_field="activation_threshold"),
    Key("namespaceLabel", "label"),
    Key("labelSelector", "labels"),
    Key("rateWindow", "duration", 60.0, 1.0, 86400.0, policy_field="rate_window_s"),
    Key("scrapeTargets", "urls"),
    Key("trafficWeight", "number", None, 0.0, 100.0),
    Key("routeSelector", "labels"),
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
