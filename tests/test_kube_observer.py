"""The observer end to end: the real ``kubernetes`` client against recorded responses on 127.0.0.1.

Why a local HTTP server rather than ``ApiClient().deserialize`` alone: it also exercises the client's
URL and query building (labelSelector, watch, resourceVersion, bookmarks), the watch stream parser,
error statuses, and the PATCH content type; and its request log is what the chart's RBAC is checked
against (``test_chart.py``).
"""

from __future__ import annotations

import datetime as dt
import socket
import time
from collections.abc import Iterator

import pytest
from support.kube_api import FakeKubeApi, load
from test_kube_drain import E2E, vllm_page

from scaler.kube.client import KubeApi, KubeError
from scaler.kube.objects import KubeObjectError
from scaler.kube.pods import DELETION_COST_ANNOTATION
from scaler.sources.kube import KubeObserver

T0 = dt.datetime(2026, 11, 30, 10, 26, tzinfo=dt.UTC).timestamp()
RS = "vllm-llama3-8b-6d5f9b8c7d-"


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    with FakeKubeApi() as fake:
        fake.add("scaledobjects", load("scaledobject_llama3.json"))
        fake.add("scaledobjects", load("scaledobject_statefulset.json"))
        fake.add("deployments", load("deployment_llama3.json"))
        fake.set_pods(load("pods_llama3.json"))
        yield fake


def observer(api: FakeKubeApi, clock: Clock, **kwargs: object) -> KubeObserver:
    return KubeObserver(KubeApi.for_host(api.url), watch=False, clock=clock, **kwargs)


def test_too_few_starts_leave_the_lead_time_to_the_configured_fallback(api: FakeKubeApi) -> None:
    view = observer(api, Clock(), lead_min_samples=4, control_lag_s=0.0).observe("llm", "llama3-8b")
    assert (view.lead_time_samples, view.lead_time_s, view.cold_start_p90_s) == (3, None, None)


def test_view_from_the_recorded_list(api: FakeKubeApi) -> None:
    view = observer(api, Clock()).observe("llm", "llama3-8b")
    assert (view.deployment, view.min_replicas, view.max_replicas) == ("vllm-llama3-8b", 1, 8)
    assert (view.ready_replicas, view.starting_replicas, view.stuck_replicas) == (3, 2, 2)
    assert (view.unschedulable_replicas, view.terminating_replicas, view.synced) == (1, 1, True)
    # clean starts: 4xk2p 195 s, 8bq7n 161 s, z8m1k 150 s (terminating now, but its start was clean)
    assert (view.lead_time_samples, view.cold_start_p90_s, view.lead_time_s) == (3, 195.0, 210.0)  # + 15 s lag
    assert sorted(view.cold_starts_s) == [150.0, 161.0, 195.0]  # the starts themselves, for pods still starting
    assert view.scrape_urls == ("http://10.244.2.31:8000/metrics", "http://10.244.3.17:8000/metrics",
                                "http://10.244.5.9:8000/metrics")  # the other model's pod is not selected
    sent = api.requests[-1]
    assert sent["query"]["labelSelector"] == ["app.kubernetes.io/instance=llama3-8b,app.kubernetes.io/name=vllm"]


def test_watch_events_move_pods_and_measure_the_new_cold_start(api: FakeKubeApi) -> None:
    clock = Clock()
    obs = observer(api, clock)
    obs.observe("llm", "llama3-8b")
    api.queue_watch(load("watch_scale_up.json"))
    watcher = obs.watcher(obs.target("llm", "llama3-8b"))
    assert watcher.watch_once(timeout_s=5) == 8  # ADDED, 2x MODIFIED, BOOKMARK, MODIFIED x3, DELETED
    assert watcher.resource_version == "48320"
    assert api.requests[-1]["query"]["resourceVersion"] == ["48213"]
    assert api.requests[-1]["query"]["allowWatchBookmarks"] == ["true"]
    clock.t += 240
    view = obs.observe("llm", "llama3-8b")
    # t6w9q became Ready (201 s start), j9wzt restarted (OOM again): starting; z8m1k deleted
    assert (view.ready_replicas, view.starting_replicas, view.terminating_replicas) == (3, 3, 0)
    assert view.unschedulable_replicas == 0  # vq5lc found a node
    assert (view.lead_time_samples, view.cold_start_p90_s) == (4, 201.0)
    assert "http://10.244.7.9:8000/metrics" in view.scrape_urls


