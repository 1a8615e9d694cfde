"""KEDA-shaped load for ``bench_getmetrics.py --soak``: many scaled objects polled on the HPA's cadence, bursts,
churn, and what the server process costs meanwhile (CPU, RSS), measured from outside with psutil.

- ``Steady``: every object gets KEDA's three calls (GetMetricSpec, GetMetrics, IsActive) once per
  ``period_s`` (15 s: the HPA sync), objects spread evenly over the period, open loop: calls go out on
  schedule whatever the earlier ones are doing, so a server stall shows up instead of being waited
  out. Latency runs from the send; how late the dispatcher itself sent (this process's own GIL and
  timer) is kept apart as ``lag``.
- ``burst``: ``clients`` channels at once, each making ``calls`` GetMetrics back to back (a KEDA
  restart, or many ScaledObjects reconciled together).
- churn: ``Steady.rename`` gives a slice of the objects new names; the old ones are no longer asked
  about and must idle out of the server (``--idle-timeout``), or its memory would grow.
- ``Sampler``: the server's CPU seconds and RSS every ``every_s``.

A peer server gets the same schedule with the gRPC health ``Check`` in place of each call, so its
figures are the floor of serving that many calls from Python gRPC on this machine at this moment.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Call = Callable[[], Any]
"""Starts one RPC and returns its future."""


@dataclass
class Recorder:
    """Latencies (ms) and errors per kind of call, filled from the futures' callbacks."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    error_samples: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def track(self, kind: str, future: Any, since: float) -> None:
        def done(f: Any) -> None:
            took = (time.perf_counter() - since) * 1000
            with self.lock:
                if f.exception() is not None:
                    self.errors[kind] += 1
                    if len(self.error_samples) < 5:
                        self.error_samples.append(f"{kind}: {f.exception()}")
                else:
                    self.latencies[kind].append(took)

        future.add_done_callback(done)

    def clear(self) -> None:
        """Forget everything so far (the end of a warm-up)."""
        with self.lock:
            self.latencies.clear()
            self.errors.clear()
            self.error_samples.clear()

    def summary(self, kind: str) -> dict[str, float]:
        values = np.asarray(self.latencies.get(kind, []))
        p50, p99 = (np.percentile(values, [50, 99]) if values.size else (np.nan, np.nan))
        return {"calls": int(values.size) + self.errors.get(kind, 0), "errors": self.errors.get(kind, 0),
                "p50_ms": float(p50), "p99_ms": float(p99), "max_ms": float(values.max()) if values.size else np.nan}


class Steady:
    """KEDA's polling of ``objects`` scaled objects every ``period_s``, spread evenly, in a thread."""

    def __init__(self, calls: Callable[[int, int], list[tuple[str, Call]]], objects: int, period_s: float,
                 recorder: Recorder) -> None:
        self.calls, self.objects, self.period_s, self.recorder = calls, objects, period_s, recorder
        self.generation = [0] * objects
        """Bumped by ``rename``: object i is asked about under name (i, generation[i])."""
        self.fresh: set[int] = set()
        """Objects renamed since their last poll: their first calls are recorded as kind ``first``."""
        self.lag_ms: list[float] = []
        """How late each tick was sent, against its schedule."""
        self.bursting = threading.Event()
        """Set while a burst runs: calls sent meanwhile are recorded as ``<kind> in burst``."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-load", daemon=True)

    def start(self) -> Steady:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def rename(self, indices: range) -> None:
        for i in indices:
            self.generation[i % self.objects] += 1
            self.fresh.add(i % self.objects)

    def _run(self) -> None:
        step = self.period_s / self.objects
        start, k = time.perf_counter(), 0
        while not self._stop.is_set():
            scheduled = start + k * step
            delay = scheduled - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            i = k % self.objects
            first = i in self.fresh
            self.fresh.discard(i)
            sent = time.perf_counter()
            self.lag_ms.append((sent - scheduled) * 1000)
            during = " in burst" if self.bursting.is_set() else ""
            for kind, call in self.calls(i, self.generation[i]):
                self.recorder.track(f"first {kind}" if first else kind + during, call(), sent)
            k += 1


def burst(calls: list[Call], clients: int, per_client: int, recorder: Recorder, kind: str = "burst") -> float:
    """``clients`` chains of ``per_client`` calls back to back, all started at once; seconds until all are done."""
    done = threading.Semaphore(0)
    started = time.perf_counter()

    def chain(client: int, left: int) -> None:
        since = time.perf_counter()
        future = calls[client % len(calls)]()
        recorder.track(kind, future, since)
        future.add_done_callback(lambda _f: chain(client, left - 1) if left > 1 else done.release())

    for client in range(clients):
        chain(client, per_client)
    for _ in range(clients):
        done.acquire(timeout=60)
    return time.perf_counter() - started


@dataclass
class Sampler:
    """CPU seconds and RSS of one process and its children every ``every_s``, in a thread."""

    pid: int
    every_s: float = 5.0
    samples: list[tuple[float, float, float, float]] = field(default_factory=list)
    """(monotonic seconds, CPU seconds user+system, RSS MiB, the children's share of those CPU seconds)."""
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Sampler:
        import psutil

        self._process = psutil.Process(self.pid)
        threading.Thread(target=self._run, name="sampler", daemon=True).start()
        return self

    def sample(self) -> tuple[float, float, float, float]:
        """The process and its children together (``leadscale serve`` computes decisions in a child), and the
        children's CPU apart: which of the two processes a change moved."""
        import psutil

        cpu_s = rss = children_s = 0.0
        for process in [self._process, *self._process.children(recursive=True)]:
            try:
                cpu, mem = process.cpu_times(), process.memory_info()
            except psutil.NoSuchProcess:  # a child that just exited
                continue
            cpu_s += cpu.user + cpu.system
            rss += mem.rss
            if process.pid != self.pid:
                children_s += cpu.user + cpu.system
        point = (time.monotonic(), cpu_s, rss / 2**20, children_s)
        self.samples.append(point)
        return point

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self.sample()

    def restart(self) -> None:
        """Forget the samples so far and take a first one now (the end of a warm-up)."""
        self.samples.clear()
        self.sample()

    def summary(self, after_s: float) -> dict[str, float]:
        """CPU cores and RSS over the samples taken ``after_s`` seconds or more after the first one."""
        t0 = self.samples[0][0]
        points = [p for p in self.samples if p[0] - t0 >= after_s] or self.samples
        (ta, ca, _, da), (tb, cb, _, db) = points[0], points[-1]
        rss = np.asarray([p[2] for p in points])
        minutes = np.asarray([(p[0] - points[0][0]) / 60 for p in points])
        slope = float(np.polyfit(minutes, rss, 1)[0]) if len(points) >= 3 and minutes[-1] > 0 else 0.0
        third = max(1, len(rss) // 3)
        return {"cpu_cores": (cb - ca) / (tb - ta) if tb > ta else np.nan,
                "children_cpu_cores": (db - da) / (tb - ta) if tb > ta else np.nan,
                "rss_first_mib": float(rss[:third].mean()),
                "rss_last_mib": float(rss[-third:].mean()), "rss_max_mib": float(rss.max()),
                "rss_slope_mib_per_min": slope, "seconds": tb - ta}
