"""Which CPUs ``leadscale serve``'s two processes run on (``--cpu-affinity``).

Why: a unary gRPC call costs the serving process about 16 hand-offs between its threads (gRPC's event-engine
threads, the polling thread, the worker that runs the handler, and back: docs/scaler.md). When those threads sit
on different cores, a hand-off wakes an idle core (an inter-processor interrupt, dear on a virtual machine); on
one core the next thread runs in place. ``split`` puts the serving process's threads on one CPU of those the
scaler may use and the decision process on the rest, so an evaluation round never takes the core an RPC waits
for. One CPU is enough for the serving side: its handlers answer from memory and hold Python's interpreter lock,
so they never ran on two cores at once. Measured on this project's 2-core machine (docs/scaler.md, Benchmark,
"2026-12-07, seventh session"): a tenth less CPU in the serving process, bursts done in half the time.
``none`` leaves placement to the kernel.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

LOG = logging.getLogger("leadscale.cpu_affinity")
SPLIT = "split"
NONE = "none"
CHOICES = (SPLIT, NONE)


@dataclass(frozen=True)
class Placement:
    """The CPUs of each process: ``serving`` (one) and ``decisions`` (the others)."""

    serving: frozenset[int]
    decisions: frozenset[int]

    def describe(self) -> str:
        return f"serving on CPU {_cpus(self.serving)}, decisions on CPU {_cpus(self.decisions)}"


def _cpus(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def plan(allowed: Iterable[int]) -> Placement | None:
    """``split``'s placement over the ``allowed`` CPUs: the serving process on the highest-numbered one (the lowest
    are where node daemons and device interrupts usually land), the decision process on all the others. None with
    fewer than two CPUs: there is nothing to split."""
    cpus = sorted(set(allowed))
    if len(cpus) < 2:
        return None
    return Placement(frozenset(cpus[-1:]), frozenset(cpus[:-1]))


def allowed_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on (its affinity mask, which a container's cpuset bounds); None where the
    platform cannot pin threads (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return frozenset(os.sched_getaffinity(0))


def pin_process(cpus: frozenset[int]) -> int:
    """Put every thread of this process on ``cpus``; threads started later inherit it from their creator.
    Returns how many threads were moved. ``sched_setaffinity`` on a process id moves only that one thread, so
    each thread of ``/proc/self/task`` is moved; raises ``OSError`` when the kernel refuses (a CPU outside the
    cpuset)."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # no /proc: the calling thread, which is the only one a caller at start-up has
    moved = 0
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended since the listing
            continue
        moved += 1
    return moved


def pin_or_warn(cpus: frozenset[int] | None, who: str) -> bool:
    """``pin_process`` for ``who`` (a process's name in the log), logging instead of failing: placement is a
    performance setting, never a reason for the scaler not to serve."""
    if cpus is None:
        return False
    try:
        pin_process(cpus)
    except (OSError, AttributeError) as exc:
        LOG.warning("cannot place the %s process on CPU %s (%s): left where the kernel puts it", who, _cpus(cpus),
                    exc)
        return False
    return True
