"""ScrapeSource: parsing captured /metrics texts, counter maths, and scraping exporters on 127.0.0.1."""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.vllm_exporter import VllmExporter

from scaler.histograms import share_above
from scaler.signals import Signals
from scaler.sources import SignalSource, SourceError, Target
from scaler.sources.scrape import ModelSample, ScrapeSource, increase, parse_metrics

FIXTURES = Path(__file__).parent / "fixtures"
TWO_ENGINES = (FIXTURES / "vllm_v1_two_engines.metrics.txt").read_text()
MIXED = (FIXTURES / "mixed_models_and_foreign.metrics.txt").read_text()
REAL = (FIXTURES / "vllm_cpu_real.metrics.txt").read_text()  # a real vLLM 0.32.0 CPU, after six requests
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"

# --- parsing ------------------------------------------------------------------------------------------------------


def test_two_engine_capture_sums_engines_per_model() -> None:
    sample = parse_metrics(TWO_ENGINES)[LLAMA]
    assert sample.counters["prompt"] == 40 * 812 and sample.counters["generation"] == 40 * 190
    assert (sample.counters["prompt_count"], sample.counters["prompt_sum"]) == (40, 40 * 812)
    assert (sample.gauges["waiting"], sample.gauges["running"]) == (3, 24)
    assert sample.gauges["kv"] / sample.kv_series == pytest.approx(0.62)
    assert sample.created > 1e9


def test_real_vllm_capture_parses_to_its_counters() -> None:
    sample = parse_metrics(REAL)["tiny-llama"]
    assert (sample.counters["prompt"], sample.counters["generation"]) == (1221, 63)
    assert (sample.counters["prompt_count"], sample.counters["prompt_sum"]) == (6, 1221)  # six requests
    assert sample.counters["output_count"] == 6
    assert sample.gauges == {"waiting": 0, "running": 0, "kv": 0} and sample.kv_series == 1


