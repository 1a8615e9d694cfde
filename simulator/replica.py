"""One vLLM replica, advanced event by event: the engine-facing side of ``scheduler.SchedulerState``.

Speed: when every running request is decoding, nothing can be admitted and the next blocks fit, the
batch stays the same until the first request finishes or the free blocks run out. That whole stretch
is planned at once (``DecodeRun``: step times in closed form) and applied lazily: an arrival cuts it at
the step in progress, a metrics read applies just the steps already over. With step jitter (the profile's
``step_jitter``) each step has its own factor and the run's times are summed instead (``JitteredRun``).
The scheduling rules themselves (vLLM v1) live in ``scheduler``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from scaler.histograms import TTFT_BUCKETS
from scaler.profiles import PerformanceProfile
from simulator.results import ABORTED, LatencyHistogram, RequestLog
from simulator.scheduler import COMP, ID, LEFT, NEW, NTOK, SchedulerState
from simulator.step_jitter import JITTERED_RUN_STEPS, FactorBlock, JitteredRun

__all__ = ["COMP", "ID", "LEFT", "NEW", "NTOK", "Replica", "ReplicaMetrics"]


@dataclass(frozen=True)
class ReplicaMetrics:
    """One replica's vLLM metrics at ``at`` (names as vLLM exports them, ``vllm:`` prefix dropped).

    Counters are monotonic over the replica's life (a new replica starts at 0, like a restarted pod);
    ``request_*_tokens_sum`` are the sums of the ``vllm:request_{prompt,generation}_tokens`` histograms
    (their count is ``request_success_total``). ``waiting_prompt_tokens`` is exact (vLLM has no such
    metric; a gateway might), preempted requests included at their recompute length.
    """

    at: float
    replica: int
    prompt_tokens_total: int
    generation_tokens_total: int
    request_success_total: int
    num_preemptions_total: int
    request_prompt_tokens_sum: int
    request_generation_tokens_sum: int
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float
    waiting_prompt_tokens: int
    num_gpu_blocks: int
    block_size: int
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    request_prompt_tokens_bucket: tuple[tuple[float, int], ...] = ()
    """The prompt-length histogram's cumulative buckets: (le, count), ``inf`` last."""
    time_to_first_token_seconds_bucket: tuple[tuple[float, int], ...] = ()
    """The TTFT histogram's cumulative buckets (arrival to first token): (le, count), ``inf`` last."""


