"""Trace readers: public LLM-serving traces into a columnar :class:`Workload`, format detected or given.

Formats (``fmt``):
- ``azure``: ``TIMESTAMP,ContextTokens,GeneratedTokens``; 2023 timestamps ``2023-11-16 18:15:46.6805900``
  and 2024 ones ``2024-05-10 00:00:00.009930+00:00`` (any ``+HH:MM``/``Z`` offset, converted to UTC).
- ``mooncake``: JSON lines ``{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}``;
  ``hash_ids`` (512-token prefix blocks) become ``block_ids``/``block_offsets``.
- ``burstgpt``: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`` (seconds); rows
  with 0 response tokens are failed requests: skipped and counted in ``skipped_rows``.
- ``generic``: ``arrival_s,input_tokens,output_tokens`` (seconds, any extra columns ignored).
- ``lengths``: prompt/output lengths only (e.g. ``num_prefill_tokens,num_decode_tokens``): every request
  arrives at 0 (an offline batch); mostly used to resample lengths under a synthetic arrival process.

CSV formats are read in chunks, never a Python object per row: the plain case through numpy.loadtxt's C
reader plus whole-column timestamp arithmetic (``numparse``), anything unusual through a careful numpy
scanner (``csvscan``) that names the bad line; both give the same result. Mooncake files are small
(thousands of lines) and use ``json`` per line. In every format, rows whose prompt or output length
is 0 are skipped and counted, arrivals are sorted and shifted to 0, and the original start is kept in
``Workload.origin_s``. Malformed input raises :class:`TraceFormatError` (file, line, column, value,
what was expected) and nothing else; with ``bad_rows="skip"`` malformed rows are left out instead and
counted in ``Workload.malformed_rows`` (the first one's error in ``meta["first_malformed"]``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeGuard

import numpy as np

from simulator.csvscan import (
    BadRows,
    Chunk,
    TraceFormatError,
    decode_header,
    fast_columns,
    first_bad,
    iter_chunks,
    open_binary,
    read_first_line,
    split_rows,
)
from simulator.numparse import parse_decimal, parse_timestamp_ns, parse_uint, timestamp_ns_matrix
from simulator.workload import Workload, from_unsorted, take_ragged

__all__ = ["BAD_ROWS", "FORMATS", "TraceFormatError", "detect_format", "load_lengths", "load_trace", "malformed_note"]

FORMATS: tuple[str, ...] = ("azure", "mooncake", "burstgpt", "generic", "lengths")
BAD_ROWS: tuple[str, ...] = ("fail", "skip")
"""What a malformed row does: stop the read with its error, or be left out and counted (``malformed_rows``)."""
INPUT_ALIASES = ("input_tokens", "num_prefill_tokens", "prompt_tokens", "input_length", "contexttokens",
                 "request tokens", "prompt_len", "input_len")
OUTPUT_ALIASES = ("output_tokens", "num_decode_tokens", "completion_tokens", "output_length", "generatedtokens",
                  "response tokens", "output_len")
MAX_TOKENS = 1 << 40  # far beyond any context window; larger is a corrupt field, not a request


@dataclass(frozen=True)
class CsvLayout:
    """Which header names carry time and lengths in a CSV format, and how time is written."""

    time: tuple[str, ...]
    time_kind: str  # "timestamp" (ISO date-time), "seconds" (decimal) or "none"
    input: tuple[str, ...]
    output: tuple[str, ...]


LAYOUTS: dict[str, CsvLayout] = {
    "azure": CsvLayout(("timestamp",), "timestamp", ("contexttokens",), ("generatedtokens",)),
    "burstgpt": CsvLayout(("timestamp",), "seconds", ("request tokens",), ("response tokens",)),
    "generic": CsvLayout(("arrival_s",), "seconds", ("input_tokens",), ("output_tokens",)),
    "lengths": CsvLayout((), "none", INPUT_ALIASES, OUTPUT_ALIASES),
}


def _header_format(names: list[str]) -> str | None:
    """The CSV format a header belongs to, or None."""
    low = {n.lower() for n in names}
    if {"timestamp", "contexttokens", "generatedtokens"} <= low:
        return "azure"
    if {"timestamp", "request tokens", "response tokens"} <= low:
        return "burstgpt"
    if {"arrival_s", "input_tokens", "output_tokens"} <= low:
        return "generic"
    if low & set(INPUT_ALIASES) and low & set(OUTPUT_ALIASES):
        return "lengths"
    return None


def detect_format(path: str | Path) -> str:
    """Guess a file's format from its first line (JSON object → mooncake, else by CSV header names)."""
    with _open(path) as stream:
        first = read_first_line(stream, path)
    return _detect(first, path)


