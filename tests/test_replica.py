"""One replica against vLLM v1's scheduler rules: invariants, analytic checks, preemption, prefix cache."""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaler.kv_memory import MemoryLedger
from scaler.profiles import PerformanceProfile, get_profile
from scaler.step_time import LinearStepTime
from simulator import replica as replica_mod
from simulator.engine import simulate as _simulate
from simulator.kv_cache import PrefixCache
from simulator.replica import COMP, ID, LEFT, NEW, NTOK
from simulator.results import FINISHED
from simulator.workload import Workload

# The Replica classes themselves (the reference: these tests patch and inspect them); the compiled
# engine is held to them in test_fast_engine.
simulate = partial(_simulate, engine="python")
STEP = LinearStepTime(overhead_s=0.001, floor_s=0.007, intercept_s=0.005, per_token_s=2e-5, per_seq_s=1e-5,
                      per_context_token_s=5e-8, prefill_attention_s=1e-9)


def tiny_profile(gib: float = 16.0, seqs: int = 8, budget: int = 512, max_len: int = 4096) -> PerformanceProfile:
    """A replica with a small KV cache (~530 blocks at 16 GiB) so preemption is easy to provoke."""
    memory = MemoryLedger(gpu_memory_gib=gib, gpu_memory_utilization=1.0, weights_gib=14.96, activation_gib=0.0,
                          kv_bytes_per_token=131072)
    return PerformanceProfile(name="tiny", gpu="test", model="test", step_time=STEP, memory=memory,
                              max_num_seqs=seqs, max_num_batched_tokens=budget, max_model_len=max_len)


def workload(arrival: list[float], inp: list[int], out: list[int], **kw: Any) -> Workload:
    return Workload(np.array(arrival, float), np.array(inp), np.array(out), **kw)