def test_an_expired_watch_lists_again(api: FakeKubeApi) -> None:
    obs = observer(api, Clock())
    obs.observe("llm", "llama3-8b")
    watcher = obs.watcher(obs.target("llm", "llama3-8b"))
    api.queue_watch([load("watch_scale_up.json")[0]])
    watcher.watch_once(timeout_s=5)
    lists_before = sum(1 for r in api.requests if "watch" not in r["query"] and r["path"].endswith("/pods"))
    api.queue_watch(load("watch_expired.json"))
    assert watcher.watch_once(timeout_s=5) == 0
    lists_after = sum(1 for r in api.requests if "watch" not in r["query"] and r["path"].endswith("/pods"))
    assert lists_after == lists_before + 1 and watcher.resource_version == "48213" and watcher.healthy()
    assert RS + "t6w9q" not in {p.name for p in watcher.pods()}  # the relist is the truth


def test_errors_name_the_object_and_the_missing_permission(api: FakeKubeApi) -> None:
    obs = observer(api, Clock())
    with pytest.raises(KubeError, match="ScaledObject llm/nope not found") as missing:
        obs.observe("llm", "nope")
    assert missing.value.status == 404
    with pytest.raises(KubeObjectError, match="kind='StatefulSet'"):
        obs.observe("llm", "embedder")
    api.forbidden.add(("list", "pods"))
    with pytest.raises(KubeError, match=r"list pods is forbidden \(403\).*RBAC") as denied:
        obs.observe("llm", "llama3-8b")
    assert denied.value.status == 403


def test_a_failed_first_resolution_is_not_retried_every_round(api: FakeKubeApi) -> None:
    clock = Clock()
    obs = observer(api, clock, retry_after_s=30.0)
    api.forbidden.add(("get", "scaledobjects"))
    for _ in range(3):
        with pytest.raises(KubeError, match="forbidden"):
            obs.observe("llm", "llama3-8b")
    assert sum(r["path"].endswith("/scaledobjects/llama3-8b") for r in api.requests) == 1
    api.forbidden.clear()
    clock.t += 31
    assert obs.observe("llm", "llama3-8b").ready_replicas == 3


def test_a_failed_refresh_keeps_the_cached_target(api: FakeKubeApi) -> None:
    clock = Clock()
    obs = observer(api, clock, resolve_ttl_s=60.0)
    assert obs.observe("llm", "llama3-8b").max_replicas == 8
    api.forbidden.add(("get", "scaledobjects"))
    clock.t += 61
    assert obs.observe("llm", "llama3-8b").max_replicas == 8


def test_an_unreachable_api_server_is_a_kube_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = KubeApi.for_host(f"http://127.0.0.1:{port}")
    api.api_client.configuration.retries = 0
    with pytest.raises(KubeError, match="unreachable"):
        KubeObserver(api, watch=False).observe("llm", "llama3-8b")


def test_the_background_watch_follows_events_and_stops(api: FakeKubeApi) -> None:
    obs = KubeObserver(KubeApi.for_host(api.url), watch=True, clock=Clock())
    api.queue_watch(load("watch_scale_up.json"))
    obs.observe("llm", "llama3-8b")
    watcher = obs.watcher(obs.target("llm", "llama3-8b"))
    deadline = time.monotonic() + 60  # generous for a loaded box; a quiet one takes milliseconds
    while watcher.resource_version != "48320" and time.monotonic() < deadline:
        time.sleep(0.02)
    obs.close()
    assert watcher.resource_version == "48320"
    assert RS + "t6w9q" in {p.name for p in watcher.pods()}


def test_idle_watchers_are_dropped(api: FakeKubeApi) -> None:
    clock = Clock()
    obs = observer(api, clock, idle_s=300.0)
    obs.observe("llm", "llama3-8b")
    assert len(obs._watchers) == 1
    clock.t += 301
    obs._drop_idle()
    assert obs._watchers == {}


def test_first_scrape_hook_extends_a_cold_start(api: FakeKubeApi) -> None:
    obs = observer(api, Clock())
    obs.observe("llm", "llama3-8b")
    ready_at = dt.datetime(2026, 11, 30, 10, 1, 17, tzinfo=dt.UTC).timestamp()
    obs.note_scrape("http://10.244.3.17:8000/metrics", ready_at + 30)
    tracker = obs.watcher(obs.target("llm", "llama3-8b")).tracker
    assert {s.pod: s.total_s for s in tracker.samples()}[RS + "4xk2p"] == 225.0


