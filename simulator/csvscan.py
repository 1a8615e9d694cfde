"""Vectorised CSV scanning for trace readers: bytes in, numpy columns out, no Python object per row.

A trace of 27 M rows cannot afford ``csv.reader`` (one list of strings per row). This module reads a
file in chunks of whole lines; ``fast_columns`` hands a plain chunk to numpy.loadtxt's C reader, and
``split_rows`` finds line and comma positions with numpy for the careful path, whose fields
``numparse`` converts on whole columns. Every problem becomes a :class:`TraceFormatError` that names
the file, the line, the column, the offending value and what was expected.

Supported CSV subset: comma-separated, one record per line (LF or CRLF), optional UTF-8 BOM, blank
lines ignored, fields may be padded with spaces or wrapped in double quotes, but quoted commas and
quoted newlines are not supported (traces never need them). ``.gz`` files are read transparently.
"""

from __future__ import annotations

import gzip
import io
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from simulator.numparse import PAD

NL, CR, COMMA, QUOTE, SPACE, TAB = 10, 13, 44, 34, 32, 9


class TraceFormatError(ValueError):
    """A trace file does not match its format; says where (file, line, column), what, and what was expected."""

    def __init__(self, path: str | Path, line: int | None, column: str | None, value: object, expected: str):
        self.path, self.line, self.column, self.value, self.expected = str(path), line, column, value, expected
        where = self.path if line is None else f"{self.path}:{line}"
        col = "" if column is None else f" column {column!r}:"
        super().__init__(f"{where}:{col} got {value!r}, expected {expected}")


def open_binary(path: str | Path) -> BinaryIO:
    """Open a trace for reading bytes, decompressing gzip when the file starts with its magic bytes."""
    raw = open(path, "rb")  # noqa: SIM115 - handed to the caller, who closes it
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def read_first_line(stream: BinaryIO, path: str | Path, limit: int = 1 << 20) -> bytes:
    """Read the header line (without BOM and line ending); the stream is left at the next line."""
    try:
        line = stream.readline(limit)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise TraceFormatError(path, 1, None, str(exc), "a readable (optionally gzip) text file") from exc
    if not line:
        raise TraceFormatError(path, 1, None, "", "a header line (the file is empty)")
    if not line.endswith(b"\n") and len(line) >= limit:
        raise TraceFormatError(path, 1, None, line[:60], f"a header line shorter than {limit} bytes")
    return line.removeprefix(b"\xef\xbb\xbf").rstrip(b"\r\n")


_ZEROS = bytes(PAD)


@dataclass
class BadRows:
    """Malformed rows a reader skipped (``bad_rows="skip"``): how many, and the first one's error."""

    count: int = 0
    first: TraceFormatError | None = None

    def add(self, error: TraceFormatError, n: int = 1) -> None:
        self.count += n
        if self.first is None or (error.line or 0) < (self.first.line or 0):
            self.first = error


@dataclass(frozen=True)
class Chunk:
    """Whole lines of a file as one uint8 array plus PAD zero bytes; ``first_line`` numbers its first line."""

    buf: np.ndarray
    first_line: int

    @property
    def data(self) -> memoryview:
        """The chunk's bytes without the padding."""
        return self.buf.data[: self.buf.size - PAD]


def iter_chunks(stream: BinaryIO, path: str | Path, first_line: int, chunk_bytes: int = 1 << 24) -> Iterator[Chunk]:
    """Yield chunks that end on a line boundary (the final one may lack a trailing newline)."""
    rest, line = b"", first_line
    while True:
        try:
            data = stream.read(chunk_bytes)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise TraceFormatError(path, line, None, str(exc), "a readable (optionally gzip) file") from exc
        if not data:
            if rest:
                yield Chunk(np.frombuffer(rest + b"\n" + _ZEROS, dtype=np.uint8), line)
            return
        cut = data.rfind(b"\n")
        if cut < 0:
            rest += data
            continue
        block = b"".join((rest, memoryview(data)[: cut + 1], _ZEROS))
        rest = data[cut + 1 :]
        buf = np.frombuffer(block, dtype=np.uint8)
        yield Chunk(buf, line)
        line += int(np.count_nonzero(buf == NL))


