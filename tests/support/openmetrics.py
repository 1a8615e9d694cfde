"""Scraped samples as an OpenMetrics file for ``promtool tsdb create-blocks-from openmetrics``: a real
Prometheus that holds a history a test wrote (``PrometheusServer(data_dir=...)``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from simulator.observe import CACHE_CONFIG

MODEL = "parity-model"
TTFT_LE = (0.5, 1.0, 2.0, 5.0, float("inf"))


def steady_replica(t: float, done: int, ttft_counts: list[float]) -> dict[str, Any]:
    """A replica's /metrics at ``t`` after ``done`` requests of 2,400 prompt and 150 output tokens, with
    ``ttft_counts`` the cumulative counts of ``TTFT_LE``; running, waiting and KV usage wobble by the minute."""
    return {
        "prompt_tokens_total": 2400.0 * done, "generation_tokens_total": 150.0 * done,
        "num_requests_running": 6.0 + (int(t) // 60) % 3, "num_requests_waiting": float((int(t) // 45) % 3),
        "kv_cache_usage_perc": 0.35 + 0.05 * ((int(t) // 30) % 4),
        "prefix_cache_queries": 2400.0 * done, "prefix_cache_hits": 0.0,
        "request_prompt_tokens_sum": 2400.0 * done, "request_prompt_tokens_count": float(done),
        "request_generation_tokens_sum": 150.0 * done, "request_generation_tokens_count": float(done),
        "time_to_first_token_seconds_bucket": list(zip(TTFT_LE, ttft_counts, strict=True)),
        "num_gpu_blocks": 12500, "block_size": 16,
    }


def openmetrics(start: int, taken: list[tuple[int, float, dict[str, float]]],
                gateway: list[tuple[float, float]], model: str | Callable[[int], str] = MODEL) -> str:
    """The same samples as an OpenMetrics file for promtool, each family's series together in time order;
    replica ``rid`` serves ``model`` (or ``model(rid)``)."""
    families: dict[tuple[str, str], list[tuple[str, float, float]]] = defaultdict(list)
    for rid, t, metrics in taken:
        base = f'instance="pod-{rid}:8000",job="vllm"'
        families[("up", "gauge")].append((f"up{{{base}}}", t, 1.0))
        labels = f'{base},model_name="{model(rid) if callable(model) else model}"'
        for name, value in metrics.items():
            if name == CACHE_CONFIG:
                blocks = int(value) // 16
                families[("vllm:cache_config", "info")].append(
                    (f'vllm:cache_config_info{{{base},block_size="16",num_gpu_blocks="{blocks}"}}', t, 1.0))
            elif "_bucket{" in name:
                family, le = name.split("_bucket{", 1)
                families[(family, "histogram")].append((f"{family}_bucket{{{labels},{le[:-1]}}}", t, value))
                if le.startswith('le="+Inf"') and family.endswith("seconds"):  # a histogram needs its count
                    families[(family, "histogram")].append((f"{family}_count{{{labels}}}", t, value))
                    families[(family, "histogram")].append((f"{family}_sum{{{labels}}}", t, 0.4 * value))
            elif name.endswith(("_sum", "_count")):
                family = name.rsplit("_", 1)[0]
                families[(family, "histogram")].append((f"{name}{{{labels}}}", t, value))
            elif name.endswith("_total"):
                families[(name[: -len("_total")], "counter")].append((f"{name}{{{labels}}}", t, value))
            else:
                families[(name, "gauge")].append((f"{name}{{{labels}}}", t, value))
    for t, value in gateway:
        families[("gateway_queue_requests", "gauge")].append(('gateway_queue_requests{job="gateway"}', t, value))
    lines = []
    for (family, kind), samples in families.items():
        lines.append(f"# TYPE {family} {kind}")
        samples.sort(key=lambda s: (s[0], s[1]))
        lines += [f"{series} {value!r} {start + t:.3f}" for series, t, value in samples]
    return "\n".join(lines) + "\n# EOF\n"