def format_of(first: bytes, path: str | Path) -> str:
    """The format a file's first line names (``detect_format`` without reopening the file)."""
    return _detect(first, path)


def _detect(first: bytes, path: str | Path) -> str:
    if first.lstrip().startswith(b"{"):
        return "mooncake"
    fmt = _header_format(decode_header(first, path))
    if fmt is None:
        raise TraceFormatError(path, 1, None, first[:120].decode("utf-8", "replace"),
                               "a known header: azure 'TIMESTAMP,ContextTokens,GeneratedTokens', burstgpt "
                               "'Timestamp,...,Request tokens,Response tokens,...', generic "
                               "'arrival_s,input_tokens,output_tokens', lengths 'input_tokens,output_tokens' "
                               "(or num_prefill_tokens,num_decode_tokens), or mooncake JSON lines")
    return fmt


def open_trace(path: str | Path) -> BinaryIO:
    """The file (gzip or not) as a binary stream; an unreadable one is a ``TraceFormatError``."""
    return _open(path)


def _open(path: str | Path) -> BinaryIO:
    try:
        return open_binary(path)
    except OSError as exc:
        raise TraceFormatError(path, None, None, exc.strerror or str(exc), "a readable trace file") from exc


def load_trace(path: str | Path, fmt: str | None = None, name: str | None = None,
               chunk_bytes: int = 1 << 24, bad_rows: str = "fail") -> Workload:
    """Read a trace file into a Workload; ``fmt`` is one of FORMATS, or None to detect it.

    ``bad_rows="fail"`` (default): the first malformed row raises its ``TraceFormatError``. ``"skip"``:
    malformed rows are left out, counted in ``Workload.malformed_rows``, and the first one's error is kept
    in ``meta["first_malformed"]``. A bad header, an unreadable file or no usable row always raise.
    """
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"trace format {fmt!r} is unknown; allowed: {', '.join(FORMATS)} (or none to detect)")
    if bad_rows not in BAD_ROWS:
        raise ValueError(f"bad_rows={bad_rows!r} is unknown; allowed: {', '.join(BAD_ROWS)}")
    skip = BadRows() if bad_rows == "skip" else None
    with _open(path) as stream:
        first = read_first_line(stream, path)
        found = fmt or _detect(first, path)
        if found == "mooncake":
            w = _read_mooncake(path, stream, first, skip)
        else:
            w = _read_csv(path, stream, first, found, chunk_bytes, skip)
    meta = {"format": found, "path": str(path)}
    if skip is not None and skip.first is not None:
        meta["first_malformed"] = str(skip.first)
    return Workload(w.arrival_s, w.input_tokens, w.output_tokens, name=name or Path(path).name,
                    block_ids=w.block_ids, block_offsets=w.block_offsets, skipped_rows=w.skipped_rows,
                    malformed_rows=skip.count if skip else 0, origin_s=w.origin_s, block_tokens=w.block_tokens,
                    meta=meta)


def malformed_note(workload: Workload) -> str | None:
    """One line for a command's stderr when rows were skipped as malformed; None when none were."""
    if not workload.malformed_rows:
        return None
    where = workload.meta.get("path", workload.name)
    return (f"{where}: skipped {workload.malformed_rows} malformed row{'s' if workload.malformed_rows > 1 else ''} "
            f"(--bad-rows skip); the first: {workload.meta.get('first_malformed', '?')}")


def load_lengths(path: str | Path, fmt: str | None = None, bad_rows: str = "fail") -> tuple[np.ndarray, np.ndarray]:
    """(input_tokens, output_tokens) of every usable request in a trace of any format, for resampling."""
    w = load_trace(path, fmt, bad_rows=bad_rows)
    return w.input_tokens, w.output_tokens


def column_index(names: list[str], accepted: tuple[str, ...], fmt: str, path: str | Path, header: bytes) -> int:
    """Index of the first header name among ``accepted``; a ``TraceFormatError`` when none is there."""
    low = [n.lower() for n in names]
    for alias in accepted:
        if alias in low:
            return low.index(alias)
    raise TraceFormatError(path, 1, None, header[:120].decode("utf-8", "replace"),
                           f"a {fmt} header with a column named one of {', '.join(accepted)}")