@dataclass(frozen=True)
class Rows:
    """Field boundaries of the non-blank rows of a chunk: ``starts``/``ends`` are (rows, columns) byte offsets."""

    buf: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    lines: np.ndarray  # 1-based line number of each row

    def __len__(self) -> int:
        return int(self.lines.size)

    def text(self, row: int, col: int) -> str:
        """The raw text of one field, for error messages."""
        raw = self.buf[self.starts[row, col] : self.ends[row, col]].tobytes()
        return raw.decode("utf-8", errors="replace")


def split_rows(chunk: Chunk, ncols: int, path: str | Path, header: list[str], skip: BadRows | None = None) -> Rows:
    """Cut a chunk into rows of exactly ``ncols`` fields, trimmed of spaces and surrounding quotes.

    A row with another field count raises, or with ``skip`` is left out and counted there.
    """
    buf = chunk.buf
    delims = np.flatnonzero((buf == COMMA) | (buf == NL))
    grid = _regular_grid(buf, delims, ncols)
    if grid is not None:  # fast path: every line has ncols fields, no blank lines
        row_start = np.concatenate(([0], grid[:-1, -1] + 1))
        row_end, inner = grid[:, -1].copy(), grid[:, :-1]
        lines = chunk.first_line + np.arange(row_end.size, dtype=np.int64)
    else:
        row_start, row_end, lines, inner = _irregular_rows(chunk, ncols, path, header, skip)
    has_cr = (row_end > row_start) & (buf[np.maximum(row_end - 1, 0)] == CR)
    row_end[has_cr] -= 1
    starts = np.concatenate((row_start[:, None], inner + 1), axis=1)
    ends = np.concatenate((inner, row_end[:, None]), axis=1)
    _trim(buf, starts, ends)
    return Rows(buf, starts, ends, lines)


def _regular_grid(buf: np.ndarray, delims: np.ndarray, ncols: int) -> np.ndarray | None:
    """Delimiter offsets as (rows, ncols) when every line has exactly ncols fields, else None."""
    if delims.size == 0 or delims.size % ncols:
        return None
    grid = delims.reshape(-1, ncols)
    kinds = buf[grid]
    if not (kinds[:, -1] == NL).all() or not (kinds[:, :-1] == COMMA).all():
        return None
    starts = np.concatenate(([0], grid[:-1, -1] + 1))
    if (grid[:, 0] == starts).any() and ncols == 1:
        return None  # blank lines in a one-column file
    return grid


