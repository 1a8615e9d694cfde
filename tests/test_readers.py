"""Trace readers: the shared traces match their README, every format round-trips, garbage only raises
TraceFormatError, and errors name file, line and column."""

from __future__ import annotations

import datetime as dt
import gzip
import itertools
import json
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.readers import FORMATS, TraceFormatError, detect_format, load_lengths, load_trace
from simulator.workload import Workload
from tests.conftest import TRACES, require

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def trace(name: str) -> Path:
    path = TRACES / name
    require(path.is_file(), f"the shared trace {path}")
    return path


# --- the shared traces: counts and means stated in ../shared/traces/README.md ---------------------------

def test_azure_conv_2023_matches_readme() -> None:
    w = load_trace(trace("azure_conv_2023.csv"))
    assert w.meta["format"] == "azure"
    assert len(w) == 19_366 and w.skipped_rows == 0
    assert 55 * 60 < w.duration_s < 60 * 60  # ~58 min
    assert len(w) / w.duration_s == pytest.approx(5.5, abs=0.1)
    assert w.input_tokens.mean() == pytest.approx(1155, abs=1) and w.input_tokens.max() == 14_050
    assert w.output_tokens.mean() == pytest.approx(211, abs=1) and w.output_tokens.max() == 1_000
    per_minute = np.bincount((w.arrival_s // 60).astype(int))[:-1]  # last minute is partial
    assert per_minute.max() > 1.8 * per_minute.min()  # bursty (README: 37-507 per minute, binned its own way)
    start = dt.datetime(2023, 11, 16, 18, 15, 46, 680590, tzinfo=dt.UTC).timestamp()
    assert w.origin_s == pytest.approx(start, abs=1e-6)
    assert w.arrival_s[0] == 0.0 and (np.diff(w.arrival_s) >= 0).all()


def test_mooncake_matches_readme_and_carries_prefix_blocks() -> None:
    w = load_trace(trace("mooncake_synthetic.jsonl"))
    assert w.meta["format"] == "mooncake"
    assert len(w) == 3_993
    assert 16 * 60 < w.duration_s < 18 * 60
    assert w.input_tokens.mean() == pytest.approx(15_325, abs=1) and w.input_tokens.max() == 191_378
    assert w.output_tokens.mean() < 500
    assert w.has_blocks and w.block_tokens == 512
    lengths = np.diff(w.block_offsets)
    assert (lengths == -(-w.input_tokens // 512)).all()  # one id per started 512-token block
    first = json.loads(trace("mooncake_synthetic.jsonl").read_text().splitlines()[0])
    assert w.blocks(0).tolist() == first["hash_ids"]
    assert np.unique(w.block_ids).size < w.block_ids.size  # shared prefixes exist


@pytest.mark.parametrize(("name", "count", "first_s", "span_s"), [
    ("sharegpt_300_at_10rps.csv", 300, 0.046926808, 29.1),
    ("sharegpt_pulses_6x50.csv", 300, 1.046926808, 103.8),
    ("sharegpt_steps_3x10.csv", 30, 1.0, 120.0),
], ids=["10rps", "pulses", "steps"])
def test_sharegpt_generic_traces(name: str, count: int, first_s: float, span_s: float) -> None:
    w = load_trace(trace(name))
    assert w.meta["format"] == "generic" and len(w) == count
    assert w.origin_s == pytest.approx(first_s) and w.duration_s == pytest.approx(span_s, abs=0.1)


def test_steps_trace_arrives_in_three_steps() -> None:
    w = load_trace(trace("sharegpt_steps_3x10.csv"))
    assert sorted(set(w.arrival_s.tolist())) == [0.0, 60.0, 120.0]
    assert np.bincount((w.arrival_s // 60).astype(int)).tolist() == [10, 10, 10]


def test_arxiv_lengths_file() -> None:
    path = trace("arxiv_summarization_lengths.csv")
    assert detect_format(path) == "lengths"
    w = load_trace(path)
    assert len(w) == 28_257 and w.duration_s == 0.0
    inp, out = load_lengths(path)
    assert inp.size == 28_257 and inp.mean() == pytest.approx(2588.08, abs=0.01)
    assert out.mean() == pytest.approx(291.43, abs=0.01)


@pytest.mark.parametrize("name", ["azure_conv_2023.csv", "mooncake_synthetic.jsonl", "sharegpt_300_at_10rps.csv"])
def test_explicit_format_equals_detected(name: str) -> None:
    path = trace(name)
    auto, explicit = load_trace(path), load_trace(path, detect_format(path))
    assert np.array_equal(auto.arrival_s, explicit.arrival_s)
    assert np.array_equal(auto.input_tokens, explicit.input_tokens)


def test_small_chunks_give_the_same_result() -> None:
    path = trace("azure_conv_2023.csv")
    big, small = load_trace(path), load_trace(path, chunk_bytes=4097)
    assert np.array_equal(big.arrival_s, small.arrival_s) and np.array_equal(big.output_tokens, small.output_tokens)


# --- writers for generated files ------------------------------------------------------------------------

T0 = dt.datetime(2024, 5, 10, tzinfo=dt.UTC)
rows_st = st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 50_000), st.integers(0, 5_000)),
                   min_size=1, max_size=40)


def expected(rows: list[tuple[int, int, int]], scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Arrival seconds (sorted, from 0), lengths and skipped count a reader must produce; time in units·scale."""
    kept = [r for r in rows if r[1] > 0 and r[2] > 0]
    t = np.array([r[0] for r in kept], dtype=np.int64)
    order = np.argsort(t, kind="stable")
    arr = (t[order] - t.min()) * scale if t.size else t
    return arr, np.array([r[1] for r in kept])[order], np.array([r[2] for r in kept])[order], len(rows) - len(kept)


_TMP = tempfile.TemporaryDirectory(prefix="leadscale-readers-")  # removed when the test process exits
_COUNT = itertools.count()


def write(text: str, suffix: str = ".csv", gz: bool = False) -> Path:
    path = Path(_TMP.name) / (f"trace{next(_COUNT)}" + suffix + (".gz" if gz else ""))
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def check(path: Path, rows: list[tuple[int, int, int]], scale: float, fmt: str | None = None) -> None:
    arr, inp, out, skipped = expected(rows, scale)
    if inp.size == 0:
        with pytest.raises(TraceFormatError, match="at least one request"):
            load_trace(path, fmt)
        return
    w = load_trace(path, fmt)
    np.testing.assert_allclose(w.arrival_s, arr, rtol=0, atol=1e-6)
    assert w.input_tokens.tolist() == inp.tolist() and w.output_tokens.tolist() == out.tolist()
    assert w.skipped_rows == skipped


def azure_time(us: int, style: str) -> str:
    t = T0 + dt.timedelta(microseconds=us)
    if style == "2023":
        return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond:06d}0"
    return t.strftime("%Y-%m-%d %H:%M:%S.%f") + "+00:00"


@FUZZ
@given(rows=rows_st, style=st.sampled_from(["2023", "2024"]), crlf=st.booleans(), tail=st.booleans(),
       gz=st.booleans())
def test_azure_round_trip(rows: list[tuple[int, int, int]], style: str, crlf: bool, tail: bool, gz: bool) -> None:
    nl = "\r\n" if crlf else "\n"
    body = nl.join(f"{azure_time(t, style)},{i},{o}" for t, i, o in rows)
    path = write("TIMESTAMP,ContextTokens,GeneratedTokens" + nl + body + (nl if tail else ""), gz=gz)
    assert detect_format(path) == "azure"
    check(path, rows, 1e-6)


@FUZZ
@given(rows=rows_st, spaces=st.booleans())
def test_generic_round_trip(rows: list[tuple[int, int, int]], spaces: bool) -> None:
    pad = " " if spaces else ""
    body = "\n".join(f"{t / 1000:.3f},{pad}{i}{pad},{o}" for t, i, o in rows)
    check(write("arrival_s,input_tokens,output_tokens\n" + body + "\n"), rows, 1e-3)


@FUZZ
@given(rows=rows_st)
def test_burstgpt_round_trip_skips_failed(rows: list[tuple[int, int, int]]) -> None:
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    body = "".join(f"{t},ChatGPT,{i},{o},{i + o},Conversation log\n" for t, i, o in rows)
    path = write(header + body)
    assert detect_format(path) == "burstgpt"
    check(path, rows, 1.0)


@FUZZ
@given(rows=rows_st, blocks=st.lists(st.lists(st.integers(0, 2**40), max_size=6), min_size=40, max_size=40))
def test_mooncake_round_trip(rows: list[tuple[int, int, int]], blocks: list[list[int]]) -> None:
    lines = [json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": b})
             for (t, i, o), b in zip(rows, blocks, strict=False)]
    path = write("\n".join(lines) + "\n", suffix=".jsonl")
    check(path, rows, 1e-3)
    kept = [(t, b) for (t, i, o), b in zip(rows, blocks, strict=False) if i > 0 and o > 0]
    if kept:
        w = load_trace(path)
        order = np.argsort([t for t, _ in kept], kind="stable")
        assert [w.blocks(k).tolist() for k in range(len(w))] == [kept[j][1] for j in order]


@FUZZ
@given(pairs=st.lists(st.tuples(st.integers(1, 10**6), st.integers(1, 10**5)), min_size=1, max_size=30))
def test_lengths_round_trip(pairs: list[tuple[int, int]]) -> None:
    body = "".join(f"{i},{o},{i + o},{i / o}\n" for i, o in pairs)
    inp, out = load_lengths(write("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n" + body))
    assert inp.tolist() == [i for i, _ in pairs] and out.tolist() == [o for _, o in pairs]


@FUZZ
@given(rows=rows_st, style=st.sampled_from(["2023", "2024", "generic"]))
def test_fast_and_careful_paths_agree(rows: list[tuple[int, int, int]], style: str) -> None:
    if style == "generic":
        text = "arrival_s,input_tokens,output_tokens\n" + "".join(f"{t / 1e3},{i},{o}\n" for t, i, o in rows)
    else:
        text = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
            f"{azure_time(t, style)},{i},{o}\n" for t, i, o in rows)
    path = write(text)
    try:
        fast = load_trace(path)
    except TraceFormatError:
        fast = None
    with mock.patch("simulator.readers.fast_columns", return_value=None):
        try:
            careful = load_trace(path)
        except TraceFormatError:
            careful = None
    assert (fast is None) == (careful is None)
    if fast is not None and careful is not None:
        assert np.array_equal(fast.arrival_s, careful.arrival_s) and fast.origin_s == careful.origin_s
        assert np.array_equal(fast.input_tokens, careful.input_tokens) and fast.skipped_rows == careful.skipped_rows


HEADERS = ["TIMESTAMP,ContextTokens,GeneratedTokens\n", "arrival_s,input_tokens,output_tokens\n",
           "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n", "input_tokens,output_tokens\n",
           '{"timestamp": 0, "input_length": 5, "output_length": 3}\n', ""]


def _load_or_error(path: Path, fmt: str | None, careful: bool) -> Workload | str:
    try:
        if careful:
            with mock.patch("simulator.readers.fast_columns", return_value=None):
                return load_trace(path, fmt)
        return load_trace(path, fmt)
    except TraceFormatError as exc:
        return str(exc)


@settings(max_examples=150, deadline=None)
@given(header=st.sampled_from(HEADERS[:4]), fmt=st.sampled_from([None, "azure", "generic", "burstgpt", "lengths"]),
       body=st.lists(st.sampled_from([*b'0123456789-:. ,\n\r"+ZTe\t', 0, 255]), max_size=120).map(bytes))
def test_fast_and_careful_paths_agree_on_garbage(header: str, fmt: str | None, body: bytes) -> None:
    path = write("")
    path.write_bytes(header.encode() + body)
    fast, careful = _load_or_error(path, fmt, False), _load_or_error(path, fmt, True)
    if isinstance(fast, str) or isinstance(careful, str):
        assert fast == careful
    else:
        assert np.array_equal(fast.arrival_s, careful.arrival_s)
        assert np.array_equal(fast.input_tokens, careful.input_tokens)
        assert np.array_equal(fast.output_tokens, careful.output_tokens)


def test_plain_files_take_the_fast_path() -> None:
    path = trace("azure_conv_2023.csv")
    with mock.patch("simulator.readers._careful_chunk", side_effect=AssertionError("careful path used")):
        assert len(load_trace(path)) == 19_366


# --- garbage never crashes ------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(header=st.sampled_from(HEADERS), body=st.binary(max_size=300), fmt=st.sampled_from([None, *FORMATS]))
def test_garbage_raises_only_trace_format_error(header: str, body: bytes, fmt: str | None) -> None:
    path = write("")
    path.write_bytes(header.encode() + body)
    try:
        w = load_trace(path, fmt)
    except TraceFormatError as exc:
        assert str(path) in str(exc)
        return
    assert len(w) >= 1 and np.isfinite(w.arrival_s).all()


@settings(max_examples=200, deadline=None)
@given(pos=st.integers(0, 10**6), junk=st.text(max_size=8), fmt_file=st.sampled_from(["azure", "generic", "burstgpt"]))
def test_mutated_valid_file_raises_only_trace_format_error(pos: int, junk: str, fmt_file: str) -> None:
    text = {"azure": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                     "2023-11-16 18:15:50.9951690,396,109\n",
            "generic": "arrival_s,input_tokens,output_tokens\n0.5,10,20\n1.5,30,40\n",
            "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                        "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,0,1087,API log\n"}[fmt_file]
    pos %= len(text) + 1
    path = write(text[:pos] + junk + text[pos:])
    try:
        w = load_trace(path)
    except TraceFormatError as exc:
        assert exc.line is None or exc.line >= 1
        return
    assert len(w) >= 1 and (w.input_tokens >= 1).all() and np.isfinite(w.arrival_s).all()


# --- precise errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "line", "column", "match"), [
    ("arrival_s,input_tokens,output_tokens\n0,1,1\n1,x2,3\n", 3, "input_tokens", "token count"),
    ("arrival_s,input_tokens,output_tokens\n0,1,1\n\n1,-2,3\n", 4, "input_tokens", "token count"),
    ("arrival_s,input_tokens,output_tokens\n0,1,1\nnan,2,3\n", 3, "arrival_s", "finite number"),
    ("arrival_s,input_tokens,output_tokens\n0,1,1\n1,2\n", 3, None, "3 comma-separated fields"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\n2023-13-16 18:15:46,1,1\n", 3,
     "TIMESTAMP", "date-time"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-02-29 18:15:46,1,1\n", 2, "TIMESTAMP", "date-time"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 3}\n{"timestamp": 1, "input_length": 5.5, '
     '"output_length": 3}\n', 2, "input_length", "token count"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 3}\n[1]\n', 2, None, "JSON object"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [1, "a"]}\n', 1, "hash_ids", "block ids"),
], ids=["letter", "negative-after-blank", "nan", "short-row", "month-13", "feb-29", "float-length", "not-object",
        "bad-hash"])
def test_errors_name_line_and_column(text: str, line: int, column: str | None, match: str) -> None:
    path = write(text)
    with pytest.raises(TraceFormatError, match=match) as err:
        load_trace(path)
    assert err.value.line == line and err.value.column == column and err.value.path == str(path)
    assert f"{path}:{line}" in str(err.value)


def test_unknown_header_lists_the_known_ones() -> None:
    with pytest.raises(TraceFormatError, match="known header") as err:
        load_trace(write("a,b,c\n1,2,3\n"))
    assert err.value.line == 1


def test_missing_file_and_unknown_format() -> None:
    with pytest.raises(TraceFormatError, match="readable"):
        load_trace("/nonexistent/trace.csv")
    with pytest.raises(ValueError, match="allowed: azure"):
        load_trace(write("arrival_s,input_tokens,output_tokens\n0,1,1\n"), "parquet")


def test_timestamp_offsets_convert_to_utc() -> None:
    path = write("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 02:00:00.5+02:00,1,1\n"
                 "2024-05-10T00:00:01Z,1,1\n2024-05-09 19:00:02-05:00,1,1\n")
    w = load_trace(path)
    assert w.arrival_s.tolist() == [0.0, 0.5, 1.5]
    assert w.origin_s == T0.timestamp() + 0.5


@FUZZ
@given(t=st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2200, 1, 1)))
def test_timestamp_parser_agrees_with_datetime(t: dt.datetime) -> None:
    path = write(f"TIMESTAMP,ContextTokens,GeneratedTokens\n1970-01-01 00:00:00,1,1\n{t.isoformat(' ')},1,1\n")
    w = load_trace(path)
    assert w.arrival_s[-1] == pytest.approx(t.replace(tzinfo=dt.UTC).timestamp(), abs=1e-5)


# --- --bad-rows: malformed rows are fatal (naming file, line, column) or skipped and counted ------------------------

GOOD_ROW = {"generic": "{t},{i},{o}", "burstgpt": "{t},GPT-4,{i},{o},0,API log", "lengths": "{i},{o}",
            "azure": "2024-05-10 00:00:{t:02d}.000000+00:00,{i},{o}",
            "mooncake": '{{"timestamp": {t}, "input_length": {i}, "output_length": {o}}}'}
BAD_ROW = {  # (row, the column its error names: None for a whole-row problem)
    "generic": [("{t},x{i},{o}", "input_tokens"), ("nan,{i},{o}", "arrival_s"), ("{t},{i}", None),
                ("{t},-{i},{o}", "input_tokens"), ("{t},{i},{o},9", None),
                ("{t},{i},99999999999999999999", "output_tokens"),
                ("{t},1e400,{o}", "input_tokens"), ('{t},"\u00e9{i}",{o}', "input_tokens")],
    "burstgpt": [("{t},GPT-4,{i},x,0,API log", "Response tokens"), ("inf,GPT-4,{i},{o},0,API log", "Timestamp")],
    "lengths": [("{i},x", "output_tokens"), ("{i}", None)],
    "azure": [("2024-05-10 00:00:{t:02d},{i},x", "GeneratedTokens"), ("2024-13-10 00:00:00,{i},{o}", "TIMESTAMP"),
              ("yesterday,{i},{o}", "TIMESTAMP")],
    "mooncake": [('{{"timestamp": {t}, "input_length": "{i}", "output_length": {o}}}', "input_length"),
                 ("[{t}]", None), ('{{"timestamp": {t}', None),
                 ('{{"timestamp": "nan", "input_length": {i}}}', "timestamp")],
}
HEADER = {"generic": "arrival_s,input_tokens,output_tokens", "lengths": "input_tokens,output_tokens",
          "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
          "azure": "TIMESTAMP,ContextTokens,GeneratedTokens", "mooncake": ""}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(sorted(GOOD_ROW)), data=st.data())
def test_bad_rows_fail_naming_the_first_or_are_skipped_and_counted(fmt: str, data: st.DataObject) -> None:
    kinds = st.one_of(st.just(None), st.sampled_from(BAD_ROW[fmt]))
    plan = data.draw(st.lists(kinds, min_size=1, max_size=30).filter(lambda p: None in p))
    lines = [HEADER[fmt]] if HEADER[fmt] else []
    for t, bad in enumerate(plan):
        template = GOOD_ROW[fmt] if bad is None else bad[0]
        lines.append(template.format(t=t, i=10 + t, o=5 + t))
    path = write("\n".join(lines) + "\n", ".jsonl" if fmt == "mooncake" else ".csv")
    first = next((k for k, bad in enumerate(plan) if bad is not None), None)
    offset = 2 if HEADER[fmt] else 1  # the line number of plan[0]
    if first is None:
        assert load_trace(path, fmt).malformed_rows == 0
        return
    with pytest.raises(TraceFormatError) as err:
        load_trace(path, fmt)
    assert (err.value.path, err.value.line, err.value.column) == (str(path), first + offset, plan[first][1]), (
        str(err.value), plan)
    w = load_trace(path, fmt, bad_rows="skip")
    assert len(w) == plan.count(None) and w.malformed_rows == len(plan) - plan.count(None)
    assert w.input_tokens.tolist() == sorted(10 + t for t, bad in enumerate(plan) if bad is None) or fmt == "lengths"
    assert w.meta["first_malformed"].startswith(f"{path}:{first + offset}:")


def test_skipping_every_row_still_fails_and_a_bad_header_always_fails() -> None:
    with pytest.raises(TraceFormatError, match="at least one request"):
        load_trace(write("arrival_s,input_tokens,output_tokens\n0,x,1\n1,2\n"), bad_rows="skip")
    with pytest.raises(TraceFormatError, match="known header"):
        load_trace(write("a,b\n1,2\n"), bad_rows="skip")
    with pytest.raises(ValueError, match="bad_rows='ignore' is unknown; allowed: fail, skip"):
        load_trace(write("arrival_s,input_tokens,output_tokens\n0,1,1\n"), bad_rows="ignore")


def test_skipping_works_across_chunks_and_on_the_shared_trace(tmp_path: Path) -> None:
    good = trace("sharegpt_300_at_10rps.csv").read_text().splitlines()
    mixed = [good[0]] + [row if k % 50 else row.replace(",", ",x", 1) for k, row in enumerate(good[1:], 1)]
    path = tmp_path / "mixed.csv"
    path.write_text("\n".join(mixed) + "\n")
    whole = load_trace(path, bad_rows="skip")
    chunked = load_trace(path, bad_rows="skip", chunk_bytes=512)
    bad = sum(1 for k in range(1, len(good)) if k % 50 == 0)
    assert whole.malformed_rows == chunked.malformed_rows == bad and len(whole) == len(chunked) == len(good) - 1 - bad
    assert whole.meta["first_malformed"] == chunked.meta["first_malformed"]
    assert whole.meta["first_malformed"].startswith(f"{path}:51:")


def test_cli_reports_bad_rows_without_a_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "bad.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,100,10\n1,abc,10\n2,100,10\n")
    base = [sys.executable, "-m", "leadscale", "simulate", "--trace", str(path), "--json"]
    root = Path(__file__).resolve().parent.parent
    failed = subprocess.run(base, capture_output=True, text=True, cwd=root, timeout=120)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert f"{path}:3: column 'input_tokens': got 'abc'" in failed.stderr, failed.stderr
    skipped = subprocess.run([*base, "--bad-rows", "skip"], capture_output=True, text=True, cwd=root, timeout=120)
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    assert f"{path}: skipped 1 malformed row (--bad-rows skip); the first: {path}:3:" in skipped.stderr
