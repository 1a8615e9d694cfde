"""KV memory ledger (GQA-aware) and the prefix cache (vLLM v1: ref-counted blocks, LRU free queue)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.kv_memory import MemoryLedger, kv_bytes_per_token
from simulator.kv_cache import PrefixCache, blocks_for


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


# ----- vLLM-faithful prefix caching: references, free queue, LRU eviction ------------------------------------
def test_shared_prefix_is_stored_once() -> None:
    cache = PrefixCache(capacity_blocks=100, block_tokens=512, kv_block_size=16)
    cache.acquire(1, np.array([7, 8, 9]), 1600)
    cache.register(1, np.array([7, 8, 9]), 1600)           # request 1 prefilled 3 full blocks
    assert cache.shared_kv == 0 and len(cache) == 3
    assert cache.acquire(2, np.array([7, 8, 5]), 2000) == 1024
    assert cache.shared_kv == 2 * 32                        # two 512-token blocks held twice, stored once
    assert cache.release(1) == 2 * 32 and cache.shared_kv == 0  # 2 still held by request 2
    assert cache.free_cached_kv == 32                       # block 9 is free but still cached
    cache.release(2)
    assert cache.free_cached_kv == 3 * 32 and cache.shared_kv == 0


def test_finished_request_blocks_reused_until_evicted() -> None:
    cache = PrefixCache(capacity_blocks=100, block_tokens=512, kv_block_size=16)
    cache.acquire(1, np.array([1, 2]), 1100)
    cache.register(1, np.array([1, 2]), 1100)
    cache.release(1)                                        # finished: blocks stay in the free queue
    assert cache.acquire(2, np.array([1, 2, 3]), 2000) == 1024
    cache.release(2)
    cache.trim(32)                                          # an allocation left room for one block only
    assert cache.lookup(np.array([1, 2]), 2000, touch=False) == 512  # the tail went first (freed first)
    cache.trim(0)
    assert cache.lookup(np.array([1, 2]), 2000, touch=False) == 0 and len(cache) == 0


def test_trim_evicts_least_recently_used_and_spares_held_blocks() -> None:
    cache = PrefixCache(capacity_blocks=100, block_tokens=512, kv_block_size=16)
    for owner, bid in enumerate([10, 20, 30]):
        cache.register(owner, np.array([bid]), 512)
        cache.release(owner)                                # free queue: 10, 20, 30
    cache.lookup(np.array([10]), 1000)                      # touch: 10 is now the most recent
    cache.acquire(9, np.array([20]), 1000)                  # held: out of the free queue
    cache.trim(32)
    assert cache.lookup(np.array([30]), 1000, touch=False) == 0
    assert cache.lookup(np.array([10]), 1000, touch=False) == 512
    cache.trim(0)
    assert cache.lookup(np.array([20]), 1000, touch=False) == 512  # held blocks are never evicted


@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 6), min_size=1, max_size=4)), max_size=30))
@settings(max_examples=80, deadline=None)
def test_reference_counts_stay_consistent(ops: list[tuple[int, list[int]]]) -> None:
    cache = PrefixCache(capacity_blocks=5, block_tokens=32, kv_block_size=16)
    live: set[int] = set()
    for owner, ids in ops:
        if owner in live:
            cache.release(owner)
            live.discard(owner)
        else:
            blocks = np.array(sorted(set(ids)))
            cached = cache.acquire(owner, blocks, 32 * len(blocks) + 1)
            assert cached % 16 == 0 and 0 <= cached <= 32 * len(blocks)
            cache.register(owner, blocks, 32 * len(blocks))
            live.add(owner)
        refs = sum(len(cache._held.get(o, [])) for o in live)
        assert cache.shared_kv == 2 * (refs - len(cache._refs)) >= 0
    for owner in list(live):
        cache.release(owner)
    assert cache.shared_kv == 0 and not cache._refs


def test_preempted_request_parks_its_own_blocks_and_resumes_into_them() -> None:
    """vLLM caches every full block of a request; a preempted one finds its own again unless evicted (tail first)."""
    cache = PrefixCache(100, 512, 16)                      # 32 KV blocks per trace block
    ids = np.array([1, 2])
    assert cache.acquire(7, ids, 1100) == 0
    cache.register(7, ids, 1100)                           # its two full trace blocks are cached (held)
    cache.release(7, park_kv=1500 // 16 - 64)              # preempted at 1500 computed tokens: 29 blocks of its own
    assert cache.parked(7) == 29 and cache.free_cached_kv == 29 + 64
    assert cache.lookup(ids, 1501, touch=False, owner=7, own_from_kv=64) == (64 + 29) * 16
    assert cache.lookup(ids, 1501, touch=False) == 2 * 512  # nobody else can hit its own blocks
    cache.trim(80)                                         # an allocation takes 13: its tail goes first
    assert cache.parked(7) == 16 and cache.free_cached_kv == 80
    assert cache.lookup(ids, 1501, touch=False, owner=7, own_from_kv=64) == (64 + 16) * 16
    cache.trim(40)                                         # the rest of its own, then trace block 2 (freed last-first)
    assert cache.parked(7) == 0 and cache.free_cached_kv == 32
    assert cache.lookup(ids, 1501, touch=False, owner=7, own_from_kv=64) == 512
    cache.park(7, 10)
    assert cache.lookup(ids, 1501, touch=False, owner=7, own_from_kv=64) == 512  # block 2 gone: the chain breaks
    assert cache.acquire(7, ids, 1501, own_from_kv=64) == 512
    assert cache.parked(7) == 0 and cache.free_cached_kv == 0  # block 1 held again, the useless rest dropped


def test_without_trace_blocks_a_resume_hits_what_is_left() -> None:
    cache = PrefixCache(1000, 16, 16)                      # a workload without trace blocks: parked entries only
    cache.park(3, 100)
    cache.park(4, 50)
    assert cache.resume_tokens(3, 1700) == 1600 and cache.resume_tokens(4, 801) == 800
    assert cache.resume_tokens(4, 800) == 784              # the last token is always computed (whole blocks)
    cache.trim(120)                                        # least recently parked first, from its tail
    assert (cache.parked(3), cache.parked(4)) == (70, 50)
    assert cache.unpark(3) == 70 and cache.free_cached_kv == 50


def test_a_finished_request_s_blocks_queue_behind_a_parked_one_s() -> None:
    """vLLM appends freed hashed blocks to one LRU free queue: blocks retired by a request that finished after
    another was preempted are evicted after the parked ones, those retired before it first."""
    cache = PrefixCache(1000, 16, 16)
    cache.retire(40)                                       # finished before anyone was parked: evicted first
    cache.park(3, 100)
    cache.retire(30)                                       # finished after request 3 was parked
    cache.park(4, 50)
    assert cache.parked_kv == 150 and cache.free_cached_kv == 220
    cache.trim(150)                                        # 70 go: the older retired 40, then 30 of request 3's
    assert (cache.parked(3), cache.parked(4), cache.parked_kv) == (70, 50, 120)
    cache.trim(60)                                         # request 3's rest, then 20 of the 30 retired behind it
    assert (cache.parked(3), cache.parked(4), cache.parked_kv, cache.free_cached_kv) == (0, 50, 50, 60)
    cache.trim(20)                                         # the newest entry goes last
    assert (cache.parked(4), cache.free_cached_kv) == (20, 20)
    assert cache.unpark(4) == 20 and cache.parked_kv == 0 and cache.free_cached_kv == 0
