"""A fixed fleet over a workload too long to hold: the compiled engine fed chunk by chunk, memory bounded.

``fast_engine.simulate_fixed`` keeps every request's columns (~130 B each: 2.6 GiB for a 20 M-request
week). Here the same ``run_loop`` sees a *window* of requests: the ``Log``'s row 0 is request
``L.off[0]``, so ids stay global in the replicas' queues and only the rows move. Whenever the loop has
taken every loaded arrival, the requests already resolved at the window's start are retired into a
``results.Tally`` (counts, sums, latency histograms), the live rest slides to the front and the next
chunk is appended. The window grows only while more requests are alive at once than it holds (a fleet
far behind its load), so memory follows the requests in flight, not the trace's length.

Per-request results are identical to the in-memory run (``tests/test_fast_stream.py`` compares every
column); the summary's counts, means and rates are too, and its percentiles are those of 1 %-wide
histogram bins.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from simulator import fast_replica as fr
from simulator.fast_engine import (
    DONE,
    FINAL,
    GROW,
    LAST,
    NKV,
    NREQ,
    NXT,
    OVERLOAD,
    grown,
    loop_buffers,
    run_loop,
    supports,
)
from simulator.fast_replica import Log
from simulator.results import PENDING, REJECTED, LatencyHistogram, Tally, summary_of
from simulator.workload import Workload

Retired = Callable[[dict[str, np.ndarray]], None]
"""Called with the columns of each batch of retired requests (a test collects them; a writer could)."""


class StreamedRun:
    """A streamed run's outcome: its summary (at the SLO it was tallied for) and its KV samples."""

    def __init__(self, tally: Tally, itl: LatencyHistogram, end_s: float, gpu_seconds: float, wall_seconds: float,
                 kv_usage: np.ndarray, preemptions: int, profile: str, extra: dict[str, Any], peak_window: int) -> None:
        self.tally, self.itl, self.end_s, self.gpu_seconds = tally, itl, end_s, gpu_seconds
        self.wall_seconds, self.kv_usage, self.preemptions, self.profile = wall_seconds, kv_usage, preemptions, profile
        self.extra, self.peak_window = extra, peak_window

    def summary(self, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None, **extra: Any) -> dict[str, Any]:
        """``SimulationResult.summary``'s dict; the SLOs, if given, must be the ones tallied."""
        for name, given, tallied in (("slo_ttft_s", slo_ttft_s, self.tally.slo_ttft_s),
                                     ("slo_tpot_s", slo_tpot_s, self.tally.slo_tpot_s)):
            if given is not None and float(given) != tallied:
                raise ValueError(f"{name}={given!r}: a streamed run was tallied at {tallied:g}; run it again")
        return summary_of(self.tally, self.itl, duration_s=self.end_s, gpu_seconds=self.gpu_seconds,
                          wall_seconds=self.wall_seconds, preemptions=self.preemptions, kv_usage=self.kv_usage,
                          extra={"profile": self.profile, **self.extra, **extra})


class _Window:
    """The requests the loop can see: rows ``[0, n)`` are requests ``off .. off + n``."""

    COLUMNS = ("arrival", "inp", "tok", "first_tok", "finish", "first_sched", "gen", "preempt", "repl", "status",
               "nextw", "park", "fill")

    def __init__(self, capacity: int) -> None:
        self.n = 0
        self.preemptions = 0
        self.L = self._alloc(capacity, 0)

    @staticmethod
    def _alloc(capacity: int, off: int) -> Log:
        nan = np.full(capacity, np.nan)
        return Log(np.zeros(capacity), np.zeros(capacity, np.int64), np.zeros(capacity, np.int64), nan,
                   nan.copy(), nan.copy(),
                   np.zeros(capacity, np.int64), np.zeros(capacity, np.int32), np.full(capacity, -1, np.int32),
                   np.zeros(capacity, np.int8), np.full(capacity, -1, np.int64), np.zeros(capacity, np.int64),
                   np.zeros(capacity, np.int64), np.array([off], np.int64))

    @property
    def capacity(self) -> int:
        return int(self.L.arrival.size)

    def retire(self, upto: int, tally: Tally, output: np.ndarray, on_retired: Retired | None) -> None:
        """Hand rows ``[0, upto)`` to ``tally`` and slide the rest to the front."""
        if upto <= 0:
            return
        L, n = self.L, self.n
        rows = {"arrival_s": L.arrival[:upto], "input_tokens": L.inp[:upto], "output_tokens": output[:upto],
                "first_scheduled_s": L.first_sched[:upto], "first_token_s": L.first_tok[:upto],
                "finish_s": L.finish[:upto], "status": L.status[:upto]}
        tally.add(**rows)
        self.preemptions += int(L.preempt[:upto].sum())
        if on_retired is not None:
            on_retired({**{k: v.copy() for k, v in rows.items()}, "generated": L.gen[:upto].copy(),
                        "preemptions": L.preempt[:upto].copy(), "replica": L.repl[:upto].copy()})
        for name in self.COLUMNS:
            column = getattr(L, name)
            column[: n - upto] = column[upto:n]
        output[: n - upto] = output[upto:n]
        L.off[0] += upto
        self.n = n - upto

    def append(self, w: Workload, max_model_len: int, output: np.ndarray) -> np.ndarray:
        """Load chunk ``w`` after the live rows (growing when they fill the window); returns ``output``."""
        k = len(w)
        if self.n + k > self.capacity:
            size = max(2 * self.capacity, self.n + k)
            grown = self._alloc(size, int(self.L.off[0]))
            for name in self.COLUMNS:
                getattr(grown, name)[: self.n] = getattr(self.L, name)[: self.n]
            output = np.concatenate((output[: self.n], np.zeros(size - self.n, np.int64)))
            self.L = grown
        L, a, b = self.L, self.n, self.n + k
        inp = w.input_tokens
        out = np.minimum(w.output_tokens, np.maximum(max_model_len - inp, 1))
        L.arrival[a:b], L.inp[a:b], L.tok[a:b], output[a:b] = w.arrival_s, inp, inp + out, out
        L.first_tok[a:b] = L.finish[a:b] = L.first_sched[a:b] = np.nan
        L.gen[a:b], L.preempt[a:b], L.repl[a:b], L.nextw[a:b] = 0, 0, -1, -1
        L.park[a:b] = L.fill[a:b] = 0
        L.status[a:b] = np.where(inp >= max_model_len, REJECTED, PENDING)
        self.n = b
        return output


