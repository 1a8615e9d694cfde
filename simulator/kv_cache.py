"""The paged KV cache of one replica: prefix caching over its blocks.

Its capacity comes from the replica's memory ledger (``scaler.kv_memory.MemoryLedger``).

Prefix caching, as vLLM v1's ``KVCacheManager`` does it (automatic prefix caching, on by default).
Traces such as Mooncake name each request's prompt in *prefix blocks* (``Workload.block_ids``, 512 tokens
each by default, i.e. 32 vLLM blocks of 16 tokens; equal ids mean equal prefixes, like vLLM's chained
block hashes). ``PrefixCache`` tracks them the way vLLM tracks its hashed blocks:

- a new request skips its longest run of cached leading blocks (capped at ``prompt - 1`` tokens, rounded
  down to whole KV blocks, as vLLM always computes the last token) and takes a reference on each fully hit
  block; a block held by several running requests is stored once (``shared_kv``: the KV blocks counted
  twice by per-request block counts, which the scheduler subtracts, so KV usage = blocks held by running
  requests, vLLM's ``kv_cache_usage_perc``);
- a prompt's full blocks become cacheable as soon as a chunk is scheduled over them (``register``, vLLM's
  ``cache_blocks`` in ``allocate_slots``), so others hit a prompt still being prefilled; when a request
  finishes or is preempted, blocks nobody else holds go to the *free* queue but stay cached (tail blocks
  first, as vLLM frees in reverse order), and are evicted least recently used only when an allocation
  needs the room (``trim``: the free cached blocks never exceed the KV blocks not held by running requests);
- a *preempted* request's own full KV blocks past its trace blocks (the rest of its prompt, the tokens
  it generated) are cached too, as vLLM hashes every full block of a request: ``park`` puts them in the
  free queue as one entry of that many KV blocks, ahead of its trace blocks (freed tail first, so evicted
  first, partly from its tail when an allocation needs only part of them). On resume its lookup
  continues past its trace blocks into what is left of them, and the request takes them back
  (``acquire``); nobody else can hit them (their content is the request's own). A workload without
  trace blocks keeps only such entries (``SchedulerState.cache``: vLLM's prefix caching is on by default).
- a finished request's full blocks past its trace blocks (the rest of its prompt and its output: vLLM
  hashes every full block) take their place in the same queue too (``retire``). Nobody hits them, but
  allocations take them only in their turn, so a parked request's blocks are evicted before those of a
  request that finished after it (vLLM 0.32's ``BlockPool.free_blocks`` appends hashed blocks to the tail
  and ``get_new_blocks`` pops the head). A retired entry matters only while it is newer than some parked
  entry, so without trace blocks it is kept only while something is parked. Blocks never hashed (a
  partial last block, one never used) are *prepended* by vLLM, so they are taken first: the free blocks
  outside the queue here.
Left out: a block recomputed while an equal one is cached is kept private (not deduplicated);
output-token blocks are never reused by another request (trace ids describe prompts only), only by their
own after a preemption.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


def blocks_for(tokens: np.ndarray | int, block_size: int) -> np.ndarray | int:
    """KV blocks that hold ``tokens`` tokens (ceil division, vectorised)."""
    return -(-tokens // block_size)


def whole_cached_tokens(kv_blocks: int, kv_block_size: int, num_tokens: int) -> int:
    """Tokens of a ``num_tokens`` request that ``kv_blocks`` cached KV blocks let it skip: whole blocks, and
    never the last token (vLLM always computes at least one to sample from). Also compiled, as is, by
    ``fast_replica`` (one rule for both engines)."""
    cached = max(min(kv_blocks * kv_block_size, num_tokens - 1), 0)
    return cached - cached % kv_block_size


RETIRED_KEYS = -(1 << 62)
"""Retired entries' keys in the free queue count down from here (parked ones are ``-1 - owner``, trace ids >= 0)."""


def _is_parked(key: int) -> bool:
    """A free-queue key of a parked request (not a trace block, not a retired entry)."""
    return RETIRED_KEYS < key < 0


