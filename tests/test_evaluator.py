"""The evaluator: batching per source, first-call bound, staleness, idle drop, the Kubernetes hook."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from scaler import policy
from scaler.evaluator import Evaluator, TooManyObjects, Unavailable
from scaler.metadata import MetadataError, parse_metadata
from scaler.signals import Signals
from scaler.sources.base import SourceError, Target
from scaler.telemetry import Telemetry

META = {"model": "llama", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000",
        "maxNumSeqs": "256", "kvCacheTokens": "200000", "scaleDownDelay": "0"}


OBJ = {"namespace": "llm", "name": "chat", "metric": "leadscale-llama"}


class Clock:
    """A hand-moved clock (seconds)."""

    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeSource:
    """Answers every target from ``load`` (prompt tokens/s per model) or with ``error``."""

    load: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    raise_exc: bool = False
    age_s: float = 1.0
    block: threading.Event | None = None
    calls: list[tuple[Target, ...]] = field(default_factory=list)

    def fetch(self, targets: Sequence[Target], now: float) -> dict[Target, Signals | SourceError]:
        self.calls.append(tuple(targets))
        if self.block is not None:
            self.block.wait(10)
        if self.raise_exc:
            raise RuntimeError("boom")
        out: dict[Target, Signals | SourceError] = {}
        for t in targets:
            if self.error is not None or t.model not in self.load:
                out[t] = SourceError(self.error or f"no series for {t.model}")
                continue
            rate = self.load[t.model]
            out[t] = Signals(at=now, prompt_tokens_per_s=rate, generation_tokens_per_s=rate / 4,
                             requests_waiting=0.0, requests_running=10.0 if rate else 0.0,
                             ready_replicas=1, data_age_s=self.age_s)
        return out


def make(source: FakeSource, clock: Clock | None = None, **kwargs: object) -> Evaluator:
    factory_calls: list[object] = []

    def factory(key: object) -> FakeSource:
        factory_calls.append(key)
        return source

    ev = Evaluator(prometheus_url="http://prom:9090", source_factory=factory, clock=clock or Clock(),
                   telemetry=Telemetry(), **kwargs)  # type: ignore[arg-type]
    ev.factory_calls = factory_calls  # type: ignore[attr-defined]
    return ev


def test_first_call_computes_the_policy_decision_synchronously() -> None:
    source = FakeSource(load={"llama": 16000.0})
    ev = make(source)
    answer = ev.lookup("llm", "chat", META)
    config = parse_metadata(META)
    signals = source.fetch([config.target("llm")], 1_000.0)[config.target("llm")]
    assert isinstance(signals, Signals)
    expected = policy.decide(signals, policy.PolicyState(), config.policy_config(), 1_000.0)
    assert (answer.desired_replicas, answer.active) == (expected.desired_replicas, True)
    assert answer.desired_replicas >= 3  # 2 replicas of prefill + decode work at 80 % utilization
    assert len(source.calls) == 2  # the helper call above plus exactly one fetch by the evaluator
    ev.lookup("llm", "chat", META)
    assert len(source.calls) == 2, "the second call must come from the cache"


def test_one_round_fetches_once_per_source_for_all_objects() -> None:
    source = FakeSource(load={"llama": 8000.0, "mistral": 0.0})
    ev = make(source)
    for name in ("a", "b", "c"):
        ev.lookup("llm", name, META)
    ev.lookup("llm", "d", {**META, "model": "mistral"})
    ev.lookup("llm", "e", {**META, "scrapeTargets": "http://10.0.0.1:8000/metrics"})
    source.calls.clear()
    ev.run_once()
    assert sorted(len(batch) for batch in source.calls) == [1, 4]
    assert ("scrape", ("http://10.0.0.1:8000/metrics",)) in ev.factory_calls  # type: ignore[attr-defined]
    assert ev.lookup("llm", "d", {**META, "model": "mistral"}).active is False


def test_transient_failure_reuses_the_last_decision_until_the_staleness_limit() -> None:
    clock = Clock()
    source = FakeSource(load={"llama": 16000.0})
    ev = make(source, clock, staleness_limit_s=30.0)
    good = ev.lookup("llm", "chat", META).desired_replicas
    source.error = "Prometheus unreachable"
    clock.t += 20
    ev.run_once()
    assert ev.lookup("llm", "chat", META).desired_replicas == good
    clock.t += 20  # the data behind the decision is now 41 s old
    ev.run_once()
    with pytest.raises(Unavailable, match="Prometheus unreachable"):
        ev.lookup("llm", "chat", META)


@pytest.mark.parametrize(("source", "match"), [
    (FakeSource(error="connection refused"), "connection refused"),
    (FakeSource(load={"other": 1.0}), "no series for llama"),
    (FakeSource(load={"llama": 1.0}, age_s=500.0), "500 s old"),
    (FakeSource(raise_exc=True), "RuntimeError: boom"),
], ids=["source-error", "missing-series", "stale-data", "source-raises"])
def test_no_trustworthy_data_is_unavailable_never_zero(source: FakeSource, match: str) -> None:
    ev = make(source, staleness_limit_s=60.0)
    with pytest.raises(Unavailable, match=match):
        ev.lookup("llm", "chat", META)


def test_first_call_is_bounded_and_the_answer_arrives_later() -> None:
    gate = threading.Event()
    source = FakeSource(load={"llama": 8000.0}, block=gate)
    ev = make(source, first_call_timeout_s=0.2)
    with pytest.raises(Unavailable, match="first evaluation still running"):
        ev.lookup("llm", "chat", META)
    gate.set()
    ev.first_call_timeout_s = 5.0
    assert ev.lookup("llm", "chat", META).active is True


def test_concurrent_first_calls_share_one_fetch() -> None:
    source = FakeSource(load={"llama": 8000.0})
    ev = make(source)
    threads = [threading.Thread(target=ev.lookup, args=("llm", "chat", META)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(source.calls) == 1


def test_new_objects_arriving_together_share_their_first_fetch() -> None:
    source = FakeSource(load={"llama": 8000.0})
    ev = make(source)
    barrier = threading.Barrier(8)

    def ask(i: int) -> None:
        barrier.wait()
        ev.lookup("llm", f"chat-{i}", META)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(len(batch) for batch in source.calls) == 8
    assert len(source.calls) <= 2, f"{len(source.calls)} fetches for 8 objects that arrived together"


def test_idle_objects_are_dropped_with_their_metrics() -> None:
    clock = Clock()
    ev = make(FakeSource(load={"llama": 8000.0}), clock, idle_timeout_s=60.0)
    ev.lookup("llm", "chat", META)
    registry = ev.telemetry.registry
    assert registry.get_sample_value("leadscale_desired_replicas", OBJ) is not None
    clock.t += 30
    ev.lookup("llm", "chat", META)  # asking (an open stream asks every second) keeps it
    clock.t += 40
    ev.run_once()
    assert [d["name"] for d in ev.snapshot()] == ["chat"]
    clock.t += 61
    ev.run_once()
    assert ev.snapshot() == []
    assert registry.get_sample_value("leadscale_desired_replicas", OBJ) is None


@dataclass
class View:
    ready_replicas: int | None = None
    starting_replicas: int | None = None
    lead_time_s: float | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    scrape_urls: tuple[str, ...] = ()


class Kube:
    def __init__(self, view: View | None = None, fail: bool = False, fail_drain: bool = False) -> None:
        self.view, self.fail, self.fail_drain = view, fail, fail_drain
        self.drains: list[tuple[str, str, str | None]] = []
        self.scrapes: list[tuple[str, float]] = []

    def note_scrape(self, url: str, at: float) -> None:
        self.scrapes.append((url, at))

    def observe(self, namespace: str, name: str) -> View | None:
        if self.fail:
            raise ConnectionError("api server down")
        return self.view

    def before_scale_down(self, namespace: str, name: str, model: str | None = None) -> dict[str, int]:
        self.drains.append((namespace, name, model))
        if self.fail_drain:
            raise PermissionError("no patch on pods")
        return {}


@pytest.mark.parametrize(("load", "drains"), [(0.0, 1), (16000.0, 0)], ids=["scale-down", "scale-up"])
def test_scale_down_below_ready_asks_the_observer_to_pick_pods(load: float, drains: int) -> None:
    kube = Kube(View(ready_replicas=3))
    assert make(FakeSource(load={"llama": load}), kube=kube).lookup("llm", "chat", META).desired_replicas != 3
    assert kube.drains == [("llm", "chat", "llama")] * drains


def test_a_failing_drain_hook_is_counted_and_ignored() -> None:
    kube = Kube(View(ready_replicas=3), fail_drain=True)
    ev = make(FakeSource(load={"llama": 0.0}), kube=kube)
    assert ev.lookup("llm", "chat", META).desired_replicas == 0
    assert ev.telemetry.registry.get_sample_value(
        "leadscale_evaluation_errors_total", {"namespace": "llm", "name": "chat", "reason": "kube"}) == 1.0


def test_kube_view_bounds_and_lead_time_feed_the_policy() -> None:
    ev = make(FakeSource(load={"llama": 0.0}), kube=Kube(View(min_replicas=2, max_replicas=5)))
    assert ev.lookup("llm", "chat", META).desired_replicas == 2  # the ScaledObject's minReplicaCount
    ev = make(FakeSource(load={"llama": 80000.0}), kube=Kube(View(max_replicas=5)))
    assert ev.lookup("llm", "chat", META).desired_replicas == 5
    ev = make(FakeSource(load={"llama": 80000.0}), kube=Kube(View(max_replicas=5)))
    assert ev.lookup("llm", "chat", {**META, "maxReplicas": "7"}).desired_replicas == 7  # metadata wins
    ev = make(FakeSource(load={"llama": 8000.0}), kube=Kube(View(lead_time_s=42.0, starting_replicas=1)))
    ev.lookup("llm", "auto", {**META, "leadTime": "auto"})
    ev.lookup("llm", "fixed", META)
    terms = {d["name"]: d["terms"] for d in ev.snapshot()}
    assert terms["auto"]["lead_time_s"] == 42.0 and terms["fixed"]["lead_time_s"] == 180.0
    assert terms["auto"]["starting_replicas"] == 1.0


def test_a_failing_kube_observer_does_not_block_decisions() -> None:
    ev = make(FakeSource(load={"llama": 8000.0}), kube=Kube(fail=True))
    assert ev.lookup("llm", "chat", META).active is True
    assert ev.telemetry.registry.get_sample_value(
        "leadscale_evaluation_errors_total", {"namespace": "llm", "name": "chat", "reason": "kube"}) == 1.0


def test_no_configured_source_is_a_metadata_error() -> None:
    ev = Evaluator(source_factory=lambda key: FakeSource(), telemetry=Telemetry())
    with pytest.raises(MetadataError, match="prometheusAddress"):
        ev.lookup("llm", "chat", META)


def test_decision_changes_are_logged_once_as_json(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    source = FakeSource(load={"llama": 0.0})
    ev = make(source, clock)
    with caplog.at_level(logging.INFO, logger="leadscale.decisions"):
        ev.lookup("llm", "chat", META)
        clock.t += 5
        ev.run_once()  # unchanged: no line
        source.load["llama"] = 16000.0
        clock.t += 5
        ev.run_once()
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "leadscale.decisions"]
    assert [(line["desired_replicas"] > 0, line["active"]) for line in lines] == [(False, False), (True, True)]
    assert "demand_replicas" in lines[1]["terms"] and lines[1]["namespace"] == "llm"


def test_background_loop_notifies_waiters_on_activity_change() -> None:
    source = FakeSource(load={"llama": 0.0})
    ev = make(source, interval_s=0.05)
    assert ev.lookup("llm", "chat", META).active is False
    ev.start()
    try:
        with ev.changed:
            source.load["llama"] = 8000.0
            assert ev.changed.wait(timeout=5)
        assert ev.lookup("llm", "chat", META).active is True
    finally:
        ev.stop()


def test_changed_metadata_exports_one_series_per_trigger_newest_first() -> None:
    clock = Clock()
    ev = make(FakeSource(load={"llama": 16000.0}), clock)
    ev.lookup("llm", "chat", META)
    clock.t += 1
    newer = ev.lookup("llm", "chat", {**META, "maxReplicas": "2"})
    samples = [s for m in ev.telemetry.registry.collect() if m.name == "leadscale_desired_replicas" for s in m.samples]
    assert [s.value for s in samples] == [float(newer.desired_replicas)] == [2.0]


@pytest.mark.parametrize("field_name", ["interval_s", "staleness_limit_s", "idle_timeout_s", "first_call_timeout_s"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf")])
def test_bad_evaluator_settings_name_the_field(field_name: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{field_name}="):
        Evaluator(**{field_name: value})  # type: ignore[arg-type]


class Recorder:
    """A scrape-source stand-in that remembers how it was built and asked."""

    built: ClassVar[list[tuple[str, ...]]] = []

    def __init__(self, urls: tuple[str, ...], with_setter: bool = False) -> None:
        self.urls = urls
        Recorder.built.append(urls)
        if with_setter:
            self.set_urls = lambda new: setattr(self, "urls", new)  # type: ignore[method-assign]

    def fetch(self, targets: Sequence[Target], now: float) -> dict[Target, Signals | SourceError]:
        return {t: SourceError(f"scraped {','.join(self.urls)}") for t in targets}


@pytest.mark.parametrize("with_setter", [False, True], ids=["rebuild", "set-urls"])
def test_discovered_scrape_follows_the_ready_pods(with_setter: bool) -> None:
    from scaler.evaluator_kube import DiscoveredScrape

    Recorder.built = []
    kube = Kube(View())
    source = DiscoveredScrape(kube, "llm", "chat", make_source=lambda urls: Recorder(urls, with_setter))
    target = Target("llama")
    assert "no ready pod of llm/chat" in str(source.fetch([target], 0.0)[target])
    kube.view.scrape_urls = ("http://10.0.0.1:8000/metrics",)  # type: ignore[union-attr]
    assert "scraped http://10.0.0.1:8000/metrics" in str(source.fetch([target], 1.0)[target])
    source.fetch([target], 2.0)
    kube.view.scrape_urls = ("http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics")  # type: ignore[union-attr]
    assert "10.0.0.2" in str(source.fetch([target], 3.0)[target])
    assert len(Recorder.built) == (1 if with_setter else 2), "a new source only when it cannot follow the pods"
    kube.fail = True
    assert "observer failed: ConnectionError" in str(source.fetch([target], 4.0)[target])


def test_kubernetes_discovery_scrapes_a_real_pod_without_prometheus() -> None:
    from support.vllm_exporter import VllmExporter

    with VllmExporter(model="llama") as pod:
        pod.set_load(prompt_tokens_per_s=16000, generation_tokens_per_s=4000)
        pod.set_queue(waiting=2, running=20, kv_usage=0.5)
        view, kube = View(ready_replicas=1, scrape_urls=(pod.url,)), Kube()
        kube.view = view
        before = time.time()
        ev = Evaluator(kube=kube, telemetry=Telemetry(), first_call_timeout_s=15.0)  # no Prometheus, no static targets
        answer = ev.lookup("llm", "chat", META)
        assert answer.active and answer.desired_replicas >= 2
        assert ev.snapshot()[0]["terms"]["ready_replicas"] == 1.0
        ev.run_once()
        ev.stop()
        assert [url for url, _ in kube.scrapes] == [pod.url], "the pod's first answered scrape, once"
        assert before <= kube.scrapes[0][1] <= time.time(), "on the evaluator's (wall) clock"


def test_dropped_objects_take_their_error_series_with_them() -> None:
    """Names churn (deploys, renames): a counter per gone object would grow the registry without bound."""
    clock = Clock()
    ev = make(FakeSource(error="Prometheus down"), clock, idle_timeout_s=60.0)
    with pytest.raises(Unavailable):
        ev.lookup("llm", "gone", META)
    labels = {"namespace": "llm", "name": "gone", "reason": "source"}
    assert ev.telemetry.registry.get_sample_value("leadscale_evaluation_errors_total", labels) == 1
    clock.t += 61
    ev.run_once()
    assert ev.telemetry.registry.get_sample_value("leadscale_evaluation_errors_total", labels) is None
    with pytest.raises(Unavailable):  # the same name coming back counts from zero again
        ev.lookup("llm", "gone", META)
    assert ev.telemetry.registry.get_sample_value("leadscale_evaluation_errors_total", labels) == 1


def test_objects_are_bounded() -> None:
    ev = make(FakeSource(load={"llama": 8000.0}), max_objects=2)
    ev.lookup("llm", "a", META)
    ev.lookup("llm", "b", META)
    with pytest.raises(TooManyObjects, match=r"llm/c: this scaler already evaluates 2 scaled objects \(--max-objects"):
        ev.lookup("llm", "c", META)
    assert ev.lookup("llm", "a", META).desired_replicas >= 1  # the known ones still answer


def test_a_round_over_many_objects_lets_rpc_threads_run() -> None:
    """A round is pure Python; holding the GIL through it made every RPC arriving meanwhile wait a switch
    interval (5 ms) or more: the median extra wait of a 1 ms sleep was 5.2 ms with 1000 objects, 0.09 ms
    once the round yields after each object."""
    import statistics
    from concurrent.futures import ThreadPoolExecutor

    ev = make(FakeSource(load={f"m{i}": 1000.0 * (i % 7) for i in range(1000)}))
    with ThreadPoolExecutor(100) as pool:  # first calls arriving together share their first evaluation
        list(pool.map(lambda i: ev.lookup("llm", f"c{i}", {**META, "model": f"m{i}"}), range(1000)))
    stop = threading.Event()

    def rounds() -> None:
        while not stop.is_set():
            ev.run_once()

    worker = threading.Thread(target=rounds, daemon=True)
    worker.start()
    waits = []
    try:
        for _ in range(300):
            started = time.perf_counter()
            time.sleep(0.001)
            waits.append(time.perf_counter() - started - 0.001)
    finally:
        stop.set()
        worker.join(timeout=30)
        ev.stop()
    assert statistics.median(waits) < 0.0025, f"median extra wait {statistics.median(waits) * 1000:.2f} ms"