def test_deletion_costs_follow_in_flight_work(api: FakeKubeApi) -> None:
    pages = {"http://10.244.3.17:8000/metrics": vllm_page(6, 3, (10000, 10), (5000, 10)),
             "http://10.244.5.9:8000/metrics": vllm_page(0, 0, (10000, 10), (5000, 10)),
             "http://10.244.2.31:8000/metrics": "connection refused"}

    def get(url: str) -> str:
        if not url.startswith("http://10.244."):
            raise AssertionError(url)
        if pages[url] == "connection refused":
            raise OSError("connection refused")
        return pages[url]

    clock = Clock()
    off = observer(api, clock, http_get=get)
    assert off.before_scale_down("llm", "llama3-8b") == {}  # opt-in
    obs = observer(api, clock, http_get=get, deletion_cost=True)
    patched = obs.before_scale_down("llm", "llama3-8b")
    assert patched == {RS + "4xk2p": 3 * 1000 + 6 * 1500, RS + "8bq7n": 0}  # j9wzt did not answer: untouched
    patches = [r for r in api.requests if r["method"] == "PATCH"]
    assert {r["content_type"] for r in patches} == {"application/merge-patch+json"}
    assert patches[0]["body"] == {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "12000"}}}
    assert obs.before_scale_down("llm", "llama3-8b") == {}  # rate-limited
    clock.t += 11
    api.queue_watch([{"type": "MODIFIED", "object": p} for p in api.pod_list["items"]])
    obs.watcher(obs.target("llm", "llama3-8b")).watch_once(timeout_s=5)
    assert obs.before_scale_down("llm", "llama3-8b") == {}  # annotations already right: no PATCH
    api.pod_list["items"] = [p for p in api.pod_list["items"] if not p["metadata"]["name"].endswith("8bq7n")]
    pages["http://10.244.5.9:8000/metrics"] = vllm_page(1, 0, (10000, 10), (5000, 10))
    clock.t += 11
    assert obs.before_scale_down("llm", "llama3-8b") == {}  # a pod deleted meanwhile (404) is skipped
    assert api.requests[-1]["method"] == "PATCH" and api.requests[-1]["path"].endswith("8bq7n")


def test_shutdown_advice_reads_the_ready_pods(api: FakeKubeApi) -> None:
    obs = observer(api, Clock(), http_get=lambda url: vllm_page(1, 0, e2e=E2E))
    advice, grace = obs.shutdown_advice("llm", "llama3-8b")
    assert (advice.vllm_shutdown_timeout_s, advice.termination_grace_period_s, grace) == (60, 75, 60)
    assert advice.requests == 300


@pytest.mark.parametrize(("field", "value"), [
    *[(f, v) for f in ("stuck_after_s", "resolve_ttl_s", "retry_after_s", "idle_s", "deletion_cost_interval_s")
      for v in (0, -1.0, float("nan"), "60")],
    *[("control_lag_s", v) for v in (-1.0, float("inf"), "15")],
])
def test_bad_observer_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"KubeObserver.{field}="):
        KubeObserver(KubeApi.for_host("http://127.0.0.1:9"), **{field: value})


def test_discovered_pods_feed_a_real_scrape_source(api: FakeKubeApi) -> None:
    """Direct-scrape mode end to end: pods found through the API are scraped on their IP and port."""
    from support.vllm_exporter import VllmExporter

    from scaler.sources.base import Target
    from scaler.sources.scrape import ScrapeSource

    with VllmExporter(model="llama3-8b") as a, VllmExporter(model="llama3-8b") as b:
        a.set_queue(waiting=2, running=5)
        b.set_queue(waiting=1, running=3)
        ready = [p for p in api.pod_list["items"] if p["metadata"]["name"].endswith(("4xk2p", "8bq7n"))]
        for pod, exporter in zip(ready, (a, b), strict=True):
            pod["status"]["podIP"] = "127.0.0.1"
            pod["status"]["podIPs"] = [{"ip": "127.0.0.1"}]
            pod["spec"]["containers"][0]["ports"][0]["containerPort"] = int(exporter.address.rsplit(":", 1)[1])
        view = observer(api, Clock()).observe("llm", "llama3-8b")
        local = [u for u in view.scrape_urls if u.startswith("http://127.0.0.1:")]
        assert sorted(local) == sorted([a.url, b.url])
        result = ScrapeSource(local, warmup_s=0.2).fetch([Target(model="llama3-8b")], now=1000.0)
    signals = result[Target(model="llama3-8b")]
    assert (signals.ready_replicas, signals.requests_running, signals.requests_waiting) == (2, 8.0, 3.0)


def test_concurrent_first_calls_list_once(api: FakeKubeApi) -> None:
    from concurrent.futures import ThreadPoolExecutor

    obs = observer(api, Clock())
    with ThreadPoolExecutor(max_workers=8) as pool:
        views = list(pool.map(lambda _: obs.observe("llm", "llama3-8b"), range(8)))
    assert {v.ready_replicas for v in views} == {3}
    lists = [r for r in api.requests if r["path"].endswith("/pods") and "watch" not in r["query"]]
    assert len(lists) == 1
