"""The serving process's threads on one CPU (``leadscale serve --pin-serving-cpu``).

Why: a unary gRPC call costs the serving process about 16 hand-offs between its threads (gRPC's event-engine
threads, the polling thread, the worker that runs the handler, and back: docs/scaler.md). When those threads sit
on different cores, a hand-off wakes an idle core (an inter-processor interrupt, dear on a virtual machine); on
one core the next thread runs in place. One CPU is enough for the serving side: its handlers answer from memory
and hold Python's interpreter lock, so they never ran on two cores at once, and a CPU it shares with a busy
neighbour still gives it its fair share.

The decision process is left where the kernel puts it. Confining it to the other CPUs was tried: on a 2-core
machine under load (a test run beside a soak) it starved on its one core while the other had room, and its
answers aged past the staleness limit. Measured (docs/scaler.md, Benchmark, "2026-12-07, seventh session").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

LOG = logging.getLogger("leadscale.cpu_affinity")


def serving_cpu(allowed: Iterable[int]) -> frozenset[int] | None:
    """The CPU the serving process runs on: the highest-numbered of ``allowed`` (the lowest are where node daemons
    and device interrupts usually land). None with fewer than two: there is no choice to make."""
    cpus = sorted(set(allowed))
    return frozenset(cpus[-1:]) if len(cpus) >= 2 else None


def allowed_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on (its affinity mask, which a container's cpuset bounds); None where the
    platform cannot pin threads (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return frozenset(os.sched_getaffinity(0))


def describe(cpus: Iterable[int]) -> str:
    """CPUs as a log line writes them: ``2`` or ``0,1``."""
    return ",".join(str(c) for c in sorted(cpus))


def pin_process(cpus: frozenset[int]) -> None:
    """Put every thread of this process on ``cpus``; threads started later inherit it from their creator, and a
    child process started later from the thread that starts it.
    ``sched_setaffinity`` on a process id moves only that one thread, so each thread of ``/proc/self/task`` is
    moved; raises ``OSError`` when the kernel refuses (a CPU outside the cpuset)."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # no /proc: the calling thread, which is the only one a caller at start-up has
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended since the listing
            continue


def pin_or_warn(cpus: frozenset[int] | None, who: str) -> bool:
    """``pin_process`` for ``who`` (a process's name in the log), logging instead of failing: placement is a
    performance setting, never a reason for the scaler not to serve."""
    if cpus is None:
        return False
    try:
        pin_process(cpus)
    except OSError as exc:
        LOG.warning("cannot place the %s process on CPU %s (%s): left where the kernel puts it", who, describe(cpus),
                    exc)
        return False
    return True