class Replica(SchedulerState):
    """One serving vLLM engine. The ``Fleet`` creates it; the engine drives it with ``enqueue``/``on_event``."""

    def __init__(self, rid: int, profile: PerformanceProfile, log: RequestLog, itl: LatencyHistogram,
                 now: float, prefix: tuple[np.ndarray, np.ndarray, int] | None = None) -> None:
        super().__init__(profile, log, itl, now, prefix)
        self.id = rid
        self.added_s = self.run_start = now
        self.draining = False
        self.version = 0  # the engine's stamp on this replica's pending step event
        self.run_k = self.run_done = self.run_fin = 0  # run_k steps from run_start, run_done applied
        self._factor_block: FactorBlock | None = None  # decode runs' jitter factors, when the profile has jitter

    # ----- engine-facing -----------------------------------------------------------------------------
    def enqueue(self, rid: int, now: float) -> float | None:
        """Add an arrived request to ``waiting``; returns the replica's next event time if it changed."""
        log = self.log
        self.waiting.append(rid)
        self.waiting_tokens += log.input_l[rid] + int(log.generated[rid])
        log.replica[rid] = self.id
        self.outstanding_tokens += log.input_l[rid] + int(log.generated[rid])  # what a gateway has seen of it
        if self.busy_until is None:
            self.clock = max(self.clock, now)
            return self._plan()
        if self.run is not None and now < self.run_start:  # the run after an eager step: none of it
            if self.run_k > 0:
                self.run_k = 0
                self.busy_until = self.run_start
                return self.busy_until
            return None
        if self.run is not None and self.run_k - self.run_done > 1:
            done = self.run.steps_within(now - self.run_start)  # steps over by now; cut after the next one
            if done + 1 < self.run_k:
                self.run_k = done + 1
                self.busy_until = self.run_start + self.run.total(self.run_k)
                return self.busy_until
        return None

    def on_event(self, now: float) -> float | None:
        """The planned step(s) end at ``now``: apply them, schedule the next; returns its end or None (idle)."""
        if self.run is not None:
            self._apply_run(self.run_k - self.run_done)
        self.busy_until = None
        self.clock = now
        return self._plan()

    def gateway_tokens(self, now: float) -> int:
        """What a token-aware gateway counts held here at ``now``: prompts + tokens streamed back so far.

        ``outstanding_tokens`` holds them up to the last step applied; a decode run applies its steps
        lazily, so the steps of the run in progress already over at ``now`` (one token per running
        request each) are added here without applying them (reading must not change the run).
        """
        run = self.run
        if run is None or now <= self.run_start:
            return self.outstanding_tokens
        done = min(run.steps_within(now - self.run_start), self.run_k)
        return self.outstanding_tokens + self.n * max(done - self.run_done, 0)

    def sync(self, now: float) -> None:
        """Apply the steps of a decode run already over at ``now`` (for an exact metrics read)."""
        if self.run is not None and self.busy_until is not None and now < self.busy_until:
            done = min(self.run.steps_within(now - self.run_start), self.run_k - 1)
            if done > self.run_done:
                self._apply_run(done - self.run_done)

    def metrics(self, now: float) -> ReplicaMetrics:
        """vLLM's metrics as a scrape at ``now`` would read them."""
        self.sync(now)
        log, waiting = self.log, self.waiting
        w = np.fromiter(waiting, np.int64, len(waiting))
        arrived = log.arrival_s[w] <= now
        return ReplicaMetrics(
            at=now, replica=self.id, **self.counters, num_requests_running=self.n,
            num_requests_waiting=int(arrived.sum()), kv_cache_usage_perc=self.used_blocks() / self.total_blocks,
            waiting_prompt_tokens=int((log.input_tokens[w] + log.generated[w])[arrived].sum()),
            num_gpu_blocks=self.num_gpu_blocks, block_size=self.bs,
            prefix_cache_queries=self.prefix.query_tokens if self.prefix else 0,
            prefix_cache_hits=self.prefix.hit_tokens if self.prefix else 0,
            request_prompt_tokens_bucket=tuple(zip((*self.prompt_bucket_bounds, math.inf),
                                                   itertools.accumulate(self.prompt_bucket_counts), strict=True)),
            time_to_first_token_seconds_bucket=tuple(zip((*TTFT_BUCKETS, math.inf),
                                                         itertools.accumulate(self.ttft_bucket_counts), strict=True)))
    @property
    def idle(self) -> bool:
        return self.busy_until is None

    def abort_all(self, now: float) -> list[int]:
        """Drop every running and waiting request (the pod is gone); returns their ids."""
        self.sync(now)
        n, S, log = self.n, self.S, self.log  # S: the shift written out
        running = S[ID, :n]
        log.generated[running] = S[NTOK, :n] - log.input_tokens[running]
        ids = [int(i) for i in running] + list(self.waiting)
        log.status[ids] = ABORTED
        self.n = self.comp_sum = self.new_sum = self.outstanding_tokens = self.fresh = self.waiting_tokens = 0
        self._reset_lefts()
        self.cache.clear()
        self.busy_until, self.run = None, None
        self.waiting.clear()
        return ids
    # ----- planning ------------------------------------------------------------------------------------
    def _plan(self) -> float | None:
        """Schedule from ``self.clock``: a decode run when nothing else can change, else one general step.

        NOTE: a general step's batch is fixed when it starts, so its outcome is applied at once (times
        stamped at its end) and the decode run that may follow is planned from its end: one engine event
        instead of two. An arrival during the step cancels that run; a metrics read during the step sees
        its counters one step early.
        """
        end = self._plan_run()
        if end is not None:
            return end
        end = self._start_step()
        if end is None or self.n == 0:
            return end
        self._complete_step()
        self.clock = end
        after = self._plan_run()
        self.busy_until = end if after is None else after
        return self.busy_until

    def _plan_run(self) -> float | None:
        """Start a decode run from ``self.clock`` if nothing but finishes and the KV cache can change it."""
        n = self.n
        if not (n and self.all_decoding and n <= self.budget):
            return None
        bs, total = self.bs, self.total_blocks
        if self.waiting:
            head = self._head_tokens(self.budget - n, self.clock)
            if head is not None:
                shared = self.prefix.shared_kv if self.prefix is not None else 0
                want = self._head_blocks(head[0], head[1])[0]  # the admission gate
                if ((self.comp_sum + n) / bs + n + want <= total
                        or want <= total + shared - int(((self._S[COMP, :n] + (bs + self.shift)) // bs).sum())):
                    return None  # it would be admitted next step
        k = self.run_fin = -(self._lefts[-1] + self.shift)  # steps until the first finish
        if (self.comp_sum + n * k) / bs + n > total:
            k = self._kv_run_length(k)
        return self._start_run(k) if k > 0 else None

    def _start_run(self, k: int) -> float:
        n = self.n
        self.new_sum = n  # one token each in flight (the NEW row is implied, not written)
        run = self.model.decode_run(n, float(self.comp_sum + n))
        if self.jitter:
            k = min(k, JITTERED_RUN_STEPS)
            if self._factor_block is None:
                self._factor_block = FactorBlock(self.jitter, self.id)
            self.run = JitteredRun(run.first_s, run.growth_s, self._factor_block.take(self.steps_taken, k))
            self.busy_until = self.clock + self.run.total(k)
        else:
            self.run = run
            self.busy_until = self.clock + k * run.first_s + run.growth_s * k * (k - 1) / 2.0
        self.run_start, self.run_k, self.run_done = self.clock, k, 0
        return self.busy_until

    def _kv_run_length(self, k_fin: int) -> int:
        """Steps (<= k_fin) whose blocks fit: the cache runs out at the next one (which then preempts)."""
        bs, n = self.bs, self.n
        total = self.total_blocks + (self.prefix.shared_kv if self.prefix is not None else 0)
        comp = self._S[COMP, :n] + (bs - 1 + self.shift)
        lo, hi = 0, k_fin + 1  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if int(((comp + mid) // bs).sum()) <= total:
                lo = mid
            else:
                hi = mid
        return lo

    def _apply_run(self, j: int) -> None:
        """Apply ``j`` more steps of the decode run in progress."""
        run, n = self.run, self.n
        if run is None:
            return
        if j > 0:
            run.add_to(self.itl, self.run_done, j, float(n))
            self.shift += j  # every running request: j more tokens (NTOK, COMP, LEFT)
            self.comp_sum += n * j
            self.counters["generation_tokens_total"] += n * j
            self.outstanding_tokens += n * j
            self.run_done += j
        if self.run_done == self.run_k:
            self.steps_taken += self.run_k
            self.run = self.busy_until = None
            self.new_sum = 0
            self._trim_cache()  # the run's last step held the most blocks: evict as its allocations did
            if self.run_k == self.run_fin:  # else cut short (an arrival, the KV cache): nobody finishes
                self._finish_done(self.run_start + run.total(self.run_k))
