"""What one vLLM replica can sustain while meeting its latency SLO.

The policy measures demand in *replica units*: token rates divided by these per-replica rates. The
numbers come from a named performance profile (``scaler.profiles``), from explicit trigger
metadata, or from ``leadscale capacity`` run against a real endpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECODE_REFERENCE_CONTEXT = 1024
"""Context (tokens) at which ``decode_tokens_per_s`` is stated when ``decode_context_tokens`` is set."""


@dataclass(frozen=True)
class ReplicaCapacity:
    """Sustainable per-replica rates within the SLO (not peak hardware throughput).

    ``prefill_attention_tokens`` (K) makes prefill cost grow with prompt length: a prompt of ``n``
    tokens costs ``n (1 + n / 2K) / prefill_tokens_per_s`` replica-seconds (causal attention: token
    ``i`` attends to ``i`` earlier ones), so ``prefill_tokens_per_s`` is then the rate for short
    prompts and K the length at which one token's attention costs as much as its linear part. None:
    every prompt token costs the same (the rate was measured on the workload's own mix).

    ``decode_context_tokens`` (K_d) does the same for decode: a generated token attends to its whole
    context (prompt plus the tokens before it), so its cost is ``a + b c`` for context ``c``;
    ``decode_tokens_per_s`` is the rate at ``DECODE_REFERENCE_CONTEXT`` and K_d = a / b the context at
    which attention costs as much as the rest. A 2.8k-token context halves an 8B model's decode rate
    on an H100 against a 1k one. None: the rate was measured on the workload's own contexts.
    """

    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    max_num_seqs: int
    kv_cache_tokens: int
    prefill_attention_tokens: float | None = None
    decode_context_tokens: float | None = None

    def __post_init__(self) -> None:
        problems = []
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                problems.append(f"{name}={value!r}: must be a finite number > 0")
        for name in ("max_num_seqs", "kv_cache_tokens"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value > 0):
                problems.append(f"{name}={value!r}: must be an integer > 0")
        for name in ("prefill_attention_tokens", "decode_context_tokens"):
            k = getattr(self, name)
            if k is not None and not (isinstance(k, (int, float)) and not isinstance(k, bool) and math.isfinite(k)
                                      and k > 0):
                problems.append(f"{name}={k!r}: must be None or a finite number > 0")
        if problems:
            raise ValueError("invalid ReplicaCapacity: " + "; ".join(problems))

    def prefill_cost_factor(self, token_weighted_prompt_tokens: float | None) -> float:
        """Prefill replica-seconds per prompt token, relative to ``1 / prefill_tokens_per_s``.

        Summed over requests, ``Σ n (1 + n / 2K) = Σn (1 + L / 2K)`` with ``L = Σn² / Σn`` the
        token-weighted mean prompt length (``scaler.histograms``). 1 without K or without L.
        """
        k, length = self.prefill_attention_tokens, token_weighted_prompt_tokens
        if k is None or length is None or not (math.isfinite(length) and length > 0):
            return 1.0
        return 1.0 + length / (2.0 * k)

    def decode_cost_factor(self, mean_context_tokens: float | None) -> float:
        """Decode replica-seconds per generated token, relative to ``1 / decode_tokens_per_s``:
        ``(1 + c / K_d) / (1 + c_ref / K_d)`` at the mean context ``c`` of a generated token (its
        prompt plus half its output). 1 without K_d or without ``c``."""
        k, context = self.decode_context_tokens, mean_context_tokens
        if k is None or context is None or not (math.isfinite(context) and context > 0):
            return 1.0
        return (1.0 + context / k) / (1.0 + DECODE_REFERENCE_CONTEXT / k)
