"""The engine limits of the capacity model, read from vLLM itself instead of typed into metadata.

``ReplicaCapacity`` needs a replica's KV cache in tokens and its ``max_num_seqs``. With a profile
both come from the profile. With the explicit rates (``prefillTokensPerSecond``/
``decodeTokensPerSecond``) they come from the engine, and the metadata keys ``kvCacheTokens`` /
``maxNumSeqs`` are only overrides:

- **KV cache**: vLLM exports ``vllm:cache_config_info`` (an info gauge, one series per engine) whose
  labels ``num_gpu_blocks`` and ``block_size`` are what the engine allocated at start-up; their
  product, summed over a pod's engines, is ``Signals.kv_cache_tokens`` (the smallest replica).
- **max_num_seqs**: vLLM 0.32 exports no scheduler limits (``log_metrics_info`` is called for the
  cache config only; ``SchedulerConfig`` has no ``metrics_info``). The policy uses ``max_num_seqs``
  in one place: while requests wait and no mean prompt length is known, each waiting request is
  taken to hold ``kv_cache_tokens / max_num_seqs``. A waiting queue means vLLM has admitted all it
  can, so the running requests per ready replica *are* the limit in effect then (``max_num_seqs``
  or the KV cache, whichever binds): that measured value stands in. Without waiting requests the
  value is not used.

Neither the key nor the series: ``EngineLimitMissing``, whose message says where the value would
come from. The evaluator turns it into ``UNAVAILABLE`` (KEDA's fallback), never into a guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaler.capacity import ReplicaCapacity
from scaler.signals import Signals


class EngineLimitMissing(ValueError):
    """A capacity field that neither the metadata nor the engine's metrics provide."""


@dataclass(frozen=True)
class CapacityKeys:
    """The explicit capacity keys; ``None`` limits are read from the engine at each evaluation."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    max_num_seqs: int | None = None
    kv_cache_tokens: int | None = None
    prefill_attention_tokens: float | None = None
    decode_context_tokens: float | None = None

    @property
    def complete(self) -> bool:
        """Both limits given: the capacity needs nothing from the engine."""
        return self.max_num_seqs is not None and self.kv_cache_tokens is not None

    def capacity(self, max_num_seqs: int, kv_cache_tokens: int) -> ReplicaCapacity:
        """The capacity with these limits (the given keys win)."""
        return ReplicaCapacity(self.prefill_tokens_per_s, self.decode_tokens_per_s,
                               self.max_num_seqs if self.max_num_seqs is not None else max_num_seqs,
                               self.kv_cache_tokens if self.kv_cache_tokens is not None else kv_cache_tokens,
                               self.prefill_attention_tokens, self.decode_context_tokens)

    def resolve(self, signals: Signals | None, where: str = "the signal source") -> ReplicaCapacity:
        """The capacity for this snapshot; ``EngineLimitMissing`` when the KV cache is known to neither."""
        kv = self.kv_cache_tokens
        if kv is None:
            measured = signals.kv_cache_tokens if signals is not None else None
            if measured is None or not (math.isfinite(measured) and measured >= 1):
                raise EngineLimitMissing(
                    f"kvCacheTokens: not set, and {where} has no vllm:cache_config_info for this model (vLLM exports "
                    "the engine's num_gpu_blocks and block_size as its labels once the engine is up; it must be "
                    "scraped with the same target labels as the other vllm: series): set kvCacheTokens to one "
                    "replica's num_gpu_blocks x block_size")
            kv = int(measured)
        return self.capacity(measured_max_num_seqs(signals), kv)


def measured_max_num_seqs(signals: Signals | None) -> int:
    """Running requests per ready replica (at least 1): the concurrency limit in effect while requests wait."""
    if signals is None or signals.ready_replicas <= 0:
        return 1
    return max(1, math.ceil(signals.requests_running / signals.ready_replicas - 1e-9))
