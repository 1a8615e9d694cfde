"""A trace file as consecutive workloads, so a week of requests never sits in memory at once.

``readers.load_trace`` reads a whole file into one :class:`Workload` (24 bytes a request, and the sort
needs it all). ``iter_trace`` reads the same CSV formats chunk by chunk (the same parser,
``readers.csv_chunks``) and yields each chunk's requests as a workload for ``fast_stream.simulate_stream``.
What the chunks hold, concatenated (and through ``select_stream``), is exactly what ``load_trace``
followed by ``select_window`` and ``rate_scale`` gives: the same rows dropped (0 prompt or output
tokens), the same arrivals to the bit.

What it cannot do, and says so: sort. A streamed file must list its requests in time order (logs do);
the first row earlier than the one before it is a ``TraceFormatError`` naming its line, column and
value. Formats without arrival times (``lengths``) and with prefix blocks (``mooncake``: the compiled
loop has no prefix cache) are refused up front, as is ``load_scale`` (its random copies are drawn over
the whole trace).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from simulator.csvscan import BadRows, Chunk, TraceFormatError, decode_header, read_first_line, split_rows
from simulator.numparse import parse_decimal, parse_timestamp_ns, parse_uint
from simulator.readers import (
    BAD_ROWS,
    FORMATS,
    LAYOUTS,
    MAX_TOKENS,
    column_index,
    csv_chunks,
    format_of,
    open_trace,
)
from simulator.workload import Workload

STREAMABLE = tuple(f for f in FORMATS if f in LAYOUTS and LAYOUTS[f].time)
"""Formats with an arrival time per row: the ones a streamed read can follow."""


PIECE_ROWS = 1 << 16
"""Requests per yielded workload: below ``simulate_stream``'s window (2^18), so the window never has to grow
to take a piece (a 4 MiB chunk of an Azure trace is ~170k rows)."""


class StreamCounts:
    """What a streamed read left out, known only once it has read to the end (a summary reports it)."""

    def __init__(self) -> None:
        self.requests = 0
        self.skipped_rows = 0
        self.malformed = BadRows()


def iter_trace(path: str | Path, fmt: str | None = None, *, bad_rows: str = "fail", chunk_bytes: int = 1 << 22,
               max_rows: int = PIECE_ROWS, counts: StreamCounts | None = None) -> Iterator[Workload]:
    """The requests of a time-ordered CSV trace, ``chunk_bytes`` of lines parsed at a time and yielded in
    pieces of at most ``max_rows``, arrivals shifted to start at the first request (as ``load_trace``).
    ``counts``, when given, is filled as the read goes (rows skipped for 0 tokens, malformed rows
    skipped with ``bad_rows="skip"``)."""
    if bad_rows not in BAD_ROWS:
        raise ValueError(f"bad_rows={bad_rows!r} is unknown; allowed: {', '.join(BAD_ROWS)}")
    if not (isinstance(max_rows, int) and max_rows >= 1):
        raise ValueError(f"max_rows={max_rows!r}: expected an integer >= 1")
    counts = counts if counts is not None else StreamCounts()
    skip = counts.malformed if bad_rows == "skip" else None
    name = Path(path).name
    with open_trace(path) as stream:
        first = read_first_line(stream, path)
        found = fmt or format_of(first, path)
        if found not in STREAMABLE:
            raise TraceFormatError(path, None, None, f"format {found!r}",
                                   f"a trace with an arrival time per row to stream ({', '.join(STREAMABLE)}); "
                                   "read it whole instead (without --stream)")
        timestamps = LAYOUTS[found].time_kind == "timestamp"
        origin_raw: int | float | None = None  # the first row's raw time: load_trace's shift
        first_kept: float | None = None  # the first kept request's arrival after that shift: from_unsorted's
        last = -math.inf
        for index, (chunk, (inp, out, raw)) in enumerate(csv_chunks(path, stream, first, found, chunk_bytes, skip)):
            if raw.size == 0:
                continue
            if origin_raw is None:
                origin_raw = int(raw[0]) if timestamps else 0.0
            arrival = ((raw - origin_raw).astype(np.float64) / 1e9) if timestamps else raw.astype(np.float64)
            disorder = np.flatnonzero(np.diff(arrival, prepend=last) < 0)
            if disorder.size:
                raise _out_of_order(path, chunk, found, first, skip, int(disorder[0]))
            last = float(arrival[-1])
            keep = (inp > 0) & (out > 0)
            counts.skipped_rows += int(keep.size - np.count_nonzero(keep))
            if not keep.all():
                arrival, inp, out = arrival[keep], inp[keep], out[keep]
            if arrival.size == 0:
                continue
            if first_kept is None:
                first_kept = float(arrival[0])
            if first_kept != 0.0:
                arrival = arrival - first_kept
            for at in range(0, arrival.size, max_rows):
                yield Workload(arrival[at:at + max_rows], inp[at:at + max_rows], out[at:at + max_rows],
                               name=f"{name} chunk {index}", meta={"format": found, "path": str(path)})


def select_stream(chunks: Iterable[Workload], start_s: float = 0.0, end_s: float | None = None,
                  rate_scale: float = 1.0, counts: StreamCounts | None = None) -> Iterator[Workload]:
    """``select_window`` then ``rate_scale`` over time-ordered chunks: only ``[start_s, end_s)`` kept,
    re-timed to start there, divided by ``rate_scale``; reading stops at the first arrival past
    ``end_s``. No request at all in the range is an error (``load_workload``'s rule)."""
    start, end = float(start_s), math.inf if end_s is None else float(end_s)
    if not (math.isfinite(start) and start >= 0):
        raise ValueError(f"--window start {start_s!r}: expected a finite number of seconds >= 0")
    if math.isnan(end) or end <= start:
        raise ValueError(f"--window end {end_s!r}: expected a number of seconds > the start {start:g}")
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise ValueError(f"--rate-scale {rate_scale!r}: expected a finite number > 0")
    counts = counts if counts is not None else StreamCounts()
    for chunk in chunks:
        lo, hi = (int(i) for i in np.searchsorted(chunk.arrival_s, [start, end], side="left"))
        if hi > lo:
            arrival = chunk.arrival_s[lo:hi] - start
            if rate_scale != 1.0:
                arrival = arrival / rate_scale
            counts.requests += hi - lo
            yield Workload(arrival, chunk.input_tokens[lo:hi], chunk.output_tokens[lo:hi], name=chunk.name,
                           meta=chunk.meta)
        if hi < len(chunk):
            break  # past end_s: what follows is later still
    if counts.requests == 0:
        raise ValueError(f"no requests in the selected time range [{start:g}, {end:g}) s")


def _out_of_order(path: str | Path, chunk: Chunk, fmt: str, first: bytes, skip: BadRows | None,
                  row: int) -> TraceFormatError:
    """The error for the ``row``-th parsed row of ``chunk`` arriving before the row above it: its line
    number is found by cutting the chunk into rows again (the fast path does not keep them)."""
    layout, names = LAYOUTS[fmt], decode_header(first, path)
    tokens = [column_index(names, aliases, fmt, path, first) for aliases in (layout.input, layout.output)]
    col = column_index(names, layout.time, fmt, path, first)
    rows = split_rows(chunk, len(names), path, names, BadRows())  # rows with a wrong field count left out
    parse = parse_timestamp_ns if layout.time_kind == "timestamp" else parse_decimal
    bad = parse(rows.buf, rows.starts[:, col], rows.ends[:, col])[1]
    for k in tokens:  # with bad rows skipped, the parsed rows are the ones whose every field parses
        values, unparsed = parse_uint(rows.buf, rows.starts[:, k], rows.ends[:, k])
        bad |= unparsed | (values > MAX_TOKENS)
    usable = np.flatnonzero(~bad) if skip is not None else np.arange(len(rows))
    at = int(usable[min(row, usable.size - 1)])
    return TraceFormatError(path, int(rows.lines[at]), names[col], rows.text(at, col),
                            "arrival times in non-decreasing order: a streamed read cannot sort (read the "
                            "trace whole, without --stream, to sort it in memory)")
