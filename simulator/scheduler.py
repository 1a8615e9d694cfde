"""vLLM v1's scheduling rules for one replica: the general step, admission, preemption, completion.

Imitates vLLM's v1 ``Scheduler.schedule()`` (chunked prefill always on, FCFS policy), as in 0.11 except
the admission gate of step 2 and the null block, which follow 0.32 (``tests/test_scheduler_vs_vllm.py``
checks against its real scheduler). Of ``num_gpu_blocks`` N, N - 1 hold KV (``total_blocks``): vLLM's
``BlockPool`` keeps one as its null block.
1. Running requests first, in order: each gets ``min(num_tokens - num_computed_tokens, budget left)``
   new tokens (1 when decoding, a chunk when prefilling) until ``max_num_batched_tokens`` is spent.
   ``allocate_slots`` needs ``ceil((computed + new) / 16)`` blocks; when the free blocks run out the
   *tail* of ``running`` (newest) is preempted: its blocks are freed, ``num_computed_tokens`` reset to 0,
   and it goes back to the *head* of ``waiting`` (recompute of prompt + generated tokens later, less its
   own full blocks still cached when it resumes: ``PrefixCache.park``, prefix caching being on by default).
2. Only if nothing was preempted this step: admit waiting requests FCFS while the budget lasts, fewer
   than ``max_num_seqs`` run and their blocks fit (prefix-cache hits skip computation, ``kv_cache``).
   With ``scheduler_reserve_full_isl`` (vLLM 0.32's default) the blocks of the whole sequence must fit,
   ``min(prompt + generated, max_model_len)`` tokens, new and preempted requests alike; else only the
   first chunk's (0.11). When the head does not fit, admission stops for the step.
3. After the step, each request whose computed tokens reach its token count samples one token (the
   first one is the TTFT); a request finishes when it has its output length.
``num_requests_waiting`` includes preempted requests, as in vLLM. Left out: priorities, the
``long_prefill_token_threshold`` and ``max_num_partial_prefills`` knobs (off by default), spec decode,
LoRA, multimodal, KV connectors, async scheduling's one-step lag, structured output.

``replica.Replica`` adds the event-driven part (decode runs in closed form) on top of this class.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque

import numpy as np

from scaler.histograms import TTFT_BUCKETS, vllm_token_buckets
from scaler.profiles import PerformanceProfile
from scaler.step_time import DecodeRun
from simulator.kv_cache import PrefixCache
from simulator.results import FINISHED, LatencyHistogram, RequestLog
from simulator.step_jitter import JitteredRun, jitter_factor

ID, NTOK, COMP, LEFT, NEW = range(5)  # rows of S; LEFT = tokens - final (< 0 while running)


class SchedulerState:
    """Running and waiting requests of one replica, and vLLM v1's general scheduling step over them.

    Running requests are the columns ``[:n]`` of ``S`` (rows ``ID``, ``NTOK`` = prompt + generated tokens,
    ``COMP`` = num_computed_tokens, ``LEFT`` = NTOK - (prompt + output), ``NEW`` = tokens of the step in
    progress), in admission order. A request holds exactly ``ceil((COMP + NEW) / block_size)`` KV blocks
    (vLLM allocates for the scheduled tokens, frees on preemption or finish), so blocks are derived, not
    stored; scalar bounds on them skip the exact count while the cache is far from full.

    Speed: decode steps add one token to every running request, so ``_S`` stores the ``NTOK``, ``COMP``
    and ``LEFT`` rows less ``shift`` (tokens added to all of them and not yet written): a step or a whole
    decode run is ``shift += j``, not an array write. ``_lefts`` holds the stored ``LEFT`` values sorted, so
    the steps to the next finish (``-(_lefts[-1] + shift)``) and who finishes need no array scan.
    ``S`` (a property) writes the shift out and returns the true rows, for readers outside the hot path.
    """

    def __init__(self, profile: PerformanceProfile, log: RequestLog, itl: LatencyHistogram, now: float,
                 prefix: tuple[np.ndarray, np.ndarray, int] | None = None) -> None:
        self.profile, self.log, self.itl = profile, log, itl
        self.clock = now
        self.bs, self.num_gpu_blocks = profile.block_size, profile.num_gpu_blocks
        self.total_blocks = profile.usable_blocks  # less vLLM's null block
        self._full_cap = profile.admission_cap  # the whole-sequence admission gate's token cap; 0: off
        self._head_full = 0  # of the waiting head ``_head_tokens`` last looked at: tokens the gate must fit
        self.budget, self.max_seqs, self.model = profile.max_num_batched_tokens, profile.max_num_seqs, profile.step_time
        self._S = np.zeros((5, profile.max_num_seqs), np.int64)
        self.shift = 0  # tokens added to rows NTOK, COMP, LEFT of every running column, not yet in _S
        self._lefts: list[int] = []  # _S[LEFT, :n] (stored, i.e. less shift), sorted
        self._adm_cached = 0  # cached (computed) tokens of the requests admitted in the step in progress
        self.n = self.comp_sum = self.new_sum = 0
        self.all_decoding = True  # every running request has its first token and one token to compute
        self.fresh = 0  # running requests still before their first token
        self.fast, self.n_running, self._adm_attn = True, 0, 0.0  # how the step in progress was scheduled
        self.waiting: deque[int] = deque()
        self.waiting_tokens = 0  # prompt (+ generated, when preempted) tokens of ``waiting``: a gateway's limit
        self.outstanding_tokens = 0  # prompt + generated tokens of held requests (``Replica.gateway_tokens``)
        self.prefix: PrefixCache | None = None  # the cache of trace prefix blocks, when the workload names them
        if prefix is not None:
            self._block_ids, self._block_offsets, block_tokens = prefix
            self.prefix = PrefixCache(self.total_blocks * self.bs // block_tokens, block_tokens, self.bs)
        # vLLM's prefix cache is on by default: without trace blocks it still keeps preempted requests' blocks
        self.cache = self.prefix if self.prefix is not None else PrefixCache(self.total_blocks, self.bs, self.bs)
        self.busy_until: float | None = None
        self.run: DecodeRun | JitteredRun | None = None  # a decode run in progress (see replica.Replica)
        self.step_s = 0.0
        self.jitter = profile.step_jitter  # a decode step's time is the model's times a draw from it (step_jitter)
        self.prefill_jitter = profile.prefill_step_jitter  # and a step with a prefill chunk's, from this one
        self.id = 0  # the replica's id (``Replica`` sets it): also which stream its jitter draws come from
        self.steps_taken = 0  # the draw's counter: jittered general steps and every decode-run step
        self.counters = dict(prompt_tokens_total=0, generation_tokens_total=0, request_success_total=0,
                             num_preemptions_total=0, request_prompt_tokens_sum=0, request_generation_tokens_sum=0)
        # vllm:request_prompt_tokens histogram: finished requests per bucket (le = bounds[i]; last: +Inf)
        self.prompt_bucket_bounds = vllm_token_buckets(profile.max_model_len)
        self.prompt_bucket_counts = [0] * (len(self.prompt_bucket_bounds) + 1)
        self.ttft_bucket_counts = [0] * (len(TTFT_BUCKETS) + 1)  # vllm:time_to_first_token_seconds

    @property
    def S(self) -> np.ndarray:
        """The running columns with every token written in (``shift`` applied): for tests and rare paths."""
        self._write_shift()
        return self._S

    def _write_shift(self) -> None:
        """Add the pending ``shift`` to the running columns (before code that reads true NTOK/COMP/LEFT)."""
        sh = self.shift
        if sh:
            self._S[NTOK:NEW, : self.n] += sh
            self._lefts = [v + sh for v in self._lefts]
            self.shift = 0

    def _reset_lefts(self) -> None:
        """Rebuild ``_lefts`` after LEFT changed unevenly (an empty batch drops the shift)."""
        n = self.n
        self._lefts = sorted(self._S[LEFT, :n].tolist())
        if not n:
            self.shift = 0

    def used_blocks(self) -> int:
        """KV blocks held now (exact); a decode run has one token in flight per request."""
        n, S, bs = self.n, self._S, self.bs
        shared = self.prefix.shared_kv if self.prefix is not None else 0  # prefix blocks stored once
        if self.run is not None:
            return int(((S[COMP, :n] + (bs + self.shift)) // bs).sum()) - shared
        return int(((S[COMP, :n] + S[NEW, :n] + (bs - 1 + self.shift)) // bs).sum()) - shared

    def _used_bound(self) -> float:
        """An upper bound on ``used_blocks()`` from running sums (no array work)."""
        return (self.comp_sum + self.new_sum) / self.bs + self.n

    def _trim_cache(self) -> None:
        """Evict free cached blocks that no longer fit beside the blocks running requests hold."""
        cache = self.cache
        if cache.free_cached_kv and cache.free_cached_kv + self._used_bound() > self.total_blocks:
            cache.trim(self.total_blocks - self.used_blocks())

    def _head_tokens(self, budget: int, now: float) -> tuple[int, int] | None:
        """(cached, scheduled) tokens of the waiting head if seats, budget and arrival allow admitting it."""
        if not self.waiting or budget <= 0 or self.n >= self.max_seqs:
            return None
        rid = self.waiting[0]
        log = self.log
        if log.arrival_l[rid] > now:
            return None
        ntok = log.input_l[rid] + int(log.generated[rid])
        self._head_full = ntok if ntok < self._full_cap else self._full_cap
        if self.prefix is None:
            if not self.cache.parked(rid):
                return 0, (ntok if ntok < budget else budget)
            self._trim_cache()
            cached = self.cache.resume_tokens(rid, ntok)
            return cached, min(ntok - cached, budget)
        self._trim_cache()
        cached = self._cached(rid, ntok, touch=False)
        return cached, min(ntok - cached, budget)

    def _head_blocks(self, cached: int, nt: int) -> tuple[int, int]:
        """(gate, alloc): the free KV blocks the waiting head needs to be admitted, and those its first
        chunk takes (cached blocks it hits in the free queue included, those running requests hold not).

        vLLM's ``allocate_slots`` with ``full_sequence_must_fit`` first checks the blocks of the whole
        sequence (``min(num_tokens, max_model_len)``: prompt + tokens generated before a preemption), then
        those of the chunk; both must fit. Without the gate (``_full_cap`` 0) only the chunk's count."""
        bs = self.bs
        shared = self.prefix.peek_shared_kv if self.prefix is not None else 0
        alloc = -(-(cached + nt) // bs)
        full = -(-self._head_full // bs)
        return (full if full > alloc else alloc) - shared, alloc - shared

    def _own_from_kv(self, rid: int) -> int:
        """The KV block where request ``rid``'s own blocks start: past its full trace blocks (none: 0)."""
        if self.prefix is None:
            return 0
        full = min(int(self._block_offsets[rid + 1] - self._block_offsets[rid]),
                   self.log.input_l[rid] // self.prefix.block_tokens)
        return full * self.prefix.kv_per_block

    def _cached(self, rid: int, ntok: int, touch: bool) -> int:
        if self.prefix is None:
            return 0
        blocks = self._block_ids[self._block_offsets[rid]: self._block_offsets[rid + 1]]
        owner = rid if self.prefix.parked(rid) else -1  # preempted, its own blocks still cached
        own = self._own_from_kv(rid) if owner >= 0 else 0
        if touch:
            return self.prefix.acquire(rid, blocks, ntok, own)
        return self.prefix.lookup(blocks, ntok, touch=False, owner=owner, own_from_kv=own)

    # ----- one general step ------------------------------------------------------------------------------
    def _start_step(self) -> float | None:
        """One general step (chunked prefill, admissions, preemption); None when there is nothing to run.

        Fast path (the common one): every running request decodes and all fit the budget, so the
        running part needs one array write and the step inputs come from running sums.
        """
        n, S = self.n, self._S
        self.run = None
        self.n_running = n  # requests before admission: only these can be decoding
        self._adm_attn = 0.0
        self._adm_cached = 0
        preempted = False
        free: int | None = None  # exact free blocks, computed only when the bound is not enough
        self.fast = self.all_decoding and n <= self.budget
        if self.fast:
            S[NEW, :n] = 1
            self.new_sum = n
        else:
            self._write_shift()  # the slow path works on true rows
            need = S[NTOK, :n] - S[COMP, :n]
            cum = np.cumsum(need)
            S[NEW, :n] = np.clip(self.budget - (cum - need), 0, need)
            self.new_sum = min(int(cum[-1]), self.budget)
        if self._used_bound() > self.total_blocks:
            free = self.total_blocks - self.used_blocks()
            if free < 0:
                self.fast = False
                free, preempted = self._schedule_with_preemption()
                self.n_running = self.n
        if self.prefix is not None and not self.fast:
            self._register_chunks()  # running prefills' chunks (the fast path has none)
        if not preempted:
            self._admit(self.budget - self.new_sum, free)
        self._trim_cache()  # the step's allocations may evict free cached blocks
        n = self.n
        if n == 0:  # idle, or everything running was preempted (the next step admits)
            self.busy_until = None
            return self._zero_step() if preempted else None
        n0 = self.n_running
        context: float
        partials = 0
        if self.fast:
            decodes, context = n0, self.comp_sum - self._adm_cached + n0
        else:
            new, comp = S[NEW, :n0], S[COMP, :n0]
            decode = (new == 1) & (S[NTOK, :n0] - comp == 1)
            partial = (new > 0) & ~decode
            decodes, context = int(decode.sum()), float(comp[decode].sum() + decode.sum())
            p_new = new[partial]
            self._adm_attn += float((p_new * (comp[partial] + p_new / 2.0)).sum())
            partials = int(partial.sum())
            n0 = partials + decodes
        admitted = n - self.n_running
        # scheduled running requests + admitted ones; running prefill chunks + admitted ones (each a first chunk)
        self.step_s = self.model.step_time(self.new_sum, n0 + admitted, float(context), self._adm_attn,
                                           partials + admitted)
        table = self.prefill_jitter if partials + admitted else self.jitter
        if table:
            self.step_s *= self._jitter_factor(table)
        self.busy_until = self.clock + self.step_s
        return self.busy_until

    def _zero_step(self) -> float:
        """Everything running was preempted this step: nothing computes; the next step admits."""
        self.step_s = self.model.step_time(0, 0, 0.0, 0.0, 0)
        if self.jitter:
            self.step_s *= self._jitter_factor(self.jitter)
        self.busy_until = self.clock + self.step_s
        return self.busy_until

    def _jitter_factor(self, table: tuple[float, ...]) -> float:
        """The step about to start takes its modelled time times this (``simulator.step_jitter``)."""
        factor = jitter_factor(table, self.id, self.steps_taken)
        self.steps_taken += 1
        return factor

    def _schedule_with_preemption(self) -> tuple[int, bool]:
        """vLLM's sequential loop: allocate in order, preempting the newest running request on shortage.

        Request ``i`` (in order) gets ``min(need, budget left)`` tokens and ``extra[i]`` new blocks; it fits
        while ``cumsum(extra)[i] <= free + freed`` (blocks freed by preempting the tail so far). So the
        loop is vectorised: find the first request that does not fit, preempt from the tail until it does
        (or it is preempted itself), repeat; only preemptions run one by one (prefix-cache releases).
        """
        self._write_shift()
        S, bs, n = self._S, self.bs, self.n
        S[NEW, :n] = 0
        comp = S[COMP, :n]
        need = S[NTOK, :n] - comp
        cum = np.cumsum(need)
        nt = np.clip(self.budget - (cum - need), 0, need)  # tokens each gets, in order, within the budget
        spent = np.cumsum(-(-(comp + nt) // bs) + -comp // bs)  # new blocks of requests [0, i], in order
        stop = min(n, int(np.searchsorted(cum, self.budget, side="left")) + 1)  # the budget ends the loop here
        free0, freed, preempted, i = self.total_blocks - self.used_blocks(), 0, False, 0
        while i < stop:
            j = int(np.searchsorted(spent, free0 + freed, side="right"))  # the first that does not fit (>= i)
            if j >= stop:
                i = stop
                break
            while int(spent[j]) > free0 + freed and self.n > j:
                freed += self._preempt(self.n - 1)
                preempted = True
            if self.n <= j:  # preempted itself: the loop ends before it
                i = j
                break
            stop = min(stop, self.n)
            i = j + 1
        S[NEW, :i] = nt[:i]
        self.new_sum = int(nt[:i].sum())
        return free0 + freed - (int(spent[i - 1]) if i else 0), preempted

    def _preempt(self, j: int) -> int:
        """Preempt running slot ``j`` (the tail): recompute later; returns the blocks freed."""
        S, log, sh = self._S, self.log, self.shift
        rid = int(S[ID, j])
        comp = int(S[COMP, j]) + sh
        log.generated[rid] = int(S[NTOK, j]) + sh - log.input_l[rid]
        self._lefts.remove(int(S[LEFT, j]))
        log.preemptions[rid] += 1
        if log.first_token_s[rid] != log.first_token_s[rid]:  # NaN: preempted before its first token
            self.fresh -= 1
        self.counters["num_preemptions_total"] += 1
        self.waiting.appendleft(rid)
        self.waiting_tokens += int(S[NTOK, j]) + sh
        self.n -= 1
        self.comp_sum -= comp
        own = comp // self.bs - self._own_from_kv(rid)  # its full blocks past its trace blocks stay cached
        if self.prefix is None:
            self.cache.park(rid, own)
            return -(-comp // self.bs)
        return -(-comp // self.bs) - self.prefix.release(rid, own)

    def _admit(self, budget: int, free: int | None) -> None:
        """Admit waiting requests FCFS while seats, budget and blocks last (each one a prefill)."""
        log, S, now, sh = self.log, self._S, self.clock, self.shift
        bound = self._used_bound()
        while True:
            head = self._head_tokens(budget, now)
            if head is None:
                break
            cached, nt = head
            gate, want = self._head_blocks(cached, nt)
            if free is None and bound + gate > self.total_blocks:
                free = self.total_blocks - self.used_blocks()
            if free is not None:
                if gate > free:  # vLLM: allocate_slots returns None and admission stops for this step
                    break
                free -= want
            bound += want
            rid = self.waiting.popleft()
            ntok = log.input_l[rid] + int(log.generated[rid])
            self.waiting_tokens -= ntok
            if self.prefix is not None:
                self._cached(rid, ntok, touch=True)
                self._register(rid, cached + nt)
            elif self.cache.free_cached_kv:
                self.cache.unpark(rid)  # held again (or, when none hit, useless)
            left = ntok - log.tokens_l[rid] - sh
            S[:, self.n] = (rid, ntok - sh, cached - sh, left, nt)  # stored less the shift
            insort(self._lefts, left)
            self.n += 1
            self.comp_sum += cached
            self._adm_cached += cached
            self.new_sum += nt
            self._adm_attn += nt * (cached + nt / 2.0)
            budget -= nt
            if log.first_scheduled_s[rid] != log.first_scheduled_s[rid]:  # NaN: first time
                log.first_scheduled_s[rid] = now
            if log.first_token_s[rid] != log.first_token_s[rid]:
                self.fresh += 1

    def _register(self, rid: int, tokens: int) -> None:
        """vLLM caches a request's full blocks as soon as a chunk is scheduled over them (``allocate_slots``
        then ``cache_blocks`` up to computed + new tokens): prompt blocks of ``rid`` up to ``tokens`` become
        hittable by requests scheduled after it, in this step or later, while its prefill goes on."""
        assert self.prefix is not None
        prompt = self.log.input_l[rid]
        self.prefix.register(rid, self._block_ids[self._block_offsets[rid]: self._block_offsets[rid + 1]],
                             tokens if tokens < prompt else prompt)

    def _register_chunks(self) -> None:
        """``_register`` for the running requests whose prompt this step's chunk extends (slow path: true rows)."""
        n, S = self.n, self._S
        ids, comp, new = S[ID, :n], S[COMP, :n], S[NEW, :n]
        for j in ((new > 0) & (comp < self.log.input_tokens[ids])).nonzero()[0].tolist():
            self._register(int(ids[j]), int(comp[j] + new[j]))

    def _complete_step(self) -> None:
        """Apply the general step just scheduled: computed tokens, samples, first tokens, finishes."""
        n, S, n0 = self.n, self._S, self.n_running
        end = self.clock + self.step_s
        if self.fast:  # running part: one decode token each (the shift); admitted ones one by one
            self.shift += 1
            decodes = n0
            first = []
            prefilled = True
            for j in range(n0, n):  # stored less the old shift; rewritten less the new one (one more)
                rid, ntok, comp, left, new = S[:, j].tolist()
                if comp + new == ntok:  # prefill done: first token (or first after a recompute)
                    S[:, j] = (rid, ntok, ntok - 1, left, 0)  # true: ntok + 1, ntok, left + 1
                    first.append(rid)
                else:
                    S[:, j] = (rid, ntok - 1, comp + new - 1, left - 1, new)  # true: ntok, comp + new, left
                    prefilled = False
            if not prefilled:
                self._reset_lefts()
            count = n0 + len(first)
        else:
            new = S[NEW, :n]
            was_decode = (new == 1) & (S[NTOK, :n] - S[COMP, :n] == 1)
            was_decode[n0:] = False
            S[COMP, :n] += new
            sampled = (new > 0) & (S[COMP, :n] == S[NTOK, :n])
            S[NTOK, :n] += sampled
            S[LEFT, :n] += sampled
            self._reset_lefts()
            ids = S[ID, :n][sampled]
            is_first = np.isnan(self.log.first_token_s[ids])  # a prefill's last chunk may be 1 token
            count, decodes = int(ids.size), int((was_decode[sampled] & ~is_first).sum())
            first = ids[is_first].tolist()
        S[NEW, :n] = 0
        self.comp_sum += self.new_sum
        self.new_sum = 0
        self.counters["generation_tokens_total"] += count
        self.outstanding_tokens += count  # streamed back: the gateway sees them
        if decodes:
            self.itl.add(self.step_s, float(decodes))
        if first:
            self._first_tokens(first, end)
        self._finish_done(end)
        if not self.fast or not prefilled or self.fresh:
            n = self.n
            self.all_decoding = self.fresh == 0 and bool((S[NTOK, :n] - S[COMP, :n] == 1).all())

    def _first_tokens(self, ids: list[int], end: float) -> None:
        """Record first tokens (not re-samples after a recompute)."""
        log, first_token = self.log, self.log.first_token_s
        for rid in ids:
            if first_token[rid] == first_token[rid]:  # not NaN: a re-sample after recompute
                continue
            first_token[rid] = end
            self.ttft_bucket_counts[bisect_left(TTFT_BUCKETS, end - log.arrival_l[rid])] += 1
            self.fresh -= 1
            self.counters["prompt_tokens_total"] += log.input_l[rid]

    def _finish_done(self, end: float) -> None:
        """Retire the running requests that reached their output length at ``end``; compact the columns."""
        n, S, sh, lefts = self.n, self._S, self.shift, self._lefts
        if not lefts or lefts[-1] + sh < 0:  # nobody at its output length (true LEFT is <= 0)
            return
        k = 1
        while k < len(lefts) and lefts[-1 - k] + sh == 0:
            k += 1
        del lefts[-k:]
        if k == 1:
            idx = [int(S[LEFT, :n].argmax())]  # the one at 0, the maximum
        else:
            done = S[LEFT, :n] == -sh
            idx = done.nonzero()[0].tolist()
        log, c = self.log, self.counters
        if k == 1:  # the common case: scalar writes
            i = idx[0]
            rids = [int(S[ID, i])]
            comps = [int(S[COMP, i]) + sh]
            self.comp_sum -= comps[0]
            log.finish_s[rids[0]] = end
            log.status[rids[0]] = FINISHED
            log.generated[rids[0]] = log.tokens_l[rids[0]] - log.input_l[rids[0]]
        else:
            rids = S[ID, idx].tolist()
            comps = (S[COMP, idx] + sh).tolist()
            self.comp_sum -= int(S[COMP, idx].sum()) + sh * k
            log.finish_s[rids] = end
            log.status[rids] = FINISHED
            log.generated[rids] = log.output_tokens[rids]
        prompt = output = 0
        for rid, comp in zip(rids, comps, strict=True):
            prompt += log.input_l[rid]
            output += log.tokens_l[rid] - log.input_l[rid]
            self.prompt_bucket_counts[bisect_left(self.prompt_bucket_bounds, log.input_l[rid])] += 1
            # its full blocks past its trace blocks join the free queue's tail (hashed: nobody hits them, yet
            # allocations take them only in their turn); a partial last block goes to the front, as never cached
            if self.prefix is not None:
                self.prefix.release(rid, retire_kv=max(comp // self.bs - self._own_from_kv(rid), 0))
            elif self.cache.parked_kv:  # (only newer than a parked entry does its place in the queue matter)
                self.cache.retire(comp // self.bs)
        c["request_success_total"] += k
        c["request_prompt_tokens_sum"] += prompt
        c["request_generation_tokens_sum"] += output
        self.outstanding_tokens -= prompt + output
        if k <= 4:  # close the gaps from the back: a few slice copies beat a boolean gather
            m = n
            for i in reversed(idx):
                if i < m - 1:
                    S[:, i: m - 1] = S[:, i + 1: m]
                m -= 1
        else:
            S[:, : n - k] = S[:, :n][:, ~done]
        self.n = n - k
        if not lefts:
            self.shift = 0
