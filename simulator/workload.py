"""The columnar ``Workload`` every simulator part consumes, and the transforms that select and scale it.

A workload is a handful of numpy arrays, one entry per request, never a Python object per request, so
a 27 M-row trace fits in memory and transforms run at numpy speed. Readers (``readers.py``) and
generators (``synthetic.py``) build it; the engine replays it.

Scaling, and when to use which:
- ``rate_scale(w, k)`` compresses time by ``k``: the same requests arrive ``k`` times faster, so the
  duration shrinks by ``k`` and every burst and lull keeps its shape, only quicker. Use it to squeeze a
  long trace into a short run, or to model a faster-arriving copy of the same traffic.
- ``load_scale(w, k, rng)`` keeps the clock: duration and shape stay, each request becomes ``k`` of
  them (fractional ``k`` by sampling), extra copies jittered by a fraction of a second. Use it to ask
  "what if this traffic were ``k`` times bigger" without changing how long the day is: it is what
  autoscaling studies need, because cold starts and scale-down delays are fixed in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests as parallel, read-only arrays, ``arrival_s`` sorted and starting at 0.

    ``block_ids``/``block_offsets`` (optional, CSR layout): request ``i``'s prefix blocks are
    ``block_ids[block_offsets[i]:block_offsets[i + 1]]``, each naming ``block_tokens`` tokens of its
    prompt; equal ids mean a shared prefix. ``origin_s`` is the original time of arrival 0 (Unix seconds
    for timestamped traces, the file's own clock otherwise), ``skipped_rows`` the input rows left out
    (failed requests, zero lengths).
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    name: str = "workload"
    block_ids: np.ndarray | None = None
    block_offsets: np.ndarray | None = None
    skipped_rows: int = 0
    origin_s: float = 0.0
    malformed_rows: int = 0
    """Rows a reader left out as malformed (``bad_rows="skip"``); ``skipped_rows`` counts well-formed ones
    that are not requests (failed, zero lengths)."""
    block_tokens: int = 512
    meta: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        arrival = np.ascontiguousarray(self.arrival_s, dtype=np.float64)
        inp = np.ascontiguousarray(self.input_tokens, dtype=np.int64)
        out = np.ascontiguousarray(self.output_tokens, dtype=np.int64)
        n = arrival.size
        if arrival.ndim != 1 or inp.shape != (n,) or out.shape != (n,):
            raise ValueError(f"Workload arrays must be 1-D of one length: arrival_s {arrival.shape}, "
                             f"input_tokens {inp.shape}, output_tokens {out.shape}")
        if n and not np.isfinite(arrival).all():
            raise ValueError("Workload.arrival_s must be finite")
        if n and (arrival[0] < 0 or (arrival[1:] < arrival[:-1]).any()):
            raise ValueError("Workload.arrival_s must be sorted and >= 0")
        arr: np.ndarray | None
        for fname, arr in (("input_tokens", inp), ("output_tokens", out)):
            if n and arr.min() < 1:
                raise ValueError(f"Workload.{fname} must be >= 1, got {int(arr.min())}")
        if (self.block_ids is None) != (self.block_offsets is None):
            raise ValueError("Workload.block_ids and block_offsets go together: give both or neither")
        if self.block_ids is not None:
            ids = np.ascontiguousarray(self.block_ids, dtype=np.int64)
            offs = np.ascontiguousarray(self.block_offsets, dtype=np.int64)
            if offs.shape != (n + 1,) or offs[0] != 0 or offs[-1] != ids.size or (np.diff(offs) < 0).any():
                raise ValueError(f"Workload.block_offsets must be non-decreasing, of length {n + 1}, "
                                 f"from 0 to len(block_ids)={ids.size}")
            object.__setattr__(self, "block_ids", ids)
            object.__setattr__(self, "block_offsets", offs)
        if not isinstance(self.block_tokens, int) or self.block_tokens < 1:
            raise ValueError(f"Workload.block_tokens must be a positive int, got {self.block_tokens!r}")
        if not math.isfinite(self.origin_s):
            raise ValueError(f"Workload.origin_s must be finite, got {self.origin_s!r}")
        for fname, arr in (("arrival_s", arrival), ("input_tokens", inp), ("output_tokens", out),
                           ("block_ids", self.block_ids), ("block_offsets", self.block_offsets)):
            if arr is not None:  # read-only views: a frozen workload, and no copy of a 27 M-row trace
                view = arr.view()
                view.flags.writeable = False
                object.__setattr__(self, fname, view)

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    def __repr__(self) -> str:
        blocks = f", blocks={self.block_ids.size}" if self.block_ids is not None else ""
        return (f"Workload({self.name!r}, requests={len(self)}, duration_s={self.duration_s:.3f}, "
                f"skipped_rows={self.skipped_rows}, malformed_rows={self.malformed_rows}{blocks})")

    @property
    def has_blocks(self) -> bool:
        return self.block_ids is not None

    @property
    def duration_s(self) -> float:
        """Time of the last arrival (0 for an empty workload)."""
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def blocks(self, i: int) -> np.ndarray:
        """Prefix block ids of request ``i`` (empty when the workload carries none)."""
        if self.block_ids is None or self.block_offsets is None:
            return np.zeros(0, np.int64)
        return self.block_ids[self.block_offsets[i] : self.block_offsets[i + 1]]

    def take(self, index: np.ndarray, arrival_s: np.ndarray | None = None, **changes: object) -> Workload:
        """A workload of the requests at ``index`` (in that order), optionally with new arrival times."""
        index = np.asarray(index, dtype=np.int64)
        ids = offs = None
        if self.block_ids is not None and self.block_offsets is not None:
            ids, offs = take_ragged(self.block_ids, self.block_offsets, index)
        fields = {"name": self.name, "skipped_rows": self.skipped_rows, "malformed_rows": self.malformed_rows,
                  "origin_s": self.origin_s,
                  "block_tokens": self.block_tokens, "meta": dict(self.meta)}
        fields.update(changes)
        arrival = self.arrival_s[index] if arrival_s is None else arrival_s
        return Workload(arrival, self.input_tokens[index], self.output_tokens[index], block_ids=ids,
                        block_offsets=offs, **fields)  # type: ignore[arg-type]

    def summary(self) -> dict[str, float | int | str]:
        """Counts and means for logs and reports."""
        n = len(self)
        dur = self.duration_s
        return {
            "name": self.name,
            "requests": n,
            "skipped_rows": self.skipped_rows,
            "malformed_rows": self.malformed_rows,
            "duration_s": dur,
            "rate_per_s": n / dur if dur > 0 else 0.0,
            "input_mean": float(self.input_tokens.mean()) if n else 0.0,
            "output_mean": float(self.output_tokens.mean()) if n else 0.0,
            "input_max": int(self.input_tokens.max()) if n else 0,
            "output_max": int(self.output_tokens.max()) if n else 0,
        }


def take_ragged(ids: np.ndarray, offs: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Select rows of a CSR ragged array without a Python loop."""
    lengths = (offs[1:] - offs[:-1])[index]
    new_offs = np.zeros(index.size + 1, np.int64)
    np.cumsum(lengths, out=new_offs[1:])
    total = int(new_offs[-1])
    if total == 0:
        return np.zeros(0, np.int64), new_offs
    row = np.repeat(np.arange(index.size), lengths)
    pos = np.arange(total) - new_offs[row] + offs[index][row]
    return ids[pos], new_offs