class PrefixCache:
    """vLLM's prefix cache over trace prefix blocks: ref-counted blocks of running requests + an LRU free queue."""

    def __init__(self, capacity_blocks: int, block_tokens: int, kv_block_size: int) -> None:
        if capacity_blocks < 0 or block_tokens < 1 or kv_block_size < 1:
            raise ValueError(f"PrefixCache: capacity_blocks={capacity_blocks}, block_tokens={block_tokens}, "
                             f"kv_block_size={kv_block_size}: need >= 0, >= 1, >= 1")
        self.capacity = capacity_blocks  # a static cap on cached prefix blocks; ``trim`` is the dynamic one
        self.block_tokens = block_tokens
        self.kv_block_size = kv_block_size
        self.kv_per_block = max(block_tokens // kv_block_size, 1)
        self._free: OrderedDict[int, int] = OrderedDict()  # cached, held by nobody, LRU first: id -> KV blocks
        self._free_kv = 0  # KV blocks of ``_free`` (a trace block: kv_per_block; a parked request: its own)
        self.parked_kv = 0  # KV blocks of the parked entries (keys ``_is_parked``)
        self._retired = 0  # retired entries so far: their keys count down from RETIRED_KEYS
        self._refs: dict[int, int] = {}  # cached and held by running requests: reference counts
        self._held: dict[int, list[int]] = {}  # request id -> the blocks it holds references on
        self.shared_kv = 0  # KV blocks saved by sharing: kv_per_block * sum(refs - 1)
        self.peek_shared_kv = 0  # of the last lookup's hit: KV blocks already held by running requests
        self.peek_hits = 0  # of the last lookup: leading trace blocks hit (the rest of a hit is parked blocks)
        self.query_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._free) + len(self._refs)

    @property
    def free_cached_kv(self) -> int:
        """KV blocks of cached blocks that nobody holds (free in vLLM's sense, reusable until evicted)."""
        return self._free_kv

    def parked(self, owner: int) -> int:
        """KV blocks request ``owner`` left cached when preempted and not evicted since (0: none); its key in
        the free queue is ``-1 - owner`` (trace block ids are >= 0)."""
        return self._free.get(-1 - owner, 0)

    def park(self, owner: int, kv_blocks: int) -> None:
        """Preempted ``owner``'s own full KV blocks (past its trace blocks) stay cached in the free queue."""
        if kv_blocks > 0:
            self.unpark(owner)
            self._free[-1 - owner] = kv_blocks
            self._free_kv += kv_blocks
            self.parked_kv += kv_blocks

    def unpark(self, owner: int) -> int:
        """``owner`` is admitted again: its parked blocks leave the free queue (held again, or useless)."""
        kv = self._free.pop(-1 - owner, 0)
        self._free_kv -= kv
        self.parked_kv -= kv
        return kv

    def retire(self, kv_blocks: int) -> None:
        """``kv_blocks`` freed full blocks nobody will hit (a finished request's own) join the free queue's tail:
        evicted after every entry freed before them, before every one freed after."""
        if kv_blocks > 0:
            self._retired += 1
            self._free[RETIRED_KEYS - self._retired] = kv_blocks
            self._free_kv += kv_blocks

    def resume_tokens(self, owner: int, num_tokens: int) -> int:
        """Cached tokens of a resumed request without trace blocks: its parked blocks, capped as ``lookup``."""
        return whole_cached_tokens(self.parked(owner), self.kv_block_size, num_tokens)

    def lookup(self, block_ids: np.ndarray, num_tokens: int, touch: bool = True, owner: int = -1,
               own_from_kv: int = 0) -> int:
        """Tokens of a ``num_tokens`` prompt that need no computation.

        ``touch``: the request is admitted: mark the hit blocks recently used and count the query
        (vLLM's prefix-cache queries/hits counters); ``touch=False`` only peeks. Sets ``peek_shared_kv``
        and ``peek_hits``. A request ``owner`` preempted with blocks parked from KV block ``own_from_kv``
        on (its full trace blocks' end) continues into them when every trace block before them hit.
        """
        free, refs = self._free, self._refs
        hits = in_use = 0
        for bid in block_ids.tolist():
            if bid in refs:
                in_use += 1
            elif bid in free:
                if touch:
                    free.move_to_end(bid)
            else:
                break
            hits += 1
        self.peek_hits = hits
        cached_kv = hits * self.kv_per_block
        if owner >= 0 and cached_kv >= own_from_kv:
            cached_kv = max(cached_kv, own_from_kv + self.parked(owner))
        cached = whole_cached_tokens(cached_kv, self.kv_block_size, num_tokens)
        if in_use:  # count only the shared blocks the hit fully covers
            in_use = sum(1 for bid in block_ids[: cached // self.block_tokens].tolist() if bid in refs)
        self.peek_shared_kv = in_use * self.kv_per_block
        if touch:
            self.query_tokens += num_tokens
            self.hit_tokens += cached
        return cached

    def acquire(self, owner: int, block_ids: np.ndarray, num_tokens: int, own_from_kv: int = 0) -> int:
        """Admit request ``owner``: count the query, take references on the fully hit blocks, take back its
        parked blocks; returns cached tokens."""
        cached = self.lookup(block_ids, num_tokens, touch=True, owner=owner, own_from_kv=own_from_kv)
        self.unpark(owner)
        full = min(cached // self.block_tokens, self.peek_hits)
        if full:
            held = self._held.setdefault(owner, [])
            self._take(block_ids[:full].tolist(), held)
        return cached

    def _take(self, bids: list[int], held: list[int]) -> None:
        free, refs = self._free, self._refs
        for bid in bids:
            count = refs.get(bid)
            if count is not None:
                refs[bid] = count + 1
                self.shared_kv += self.kv_per_block
            else:
                self._free_kv -= free.pop(bid, 0)
                refs[bid] = 1
            held.append(bid)

    def register(self, owner: int, block_ids: np.ndarray, prompt_tokens: int) -> None:
        """``owner``'s first ``prompt_tokens`` tokens are computed or scheduled: its full blocks among them that
        are not cached yet become cached (held); called per chunk."""
        full = min(len(block_ids), prompt_tokens // self.block_tokens)
        if full == 0 or self.capacity == 0:
            return
        held = self._held.setdefault(owner, [])
        refs, free = self._refs, self._free
        for bid in block_ids[len(held): full].tolist():
            if bid not in refs and bid not in free:  # else an equal block is cached: ours stays private
                refs[bid] = 1
                held.append(bid)

    def release(self, owner: int, park_kv: int = 0, retire_kv: int = 0) -> int:
        """``owner`` finished or was preempted; drop its references; returns KV blocks others still hold.

        vLLM frees a request's blocks tail first, so its full blocks join the free queue in this order: its
        own past its trace blocks (``retire_kv`` when it finished: nobody will hit them; ``park_kv`` when it
        was preempted: it may resume into them), then its trace blocks, last one first."""
        self.retire(retire_kv)
        self.park(owner, park_kv)
        held = self._held.pop(owner, None)
        if not held:
            self._cap()
            return 0
        refs, free, still, per = self._refs, self._free, 0, self.kv_per_block
        for bid in reversed(held):  # vLLM frees the tail first, so it is evicted first
            count = refs[bid] - 1
            if count:
                refs[bid] = count
                still += 1
            else:
                del refs[bid]
                free[bid] = per
                self._free_kv += per
        still *= per
        self.shared_kv -= still
        self._cap()
        return still

    def trim(self, free_kv_blocks: int) -> None:
        """Evict free cached blocks, least recently used first, until they fit in ``free_kv_blocks``."""
        while self._free and self._free_kv > free_kv_blocks:
            self._evict_front(self._free_kv - free_kv_blocks)

    def _evict_front(self, excess: int) -> None:
        """Evict from the least recently used entry: a trace block whole, parked blocks only ``excess`` of
        them (their tail: freed first, so first in vLLM's free queue)."""
        free = self._free
        key = next(iter(free))
        kv = free[key]
        gone = excess if key < 0 and kv > excess else kv
        if gone < kv:
            free[key] = kv - gone
        else:
            del free[key]
        self._free_kv -= gone
        if _is_parked(key):
            self.parked_kv -= gone

    def clear(self) -> None:
        """Forget everything (the pod is gone)."""
        self._free.clear()
        self._free_kv = 0
        self.parked_kv = 0
        self._refs.clear()
        self._held.clear()
        self.shared_kv = 0

    def insert(self, block_ids: np.ndarray, prompt_tokens: int) -> None:
        """Cache the full prefix blocks of a prompt as free (nobody holds them); evict beyond ``capacity``."""
        full = min(len(block_ids), prompt_tokens // self.block_tokens)
        if self.capacity == 0 or full == 0:
            return
        free, refs, per = self._free, self._refs, self.kv_per_block
        for bid in block_ids[:full].tolist():
            if bid not in refs:
                if bid not in free:
                    self._free_kv += per
                free[bid] = per
                free.move_to_end(bid)
        self._cap()

    def _cap(self) -> None:
        """The static cap: cached KV blocks (free and held) never exceed ``capacity`` trace blocks' worth."""
        limit = (self.capacity - len(self._refs)) * self.kv_per_block
        while self._free and self._free_kv > limit:
            self._evict_front(self._free_kv - limit)
