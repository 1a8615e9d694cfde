"""KV memory ledger (GQA-aware) and the prefix cache."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.kv_cache import MemoryLedger, PrefixCache, blocks_for, kv_bytes_per_token


def test_gqa_bytes_per_token() -> None:
    assert kv_bytes_per_token(32, 8, 128, 2) == 128 * 1024      # Llama-3-8B: 128 KiB
    assert kv_bytes_per_token(32, 32, 128, 2) == 512 * 1024     # Llama-2-7B, no GQA: 512 KiB
    with pytest.raises(ValueError, match="kv_heads=0"):
        kv_bytes_per_token(32, 0, 128)


def test_ledger_blocks_for_llama3_8b_on_a100() -> None:
    ledger = MemoryLedger(80.0, 0.9, 14.96, 1.5, 131072)
    # (72 - 14.96 - 1.5) GiB / (128 KiB * 16) per block
    assert ledger.num_gpu_blocks == int((72 - 14.96 - 1.5) * 1024 // 2)
    assert ledger.kv_cache_tokens == ledger.num_gpu_blocks * 16
    tp = MemoryLedger(80.0, 0.9, 128.5, 2.5, 327680, tensor_parallel=4)
    assert tp.num_gpu_blocks == int((72 - 128.5 / 4 - 2.5) * 1024**3 // (327680 * 16 / 4))


@pytest.mark.parametrize(("changes", "field"), [
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"weights_gib": -1.0}, "weights_gib"),
    ({"block_size": 0}, "block_size"),
    ({"weights_gib": 200.0}, "nothing left for the KV cache"),
])
def test_ledger_errors_name_the_field(changes: dict[str, float], field: str) -> None:
    base = {"gpu_memory_gib": 80.0, "gpu_memory_utilization": 0.9, "weights_gib": 15.0, "activation_gib": 1.0,
            "kv_bytes_per_token": 131072}
    with pytest.raises(ValueError, match=field):
        MemoryLedger(**{**base, **changes})


def test_blocks_for_is_ceil() -> None:
    assert blocks_for(np.array([0, 1, 16, 17, 32]), 16).tolist() == [0, 1, 1, 2, 2]
    assert blocks_for(33, 16) == 3


def test_prefix_cache_hits_prefix_only_and_caps() -> None:
    cache = PrefixCache(capacity_blocks=3, block_tokens=512, kv_block_size=16)
    cache.insert(np.array([1, 2, 3]), 1600)         # 3 full blocks
    assert cache.lookup(np.array([1, 2, 9]), 2000) == 1024
    assert cache.lookup(np.array([9, 1, 2]), 2000) == 0         # a prefix, not any block
    assert cache.lookup(np.array([1, 2, 3]), 1536) == 1520      # never the last token; whole KV blocks
    assert cache.hit_tokens == 1024 + 1520 and cache.query_tokens == 2000 + 2000 + 1536
    assert cache.lookup(np.array([1]), 600, touch=False) == 512
    assert cache.query_tokens == 5536  # a peek counts nothing


def test_prefix_cache_evicts_least_recently_used() -> None:
    cache = PrefixCache(capacity_blocks=2, block_tokens=512, kv_block_size=16)
    cache.insert(np.array([1]), 512)
    cache.insert(np.array([2]), 512)
    cache.lookup(np.array([1]), 1000)     # 1 is now the most recent
    cache.insert(np.array([3]), 512)      # evicts 2
    assert cache.lookup(np.array([2]), 1000) == 0
    assert cache.lookup(np.array([1]), 1000) == 512
    cache.insert(np.array([4, 5]), 700)   # only one full block of a 700-token prompt
    assert len(cache) == 2