def _irregular_rows(chunk: Chunk, ncols: int, path: str | Path, header: list[str],
                    skip: BadRows | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row bounds, line numbers and inner comma offsets, skipping blank lines; a wrong field count raises
    (or, with ``skip``, the row is left out and counted)."""
    buf = chunk.buf
    nl = np.flatnonzero(buf == NL)
    row_start = np.concatenate(([0], nl[:-1] + 1))
    row_end = nl.copy()
    lines = chunk.first_line + np.arange(nl.size, dtype=np.int64)
    blank = (row_end == row_start) | ((row_end == row_start + 1) & (buf[np.maximum(row_end - 1, 0)] == CR))
    if blank.any():
        keep = ~blank
        row_start, row_end, lines = row_start[keep], row_end[keep], lines[keep]
    commas = np.flatnonzero(buf == COMMA)
    first = np.searchsorted(commas, row_start)
    count = np.searchsorted(commas, row_end) - first
    wrong = np.flatnonzero(count != ncols - 1)
    if wrong.size:
        i = int(wrong[0])
        text = buf[row_start[i] : row_end[i]].tobytes().decode("utf-8", errors="replace").rstrip("\r")
        error = TraceFormatError(path, int(lines[i]), None, text[:120],
                                 f"{ncols} comma-separated fields like the header {','.join(header)!r}"
                                 " (quoted commas are not supported)")
        if skip is None:
            raise error
        skip.add(error, int(wrong.size))
        keep = count == ncols - 1
        row_start, row_end, lines, first = row_start[keep], row_end[keep], lines[keep], first[keep]
    inner = commas[first[:, None] + np.arange(ncols - 1)] if ncols > 1 else np.empty((row_start.size, 0), np.int64)
    return row_start, row_end, lines, inner


_SPECIAL = np.zeros(256, np.uint8)  # bytes _trim strips: 1 = space/tab, 2 = quote
_SPECIAL[[SPACE, TAB]] = 1
_SPECIAL[QUOTE] = 2


def _trim(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
    """Strip spaces/tabs and one pair of surrounding double quotes from every field, in place."""
    for _ in range(3):  # spaces, then quotes, then spaces inside the quotes
        first, last = _SPECIAL[buf[starts]], _SPECIAL[buf[np.maximum(ends - 1, 0)]]
        if not (first | last).any():  # the common case: one look at each field's ends
            return
        nonempty = starts < ends
        lead, trail = (first == 1) & nonempty, (last == 1) & nonempty
        while lead.any() or trail.any():
            starts[lead] += 1
            ends[trail] -= 1
            nonempty = starts < ends
            lead = (_SPECIAL[buf[starts]] == 1) & nonempty
            trail = (_SPECIAL[buf[np.maximum(ends - 1, 0)]] == 1) & nonempty
        quoted = (ends - starts >= 2) & (buf[starts] == QUOTE) & (buf[np.maximum(ends - 1, 0)] == QUOTE)
        starts[quoted] += 1
        ends[quoted] -= 1


def fast_columns(chunk: Chunk, ncols: int, usecols: list[int], kinds: list[str]) -> list[np.ndarray] | None:
    """The chunk's columns parsed by numpy.loadtxt's C reader, or None where the careful path must look.

    ``kinds`` per used column: ``"int"`` (int64), ``"float"`` (float64) or ``"bytes"`` (an (n, 41) uint8
    matrix, NUL after each field). Only the plain case is taken: exactly ``ncols`` fields on every line,
    no NUL byte (quotes and blank lines make a parse fail); anything else returns None, and the
    caller re-reads the chunk with ``split_rows`` and ``numparse``, which name the bad line.
    """
    buf = chunk.buf[: chunk.buf.size - PAD]
    rows = int(np.count_nonzero(buf == NL))
    if rows == 0 or int(np.count_nonzero(buf == COMMA)) != rows * (ncols - 1):
        return None
    if (buf == 0).any():  # a NUL would end a bytes field early without an error
        return None
    codes = {"int": "i8", "float": "f8", "bytes": "S41"}
    dtype = [(f"c{k}", codes[kind]) for k, kind in enumerate(kinds)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            table = np.loadtxt(io.BytesIO(chunk.data), delimiter=",", dtype=dtype, usecols=usecols, comments=None,
                               encoding="latin1", ndmin=1)
    except (ValueError, TypeError, OverflowError):
        return None
    if table.shape[0] != rows:  # blank lines: let the careful path number the lines
        return None
    out = []
    for k, kind in enumerate(kinds):
        col = np.ascontiguousarray(table[f"c{k}"])
        out.append(col.view(np.uint8).reshape(rows, 41) if kind == "bytes" else col)
    return out


def first_bad(rows: Rows, bad: np.ndarray, col: int) -> tuple[int, str]:
    """Line number and text of the first bad field in a column, for the error message."""
    i = int(np.flatnonzero(bad)[0])
    return int(rows.lines[i]), rows.text(i, col)


def decode_header(raw: bytes, path: str | Path) -> list[str]:
    """Header names, stripped of spaces and quotes; undecodable bytes are a format error."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, 1, None, raw[:60], "a UTF-8 header line") from exc
    return [name.strip().strip('"').strip() for name in text.split(",")]