def simulate_stream(chunks: Iterable[Workload], profile: Any, replicas: int, *, slo_ttft_s: float = 2.0,
                    slo_tpot_s: float = 0.1, router: str = "auto", waiting_tokens_limit: float | None = None,
                    kv_sample_s: float = 10.0, horizon_s: float = 86_400.0, window: int = 1 << 18,
                    progress: Callable[[int], None] | None = None,
                    on_retired: Retired | None = None) -> StreamedRun:
    """``fast_engine.simulate_fixed`` over ``chunks`` (consecutive pieces of one workload, arrivals sorted
    across them), holding about ``window`` requests at a time."""
    started = time.perf_counter()
    source: Iterator[Workload] = iter(chunks)
    tally = Tally(slo_ttft_s, slo_tpot_s, streamed=True)
    win = _Window(window)
    output = np.zeros(window, np.int64)
    q = fr.new_fleet(replicas, profile)
    itl, h, hp, G, Gf, kv = loop_buffers(replicas)
    limit = float(waiting_tokens_limit) if waiting_tokens_limit is not None else 0.0
    stop, last_arrival, peak = np.inf, 0.0, 0
    while True:  # load the next chunk, or say the stream ended
        chunk = next(source, None)
        if chunk is None:
            G[FINAL] = 1
            stop = last_arrival + horizon_s
        elif len(chunk):
            if not supports(chunk, router):
                raise ValueError(f"fast_stream: router={router!r}, prefix blocks={chunk.block_ids is not None}: "
                                 "a streamed run needs a fast-engine router and no prefix blocks")
            if float(chunk.arrival_s[0]) < last_arrival:
                raise ValueError(f"fast_stream: chunk {chunk.name!r} starts at {float(chunk.arrival_s[0]):g} s, "
                                 f"before the previous chunk's last arrival {last_arrival:g} s: chunks go in order")
            resolved = win.L.status[: win.n] != PENDING
            live = np.flatnonzero(~resolved)
            first_live = int(live[0]) if live.size else win.n
            win.retire(min(first_live, max(0, int(G[NXT] - win.L.off[0]))), tally, output, on_retired)
            output = win.append(chunk, profile.max_model_len, output)
            last_arrival = float(chunk.arrival_s[-1])
            G[NREQ] = win.L.off[0] + win.n
            peak = max(peak, win.capacity)
        else:
            continue
        while True:
            why = run_loop(q, win.L, h, hp, G, Gf, kv, stop, float(kv_sample_s), limit, router == "round-robin",
                           int(G[NREQ]))
            if why == GROW:
                hp, kv = grown(hp, kv, G)
                continue
            break
        if progress is not None:
            progress(int(G[NXT]))
        if why == DONE:
            break
    win.retire(win.n, tally, output, on_retired)
    fr.bin_runs(h)
    end = float(Gf[LAST])
    samples = kv[: G[NKV]]
    kv_usage = np.column_stack((samples[:, 0], samples[:, 1:].mean(axis=1), samples[:, 1:].max(axis=1),
                                np.full(len(samples), replicas))) if len(samples) else np.zeros((0, 4))
    gpu_seconds = sum(end * profile.tensor_parallel for _ in range(replicas))
    return StreamedRun(tally, itl, end, gpu_seconds, time.perf_counter() - started, kv_usage, win.preemptions,
                       profile.name,
                       {"prefix_cache_hit_rate": None, "overload_rejected": int(G[OVERLOAD]),
                        "streamed_window_peak": peak}, peak)
