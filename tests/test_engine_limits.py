"""Engine limits from vLLM's own metrics: no hand-typed kvCacheTokens/maxNumSeqs (issue #13)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_evaluator import Clock, FakeSource, make

from scaler.engine_limits import CapacityKeys, EngineLimitMissing, measured_max_num_seqs
from scaler.evaluator import Unavailable
from scaler.metadata import MetadataError, parse_metadata
from scaler.signals import Signals
from scaler.sources.base import Target
from scaler.sources.prometheus import _kv_cache_tokens, group_queries
from scaler.sources.scrape import parse_metrics

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RATES = {"model": "llama", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000",
         "scaleDownDelay": "0"}


def snapshot(**kw: float) -> Signals:
    base = dict(at=0.0, prompt_tokens_per_s=8000.0, generation_tokens_per_s=500.0, requests_waiting=0.0,
                requests_running=40.0, ready_replicas=2)
    return Signals(**{**base, **kw})  # type: ignore[arg-type]


# --- metadata: the keys are overrides --------------------------------------------------------------------------

def test_rates_alone_parse_and_leave_the_limits_to_the_engine() -> None:
    config = parse_metadata(RATES)
    assert config.capacity is None and config.capacity_keys is not None
    capacity = config.replica_capacity(snapshot(kv_cache_tokens=131072.0, requests_running=40.0))
    assert capacity.kv_cache_tokens == 131072  # vllm:cache_config_info: num_gpu_blocks x block_size
    assert capacity.max_num_seqs == 20  # 40 running over 2 ready replicas
    assert capacity.prefill_tokens_per_s == 8000.0


def test_given_keys_override_what_the_engine_reports() -> None:
    config = parse_metadata({**RATES, "kvCacheTokens": "50000", "maxNumSeqs": "64"})
    assert config.capacity is not None  # complete from metadata: nothing read per snapshot
    assert config.replica_capacity(snapshot(kv_cache_tokens=1e6)).kv_cache_tokens == 50000
    partial = parse_metadata({**RATES, "maxNumSeqs": "64"})
    capacity = partial.replica_capacity(snapshot(kv_cache_tokens=90000.0))
    assert (capacity.max_num_seqs, capacity.kv_cache_tokens) == (64, 90000)


def test_neither_key_nor_series_says_where_the_value_would_come_from() -> None:
    config = parse_metadata(RATES)
    with pytest.raises(EngineLimitMissing) as info:
        config.replica_capacity(snapshot(), where="Prometheus http://prom:9090")
    message = str(info.value)
    for part in ("kvCacheTokens", "Prometheus http://prom:9090", "vllm:cache_config_info", "num_gpu_blocks",
                 "block_size"):
        assert part in message
    with pytest.raises(EngineLimitMissing):
        config.policy_config()  # no capacity passed and none in the metadata


@pytest.mark.parametrize(("changes", "key"), [({"kvCacheTokens": "0"}, "kvCacheTokens"),
                                               ({"maxNumSeqs": "1.5"}, "maxNumSeqs"),
                                               ({"decodeTokensPerSecond": None}, "decodeTokensPerSecond")],
                         ids=["kv-zero", "seqs-fraction", "decode-missing"])
def test_bad_overrides_are_still_named(changes: dict[str, str | None], key: str) -> None:
    meta = {k: v for k, v in {**RATES, **changes}.items() if v is not None}
    with pytest.raises(MetadataError) as info:
        parse_metadata(meta)
    assert key in {p.key for p in info.value.problems}


@given(st.floats(0, 1e6), st.integers(0, 1000))
def test_measured_concurrency_is_a_positive_integer(running: float, ready: int) -> None:
    seqs = measured_max_num_seqs(snapshot(requests_running=running, ready_replicas=ready))
    assert isinstance(seqs, int) and seqs >= 1
    if ready and running >= ready:
        assert seqs * ready >= running


@given(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)))
def test_no_usable_kv_series_is_never_a_made_up_capacity(value: float | None) -> None:
    keys = CapacityKeys(8000.0, 2000.0)
    try:
        signals = snapshot(kv_cache_tokens=value) if value is not None else snapshot()
    except ValueError:
        return  # Signals refuses non-finite values itself
    try:
        capacity = keys.resolve(signals)
    except EngineLimitMissing:
        assert value is None or value < 1
    else:
        assert value is not None and capacity.kv_cache_tokens == int(value) >= 1


# --- sources: vllm:cache_config_info ----------------------------------------------------------------------------

def test_real_vllm_capture_gives_the_engines_kv_cache() -> None:
    real = parse_metrics((FIXTURES / "vllm_cpu_real.metrics.txt").read_text())["tiny-llama"]
    assert real.kv_cache_tokens == 8192 * 128  # == its kv_cache_size_tokens label (1048576)
    two = parse_metrics((FIXTURES / "vllm_v1_two_engines.metrics.txt").read_text())
    assert two["meta-llama/Llama-3.1-8B-Instruct"].kv_cache_tokens == 2 * 27000 * 16  # one pod, two engines


def test_prometheus_joins_cache_config_to_the_models_replicas_by_instance() -> None:
    queries = group_queries(["m"], {"namespace": ["llm"]}, 60)
    assert "vllm:cache_config_info{namespace=~" in queries["cache_config"]
    assert "instance" in queries["replica_instances"]
    target = Target("m", label_matchers=(("namespace", "llm"),))
    rows = {
        "replica_instances": [{"metric": {"model_name": "m", "namespace": "llm", "instance": "a:8000"}},
                              {"metric": {"model_name": "m", "namespace": "llm", "instance": "b:8000"}},
                              {"metric": {"model_name": "other", "namespace": "llm", "instance": "c:8000"}}],
        "cache_config": [
            {"metric": {"instance": "a:8000", "engine": "0", "num_gpu_blocks": "1000", "block_size": "16"}},
            {"metric": {"instance": "a:8000", "engine": "1", "num_gpu_blocks": "1000", "block_size": "16"}},
            {"metric": {"instance": "b:8000", "engine": "0", "num_gpu_blocks": "1500", "block_size": "16"}},
            {"metric": {"instance": "c:8000", "engine": "0", "num_gpu_blocks": "10", "block_size": "16"}},
            {"metric": {"instance": "b:8000", "engine": "1", "num_gpu_blocks": "lots", "block_size": "16"}},
            "garbage",
        ],
    }
    assert _kv_cache_tokens(rows, target, ("namespace",)) == 1500 * 16  # b (one engine) < a (two)
    assert _kv_cache_tokens({"replica_instances": rows["replica_instances"]}, target, ("namespace",)) is None


# --- the evaluator: UNAVAILABLE with the reason, never a guess --------------------------------------------------

class KvSource(FakeSource):
    kv: float | None = None

    def fetch(self, targets, now):  # type: ignore[no-untyped-def]
        out = super().fetch(targets, now)
        return {t: (Signals(**{**s.__dict__, "kv_cache_tokens": self.kv}) if isinstance(s, Signals) else s)
                for t, s in out.items()}


def test_evaluator_reads_the_kv_cache_or_answers_unavailable_naming_it() -> None:
    source = KvSource(load={"llama": 16000.0})
    ev = make(source, clock=Clock())
    with pytest.raises(Unavailable, match=r"kvCacheTokens.*vllm:cache_config_info"):
        ev.lookup("llm", "chat", RATES)
    source.kv = 200000.0
    ev.run_once()
    answer = ev.lookup("llm", "chat", RATES)
    with_keys = make(KvSource(load={"llama": 16000.0}), clock=Clock()).lookup(
        "llm", "chat", {**RATES, "kvCacheTokens": "200000", "maxNumSeqs": "10"})
    assert answer.desired_replicas == with_keys.desired_replicas >= 2  # the same fleet as the typed-in keys


def test_simulated_leadscale_reads_the_replicas_cache_config() -> None:
    from scaler.profiles import get_profile
    from simulator.autoscale import run_autoscaled
    from simulator.engine import Engine
    from simulator.observe import Observer
    from simulator.policies import Leadscale, leadscale_control, leadscale_metadata
    from simulator.synthetic import load_workload
    from simulator.workload import select_window

    profile = get_profile("h100-llama3-8b")
    workload = select_window(load_workload("builtin:default", None, seed=1), 0.0, 300.0)
    engine = Engine(workload, profile, initial_replicas=2)
    observer = Observer()
    for t in (0.0, 15.0, 30.0, 45.0, 60.0):
        engine.now = t
        observer.scrape(t, {rid: engine.fleet.metrics(rid, t) for rid in engine.fleet.replicas})
    signals = observer.signals(60.0, 2, 0)
    assert signals is not None and signals.kv_cache_tokens == profile.num_gpu_blocks * profile.block_size

    capacity = profile.capacity(2.0)
    meta = {"prefillTokensPerSecond": repr(capacity.prefill_tokens_per_s),
            "decodeTokensPerSecond": repr(capacity.decode_tokens_per_s)}
    policy = Leadscale(leadscale_metadata(meta, 2.0), leadscale_control(1, 20))
    result = run_autoscaled(workload, profile, policy, "fixed:60", 2.0, seed=1, max_replicas=20)
    assert len(result.decisions) > 30, "evaluations were skipped: the KV cache never reached the Signals"
