"""What one vLLM replica can sustain while meeting its latency SLO.

The policy measures demand in *replica units*: token rates divided by these per-replica rates. The
numbers come from a named performance profile (``simulator.profiles``), from explicit trigger
metadata, or from ``leadscale capacity`` run against a real endpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaCapacity:
    """Sustainable per-replica rates within the SLO (not peak hardware throughput)."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    max_num_seqs: int
    kv_cache_tokens: int

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
        if problems:
            raise ValueError("invalid ReplicaCapacity: " + "; ".join(problems))