def from_unsorted(arrival_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray,
                  **fields: object) -> Workload:
    """Build a workload from raw arrival times in any order: sorted (stably) and shifted to start at 0.

    ``origin_s`` in ``fields`` is taken as the clock of the raw times; the result's origin is that plus
    the first arrival. Block arrays, when given, are reordered with the requests.
    """
    arrival = np.asarray(arrival_s, dtype=np.float64)
    order = None if not (arrival[1:] < arrival[:-1]).any() else np.argsort(arrival, kind="stable")
    start = float(arrival.min()) if arrival.size else 0.0
    origin = float(fields.pop("origin_s", 0.0)) + start  # type: ignore[arg-type]
    shifted = arrival - start if start != 0.0 else arrival
    if order is None:
        return Workload(shifted, input_tokens, output_tokens, origin_s=origin, **fields)  # type: ignore[arg-type]
    raw = Workload(np.zeros(arrival.size), input_tokens, output_tokens, origin_s=origin, **fields)  # type: ignore[arg-type]
    return raw.take(order, arrival_s=shifted[order])


def select_window(w: Workload, start_s: float, end_s: float | None = None) -> Workload:
    """Requests arriving in ``[start_s, end_s)``, re-timed so ``start_s`` becomes 0 (idle head kept)."""
    end = math.inf if end_s is None else float(end_s)
    start = float(start_s)
    if not math.isfinite(start) or start < 0:
        raise ValueError(f"select_window start_s must be finite and >= 0, got {start_s!r}")
    if math.isnan(end) or end <= start:
        raise ValueError(f"select_window end_s must be > start_s={start}, got {end_s!r}")
    lo, hi = np.searchsorted(w.arrival_s, [start, end], side="left")
    index = np.arange(lo, hi)
    return w.take(index, arrival_s=w.arrival_s[lo:hi] - start, origin_s=w.origin_s + start,
                  name=f"{w.name}[{start:g}:{end:g}]")


def rate_scale(w: Workload, k: float) -> Workload:
    """Compress time by ``k`` (> 0): same requests, arrivals ``k`` times faster, duration divided by ``k``."""
    k = _positive("rate_scale", k)
    if k == 1.0:
        return w
    return w.take(np.arange(len(w)), arrival_s=w.arrival_s / k, name=f"{w.name}*rate{k:g}")


def load_scale(w: Workload, k: float, rng: np.random.Generator, jitter_s: float = 0.5) -> Workload:
    """Multiply load by ``k`` (> 0) on the same clock: each request becomes ``floor(k)`` copies plus one
    more with probability ``frac(k)``. The first copy keeps its time; extra copies move uniformly within
    ``±jitter_s`` (clipped to the trace's span). ``k < 1`` thins the trace. Deterministic for a seeded rng.
    """
    k = _positive("load_scale", k)
    if not math.isfinite(jitter_s) or jitter_s < 0:
        raise ValueError(f"load_scale jitter_s must be finite and >= 0, got {jitter_s!r}")
    if k == 1.0:
        return w
    n = len(w)
    whole, frac = math.floor(k), k - math.floor(k)
    copies = np.full(n, whole, dtype=np.int64) + (rng.random(n) < frac)
    index = np.repeat(np.arange(n), copies)
    first = np.zeros(index.size, dtype=bool)
    first[(np.cumsum(copies) - copies)[copies > 0]] = True
    jitter = rng.uniform(-jitter_s, jitter_s, index.size)
    arrival = w.arrival_s[index] + np.where(first, 0.0, jitter)
    arrival = np.clip(arrival, 0.0, w.duration_s)
    order = np.argsort(arrival, kind="stable")
    return w.take(index[order], arrival_s=arrival[order], name=f"{w.name}*load{k:g}")


def _positive(what: str, k: float) -> float:
    try:
        k = float(k)
    except (TypeError, ValueError):
        raise ValueError(f"{what} factor must be a number > 0, got {k!r}") from None
    if not math.isfinite(k) or k <= 0:
        raise ValueError(f"{what} factor must be finite and > 0, got {k!r}")
    return k
