"""Trace loading speed on a large Azure-2024-style file, side by side with the obvious peers.

Generates (once, cached) a CSV in the Azure LLM inference 2024 layout: ``TIMESTAMP,ContextTokens,
GeneratedTokens`` with ``2024-05-10 00:00:00.009930+00:00`` timestamps, a week-long arrival stream and
lognormal lengths, ``--rows`` rows (the real conversation trace has ~27 M). Then times:

- ``leadscale``: ``simulator.readers.load_trace`` on the whole file (numpy, chunked, every column parsed);
- ``csv module``: ``csv.reader`` + ``int`` + ``datetime.fromisoformat`` into lists, then numpy arrays
  (what one writes without thinking), on the first ``--peer-rows`` rows;
- ``numpy.loadtxt``: numpy's C parser on the two *integer* columns only (it cannot parse the timestamps
  without a per-row Python converter), on the same rows.

Rows per CPU second for each (best of ``--repeat``), and leadscale's ratio over each peer. CPU time,
not wall time, because the machine is shared; still, compare the ratios more than the absolute numbers.

    python benchmarks/bench_readers.py                     # 5 M rows
    python benchmarks/bench_readers.py --rows 27000000     # the real trace's size (~1.1 GB on disk)
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BASE = dt.datetime(2024, 5, 10, tzinfo=dt.UTC)
HEADER = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """Zero-padded decimal digits of non-negative ints as an (n, width) uint8 matrix of ASCII bytes."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return ((values[:, None] // powers) % 10 + 48).astype(np.uint8)


def _rows_bytes(micros: np.ndarray, inp: np.ndarray, out: np.ndarray) -> bytes:
    """CSV lines for one block of rows, built with numpy (variable-width token fields included)."""
    n = micros.size
    days, rest = np.divmod(micros, 86_400_000_000)
    dates = np.array([list((BASE + dt.timedelta(days=int(d))).strftime("%Y-%m-%d ").encode())
                      for d in range(int(days.max()) + 1)], dtype=np.uint8)
    secs, us = np.divmod(rest, 1_000_000)
    hh, mm, ss = secs // 3600, (secs // 60) % 60, secs % 60
    stamp = np.concatenate((dates[days], _digits(hh, 2), np.full((n, 1), ord(":"), np.uint8), _digits(mm, 2),
                            np.full((n, 1), ord(":"), np.uint8), _digits(ss, 2), np.full((n, 1), ord("."), np.uint8),
                            _digits(us, 6), np.frombuffer(b"+00:00,", np.uint8)[None, :].repeat(n, 0)), axis=1)
    len_in, len_out = np.floor(np.log10(inp)).astype(int) + 1, np.floor(np.log10(out)).astype(int) + 1
    width = stamp.shape[1] + len_in + 1 + len_out + 1
    starts = np.concatenate(([0], np.cumsum(width)[:-1]))
    buf = np.empty(int(width.sum()), np.uint8)
    buf[starts[:, None] + np.arange(stamp.shape[1])] = stamp
    for values, lengths, offset, tail in ((inp, len_in, stamp.shape[1], ord(",")),
                                          (out, len_out, stamp.shape[1] + len_in + 1, ord("\n"))):
        digits = _digits(values, 6)
        keep = np.arange(6) >= 6 - lengths[:, None]
        pos = (starts + offset)[:, None] + np.arange(6) - (6 - lengths[:, None])
        buf[pos[keep]] = digits[keep]
        buf[starts + offset + lengths] = tail
    return buf.tobytes()


