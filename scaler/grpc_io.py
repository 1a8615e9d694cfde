"""gRPC's socket I/O done by the thread that polls for calls, not handed to EventEngine's thread pool.

Since grpcio 1.6x the server reads and writes its sockets on EventEngine's own threads, which then hand
each event to the thread that polls the completion queue, which hands the call to a worker: a unary call
cost the serving process 15 context switches (``/proc/<pid>/task/*/status``, 200 health Checks a second
on this 2-core VM), and a switch here costs tens of microseconds of CPU. With gRPC's two EventEngine
experiments for the listener and server endpoints turned off, the polling thread does the socket I/O
itself while it polls: 10 switches a call, and 11-15 % less CPU a call (docs/scaler.md, "2026-12-07,
sixth session": the whole ``leadscale serve`` answering GetMetrics, and a bare health server, alternated).

The switches are read by gRPC core once, when it is first loaded, from ``GRPC_EXPERIMENTS``, so they must be
in the environment before ``import grpc``: ``leadscale serve`` calls ``prefer_polling_io()`` first thing.
A user's own ``GRPC_EXPERIMENTS`` is left alone, and so is a grpcio release the saving was not measured on
(an experiment gRPC no longer knows is only an error line at start, but its I/O path may be gone too).
"""

from __future__ import annotations

import logging
import os
import sys
from importlib import metadata

LOG = logging.getLogger("leadscale.grpc_io")
EXPERIMENTS = "-event_engine_listener,-event_engine_for_all_other_endpoints"
MEASURED_ON = ("1.85.",)
"""grpcio releases (prefixes) on which the polling thread's I/O was measured cheaper and passes the tests."""


def prefer_polling_io() -> str:
    """Turn gRPC's EventEngine listener and endpoints off for this process, where that is safe and known to
    pay; returns what was done, for the start-up log."""
    if "GRPC_EXPERIMENTS" in os.environ:
        return f"GRPC_EXPERIMENTS={os.environ['GRPC_EXPERIMENTS']!r} as given"
    if "grpc" in sys.modules:
        return "gRPC was loaded already: its default I/O threads"
    try:
        version = metadata.version("grpcio")
    except metadata.PackageNotFoundError:
        return "grpcio is not installed"
    if not version.startswith(MEASURED_ON):
        return f"grpcio {version}: its default I/O threads (the polling thread's I/O was measured on 1.85)"
    os.environ["GRPC_EXPERIMENTS"] = EXPERIMENTS
    return f"grpcio {version}: socket I/O on the polling thread (GRPC_EXPERIMENTS={EXPERIMENTS})"
