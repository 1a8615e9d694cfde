"""A trace file read chunk by chunk (``simulator.trace_stream``) and ``simulate --stream``: the same requests
as reading it whole, the same answers as the in-memory run, and precise refusals where a stream cannot go."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leadscale.cli import main
from simulator import workload as wl
from simulator.csvscan import TraceFormatError
from simulator.readers import load_trace
from simulator.trace_stream import StreamCounts, iter_trace, select_stream
from tests.conftest import TRACES, require

AZURE = TRACES / "azure_conv_2023.csv"


def gathered(chunks: list[wl.Workload]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([getattr(c, name) for c in chunks])
            for name in ("arrival_s", "input_tokens", "output_tokens")}


@pytest.fixture(scope="module")
def azure_whole() -> wl.Workload:
    require(AZURE.is_file(), f"trace {AZURE}")
    return load_trace(AZURE)


@settings(max_examples=25, deadline=None)
@given(st.integers(2_000, 200_000), st.integers(1, 5_000), st.floats(0.0, 3000.0),
       st.one_of(st.none(), st.floats(1.0, 3000.0)), st.sampled_from([1.0, 0.5, 2.0, 3.7]))
def test_chunks_are_the_whole_read_windowed_and_scaled_to_the_bit(azure_whole: wl.Workload, chunk_bytes: int,
                                                                   max_rows: int, start: float, span: float | None,
                                                                   rate: float) -> None:
    end = None if span is None else start + span
    counts = StreamCounts()
    try:
        chunks = list(select_stream(iter_trace(AZURE, chunk_bytes=chunk_bytes, max_rows=max_rows, counts=counts),
                                    start, end, rate, counts))
    except ValueError as exc:  # nothing in the range: the whole read says the same
        assert "no requests" in str(exc)
        assert len(wl.select_window(azure_whole, start, end)) == 0
        return
    want = wl.rate_scale(wl.select_window(azure_whole, start, end), rate)
    got = gathered(chunks)
    for name, values in got.items():
        assert np.array_equal(values, getattr(want, name)), name
    assert counts.requests == len(want)
    assert max(len(c) for c in chunks) <= max_rows


def test_rows_the_whole_read_drops_are_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "generic.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0.5,0,10\n1.0,100,20\n1.0,50,0\n2.5,30,5\n4.0,8,8\n")
    counts = StreamCounts()
    got = gathered(list(iter_trace(path, chunk_bytes=32, counts=counts)))
    whole = load_trace(path)
    assert got["arrival_s"].tolist() == whole.arrival_s.tolist() == [0.0, 1.5, 3.0]
    assert counts.skipped_rows == whole.skipped_rows == 2


def test_a_row_out_of_time_order_is_named_by_line_column_and_value(tmp_path: Path) -> None:
    path = tmp_path / "unsorted.csv"
    rows = [f"{t:.1f},10,10" for t in (0.0, 1.0, 2.0, 3.0)] + ["2.5,10,10"] + [f"{t:.1f},10,10" for t in (4.0, 5.0)]
    path.write_text("arrival_s,input_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    for chunk_bytes in (16, 1 << 20):  # the disorder inside one chunk, and across two
        with pytest.raises(TraceFormatError) as info:
            list(iter_trace(path, chunk_bytes=chunk_bytes))
        err = info.value
        assert (err.line, err.column, err.value) == (6, "arrival_s", "2.5"), chunk_bytes
        assert "non-decreasing" in str(err) and "without --stream" in str(err)


def test_skipped_malformed_rows_are_counted_and_do_not_shift_the_order_check(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,10,10\n1,ten,10\n2,10,10\n1.5,10,10\n")
    counts = StreamCounts()
    with pytest.raises(TraceFormatError) as info:
        list(iter_trace(path, bad_rows="skip", counts=counts))
    assert (info.value.line, info.value.value) == (5, "1.5")
    assert counts.malformed.count == 1 and counts.malformed.first is not None
    assert counts.malformed.first.line == 3


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("lengths.csv", "input_tokens,output_tokens\n10,10\n", "format 'lengths'"),
    ("mooncake.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n',
     "format 'mooncake'"),
])
def test_formats_a_stream_cannot_follow_are_refused_up_front(tmp_path: Path, name: str, content: str,
                                                             expected: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceFormatError, match=expected) as info:
        next(iter_trace(path))
    assert "arrival time per row" in str(info.value)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["simulate", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_stream_answers_as_the_in_memory_run(capsys: pytest.CaptureFixture[str]) -> None:
    """The azure trace, a stretch of it at twice its rate, on 2 replicas: counts and rates exact,
    percentiles within the 1 %-wide bins."""
    require(AZURE.is_file(), f"trace {AZURE}")
    argv = ("--trace", str(AZURE), "--window", "600:1800", "--rate-scale", "2", "--replicas", "2",
            "--profile", "a100-llama3-8b")
    whole = run_json(capsys, *argv)
    streamed = run_json(capsys, *argv, "--stream")
    assert streamed["streamed"] is True and streamed["skipped_rows"] == 0
    for key in ("requests", "completed", "rejected", "preemptions", "slo_attainment", "duration_s", "gpu_hours"):
        assert streamed[key] == whole[key], key
    assert streamed["requests"] > 1000
    for key in ("ttft_p50", "ttft_p95", "e2e_p95", "tpot_p95"):
        assert streamed[key] == pytest.approx(whole[key], rel=0.012, abs=1e-5), key


@pytest.mark.parametrize(("extra", "message"), [
    (["--policy", "leadscale"], "the autoscaled loop is not streamed"),
    (["--load-scale", "2"], "--load-scale 2"),
    (["--router", "random"], "--router 'random'"),
])
def test_simulate_stream_refuses_what_it_cannot_stream(capsys: pytest.CaptureFixture[str], extra: list[str],
                                                       message: str) -> None:
    assert main(["simulate", "--stream", "--json", "--trace", "builtin:poisson?rate=2&duration=30", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_simulate_stream_on_a_builtin_runs_hour_by_hour(capsys: pytest.CaptureFixture[str]) -> None:
    got = run_json(capsys, "--stream", "--trace", "builtin:poisson?rate=4&duration=7300", "--replicas", "2")
    assert got["completed"] == got["requests"] and abs(got["requests"] - 4 * 7300) < 4 * 7300 * 0.05
    assert got["duration_s"] >= 7200
