"""The memory ledger of one vLLM replica: what is left for the paged KV cache after weights and activations.

Capacity (what vLLM prints at startup as "# GPU blocks"), per GPU of a tensor-parallel group::

    free = gpu_memory * gpu_memory_utilization - weights / tp - activation_and_graphs
    num_gpu_blocks = floor(free / (kv_bytes_per_token / tp * block_size))

with ``kv_bytes_per_token = 2 (K and V) * layers * kv_heads * head_dim * dtype_bytes``: grouped-query
attention models store ``kv_heads`` (8 for Llama-3-8B), not ``heads`` (32), so they are not overestimated.
It lives in ``scaler/`` because a built-in profile's capacity (``scaler.profiles``) needs it; the
simulator's prefix cache (``simulator.kv_cache``) uses the block count it gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1024**3


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token needs in the whole model (all layers, K and V)."""
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                        ("dtype_bytes", dtype_bytes)):
        if not (isinstance(value, int) and value > 0):
            raise ValueError(f"kv_bytes_per_token: {name}={value!r}: must be an integer > 0")
    return 2 * layers * kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class MemoryLedger:
    """Per-GPU memory budget of one replica (GiB); ``num_gpu_blocks`` is what is left for KV."""

    gpu_memory_gib: float
    gpu_memory_utilization: float
    weights_gib: float
    activation_gib: float
    kv_bytes_per_token: int
    tensor_parallel: int = 1
    block_size: int = 16

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.gpu_memory_utilization <= 1:
            problems.append(f"gpu_memory_utilization={self.gpu_memory_utilization!r}: must be in (0, 1]")
        for name in ("gpu_memory_gib", "weights_gib"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                problems.append(f"{name}={getattr(self, name)!r}: must be a finite number > 0")
        if not (math.isfinite(self.activation_gib) and self.activation_gib >= 0):
            problems.append(f"activation_gib={self.activation_gib!r}: must be a finite number >= 0")
        for name in ("kv_bytes_per_token", "tensor_parallel", "block_size"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) > 0):
                problems.append(f"{name}={getattr(self, name)!r}: must be an integer > 0")
        if problems:
            raise ValueError("invalid memory ledger: " + "; ".join(problems))
        if self.free_kv_gib <= 0:
            raise ValueError(f"invalid memory ledger: nothing left for the KV cache ({self.free_kv_gib:.2f} GiB per "
                             f"GPU): weights_gib={self.weights_gib} / tp={self.tensor_parallel} + activation_gib="
                             f"{self.activation_gib} exceed {self.gpu_memory_gib} GiB x {self.gpu_memory_utilization}")

    @property
    def free_kv_gib(self) -> float:
        """GiB per GPU left for the KV cache."""
        return (self.gpu_memory_gib * self.gpu_memory_utilization - self.weights_gib / self.tensor_parallel
                - self.activation_gib)

    @property
    def num_gpu_blocks(self) -> int:
        per_gpu_block_bytes = self.kv_bytes_per_token * self.block_size / self.tensor_parallel
        return int(self.free_kv_gib * GIB // per_gpu_block_bytes)

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size
