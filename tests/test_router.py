"""The gateway's routers: prefix-aware routing and ``auto``, and their effect on prefix-cache hits."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from scaler.profiles import get_profile
from simulator.engine import Engine, EngineConfig, simulate
from simulator.kv_cache import PrefixCache
from simulator.router import PREFILL_WEIGHT, Router
from simulator.workload import Workload


@dataclass
class FakeReplica:
    id: int
    outstanding_tokens: int = 0
    prefix: PrefixCache = field(default_factory=lambda: PrefixCache(1000, 512, 16))

    def gateway_tokens(self, now: float) -> int:
        return self.outstanding_tokens


def families(n_req: int, n_fam: int, shared: int, gap_s: float = 5.0, seed: int = 0) -> Workload:
    """Requests of ``n_fam`` families: ``shared`` common 512-token blocks + one block of their own."""
    rng = np.random.default_rng(seed)
    fam = rng.integers(n_fam, size=n_req)
    ids = np.concatenate([np.r_[np.arange(shared) + 1000 * f, 10**6 + i] for i, f in enumerate(fam)])
    offs = np.arange(n_req + 1) * (shared + 1)
    prompt = np.full(n_req, 512 * (shared + 1))
    return Workload(np.arange(n_req) * gap_s, prompt, np.full(n_req, 8), block_ids=ids, block_offsets=offs)


def test_prefix_router_picks_the_replica_holding_the_prefix() -> None:
    reps = [FakeReplica(0), FakeReplica(1), FakeReplica(2)]
    reps[2].prefix.insert(np.array([1, 2, 3, 4]), 2048)
    reps[2].outstanding_tokens = 1000                        # busier, but holds 2048 of the 2100 tokens
    ids, offs = np.array([1, 2, 3, 4, 99]), np.array([0, 5])
    router = Router("prefix", prefix=(ids, offs), prompt_tokens=np.array([2100]))
    assert router.name == "prefix" and router.pick(reps, 0) is reps[2]
    reps[2].outstanding_tokens = int(PREFILL_WEIGHT * 2048) + 1  # now its backlog outweighs the saving
    assert router.pick(reps, 0) is reps[0]
    assert router.pick(reps, -1) is reps[0]                  # no request id: least outstanding tokens


def test_auto_resolves_by_workload() -> None:
    ids, offs = np.array([1]), np.array([0, 1])
    assert Router("auto", prefix=(ids, offs), prompt_tokens=np.array([600])).name == "prefix"
    assert Router("auto").name == "least-tokens"
    assert Router("prefix").name == "least-tokens"          # no blocks to look at
    with pytest.raises(ValueError, match=r"router='x'.*prefix"):
        Router("x")


def test_hit_rate_matches_known_sharing() -> None:
    n_req, n_fam, shared = 60, 4, 6
    w = families(n_req, n_fam, shared)
    expected = (n_req - n_fam) * shared / (n_req * (shared + 1))  # every family's first request misses
    prof = get_profile("h100-llama3-8b")
    one = simulate(w, prof, replicas=1).extra["prefix_cache_hit_rate"]
    assert one == pytest.approx(expected, abs=1e-9)
    routed = simulate(w, prof, replicas=4).extra["prefix_cache_hit_rate"]  # auto -> prefix
    assert routed == pytest.approx(expected, abs=1e-9)
    spread = simulate(w, prof, replicas=4, router="round-robin").extra["prefix_cache_hit_rate"]
    assert spread < expected - 0.1                           # each family's first visit to each replica misses


def test_concurrent_requests_share_prefix_blocks_in_kv_usage() -> None:
    """Two running requests with the same 20-block prefix hold it once (vLLM ref-counts shared blocks)."""
    prof = get_profile("h100-llama3-8b")
    shared = 20
    ids = np.r_[np.arange(shared), 500, np.arange(shared), 501]
    w = Workload(np.array([0.0, 2.0]), np.full(2, 512 * (shared + 1)), np.full(2, 4000),
                 block_ids=ids, block_offsets=np.array([0, shared + 1, 2 * (shared + 1)]))
    engine = Engine(w, prof, EngineConfig(seed=0), initial_replicas=1)
    engine.run(until=3.0)
    rep = engine.fleet.replicas[0]
    assert rep.n == 2
    per_request = int(((rep.S[2, :2] + 16) // 16).sum())  # blocks each request would hold on its own
    assert rep.prefix is not None and rep.prefix.shared_kv == shared * 32
    assert rep.used_blocks() == per_request - shared * 32
    assert rep.metrics(3.0).kv_cache_usage_perc == pytest.approx(rep.used_blocks() / rep.total_blocks)


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_least_tokens_does_not_see_true_output_lengths(engine: str) -> None:
    """A gateway knows prompts and the tokens streamed so far, never a request's future output length.

    Request 0 (100-token prompt, 4000 tokens to come) and request 1 (300-token prompt, 50 to come) take
    one replica each; request 2 arrives 50 ms later. Counting true outputs would call replica 0 the busy
    one (4100 vs 350 tokens); what a gateway sees is ~100 + a few vs ~300 + a few: replica 0.
    """
    w = Workload(np.array([0.0, 0.0, 0.05]), np.array([100, 300, 10]), np.array([4000, 50, 5]))
    res = simulate(w, get_profile("h100-llama3-8b"), replicas=2, router="least-tokens", engine=engine)
    assert res.log.replica.tolist() == [0, 1, 0]


def test_gateway_tokens_count_prompts_and_streamed_tokens_mid_decode_run() -> None:
    """During a lazily applied decode run the count includes the steps already over (as ``sync`` applies)."""
    rng = np.random.default_rng(5)
    n = 40
    w = Workload(np.sort(rng.uniform(0, 2.0, n)), rng.integers(50, 3000, n), rng.integers(200, 2000, n))
    engine = Engine(w, get_profile("h100-llama3-8b"), EngineConfig(router="least-tokens"), initial_replicas=2)
    engine.run(until=3.0)
    for rep in engine.fleet.replicas.values():
        assert rep.run is not None and rep.run_done < rep.run.steps_within(3.0 - rep.run_start)  # lazily behind
        seen = rep.gateway_tokens(3.0)
        rep.sync(3.0)
        assert seen == rep.outstanding_tokens == rep.gateway_tokens(3.0)
        log, S = engine.log, rep.S
        running = S[0, : rep.n]
        waiting = np.array(list(rep.waiting), np.int64)
        prompts = int(log.input_tokens[running].sum() + log.input_tokens[waiting].sum())
        streamed = int((S[1, : rep.n] - log.input_tokens[running]).sum() + log.generated[waiting].sum())
        assert seen == prompts + streamed


def test_prefix_blocks_are_hittable_while_the_prompt_is_still_prefilled() -> None:
    """vLLM caches each full block when a chunk is scheduled over it, not when the prefill ends.

    Request 0 (40 blocks, 20480 tokens) takes three 8192-token chunks; request 1 (the same 40 blocks + one
    of its own) arrives during the first one, waits while chunk 2 spends the whole budget, and is
    admitted beside chunk 3. It finds all 40 blocks, chunk 3's included (scheduled earlier in that same
    step), and computes only its own 512 tokens: its first token comes with request 0's.
    """
    prof = get_profile("h100-llama3-8b")
    ids = np.r_[np.arange(40), np.arange(40), 999]
    w = Workload(np.array([0.0, 0.001]), np.array([40 * 512, 41 * 512]), np.array([4, 4]),
                 block_ids=ids, block_offsets=np.array([0, 40, 81]))
    res = simulate(w, prof, replicas=1)
    assert res.extra["prefix_cache_hit_rate"] == pytest.approx(40 * 512 / (81 * 512))
    assert res.log.first_token_s[1] == res.log.first_token_s[0]
