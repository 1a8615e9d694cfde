"""Vectorised parsing of numeric CSV fields: integers, decimals and date-times on whole columns.

Each parser takes the chunk's bytes (``buf``, uint8) and the fields' byte offsets (``starts``/``ends``),
copies each field's bytes into a small (fields, width) matrix through a strided window view, and does the
digit arithmetic column by column, so the cost is a few numpy passes per chunk whatever the row count.
Each returns ``(values, bad)``: ``bad`` marks fields that are not of the expected form (their value is 0),
so the caller can name the first bad line. Nothing here raises on data.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MAX_INT_DIGITS = 18  # int64 holds any 18-digit decimal
MAX_FIELD = 40  # widest numeric field we gather; longer ones are bad
PAD = 64  # zero bytes a chunk carries past its end so windows never run off it
DOT, SPACE = 46, 32


def gather(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-aligned bytes of each field as an (n, width) uint8 matrix, and the lengths.

    Bytes past a field's end are whatever follows it in ``buf`` (a delimiter first): mask with the lengths.
    """
    lengths = ends - starts
    if starts.size and int(starts.max()) + width > buf.size:
        buf = np.concatenate((buf, np.zeros(width, np.uint8)))
    windows = sliding_window_view(buf, width)
    mat = windows[np.minimum(starts, windows.shape[0] - 1)]
    return mat, lengths


def _width(lengths: np.ndarray) -> int:
    return int(min(max(int(lengths.max()), 1), MAX_FIELD))


_U64 = np.uint64


