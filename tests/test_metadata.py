"""Trigger metadata parsing: defaults, every bad case named precisely, and parser properties."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.metadata import with_changes as support_with_changes

from scaler.metadata import CORE_KEYS, KEDA_KEYS, MetadataError, ScalerConfig, known_keys, parse_metadata
from scaler.signals import Signals

GOOD = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prefillTokensPerSecond": "8000",
        "decodeTokensPerSecond": "2000", "maxNumSeqs": "256", "kvCacheTokens": "200000"}

# (id, changes to GOOD (None deletes a key), the key the error must name, the value it must quote)
BAD_CASES: list[tuple[str, dict[str, str | None], str, str | None]] = [
    ("model-missing", {"model": None}, "model", None),
    ("model-empty", {"model": ""}, "model", ""),
    ("unknown-key", {"modle": "x"}, "modle", "x"),
    ("ttft-zero", {"ttftSeconds": "0"}, "ttftSeconds", "0"),
    ("ttft-negative", {"ttftSeconds": "-1"}, "ttftSeconds", "-1"),
    ("ttft-nan", {"ttftSeconds": "nan"}, "ttftSeconds", "nan"),
    ("ttft-inf", {"ttftSeconds": "inf"}, "ttftSeconds", "inf"),
    ("ttft-text", {"ttftSeconds": "fast"}, "ttftSeconds", "fast"),
    ("utilization-zero", {"targetUtilization": "0"}, "targetUtilization", "0"),
    ("utilization-over-one", {"targetUtilization": "1.5"}, "targetUtilization", "1.5"),
    ("lead-text", {"leadTime": "soon"}, "leadTime", "soon"),
    ("lead-negative", {"leadTime": "-5"}, "leadTime", "-5"),
    ("lead-days", {"leadTime": "1d"}, "leadTime", "1d"),
    ("delay-negative", {"scaleDownDelay": "-1s"}, "scaleDownDelay", "-1s"),
    ("rate-window-zero", {"rateWindow": "0"}, "rateWindow", "0"),
    ("min-negative", {"minReplicas": "-1"}, "minReplicas", "-1"),
    ("min-fraction", {"minReplicas": "1.5"}, "minReplicas", "1.5"),
    ("max-zero", {"maxReplicas": "0"}, "maxReplicas", "0"),
    ("max-text", {"maxReplicas": "many"}, "maxReplicas", "many"),
    ("max-below-min", {"minReplicas": "4", "maxReplicas": "2"}, "maxReplicas", "2"),
    ("threshold-without-query", {"activationThreshold": "3"}, "activationThreshold", "3"),
    ("threshold-text", {"activationQuery": "sum(gateway_queue)", "activationThreshold": "x"},
     "activationThreshold", "x"),
    ("namespace-label-invalid", {"namespaceLabel": "1ns"}, "namespaceLabel", "1ns"),
    ("selector-no-equals", {"labelSelector": "app"}, "labelSelector", "app"),
    ("selector-empty-value", {"labelSelector": "app="}, "labelSelector", "app="),
    ("selector-duplicate", {"labelSelector": "a=b,a=c"}, "labelSelector", "a=b,a=c"),
    ("selector-bad-name", {"labelSelector": "1a=b"}, "labelSelector", "1a=b"),
    ("selector-repeats-namespace", {"namespaceLabel": "ns", "labelSelector": "ns=x"}, "labelSelector", "ns=x"),
    ("selector-model-name", {"labelSelector": "team=a,model_name=x"}, "labelSelector", "team=a,model_name=x"),
    ("selector-metric-name", {"labelSelector": "__name__=vllm:x"}, "labelSelector", "__name__=vllm:x"),
    ("selector-internal-label", {"labelSelector": "__address__=a"}, "labelSelector", "__address__=a"),
    ("namespace-label-model-name", {"namespaceLabel": "model_name"}, "namespaceLabel", "model_name"),
    ("namespace-label-metric-name", {"namespaceLabel": "__name__"}, "namespaceLabel", "__name__"),
    ("prometheus-no-scheme", {"prometheusAddress": "prometheus:9090"}, "prometheusAddress", "prometheus:9090"),
    ("prometheus-bad-ipv6", {"prometheusAddress": "http://[::1:9090"}, "prometheusAddress", "http://[::1:9090"),
    ("prometheus-ftp", {"prometheusAddress": "ftp://prom"}, "prometheusAddress", "ftp://prom"),
    ("scrape-not-url", {"scrapeTargets": "http://a:8000/metrics,pod-b"}, "scrapeTargets",
     "http://a:8000/metrics,pod-b"),
    ("profile-and-explicit", {"profile": "h100-llama3-8b"}, "prefillTokensPerSecond", "8000"),
    ("no-capacity", {k: None for k in ("prefillTokensPerSecond", "decodeTokensPerSecond", "maxNumSeqs",
                                       "kvCacheTokens")}, "profile", None),
    ("partial-capacity", {"decodeTokensPerSecond": None}, "decodeTokensPerSecond", None),
    ("prefill-zero", {"prefillTokensPerSecond": "0"}, "prefillTokensPerSecond", "0"),
    ("seqs-zero", {"maxNumSeqs": "0"}, "maxNumSeqs", "0"),
    ("kv-not-integer", {"kvCacheTokens": "1e5"}, "kvCacheTokens", "1e5"),
    ("unknown-profile", {k: None for k in ("prefillTokensPerSecond", "decodeTokensPerSecond", "maxNumSeqs",
                                           "kvCacheTokens")} | {"profile": "nope-gpu"}, "profile", "nope-gpu"),
    ("profile-path", {k: None for k in ("prefillTokensPerSecond", "decodeTokensPerSecond", "maxNumSeqs",
                                        "kvCacheTokens")} | {"profile": "/etc/passwd"}, "profile", "/etc/passwd"),
    ("attention-zero", {"prefillAttentionTokens": "0"}, "prefillAttentionTokens", "0"),
    ("attention-with-profile", {k: None for k in ("prefillTokensPerSecond", "decodeTokensPerSecond", "maxNumSeqs",
                                                  "kvCacheTokens")} | {"profile": "h100-llama3-8b",
                                                                       "prefillAttentionTokens": "20000"},
     "prefillAttentionTokens", "20000"),
    ("trend-confidence-one", {"trendConfidence": "1"}, "trendConfidence", "1"),
    ("backlog-drain-zero", {"backlogDrainSeconds": "0"}, "backlogDrainSeconds", "0"),
]


def with_changes(changes: dict[str, str | None]) -> dict[str, str]:
    return support_with_changes(GOOD, changes)


@pytest.mark.parametrize(("changes", "key", "value"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_metadata_names_key_value_and_allowed(changes: dict[str, str | None], key: str,
                                                  value: str | None) -> None:
    with pytest.raises(MetadataError) as info:
        parse_metadata(with_changes(changes))
    problems = {p.key: p for p in info.value.problems}
    assert key in problems, str(info.value)
    assert problems[key].value == value
    assert problems[key].allowed and f"{key}:" in str(info.value)


def test_defaults_follow_the_issues() -> None:
    config = parse_metadata(GOOD)
    # issue #2's defaults, except the utilization target: issue #11 replaced the fixed 0.8 with headroom
    # measured from the demand's own variability (headroomQuantile), so no blind margin is added by default
    assert (config.ttft_s, config.target_utilization, config.lead_time_s, config.scale_down_delay_s) == (
        2.0, 1.0, 180.0, 300.0)
    assert (config.min_replicas, config.max_replicas, config.lead_time_auto) == (None, None, False)
    policy = config.policy_config()
    assert (policy.min_replicas, policy.max_replicas, policy.rate_window_s) == (0, 1000, 60.0)


def test_prefill_attention_tokens_reach_the_capacity() -> None:
    assert parse_metadata(GOOD).capacity.prefill_attention_tokens is None  # optional: linear prefill cost
    config = parse_metadata(with_changes({"prefillAttentionTokens": "20000"}))
    assert config.capacity.prefill_attention_tokens == 20000.0
    assert config.capacity.prefill_cost_factor(40000.0) == pytest.approx(2.0)
    explicit = ("prefillTokensPerSecond", "decodeTokensPerSecond", "maxNumSeqs", "kvCacheTokens")
    profiled = parse_metadata(with_changes(dict.fromkeys(explicit) | {"profile": "h100-llama3-8b"}))
    assert profiled.capacity.prefill_attention_tokens is not None  # the profile carries its own


def test_all_problems_are_reported_together() -> None:
    with pytest.raises(MetadataError) as info:
        parse_metadata(with_changes({"ttftSeconds": "0", "leadTime": "x", "bogus": "1", "model": None}))
    assert {"ttftSeconds", "leadTime", "bogus", "model"} <= {p.key for p in info.value.problems}


def test_unknown_key_suggests_the_close_one() -> None:
    with pytest.raises(MetadataError, match="did you mean 'maxReplicas'"):
        parse_metadata(with_changes({"maxReplica": "3"}))


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("3m", 180.0), ("1h", 3600.0),
                                               ("1500ms", 1.5), ("2.5m", 150.0), (" 45 ", 45.0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_metadata(with_changes({"leadTime": text})).lead_time_s == seconds


def test_lead_time_auto_keeps_the_default_as_fallback() -> None:
    config = parse_metadata(with_changes({"leadTime": "AUTO"}))
    assert config.lead_time_auto and config.lead_time_s == 180.0


def test_target_carries_matchers_and_namespace() -> None:
    config = parse_metadata(with_changes({"namespaceLabel": "namespace", "labelSelector": "team=a, tier=gold",
                                          "activationQuery": "sum(q)", "rateWindow": "2m",
                                          "prometheusAddress": "http://prom:9090/"}))
    target = config.target("llm")
    assert target.label_matchers == (("namespace", "llm"), ("team", "a"), ("tier", "gold"))
    assert (target.activation_query, target.rate_window_s, target.prometheus_address) == (
        "sum(q)", 120.0, "http://prom:9090")
    assert config.target(None).label_matchers == (("team", "a"), ("tier", "gold"))
    assert config.policy_config().rate_window_s == 120.0


def test_tunables_reach_the_policy_and_metadata_bounds_win() -> None:
    config = parse_metadata(with_changes({"backlogDrainSeconds": "30", "trendConfidence": "0.5",
                                          "minReplicas": "1"}))
    policy = config.policy_config(min_replicas=3, max_replicas=9)
    assert (policy.backlog_drain_s, policy.trend_confidence, policy.min_replicas, policy.max_replicas) == (
        30.0, 0.5, 1, 9)
    assert {"backlogDrainSeconds", "headroomQuantile", "headroomHistorySeconds"} <= set(known_keys())


def test_parse_is_cached_per_distinct_map() -> None:
    first = parse_metadata(dict(GOOD))
    assert parse_metadata(dict(reversed(list(GOOD.items())))) is first
    assert parse_metadata(with_changes({"ttftSeconds": "3"})) is not first


def test_known_profile_gives_its_capacity() -> None:
    profiles = pytest.importorskip("scaler.profiles")
    name = profiles.list_profiles()[0]
    meta = {"model": "m", "profile": name, "ttftSeconds": "1.5"}
    assert parse_metadata(meta).capacity == profiles.get_profile(name).capacity(1.5)


@settings(deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_metric_name_is_lowercase_and_kubernetes_safe(model: str) -> None:
    if not model.strip():
        return
    name = parse_metadata(with_changes({"model": model})).metric_name
    assert re.fullmatch(r"leadscale-[a-z0-9]+(-[a-z0-9]+)*", name), name


VALUES = st.one_of(st.text(max_size=12), st.integers(-5, 10**6).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(str),
                   st.sampled_from(["auto", "3m", "1500ms", "a=b", "http://p:9090", "", " "]))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.one_of(st.sampled_from((*CORE_KEYS, *KEDA_KEYS, "trendConfidence", "ttftSecondsFromEnv")),
                                 st.text(max_size=8)),
                       VALUES, max_size=10))
def test_parser_never_crashes_and_names_every_bad_key(extra: dict[str, str]) -> None:
    meta = {**GOOD, **extra}
    try:
        config = parse_metadata(meta)
    except MetadataError as exc:
        # a key that is empty or holds odd characters is quoted (repr), so that it stays visible; past the
        # message cap (KEDA reads it from gRPC trailers) the rest are counted, not dropped silently
        text = str(exc)
        unnamed = [p for p in exc.problems if p.key not in text and repr(p.key) not in text]
        assert exc.problems
        if unnamed:
            match = re.search(r"and (\d+) more problems?$", text)
            assert match and int(match.group(1)) >= len(unnamed), text[-300:]
        return
    assert isinstance(config, ScalerConfig)
    # engine limits the metadata leaves open come from the snapshot (vllm:cache_config_info)
    engine = Signals(at=0.0, prompt_tokens_per_s=0.0, generation_tokens_per_s=0.0, requests_waiting=0.0,
                     requests_running=0.0, ready_replicas=1, kv_cache_tokens=100000.0)
    policy = config.policy_config(capacity=config.replica_capacity(engine))
    assert 0 < policy.target_utilization <= 1 and policy.ttft_slo_s > 0


LABELS = st.sampled_from(["model_name", "__name__", "__x", "team", "ns", "namespace", "1a", "a-b", "_ok"])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(LABELS, st.sampled_from(["a", "llm", ""]), max_size=3), st.one_of(st.none(), LABELS))
def test_any_accepted_selector_builds_a_target(selector: dict[str, str], namespace_label: str | None) -> None:
    """A label the sources would refuse is a metadata error (INVALID_ARGUMENT), never a ValueError later."""
    changes: dict[str, str | None] = {"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items()),
                                      "namespaceLabel": namespace_label}
    try:
        config = parse_metadata(with_changes(changes))
    except MetadataError as exc:
        assert {p.key for p in exc.problems} <= {"labelSelector", "namespaceLabel"}, str(exc)
        return
    target = config.target("llm")
    assert all(name not in ("model_name", "__name__") for name, _ in target.label_matchers)


@settings(deadline=None)
@given(st.integers(0, 50), st.integers(1, 50), st.floats(0.01, 1.0), st.floats(0, 7200))
def test_valid_values_round_trip(low: int, high: int, utilization: float, lead: float) -> None:
    meta = with_changes({"minReplicas": str(low), "maxReplicas": str(max(low, high)),
                         "targetUtilization": repr(utilization), "leadTime": repr(lead)})
    config = parse_metadata(meta)
    assert (config.min_replicas, config.max_replicas) == (low, max(low, high))
    assert (config.target_utilization, config.lead_time_s) == (utilization, lead)


def test_keda_own_keys_are_accepted_and_from_env_keys_resolve() -> None:
    keda = {"scalerAddress": "leadscale.keda:9090", "enableTLS": "true", "unsafeSsl": "false",
            "caCert": "/ca.pem", "tlsCertFile": "/c.pem", "tlsClientCert": "/c.pem", "tlsClientKey": "/k.pem"}
    config = parse_metadata({**with_changes({"model": None}), **keda, "modelFromEnv": "llama-from-env"})
    assert config.model == "llama-from-env"
    with pytest.raises(MetadataError, match="either model or modelFromEnv, not both"):
        parse_metadata({**GOOD, "modelFromEnv": "other"})
    with pytest.raises(MetadataError, match="bogusFromEnv"):
        parse_metadata({**GOOD, "bogusFromEnv": "x"})


def test_every_key_is_documented() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "scaler.md").read_text()
    missing = [key for key in (*known_keys(), *KEDA_KEYS) if f"`{key}`" not in docs]
    assert not missing, f"docs/scaler.md does not document {missing}"
