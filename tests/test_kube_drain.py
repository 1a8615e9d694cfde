"""Drain-aware scale-down: in-flight tokens per pod, deletion costs, shutdown advice."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.kube.drain import (
    INT32_MAX,
    PodLoad,
    deletion_costs,
    in_flight_tokens,
    parse_pod_metrics,
    patches_needed,
    shutdown_advice,
)


def vllm_page(running: float, waiting: float, prompt: tuple[float, float] = (0.0, 0.0),
              output: tuple[float, float] = (0.0, 0.0), e2e: tuple[tuple[str, float], ...] = (),
              model: str = "llama3-8b") -> str:
    """A vLLM v1 /metrics page in the exposition format (only the families the drain logic reads)."""
    labels = f'engine="0",model_name="{model}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} {running}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} {waiting}",
        "# TYPE vllm:request_prompt_tokens histogram",
        f'vllm:request_prompt_tokens_bucket{{{labels},le="+Inf"}} {prompt[1]}',
        f"vllm:request_prompt_tokens_sum{{{labels}}} {prompt[0]}",
        f"vllm:request_prompt_tokens_count{{{labels}}} {prompt[1]}",
        "# TYPE vllm:request_generation_tokens histogram",
        f'vllm:request_generation_tokens_bucket{{{labels},le="+Inf"}} {output[1]}',
        f"vllm:request_generation_tokens_sum{{{labels}}} {output[0]}",
        f"vllm:request_generation_tokens_count{{{labels}}} {output[1]}",
        "# TYPE vllm:e2e_request_latency_seconds histogram",
    ]
    lines += [f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="{le}"}} {n}' for le, n in e2e]
    if e2e:
        lines += [f"vllm:e2e_request_latency_seconds_sum{{{labels}}} 1.0",
                  f"vllm:e2e_request_latency_seconds_count{{{labels}}} {e2e[-1][1]}"]
    return "\n".join(lines) + "\n"


E2E = (("1.0", 10.0), ("5.0", 60.0), ("20.0", 95.0), ("60.0", 99.5), ("+Inf", 100.0))


def test_parse_reads_gauges_histogram_means_and_latency_buckets() -> None:
    load = parse_pod_metrics(vllm_page(3, 2, (5000, 10), (2000, 10), E2E))
    assert (load.running, load.waiting, load.prompt_sum, load.output_count) == (3, 2, 5000, 10)
    assert load.e2e_buckets[0] == (1.0, 10.0) and math.isinf(load.e2e_buckets[-1][0])


def test_parse_filters_by_model_and_names_what_is_missing() -> None:
    assert parse_pod_metrics(vllm_page(3, 2), model="llama3-8b").running == 3
    with pytest.raises(ValueError, match=r"num_requests_running.*model_name='qwen'"):
        parse_pod_metrics(vllm_page(3, 2), model="qwen")
    with pytest.raises(ValueError, match="num_requests_waiting are required"):
        parse_pod_metrics("# TYPE up gauge\nup 1\n")


def test_in_flight_tokens_use_the_pods_own_means_or_the_fleets() -> None:
    loads = {
        "busy": PodLoad(running=4, waiting=2, prompt_sum=1000, prompt_count=10, output_sum=500, output_count=10),
        "idle": PodLoad(running=0, waiting=0, prompt_sum=100, prompt_count=1, output_sum=10, output_count=1),
        "fresh": PodLoad(running=1, waiting=0),  # has finished nothing yet: fleet means (1100/11, 510/11)
    }
    work = in_flight_tokens(loads)
    assert work["busy"] == 2 * 100 + 4 * (100 + 50)
    assert work["idle"] == 0.0
    assert work["fresh"] == pytest.approx(1100 / 11 + 510 / 11)


def test_costs_rank_the_idlest_first_and_patch_only_changes() -> None:
    costs = deletion_costs({"a": 12345.0, "b": 0.0, "c": 987.0, "d": float("nan"), "e": 1e15})
    assert costs == {"a": 12000, "b": 0, "c": 990, "e": INT32_MAX}
    assert min(costs, key=costs.__getitem__) == "b"
    assert patches_needed(costs, {"a": 12000, "b": None, "c": 1000}) == {"b": 0, "c": 990, "e": INT32_MAX}


@settings(max_examples=200, deadline=None)
@given(work=st.dictionaries(st.text(min_size=1, max_size=5), st.floats(min_value=0, max_value=1e12), max_size=8))
def test_more_work_never_means_a_lower_cost(work: dict[str, float]) -> None:
    costs = deletion_costs(work)
    for a in work:
        for b in work:
            if work[a] < work[b]:
                assert costs[a] <= costs[b]
        assert 0 <= costs[a] <= INT32_MAX


def test_shutdown_advice_from_the_fleet_p99() -> None:
    loads = {"a": parse_pod_metrics(vllm_page(0, 0, e2e=E2E)), "b": parse_pod_metrics(vllm_page(0, 0, e2e=E2E))}
    advice = shutdown_advice(loads, margin_s=15.0)
    assert (advice.p99_request_s, advice.vllm_shutdown_timeout_s, advice.termination_grace_period_s) == (60, 60, 75)
    assert advice.requests == 200 and not advice.lower_bound
    text = advice.explain(current_grace_s=30)
    assert "--shutdown-timeout=60" in text and "terminationGracePeriodSeconds to 75" in text and "30 s" in text
    assert "shorter" not in advice.explain(current_grace_s=90)


def test_a_tail_beyond_the_buckets_is_a_stated_lower_bound() -> None:
    tail = (("1.0", 10.0), ("60.0", 50.0), ("+Inf", 100.0))
    advice = shutdown_advice({"a": parse_pod_metrics(vllm_page(0, 0, e2e=tail))})
    assert advice.lower_bound and advice.p99_request_s == 60.0 and "at least 60" in advice.explain()


def test_no_finished_requests_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="no finished requests in 1 pod"):
        shutdown_advice({"a": parse_pod_metrics(vllm_page(1, 0))})


def test_reads_a_vllm_format_page_with_several_engines() -> None:
    """The exporter renders vLLM v1's exact families with prometheus_client (``_created`` series included)."""
    import httpx
    from support.vllm_exporter import VllmExporter

    with VllmExporter(model="tiny", engines=2) as pod:
        pod.set_queue(waiting=3, running=5)
        for engine, seconds in (("0", 12.0), ("1", 0.4), ("1", 700.0)):
            pod.metrics.e2e.labels("tiny", engine).observe(seconds)
            pod.metrics.prompt_hist.labels("tiny", engine).observe(1000)
            pod.metrics.output_hist.labels("tiny", engine).observe(200)
        load = parse_pod_metrics(httpx.get(pod.url, timeout=5).text, model="tiny")
    assert (load.running, load.waiting) == (5, 3)
    assert (load.prompt_sum, load.prompt_count, load.output_sum) == (3000, 3, 600)
    assert dict(load.e2e_buckets)[15.0] == 2 and dict(load.e2e_buckets)[float("inf")] == 3
    assert in_flight_tokens({"pod": load})["pod"] == 3 * 1000 + 5 * 1200
    advice = shutdown_advice({"pod": load})
    assert (advice.p99_request_s, advice.vllm_shutdown_timeout_s) == (960.0, 960)