def csv_chunks(path: str | Path, stream: BinaryIO, first: bytes, fmt: str, chunk_bytes: int,
               skip: BadRows | None) -> Iterator[tuple[Chunk, list[np.ndarray]]]:
    """A CSV trace chunk by chunk after its header line ``first``: each chunk of whole lines with its parsed
    columns (input tokens, output tokens and, where the format has one, the raw time: integer ns since the
    epoch for timestamps, float seconds otherwise). ``load_trace`` gathers them; ``trace_stream`` does not."""
    layout = LAYOUTS[fmt]
    names = decode_header(first, path)
    cols = [column_index(names, layout.input, fmt, path, first), column_index(names, layout.output, fmt, path, first)]
    if layout.time:
        cols.append(column_index(names, layout.time, fmt, path, first))
    for chunk in iter_chunks(stream, path, first_line=2, chunk_bytes=chunk_bytes):
        yield chunk, _fast_chunk(chunk, names, cols, layout) or _careful_chunk(chunk, names, cols, layout, path, skip)


def _read_csv(path: str | Path, stream: BinaryIO, first: bytes, fmt: str, chunk_bytes: int,
              skip: BadRows | None) -> Workload:
    layout = LAYOUTS[fmt]
    columns: list[list[np.ndarray]] = [[] for _ in range(3 if layout.time else 2)]
    for _, parsed in csv_chunks(path, stream, first, fmt, chunk_bytes, skip):
        for store, values in zip(columns, parsed, strict=True):
            store.append(values)
    inp, out = (_concat(columns[k], np.int64) for k in (0, 1))
    if not layout.time:
        return _finish(path, np.zeros(inp.size), inp, out, 0.0)
    stamps = _concat(columns[2], np.int64 if layout.time_kind == "timestamp" else np.float64)
    if layout.time_kind != "timestamp":
        return _finish(path, stamps, inp, out, 0.0)
    start_ns = int(stamps.min()) if stamps.size else 0
    stamps -= start_ns  # in place: a 27 M-row trace has no memory to spare
    arrival = stamps.astype(np.float64)
    del stamps
    arrival /= 1e9
    return _finish(path, arrival, inp, out, start_ns / 1e9)


def _concat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    """One column from its chunks, emptying the list as it goes so the chunks can be freed."""
    out = np.concatenate(parts) if parts else np.zeros(0, dtype)
    parts.clear()
    return out


def _fast_chunk(chunk: Chunk, names: list[str], cols: list[int], layout: CsvLayout) -> list[np.ndarray] | None:
    """The plain case through numpy's C reader; None when anything looks off (the careful path reports it)."""
    kinds = ["int", "int"] + ([] if len(cols) == 2 else ["bytes" if layout.time_kind == "timestamp" else "float"])
    got = fast_columns(chunk, len(names), cols, kinds)
    if got is None:
        return None
    for tokens in got[:2]:
        if tokens.size and (tokens.min() < 0 or tokens.max() > MAX_TOKENS):
            return None
    if len(got) == 3 and layout.time_kind == "timestamp":
        mat = got[2]
        lengths = _nul_terminated_lengths(mat)
        got[2], bad = timestamp_ns_matrix(mat, lengths)
        if bad.any():
            return None
    elif len(got) == 3 and not np.isfinite(got[2]).all():
        return None
    return got


def _nul_terminated_lengths(mat: np.ndarray) -> np.ndarray:
    """Length of each NUL-padded row; one look per row when, as usual, every field has the first one's length."""
    first = int(np.argmax(mat[0] == 0)) if (mat[0] == 0).any() else mat.shape[1]
    if 0 < first < mat.shape[1] and (mat[:, first] == 0).all() and (mat[:, first - 1] != 0).all():
        return np.full(mat.shape[0], first)
    return np.where((mat == 0).any(axis=1), np.argmax(mat == 0, axis=1), mat.shape[1])


def _careful_chunk(chunk: Chunk, names: list[str], cols: list[int], layout: CsvLayout,
                   path: str | Path, skip: BadRows | None) -> list[np.ndarray]:
    """Field by field with numpy: the first bad field raises, naming its line and column (with ``skip``:
    every row with a bad field is left out and counted, the first error kept)."""
    found = skip if skip is not None else BadRows()  # rows with a wrong field count, to compare lines below
    rows = split_rows(chunk, len(names), path, names, found)
    out = []
    row_bad = np.zeros(len(rows), bool)
    first_error: tuple[int, TraceFormatError] | None = None
    for k, col in enumerate(cols):
        starts, ends = rows.starts[:, col], rows.ends[:, col]
        if k < 2:
            values, bad = parse_uint(rows.buf, starts, ends)
            bad |= values > MAX_TOKENS
            what = f"a token count: an integer in 0..{MAX_TOKENS}"
        elif layout.time_kind == "timestamp":
            values, bad = parse_timestamp_ns(rows.buf, starts, ends)
            what = "a date-time like 2023-11-16 18:15:46.6805900 or 2024-05-10 00:00:00.009930+00:00"
        else:
            values, bad = parse_decimal(rows.buf, starts, ends)
            what = "a finite number of seconds"
        if bad.any():
            line, text = first_bad(rows, bad, col)
            if first_error is None or line < first_error[0]:
                first_error = (line, TraceFormatError(path, line, names[col], text, what))
            row_bad |= bad
        out.append(values)
    if first_error is not None:
        found.add(first_error[1], int(np.count_nonzero(row_bad)))
    if skip is None and found.first is not None:
        raise found.first  # the earliest malformed line of the chunk, whatever was wrong with it
    return [values[~row_bad] for values in out] if row_bad.any() else out


