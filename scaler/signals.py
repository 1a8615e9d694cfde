"""The one snapshot the policy may read.

Live sources (Prometheus, pod scrapes, the Kubernetes API) and the simulator both build a
``Signals``; the policy never learns where it came from. Every rate is fleet-wide (summed over the
replicas of one model) and per second. ``None`` means "not measured", never "zero".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Signals:
    """Fleet-wide view of one model's vLLM replicas at time ``at`` (seconds, the source's clock)."""

    at: float
    prompt_tokens_per_s: float
    """rate(vllm:prompt_tokens_total) summed over replicas: prefill work done."""
    generation_tokens_per_s: float
    """rate(vllm:generation_tokens_total) summed over replicas: decode work done."""
    requests_waiting: float
    """sum(vllm:num_requests_waiting), preempted requests included (as vLLM counts them)."""
    requests_running: float
    """sum(vllm:num_requests_running)."""
    ready_replicas: int
    """Replicas that answer /metrics (the engine is up)."""
    starting_replicas: int = 0
    """Pods created but not yet serving: capacity on its way (0 when unknown)."""
    mean_prompt_tokens: float | None = None
    """Mean prompt length of recent requests (histogram sum / count over the rate window)."""
    mean_output_tokens: float | None = None
    """Mean generated length of recent requests."""
    prompt_tokens_weighted_mean: float | None = None
    """Token-weighted mean prompt length Σn²/Σn of recent requests (``scaler.histograms``): how
    long the prompt an average prompt token belongs to is, which sets its prefill cost."""
    ttft_buckets: tuple[tuple[float, float], ...] | None = None
    """rate() of vllm:time_to_first_token_seconds buckets summed over replicas: ((le, per s), ...),
    cumulative, ``inf`` last; the policy reads the share of first tokens later than its SLO."""
    prefix_cache_hit_share: float | None = None
    """rate(vllm:prefix_cache_hits_total) / rate(vllm:prefix_cache_queries_total): the share of prompt
    tokens the prefix cache served over the rate window (their prefill is not recomputed); 0..1."""
    waiting_tokens: float | None = None
    """Exact prompt tokens waiting, when a gateway or the simulator knows them; else estimated."""
    kv_cache_usage: float | None = None
    """Mean vllm:kv_cache_usage_perc over ready replicas, 0..1."""
    kv_cache_tokens: float | None = None
    """KV-cache tokens of one replica from vLLM's own ``vllm:cache_config_info`` (``num_gpu_blocks`` ×
    ``block_size``, summed over a pod's engines), the smallest over ready replicas; None: not exported."""
    lead_time_s: float | None = None
    """Measured cold-start lead time (p90); None: use the configured one."""
    cold_starts_s: tuple[float, ...] = ()
    """The measured cold starts behind ``lead_time_s`` (seconds, oldest first); () when not measured. They
    say how long a pod still starting will take (``scaler.lead_time.remaining_s``)."""
    activation_value: float | None = None
    """Value of the user's activation query (a demand signal that exists at zero replicas)."""
    data_age_s: float = 0.0
    """Age of the newest sample behind this snapshot."""

    def __post_init__(self) -> None:
        for name in _FIELD_NAMES:  # (not dataclasses.fields(): a source builds one per object per round)
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"Signals.{name}={value!r}: must be finite")
        for start in self.cold_starts_s:
            if not (isinstance(start, (int, float)) and math.isfinite(start) and start >= 0):
                raise ValueError(f"Signals.cold_starts_s contains {start!r}: each must be a finite number >= 0")
        for name in ("prompt_tokens_per_s", "generation_tokens_per_s", "requests_waiting",
                     "requests_running", "ready_replicas", "starting_replicas", "data_age_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"Signals.{name}={getattr(self, name)!r}: must be >= 0")


_FIELD_NAMES = tuple(f.name for f in fields(Signals))
