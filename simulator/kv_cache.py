"""The paged KV cache of one replica: its capacity from a memory ledger, and prefix caching.

Capacity (what vLLM prints at startup as "# GPU blocks"), per GPU of a tensor-parallel group::

    free = gpu_memory * gpu_memory_utilization - weights / tp - activation_and_graphs
    num_gpu_blocks = floor(free / (kv_bytes_per_token / tp * block_size))

with ``kv_bytes_per_token = 2 (K and V) * layers * kv_heads * head_dim * dtype_bytes``: grouped-query
attention models store ``kv_heads`` (8 for Llama-3-8B), not ``heads`` (32), so they are not overestimated.

Prefix caching (NOTE: simpler than vLLM's hash chain of 16-token blocks). Traces such as Mooncake name
each request's prompt in *prefix blocks* (``Workload.block_ids``, 512 tokens each by default; equal ids
mean equal prefixes). A replica remembers the prefix blocks of prompts it has prefilled in an LRU set
whose size is its whole KV cache (vLLM keeps freed blocks cached until it needs them). A new request
skips the computation of its longest run of remembered leading blocks (capped at ``prompt - 1`` tokens,
rounded down to whole KV blocks, as vLLM always computes the last token). Left out: a cached prefix
shared by two *running* requests is counted twice in KV usage (vLLM shares the blocks), and eviction is
LRU over prefix blocks rather than vLLM's free-block queue.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

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


def blocks_for(tokens: np.ndarray | int, block_size: int) -> np.ndarray | int:
    """KV blocks that hold ``tokens`` tokens (ceil division, vectorised)."""
    return -(-tokens // block_size)


class PrefixCache:
    """LRU set of prefix-block ids a replica has computed (see the module docstring)."""

    def __init__(self, capacity_blocks: int, block_tokens: int, kv_block_size: int) -> None:
        if capacity_blocks < 0 or block_tokens < 1 or kv_block_size < 1:
            raise ValueError(f"PrefixCache: capacity_blocks={capacity_blocks}, block_tokens={block_tokens}, "
                             f"kv_block_size={kv_block_size}: need >= 0, >= 1, >= 1")
        self.capacity = capacity_blocks
        self.block_tokens = block_tokens
        self.kv_block_size = kv_block_size
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.query_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, block_ids: np.ndarray, num_tokens: int, touch: bool = True) -> int:
        """Tokens of a ``num_tokens`` prompt that need no computation.

        ``touch``: the request is admitted: mark the hit blocks recently used and count the query
        (vLLM's prefix-cache queries/hits counters); ``touch=False`` only peeks.
        """
        hits = 0
        for bid in block_ids.tolist():
            if bid not in self._lru:
                break
            if touch:
                self._lru.move_to_end(bid)
            hits += 1
        cached = max(min(hits * self.block_tokens, num_tokens - 1), 0)
        cached -= cached % self.kv_block_size
        if touch:
            self.query_tokens += num_tokens
            self.hit_tokens += cached
        return cached

    def insert(self, block_ids: np.ndarray, prompt_tokens: int) -> None:
        """Remember the full prefix blocks of a prompt just prefilled; evict the least recently used."""
        full = min(len(block_ids), prompt_tokens // self.block_tokens)
        if self.capacity == 0 or full == 0:
            return
        lru = self._lru
        for bid in block_ids[:full].tolist():
            lru[bid] = None
            lru.move_to_end(bid)
        while len(lru) > self.capacity:
            lru.popitem(last=False)