def _finish(path: str | Path, arrival: np.ndarray, inp: np.ndarray, out: np.ndarray, origin: float,
            block_ids: np.ndarray | None = None, block_offsets: np.ndarray | None = None) -> Workload:
    """Drop zero-length requests (counted), refuse an empty result, sort and shift arrivals."""
    keep = (inp > 0) & (out > 0)
    skipped = int(keep.size - np.count_nonzero(keep))
    if not keep.any():
        raise TraceFormatError(path, None, None, f"{keep.size} rows, {skipped} skipped (0 prompt or output tokens)",
                               "at least one request with prompt and output tokens >= 1")
    if skipped:
        arrival, inp, out = arrival[keep], inp[keep], out[keep]
        if block_ids is not None and block_offsets is not None:
            block_ids, block_offsets = take_ragged(block_ids, block_offsets, np.flatnonzero(keep))
    return from_unsorted(arrival, inp, out, block_ids=block_ids, block_offsets=block_offsets,
                         skipped_rows=skipped, origin_s=origin)


def _read_mooncake(path: str | Path, stream: BinaryIO, first: bytes, skip: BadRows | None) -> Workload:
    stamps: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    ids: list[int] = []
    lengths: list[int] = []
    line_no = 1
    raw: bytes | None = first
    while raw is not None:
        text = raw.strip()
        if text:
            try:
                rec = _json_object(path, line_no, text)
                stamp = _number(path, line_no, rec, "timestamp", "a finite number of milliseconds")
                counts = _count(path, line_no, rec, "input_length"), _count(path, line_no, rec, "output_length")
                block_list = rec.get("hash_ids", [])
                if not isinstance(block_list, list) or not all(_is_int(b) and 0 <= b < 1 << 63 for b in block_list):
                    raise TraceFormatError(path, line_no, "hash_ids", str(block_list)[:80],
                                           "a list of block ids (integers in 0..2**63-1)")
            except TraceFormatError as error:
                if skip is None:
                    raise
                skip.add(error)
            else:
                stamps.append(stamp)
                ins.append(counts[0])
                outs.append(counts[1])
                ids.extend(block_list)
                lengths.append(len(block_list))
        try:
            nxt = stream.readline()
        except (OSError, EOFError) as exc:
            raise TraceFormatError(path, line_no + 1, None, str(exc), "a readable JSON-lines file") from exc
        raw = nxt if nxt else None
        line_no += 1
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(np.asarray(lengths, np.int64), out=offsets[1:])
    arrival = np.asarray(stamps, np.float64) / 1000.0
    return _finish(path, arrival, np.asarray(ins, np.int64), np.asarray(outs, np.int64), 0.0,
                   np.asarray(ids, np.int64), offsets)


def _json_object(path: str | Path, line: int, text: bytes) -> dict[str, object]:
    try:
        rec = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise TraceFormatError(path, line, None, text[:80].decode("utf-8", "replace"),
                               f"a JSON object ({exc.__class__.__name__})") from None
    if not isinstance(rec, dict):
        raise TraceFormatError(path, line, None, text[:80].decode("utf-8", "replace"),
                               'a JSON object like {"timestamp": 0, "input_length": 10, "output_length": 5}')
    return rec


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(path: str | Path, line: int, rec: dict[str, object], key: str, expected: str) -> float:
    v = rec.get(key)
    if not isinstance(v, int | float) or isinstance(v, bool) or abs(v) > 1e15 or not math.isfinite(v):
        raise TraceFormatError(path, line, key, v, expected)
    return float(v)


def _count(path: str | Path, line: int, rec: dict[str, object], key: str) -> int:
    v = rec.get(key)
    if not _is_int(v) or not 0 <= v <= MAX_TOKENS:
        raise TraceFormatError(path, line, key, v, f"a token count: an integer in 0..{MAX_TOKENS}")
    return int(v)
