"""Arbitrary trigger metadata over gRPC: a precise INVALID_ARGUMENT or a finite, non-negative answer; never a crash.

Hypothesis draws metadata maps (missing, unknown and misspelt keys, non-numeric, negative, NaN/inf, huge
numbers, megabyte strings, unicode, label values that try to close the PromQL selector) and sends them to
a live server over loopback. Every answer must be one of:

- ``OK`` with ``metricValue == metricValueFloat``, finite and >= 0 (``IsActive`` a bool);
- ``INVALID_ARGUMENT`` whose details list the parser's own problems, each naming the key, the value given
  (or ``missing``) and what is allowed, short enough for KEDA's client to read (gRPC refuses trailing
  metadata past 8-16 KiB: a longer message reaches KEDA as RESOURCE_EXHAUSTED, not as our reason);

and the server must still answer its health check and a good request afterwards.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterator, Sequence

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_metadata import GOOD

from scaler._proto import externalscaler_pb2 as pb
from scaler._proto import externalscaler_pb2_grpc as pb_grpc
from scaler.evaluator import Evaluator
from scaler.metadata import KEDA_KEYS, MetadataError, known_keys, parse_metadata
from scaler.service import MAX_DETAILS_CHARS, RunningScaler, start_server
from scaler.signals import Signals
from scaler.sources.base import SourceError, Target
from scaler.sources.prometheus import group_queries
from scaler.telemetry import Telemetry

MEGABYTE = "x" * (1 << 20)
BREAKOUTS = ('a"} or vector(1) or {a="', 'x\\"}) > 0 #', "a\nb", "ok|.*", ".+", "\\", '"', "}", "llm=~\".*\"",
             "model_name=\"x\"", "\u202e\u0000", "naïve-модель-模型")
VALUES = st.one_of(
    st.sampled_from(["", " ", "0", "-1", "-0", "1", "nan", "NaN", "inf", "-inf", "+Inf", "1e308", "1e400", "9" * 400,
                     "0.0000001", "3m", "1500ms", "-5s", "1d", "auto", "true", "http://127.0.0.1:9",
                     "https://p", "prometheus:9090", "a=b", "a=b,a=c", "h100-llama3-8b", "/etc/passwd", MEGABYTE,
                     *BREAKOUTS]),
    st.integers(-10**20, 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=24),
)
KEYS = st.one_of(st.sampled_from([*known_keys(), *KEDA_KEYS, "modelFromEnv", "ttftSecondsFromEnv", "maxReplica",
                                  "", "bogus" * 40]),
                 st.text(max_size=12), st.just(MEGABYTE[:5000]))
PLAUSIBLE = st.sampled_from(["1", "2", "0.5", "0.9", "60", "3m", "90s", "auto", "0", "10", "100000"])
# Most maps start from a good one, so the valid branch (and PromQL built from hostile labels) is exercised too
MAPS = st.one_of(
    st.dictionaries(KEYS, VALUES, max_size=8),
    st.builds(lambda extra, drop: {**{k: v for k, v in GOOD.items() if k not in drop}, **extra},
              st.dictionaries(KEYS, VALUES, max_size=4), st.sets(st.sampled_from(sorted(GOOD)), max_size=2)),
    st.builds(lambda extra: {**GOOD, **extra}, st.dictionaries(st.sampled_from(known_keys()), PLAUSIBLE, max_size=4)),
    st.builds(lambda model, team: {**GOOD, "model": model, "labelSelector": f"team={team}"},
              st.one_of(st.sampled_from(BREAKOUTS), st.text(min_size=1, max_size=30)),
              st.one_of(st.sampled_from(BREAKOUTS), st.text(min_size=1, max_size=30).filter(lambda t: "," not in t))),
)


class AnyModelSource:
    """Measures any target: a steady, model-dependent load, built only after the target's PromQL is built, and
    the engine's KV cache as vLLM's ``cache_config_info`` reports it (so ``kvCacheTokens`` stays optional)."""

    def fetch(self, targets: Sequence[Target], now: float) -> dict[Target, Signals | SourceError]:
        out: dict[Target, Signals | SourceError] = {}
        for t in targets:
            group_queries([t.model], {k: [v] for k, v in t.label_matchers}, t.rate_window_s)  # must not raise
            load = float(zlib.crc32(t.model.encode()) % 50_000)
            out[t] = Signals(at=now, prompt_tokens_per_s=load, generation_tokens_per_s=load / 5,
                             requests_waiting=float(load > 25_000) * 7, requests_running=min(load / 100, 64.0),
                             ready_replicas=1, data_age_s=1.0, kv_cache_tokens=200_000.0)
        return out


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[RunningScaler, grpc.Channel]]:
    source = AnyModelSource()
    evaluator = Evaluator(prometheus_url="http://127.0.0.1:9", source_factory=lambda key: source,
                          telemetry=Telemetry())
    running = start_server(evaluator, evaluator.telemetry)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}",
                                    options=[("grpc.max_send_message_length", 8 << 20)])
    yield running, channel
    channel.close()
    running.stop(0.2)
    evaluator.stop()


def problem_texts(metadata: dict[str, str]) -> list[str] | None:
    """What the parser itself says is wrong (None: valid)."""
    try:
        parse_metadata(metadata)
    except MetadataError as exc:
        return [str(p) for p in exc.problems]
    return None


def check_invalid(details: str, expected: list[str]) -> None:
    assert len(details) <= MAX_DETAILS_CHARS, f"details of {len(details)} characters"
    assert details.startswith("invalid trigger metadata: ")
    assert expected[0] in details, (expected[0], details[:400])  # at least the first problem, verbatim
    shown = [p for p in expected if p in details]
    for text in shown:  # key, value (or missing) and what is allowed, each
        assert re.match(r"^.+: (missing|got .+); allowed: .+$", text, flags=re.DOTALL), text
    if len(shown) < len(expected):
        assert re.search(r"and \d+ more problems?$", details), details[-200:]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(metadata=MAPS)
def test_any_metadata_gets_a_precise_error_or_a_finite_answer(server: tuple[RunningScaler, grpc.Channel],
                                                             metadata: dict[str, str]) -> None:
    _, channel = server
    stub = pb_grpc.ExternalScalerStub(channel)
    ref = pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=metadata)
    expected = problem_texts(metadata)
    event("valid" if expected is None else "invalid")
    for call in (lambda: stub.GetMetricSpec(ref, timeout=3),
                 lambda: stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref), timeout=3),
                 lambda: stub.IsActive(ref, timeout=3)):
        try:
            reply = call()
        except grpc.RpcError as exc:
            assert expected is not None, f"valid metadata answered {exc.code()}: {exc.details()}"
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), (exc.details() or "")[:300])
            check_invalid(exc.details() or "", expected)
            continue
        assert expected is None, f"invalid metadata was answered: {expected[:2]}"
        if isinstance(reply, pb.GetMetricsResponse):
            (value,) = reply.metricValues
            assert math.isfinite(value.metricValueFloat) and value.metricValueFloat >= 0
            assert value.metricValue == int(value.metricValueFloat)
        elif isinstance(reply, pb.GetMetricSpecResponse):
            (spec,) = reply.metricSpecs
            assert (spec.targetSize, spec.targetSizeFloat) == (1, 1.0)
            assert re.fullmatch(r"leadscale-[a-z0-9-]+", spec.metricName)
        else:
            assert reply.result in (True, False)


def test_a_megabyte_value_is_named_not_refused_by_grpc(server: tuple[RunningScaler, grpc.Channel]) -> None:
    """Before the messages were bounded, KEDA got RESOURCE_EXHAUSTED ("metadata size exceeds hard limit")."""
    stub = pb_grpc.ExternalScalerStub(server[1])
    for metadata, key in (({**GOOD, "ttftSeconds": MEGABYTE}, "ttftSeconds"), ({**GOOD, "model": MEGABYTE}, "model"),
                          ({**GOOD, "b" * 100_000: "1"}, "bbbb"),
                          ({**GOOD, **{f"junk{i}": MEGABYTE[:1000] for i in range(200)}, "maxNumSeqs": "-3"},
                           "maxNumSeqs")):
        with pytest.raises(grpc.RpcError) as info:
            stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=pb.ScaledObjectRef(
                name="big", namespace="llm", scalerMetadata=metadata)), timeout=3)
        details = info.value.details() or ""
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details[:200]
        assert details.startswith("invalid trigger metadata: ") and len(details) <= MAX_DETAILS_CHARS
        assert key in details[:40], details[:80]  # the first problem names it
    assert "maxNumSeqs: got '-3'; allowed: an integer >= 1" in details  # the real problem before 200 unknown keys
    assert re.search(r"; and 1[0-9][0-9] more problems$", details), details[-80:]  # of the 200 unknown keys


def test_the_server_is_alive_after_the_barrage(server: tuple[RunningScaler, grpc.Channel]) -> None:
    running, channel = server
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    reply = pb_grpc.ExternalScalerStub(channel).GetMetrics(pb.GetMetricsRequest(
        scaledObjectRef=pb.ScaledObjectRef(name="after", namespace="llm", scalerMetadata=GOOD)), timeout=3)
    assert reply.metricValues[0].metricValueFloat >= 0
    assert running.servicer.telemetry.rpc_errors.labels("GetMetrics", "INTERNAL")._value.get() == 0