def _names_and_labels(text: str) -> dict[str, set[frozenset[str]]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:"):
                out.setdefault(sample.name, set()).add(frozenset(sample.labels))
    return out


def test_the_test_exporter_speaks_real_vllm_names_and_labels() -> None:
    from prometheus_client import generate_latest

    real = _names_and_labels(REAL)
    fake = _names_and_labels(generate_latest(VllmExporter(model="tiny-llama").metrics.registry).decode())
    for name, label_sets in fake.items():
        assert name in real, f"the exporter invents {name}"
        for labels in label_sets:  # info gauges carry many more labels in vLLM; a subset is fine there
            ok = any(labels == r or (name.endswith("_info") and labels <= r) for r in real[name])
            assert ok, f"{name} labels {sorted(labels)} not in real vLLM's {[sorted(r) for r in real[name]]}"


def test_foreign_series_and_unlabelled_ones_are_ignored() -> None:
    models = parse_metrics(MIXED)
    assert set(models) == {"base", 'adapter "q" \\ v2'}  # escaped label values come back unescaped
    assert models["base"].gauges == {"waiting": 5, "running": 7, "kv": 0.91}
    assert models['adapter "q" \\ v2'].gauges["running"] == 2  # the unlabelled 99 went nowhere


@pytest.mark.parametrize("text", [
    'vllm:num_requests_running{model_name="m"} NaN',
    'vllm:num_requests_running{model_name="m"} -1',
    'vllm:prompt_tokens_total{model_name="m"} +Inf',
    'vllm:num_requests_running{model_name="m" 3',
    'vllm:num_requests_running{model_name="m"} three',
], ids=["nan", "negative", "inf", "unclosed-brace", "word"])
def test_bad_values_and_syntax_are_source_errors(text: str) -> None:
    with pytest.raises(SourceError):
        parse_metrics(text + "\n")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # no timing on a loaded box
@given(st.one_of(
    st.text(),
    st.lists(st.sampled_from(TWO_ENGINES.splitlines() + MIXED.splitlines() + ["{", "}", '"', "\\", " ", "#"]))
    .map("\n".join),
    st.tuples(st.integers(0, len(MIXED)), st.text(max_size=20)).map(lambda c: MIXED[:c[0]] + c[1] + MIXED[c[0]:]),
))
def test_garbage_never_crashes_the_parser(text: str) -> None:
    try:
        models = parse_metrics(text)
    except SourceError:
        return
    for sample in models.values():
        assert all(v >= 0 for v in [*sample.counters.values(), *sample.gauges.values()])


# --- counter maths ------------------------------------------------------------------------------------------------

def _history(*values: float, created: tuple[float, ...] = ()) -> list[tuple[float, ModelSample]]:
    points = []
    for i, value in enumerate(values):
        sample = ModelSample(created=created[i] if created else 0.0)
        sample.counters["prompt"] = value
        points.append((float(i), sample))
    return points


@pytest.mark.parametrize(("values", "created", "expected"), [
    ((10, 20, 35), (), 25),
    ((10, 20, 5, 15), (), 10 + 5 + 10),  # dropped to 5: restarted, counted from zero
    ((10, 20, 30), (1.0, 1.0, 2.0), 10 + 30),  # grew past the old value but _created moved: restart
    ((7,), (), 0),
], ids=["monotonic", "drop-is-reset", "created-moved", "single"])
def test_increase_handles_counter_resets(values: tuple[float, ...], created: tuple[float, ...],
                                         expected: float) -> None:
    assert increase(_history(*values, created=created), "prompt") == expected


@settings(deadline=None)
@given(st.lists(st.floats(0, 1e12), min_size=1, max_size=20))
def test_increase_is_never_negative_and_exact_for_monotonic_counters(values: list[float]) -> None:
    assert increase(_history(*values), "prompt") >= 0
    ordered = sorted(values)
    assert increase(_history(*ordered), "prompt") == pytest.approx(ordered[-1] - ordered[0], abs=1e-3)


# --- scraping real HTTP endpoints on 127.0.0.1 ------------------------------------------------------------------

def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"


@pytest.fixture
def pods() -> Iterator[tuple[VllmExporter, VllmExporter]]:
    with VllmExporter(model="m", engines=2) as a, VllmExporter(model="m") as b:
        yield a, b


def test_rates_come_from_successive_scrapes(pods: tuple[VllmExporter, VllmExporter]) -> None:
    a, b = pods
    source, target = ScrapeSource([a.url, b.url], warmup_s=0), Target("m", rate_window_s=60)
    assert isinstance(source, SignalSource)
    first = source.fetch([target], now=100.0)[target]
    assert isinstance(first, SourceError) and "warming up" in str(first)
    a.record_requests(10, prompt_len=500, output_len=100)
    b.record_requests(5, prompt_len=200, output_len=50)
    a.set_queue(waiting=4, running=8, kv_usage=0.5)
    b.set_queue(waiting=1, running=2, kv_usage=0.1)
    second = source.fetch([target], now=110.0)[target]
    assert isinstance(second, Signals)
    assert second.prompt_tokens_per_s == pytest.approx((10 * 500 + 5 * 200) / 10)
    assert second.generation_tokens_per_s == pytest.approx((10 * 100 + 5 * 50) / 10)
    assert second.mean_prompt_tokens == pytest.approx(6000 / 15)
    assert second.mean_output_tokens == pytest.approx(1250 / 15)
    # the prompt-length histogram's buckets, (200, 500] and (100, 200], read as uniform (scaler.histograms)
    squares = 10 * (200**2 + 200 * 500 + 500**2) / 3 + 5 * (100**2 + 100 * 200 + 200**2) / 3
    assert second.prompt_tokens_weighted_mean == pytest.approx(squares / (10 * 350 + 5 * 150))
    # every first token came after 0.1 s (the exporter's default): none late for a 2 s SLO, all for 0.05 s
    assert second.ttft_buckets is not None and dict(second.ttft_buckets)[math.inf] == pytest.approx(15 / 10)
    assert share_above(dict(second.ttft_buckets), 2.0) == 0.0
    assert share_above(dict(second.ttft_buckets), 0.05) == 1.0
    assert (second.requests_waiting, second.requests_running, second.ready_replicas) == (5, 10, 2)
    assert second.kv_cache_usage == pytest.approx(0.3)
    assert second.waiting_tokens is None


def test_first_fetch_scrapes_twice_so_the_first_evaluation_can_answer(
        pods: tuple[VllmExporter, VllmExporter]) -> None:
    a, _ = pods
    a.set_load(prompt_tokens_per_s=20_000, generation_tokens_per_s=2_000, prompt_len=500, output_len=50)
    warmup = 1.5  # long beside a scrape of 127.0.0.1, so a loaded box cannot blur "waited" and "did not"
    source, target = ScrapeSource([a.url], warmup_s=warmup), Target("m")
    started = time.monotonic()
    first = source.fetch([target], now=1000.0)[target]
    assert time.monotonic() - started >= warmup
    assert isinstance(first, Signals) and first.at == 1000.0 and first.ready_replicas == 1
    assert 10_000 < first.prompt_tokens_per_s < 30_000  # a short first rate, but a real one
    started = time.monotonic()
    assert isinstance(source.fetch([target], now=1005.0)[target], Signals)
    assert time.monotonic() - started < warmup, "only the first sight of a pod waits"


def test_restarted_pod_counts_from_zero_not_negative(pods: tuple[VllmExporter, VllmExporter]) -> None:
    a, _ = pods
    source, target = ScrapeSource([a.url], warmup_s=0), Target("m")
    a.record_requests(100, prompt_len=1000, output_len=10)
    source.fetch([target], now=0.0)
    a.restart()
    a.record_requests(3, prompt_len=1000, output_len=10)
    signals = source.fetch([target], now=10.0)[target]
    assert isinstance(signals, Signals) and signals.prompt_tokens_per_s == pytest.approx(300)


def test_failed_scrape_is_a_starting_pod_not_zero_load(pods: tuple[VllmExporter, VllmExporter]) -> None:
    a, b = pods
    source, target = ScrapeSource([a.url, b.url, _closed_port_url()], timeout_s=1, warmup_s=0), Target("m")
    source.fetch([target], now=0.0)
    b.set_serving(False)
    a.record_requests(1, prompt_len=100, output_len=10)
    signals = source.fetch([target], now=1.0)[target]
    assert isinstance(signals, Signals)
    assert (signals.ready_replicas, signals.starting_replicas) == (1, 2)
    assert signals.prompt_tokens_per_s == pytest.approx(100)
    a.set_serving(False)
    nothing = source.fetch([target], now=2.0)[target]
    assert isinstance(nothing, SourceError) and "no data" in str(nothing) and "HTTP 503" in str(nothing)


def test_on_scrape_hears_first_answers_and_recoveries_only(pods: tuple[VllmExporter, VllmExporter]) -> None:
    a, b = pods
    heard: list[tuple[str, float]] = []
    source = ScrapeSource([a.url, b.url], warmup_s=0, on_scrape=lambda url, at: heard.append((url, at)))
    b.set_serving(False)
    source.fetch([Target("m")], now=1.0)
    source.fetch([Target("m")], now=2.0)
    assert heard == [(a.url, 1.0)], "a pod that never answered is not heard; one that answered, once"
    b.set_serving(True)
    source.fetch([Target("m")], now=3.0)
    a.set_serving(False)
    source.fetch([Target("m")], now=4.0)
    a.set_serving(True)
    source.fetch([Target("m")], now=5.0)
    assert heard == [(a.url, 1.0), (b.url, 3.0), (a.url, 5.0)]


def test_a_failing_listener_costs_no_signals(pods: tuple[VllmExporter, VllmExporter]) -> None:
    def boom(url: str, at: float) -> None:
        raise RuntimeError("listener down")

    source = ScrapeSource([pods[0].url], warmup_s=0, on_scrape=boom)
    source.fetch([Target("m")], now=0.0)
    assert isinstance(source.fetch([Target("m")], now=1.0)[Target("m")], Signals)


def test_set_urls_keeps_the_history_of_pods_that_stay(pods: tuple[VllmExporter, VllmExporter]) -> None:
    a, b = pods
    source, target = ScrapeSource([a.url], warmup_s=0), Target("m")
    source.fetch([target], now=0.0)
    a.record_requests(10, prompt_len=100, output_len=10)
    source.set_urls([a.url, b.url])  # b is new: one scrape, no rate yet; a keeps its first scrape
    signals = source.fetch([target], now=10.0)[target]
    assert isinstance(signals, Signals) and signals.ready_replicas == 2
    assert signals.prompt_tokens_per_s == pytest.approx(100)
    source.set_urls([b.url])
    assert source.urls == [b.url]
    with pytest.raises(ValueError, match="ScrapeSource urls="):
        source.set_urls([])


def test_model_no_pod_serves_is_no_data(pods: tuple[VllmExporter, VllmExporter]) -> None:
    source = ScrapeSource([pods[0].url], warmup_s=0)
    source.fetch([Target("other")], now=0.0)
    result = source.fetch([Target("other")], now=1.0)[Target("other")]
    assert isinstance(result, SourceError) and "no data" in str(result)


@pytest.mark.parametrize(("urls", "timeout", "warmup"), [
    ([], 1, 0), ("http://a/metrics", 1, 0), (["a:80/metrics"], 1, 0), (["http://a/metrics"], 0, 0),
    (["http://a/metrics"], 1, -1), (["http://a/metrics"], 1, 60)],
    ids=["empty", "str", "scheme", "timeout", "negative-warmup", "long-warmup"])
def test_bad_settings_name_the_field(urls: list[str], timeout: float, warmup: float) -> None:
    with pytest.raises(ValueError, match=r"ScrapeSource (urls|timeout_s|warmup_s)="):
        ScrapeSource(urls, timeout_s=timeout, warmup_s=warmup)


def test_the_evaluator_serves_a_decision_from_direct_scrapes(pods: tuple[VllmExporter, VllmExporter]) -> None:
    """``scrapeTargets`` end to end (without gRPC): the real source factory, the wall clock, the policy."""
    from scaler.evaluator import Evaluator

    a, b = pods
    a.set_load(prompt_tokens_per_s=20_000, generation_tokens_per_s=1_000, prompt_len=500, output_len=25)
    a.set_queue(waiting=3, running=8)
    metadata = {"model": "m", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000", "maxNumSeqs": "64",
                "kvCacheTokens": "100000", "scrapeTargets": f"{a.url},{b.url}", "leadTime": "5"}
    evaluator = Evaluator(interval_s=0.5, first_call_timeout_s=15.0)  # a loaded box scrapes slowly
    try:
        answer = evaluator.lookup("llm", "chat", metadata)
        assert answer.active and answer.desired_replicas >= 3  # 20k prompt tok/s over 8k per replica, at 0.8
    finally:
        evaluator.stop()