def parse_uint(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative integers (``123``; ``123.0`` too, as some exporters write counts as floats).

    Fields of up to 8 bytes, i.e. every real token count, take a SWAR path: the field's last 8 bytes
    as one uint64, checked and converted with a few whole-word operations.
    """
    if starts.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    lengths = ends - starts
    if int(ends.min()) < 8:  # windows end at the field and must not start before the buffer
        buf, starts, ends = np.concatenate((np.zeros(8, np.uint8), buf)), starts + 8, ends + 8
    word = np.ascontiguousarray(sliding_window_view(buf, 8)[ends - 8]).view("<u8").ravel()
    pad_bits = (8 - np.clip(lengths, 0, 8)).astype(_U64) * _U64(8)  # leading bytes sit in the low bits
    low = np.where(pad_bits >= 64, _U64(0xFFFFFFFFFFFFFFFF), (_U64(1) << np.minimum(pad_bits, _U64(63))) - _U64(1))
    word = (word & ~low) | (_U64(0x3030303030303030) & low)  # left-pad with '0'
    high_ok = (word & _U64(0xF0F0F0F0F0F0F0F0)) == _U64(0x3030303030303030)
    low_ok = (((word & _U64(0x0F0F0F0F0F0F0F0F)) + _U64(0x0606060606060606)) & _U64(0xF0F0F0F0F0F0F0F0)) == 0
    bad = ~(high_ok & low_ok) | (lengths < 1) | (lengths > 8)
    v = ((word & _U64(0x0F0F0F0F0F0F0F0F)) * _U64(2561)) >> _U64(8)
    v = ((v & _U64(0x00FF00FF00FF00FF)) * _U64(6553601)) >> _U64(16)
    v = ((v & _U64(0x0000FFFF0000FFFF)) * _U64(42949672960001)) >> _U64(32)
    values = v.astype(np.int64)
    wide = np.flatnonzero((lengths > 8) & (lengths <= MAX_INT_DIGITS))
    if wide.size:  # 9-18 digits: the leading part parsed the same way, times 10**8
        high, high_bad = parse_uint(buf, starts[wide], ends[wide] - 8)
        ok = ~high_bad & (high_ok & low_ok)[wide]
        values[wide] += high * 10**8
        bad[wide[ok]] = False
    if bad.any():  # "12.0" and "1e3": decimals that are whole numbers
        idx = np.flatnonzero(bad & (lengths > 0) & (lengths <= MAX_FIELD))
        dec, dbad = parse_decimal(buf, starts[idx], ends[idx])
        whole = ~dbad & (dec >= 0) & (dec == np.floor(dec)) & (dec < 2.0**53)
        values[idx[whole]] = dec[whole].astype(np.int64)
        bad[idx[whole]] = False
    values[bad] = 0
    return values, bad


def parse_decimal(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finite decimal numbers (``-1.5``, ``2``, ``.5``; ``3e-4`` on a slow path); never nan or inf."""
    if starts.size == 0:
        return np.zeros(0), np.zeros(0, bool)
    lengths = ends - starts
    width = _width(lengths)
    mat, _ = gather(buf, starts, ends, width)
    cols = np.arange(width)
    neg = mat[:, 0] == ord("-")
    signed = neg | (mat[:, 0] == ord("+"))
    inside = (cols < lengths[:, None]) & ~((cols == 0) & signed[:, None])
    is_dot = inside & (mat == DOT)
    n_dot = is_dot.sum(axis=1)
    dot_at = np.where(n_dot > 0, np.argmax(is_dot, axis=1), lengths)
    digit = (mat - np.uint8(48)) < 10
    int_mask = inside & (cols < dot_at[:, None])
    frac_mask = inside & (cols > dot_at[:, None])
    bad = (lengths < 1) | (lengths > MAX_FIELD) | (inside & ~digit & ~is_dot).any(axis=1) | (n_dot > 1)
    bad |= ~(int_mask | frac_mask).any(axis=1) | (int_mask.sum(axis=1) > 15)
    whole = np.zeros(starts.size, np.int64)
    frac = np.zeros(starts.size, np.int64)
    denom = np.ones(starts.size, np.int64)
    for j in range(width):
        d = mat[:, j].astype(np.int64) - 48
        im, fm = int_mask[:, j], frac_mask[:, j] & (denom < 10**17)
        whole = np.where(im, whole * 10 + d, whole)
        frac = np.where(fm, frac * 10 + d, frac)
        denom = np.where(fm, denom * 10, denom)
    # up to 15 digits in all, mantissa and power of ten are exact floats, so one division rounds
    # correctly (as strtod does); longer numbers are within an ulp or two
    exact = (int_mask.sum(axis=1) + frac_mask.sum(axis=1)) <= 15
    mantissa = np.where(exact, whole * np.where(exact, denom, 1) + frac, 0)
    values = np.where(exact, mantissa / denom, whole + frac / denom)
    values = np.where(neg, -values, values)
    if bad.any():  # exponents and other forms float() takes; nan, inf and '_' stay bad
        for i in np.flatnonzero(bad & (lengths > 0) & (lengths <= MAX_FIELD)):
            text = buf[starts[i] : ends[i]].tobytes()
            try:
                v = float(text)
            except ValueError:
                continue
            if np.isfinite(v) and b"_" not in text and abs(v) < 1e300:
                values[i], bad[i] = v, False
    values[bad] = 0.0
    return values, bad


_DAYS_BEFORE_MONTH = np.array([0, 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334], dtype=np.int64)
_MONTH_LEN = np.array([31, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)
_POW9 = 10 ** np.arange(8, -1, -1, dtype=np.int64)


def _minute_ns(head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unix ns of ``YYYY-MM-DD HH:MM`` (the first 16 bytes of each row) and a bad mask."""
    d = head[:, :16].astype(np.int64) - 48
    digit = (d >= 0) & (d <= 9)
    bad = ~digit[:, [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15]].all(axis=1)
    bad |= (head[:, 4] != ord("-")) | (head[:, 7] != ord("-")) | (head[:, 13] != ord(":"))
    bad |= (head[:, 10] != SPACE) & (head[:, 10] != ord("T"))
    year = d[:, 0] * 1000 + d[:, 1] * 100 + d[:, 2] * 10 + d[:, 3]
    month, day = d[:, 5] * 10 + d[:, 6], d[:, 8] * 10 + d[:, 9]
    hour, minute = d[:, 11] * 10 + d[:, 12], d[:, 14] * 10 + d[:, 15]
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    month = np.where((month >= 1) & (month <= 12), month, 0)
    bad |= (month == 0) | (day < 1) | (day > _MONTH_LEN[month] + (leap & (month == 2))) | (hour > 23) | (minute > 59)
    y = year - 1
    days = y * 365 + y // 4 - y // 100 + y // 400 - 719162  # 719162: days from 0001-01-01 to 1970-01-01
    days += _DAYS_BEFORE_MONTH[month] + (leap & (month > 2)) + day - 1
    return (days * 1440 + hour * 60 + minute) * 60_000_000_000, bad


def parse_timestamp_ns(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``YYYY-MM-DD HH:MM:SS[.f...][Z|±HH:MM]`` (``T`` also separates) to Unix nanoseconds, UTC.

    Consecutive rows of a trace mostly share their minute, so the date arithmetic runs only where the
    16-byte ``YYYY-MM-DD HH:MM`` prefix changes; every row still has all its bytes checked.
    """
    if starts.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    lengths = ends - starts
    width = int(min(max(int(lengths.max()) + 1, 32), MAX_FIELD + 1))  # >= 1 byte after the longest field
    mat, _ = gather(buf, starts, ends, width)
    return timestamp_ns_matrix(mat, lengths)


def timestamp_ns_matrix(mat: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``parse_timestamp_ns`` on fields already left-aligned in an (n, >= 32) uint8 matrix.

    Each row must hold a non-digit byte right after its field (a delimiter or a NUL).
    """
    n = mat.shape[0]
    prefix = np.ascontiguousarray(mat[:, :16]).view(np.uint64)
    new = np.ones(n, bool)
    new[1:] = (prefix[1:, 0] != prefix[:-1, 0]) | (prefix[1:, 1] != prefix[:-1, 1])
    heads = np.flatnonzero(new)
    head_ns, head_bad = _minute_ns(mat[heads])
    owner = np.cumsum(new) - 1
    bad = head_bad[owner] | (lengths < 19) | (lengths > MAX_FIELD) | (mat[:, 16] != ord(":"))
    tens, ones = mat[:, 17] - np.uint8(48), mat[:, 18] - np.uint8(48)
    bad |= (tens >= 10) | (ones >= 10)
    sec = tens.astype(np.int64) * 10 + ones
    bad |= sec > 60
    # fraction: '.' then a run of digits (nanoseconds from its first nine), then the zone; rows are
    # grouped by layout (fraction length), which a trace almost never varies, so each group is sliced
    has_frac = mat[:, 19] == DOT
    run = np.argmin((mat[:, 20:] - np.uint8(48)) < 10, axis=1)  # first non-digit; the delimiter after is one
    bad |= has_frac & (run == 0)
    tz_at = np.where(has_frac, 20 + run, 19)
    values = head_ns[owner] + sec * 1_000_000_000
    for at in np.flatnonzero(np.bincount(tz_at)):
        sel = slice(None) if tz_at[0] == at and (tz_at == at).all() else np.flatnonzero(tz_at == at)
        group = mat[sel]
        if at > 20:
            digits = min(int(at) - 20, 9)
            frac = (group[:, 20 : 20 + digits] - np.uint8(48)).astype(np.int64) @ _POW9[9 - digits :]
            values[sel] += frac * 10 ** (9 - digits)
        values[sel] -= _zone_s(group, int(at), lengths[sel], bad, sel) * 1_000_000_000
    values[bad] = 0
    return values, bad


def _zone_s(group: np.ndarray, at: int, lengths: np.ndarray, bad: np.ndarray, sel: slice | np.ndarray) -> np.ndarray:
    """UTC offset in seconds of rows whose zone starts at byte ``at``: none, ``Z`` or ``±HH:MM``; marks bad rows."""
    if at + 7 <= group.shape[1] and len(group) > 1:  # a whole trace in one zone: check bytes, parse once
        zone = group[:, at : at + 7]
        if (zone == zone[0]).all() and (lengths == lengths[0]).all():
            one = np.zeros(1, bool)
            offset = _zone_s(group[:1], at, lengths[:1], one, slice(None))
            bad[sel] |= one[0]
            return np.full(len(group), offset[0])
    tail = lengths - at
    sign = group[:, at] if at < group.shape[1] else np.zeros(len(group), np.uint8)
    is_off = (tail == 6) & ((sign == ord("+")) | (sign == ord("-")))
    bad[sel] |= ~((tail == 0) | ((tail == 1) & (sign == ord("Z"))) | is_off)
    if not is_off.any() or at + 6 > group.shape[1]:
        return np.zeros(len(group), np.int64)
    off = group[:, at + 1 : at + 6].astype(np.int64) - 48
    ok = ((off[:, [0, 1, 3, 4]] >= 0) & (off[:, [0, 1, 3, 4]] <= 9)).all(axis=1) & (off[:, 2] == ord(":") - 48)
    bad[sel] |= is_off & ~ok
    off_s = (off[:, 0] * 10 + off[:, 1]) * 3600 + (off[:, 3] * 10 + off[:, 4]) * 60
    return np.where(is_off, np.where(sign == ord("-"), -off_s, off_s), 0)