class Checker:
    """Wraps Replica's step planning to assert the scheduler invariants after every decision."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps = 0
        self.preempted = 0
        orig_step, orig_run = replica_mod.Replica._start_step, replica_mod.Replica._start_run

        def start_step(rep: replica_mod.Replica) -> float | None:
            before = int(rep.counters["num_preemptions_total"])
            t = orig_step(rep)
            self.check(rep)
            self.preempted += int(rep.counters["num_preemptions_total"]) - before
            return t

        def start_run(rep: replica_mod.Replica, k: int) -> float:
            t = orig_run(rep, k)
            self.check(rep)
            # the whole run fits: the blocks of its last step are available now
            last = (rep.S[COMP, : rep.n] + k + rep.bs - 1) // rep.bs
            shared = rep.prefix.shared_kv if rep.prefix is not None else 0  # prefix blocks stored once
            assert int(last.sum()) - shared <= rep.total_blocks
            return t

        monkeypatch.setattr(replica_mod.Replica, "_start_step", start_step)
        monkeypatch.setattr(replica_mod.Replica, "_start_run", start_run)

    def check(self, rep: replica_mod.Replica) -> None:
        self.steps += 1
        n, S = rep.n, rep.S
        assert n <= rep.max_seqs
        new = np.ones(n, np.int64) if rep.run is not None else S[NEW, :n]  # a decode run: one token each
        assert int(new.sum()) == rep.new_sum <= rep.budget, "token budget exceeded"
        assert rep.used_blocks() <= rep.total_blocks, "KV over capacity"
        assert rep.used_blocks() <= rep._used_bound()
        assert int(S[COMP, :n].sum()) == rep.comp_sum
        assert rep.fresh == int(np.isnan(rep.log.first_token_s[S[ID, :n]]).sum())
        assert (S[COMP, :n] + new <= S[NTOK, :n]).all() and (S[LEFT, :n] < 0).all()


def test_lone_request_ttft_is_its_prefill_time() -> None:
    prof = get_profile("h100-llama3-8b")
    res = simulate(workload([0.0], [20_000], [50]), prof)
    ttft = res.log.first_token_s[0] - res.log.arrival_s[0]
    assert ttft == pytest.approx(prof.step_time.prefill_time(20_000, prof.max_num_batched_tokens), rel=1e-12)
    # then 49 decode steps, one token each, context growing by one per step
    decode = sum(prof.step_time.step_time(1, 1, 20_001 + i, 0.0) for i in range(49))
    assert res.log.finish_s[0] - res.log.first_token_s[0] == pytest.approx(decode, rel=1e-9)


def test_every_request_finishes_exactly_once_with_fcfs_admission(monkeypatch: pytest.MonkeyPatch) -> None:
    checker = Checker(monkeypatch)
    rng = np.random.default_rng(7)
    n = 300
    w = Workload(np.sort(rng.uniform(0, 20, n)), rng.integers(1, 1500, n), rng.integers(1, 300, n))
    res = simulate(w, tiny_profile())
    log = res.log
    assert (log.status == FINISHED).all()
    assert np.isfinite(log.first_token_s).all()
    assert (log.generated == log.output_tokens).all()
    assert (log.first_token_s >= log.first_scheduled_s).all() and (log.finish_s >= log.first_token_s).all()
    never_preempted = log.preemptions == 0
    first = log.first_scheduled_s[never_preempted]
    assert (np.diff(first) >= 0).all(), "admission is FCFS"
    assert res.summary()["completed"] == n
    assert checker.steps > 0


def test_preemption_frees_blocks_and_request_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    checker = Checker(monkeypatch)
    # 8 requests whose outputs together need far more KV than the ~530 blocks
    w = workload([0.0] * 8, [400] * 8, [1600] * 8)
    res = simulate(w, tiny_profile())
    assert checker.preempted > 0 and res.preemptions == checker.preempted
    assert (res.log.status == FINISHED).all()
    assert res.log.preemptions[-1] > 0  # the newest goes first
    assert res.log.preemptions[0] == 0  # the oldest is never the victim while others run


FUZZ_EXAMPLES = int(os.environ.get("SIM_FUZZ_EXAMPLES", "25"))  # raise it locally to hunt harder


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_invariants_on_random_workloads(monkeypatch: pytest.MonkeyPatch, data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40))
    arrivals = sorted(data.draw(st.lists(st.floats(0, 5), min_size=n, max_size=n)))
    inp = data.draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    out = data.draw(st.lists(st.integers(1, 800), min_size=n, max_size=n))
    seqs = data.draw(st.integers(1, 16))
    budget = data.draw(st.sampled_from([16, 64, 512, 2048]))
    blocks = {}
    if data.draw(st.booleans(), label="prefix blocks"):  # a few prompt families sharing prefixes
        family = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        ids = [np.arange(-(-k // 512)) + 1000 * f for k, f in zip(inp, family, strict=True)]
        blocks = {"block_ids": np.concatenate(ids), "block_offsets": np.cumsum([0] + [len(i) for i in ids])}
    checker = Checker(monkeypatch)
    res = simulate(workload(arrivals, inp, out, **blocks), tiny_profile(seqs=seqs, budget=budget))
    assert (res.log.status == FINISHED).all()
    assert np.isfinite(res.log.first_token_s).all(), "every finished request had a first token"
    assert (res.log.first_token_s >= res.log.first_scheduled_s).all()
    assert (res.log.finish_s >= res.log.first_token_s).all()
    assert res.summary()["completed"] == n
    assert checker.steps > 0


def test_decode_runs_match_step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    n = 200
    w = Workload(np.sort(rng.uniform(0, 10, n)), rng.integers(1, 2000, n), rng.integers(1, 400, n))
    fast = simulate(w, tiny_profile(gib=17.0, seqs=32, budget=1024))
    one_step = replica_mod.Replica._start_run
    monkeypatch.setattr(replica_mod.Replica, "_start_run", lambda self, k: one_step(self, 1))  # step by step
    slow = simulate(w, tiny_profile(gib=17.0, seqs=32, budget=1024))
    assert np.allclose(fast.log.first_token_s, slow.log.first_token_s, rtol=1e-9, atol=1e-9)
    assert np.allclose(fast.log.finish_s, slow.log.finish_s, rtol=1e-9, atol=1e-9)
    assert (fast.log.preemptions == slow.log.preemptions).all()
    assert fast.itl.percentile(50) == slow.itl.percentile(50)


def test_prefix_cache_skips_shared_prefix() -> None:
    prof = get_profile("h100-llama3-8b")
    ids, offs = np.array([1, 2, 3, 1, 2, 3]), np.array([0, 3, 6])
    w = workload([0.0, 10.0], [1536, 1536], [2, 2], block_ids=ids, block_offsets=offs)
    res = simulate(w, prof)
    ttft = res.log.first_token_s - res.log.arrival_s
    assert ttft[1] < ttft[0] / 3  # 1520 of 1536 tokens were cached
    plain = simulate(workload([0.0, 10.0], [1536, 1536], [2, 2]), prof)
    assert plain.log.first_token_s[1] - 10.0 == pytest.approx(ttft[0])


def test_preempted_request_resumes_into_its_cached_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM keeps a preempted request's freed blocks cached (prefix caching is on by default): it resumes
    where its surviving blocks end instead of recomputing everything (and thrashing: re-admitted for one
    chunk, preempted again, 93 times here, when admission checks the first chunk only, as in vLLM 0.11;
    vLLM's full-sequence admission gate also stops that)."""
    prof = tiny_profile(gib=16.0, seqs=8, budget=512, max_len=8192)  # 532 blocks: two 5000-token requests do not fit
    w = workload([0.0, 0.01], [2000, 2000], [3000, 3000])
    took: list[tuple[int, int]] = []
    unpark = PrefixCache.unpark

    def record(cache: Any, owner: int) -> int:
        kv = unpark(cache, owner)
        took.append((owner, kv))
        return kv

    monkeypatch.setattr(PrefixCache, "unpark", record)
    res = simulate(w, prof)
    assert res.log.preemptions.tolist() == [0, 1]
    parked = 4240 // 16                                      # request 1 had 4240 tokens computed when preempted
    resumed = [kv for owner, kv in took if owner == 1 and kv]
    assert len(resumed) == 1 and 0 < resumed[0] < parked    # request 0 kept decoding: it evicted the tail part
    monkeypatch.setattr(PrefixCache, "park", lambda cache, owner, kv: None)  # recompute everything
    recompute = simulate(w, prof)  # the admission gate: resumed only once all of it fits, so no thrashing
    assert recompute.log.preemptions.tolist() == [0, 1]
    assert res.log.finish_s[1] < recompute.log.finish_s[1]  # its surviving blocks still save a little
    ungated = simulate(w, replace(prof, scheduler_reserve_full_isl=False))  # vLLM 0.11: the first chunk fits
    assert ungated.log.preemptions.tolist()[1] > 10
    assert res.log.finish_s[1] < ungated.log.finish_s[1] - 5.0