def generate(path: Path, rows: int, seed: int = 0, block: int = 1_000_000) -> None:
    """A week of Azure-2024-style rows: Poisson arrivals, lognormal lengths like the conversation trace."""
    rng = np.random.default_rng(seed)
    mean_gap_us = 7 * 86_400_000_000 / rows
    tmp = path.with_suffix(".part")
    with tmp.open("wb") as f:
        f.write(HEADER)
        t = 0
        for lo in range(0, rows, block):
            n = min(block, rows - lo)
            micros = t + np.cumsum(rng.exponential(mean_gap_us, n)).astype(np.int64)
            t = int(micros[-1])
            inp = np.clip(np.rint(rng.lognormal(np.log(1020), 0.5, n)), 1, 99_999).astype(np.int64)
            out = np.clip(np.rint(rng.lognormal(np.log(129), 0.99, n)), 1, 99_999).astype(np.int64)
            f.write(_rows_bytes(micros, inp, out))
    tmp.rename(path)


def peer_csv(path: Path, rows: int) -> int:
    """The obvious reader: csv module, Python ints and datetimes, then numpy arrays."""
    times, ins, outs = [], [], []
    with path.open(newline="") as f:
        reader = csv.reader(f)
        next(reader)
        for k, (ts, i, o) in enumerate(reader):
            if k == rows:
                break
            times.append(dt.datetime.fromisoformat(ts).timestamp())
            ins.append(int(i))
            outs.append(int(o))
    t = np.array(times)
    _ = (t - t.min(), np.array(ins, np.int64), np.array(outs, np.int64))
    return len(times)


def peer_loadtxt(path: Path, rows: int) -> int:
    """numpy's own C-level text parser, integer columns only."""
    return int(np.loadtxt(path, delimiter=",", skiprows=1, usecols=(1, 2), dtype=np.int64, max_rows=rows).shape[0])


def timed(fn, *args, repeat: int = 1) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Best CPU seconds of ``repeat`` runs (CPU time, not wall: the machine is shared) and rows read."""
    best, n = float("inf"), 0
    for _ in range(repeat):
        start = time.process_time()
        n = fn(*args)
        best = min(best, time.process_time() - start)
    return best, n


def main(argv: list[str] | None = None) -> int:
    from simulator.readers import load_trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=5_000_000, help="rows in the generated file")
    ap.add_argument("--peer-rows", type=int, default=1_000_000, help="rows the (slow) peers read")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "leadscale-bench",
                    help="where the generated file is cached")
    ap.add_argument("--repeat", type=int, default=2, help="runs per reader; the best CPU time counts")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"azure2024_{args.rows}.csv"
    if not path.exists():
        secs, _ = timed(lambda: generate(path, args.rows))
        print(f"generated {path} ({path.stat().st_size / 1e6:.0f} MB) in {secs:.1f} s", file=sys.stderr)
    ours_s, ours_n = timed(lambda: len(load_trace(path)), repeat=args.repeat)
    peer_rows = min(args.peer_rows, args.rows)
    csv_s, csv_n = timed(peer_csv, path, peer_rows, repeat=args.repeat)
    txt_s, txt_n = timed(peer_loadtxt, path, peer_rows, repeat=args.repeat)
    rate = {"leadscale": ours_n / ours_s, "csv_module": csv_n / csv_s, "numpy_loadtxt_ints_only": txt_n / txt_s}
    result = {"rows": ours_n, "file_mb": round(path.stat().st_size / 1e6, 1), "leadscale_s": round(ours_s, 2),
              "rows_per_s": {k: round(v) for k, v in rate.items()},
              "ratio_vs_csv_module": round(rate["leadscale"] / rate["csv_module"], 2),
              "ratio_vs_numpy_loadtxt": round(rate["leadscale"] / rate["numpy_loadtxt_ints_only"], 2)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{ours_n:,} rows ({result['file_mb']} MB) loaded in {ours_s:.2f} s of CPU")
        for k, v in rate.items():
            print(f"  {k:<26} {v:>12,.0f} rows/s")
        print(f"  leadscale / csv module      x{result['ratio_vs_csv_module']}")
        print(f"  leadscale / numpy.loadtxt   x{result['ratio_vs_numpy_loadtxt']} (loadtxt skips the timestamps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
