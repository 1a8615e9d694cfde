"""Workload type and its transforms: invariants, window selection, rate and load scaling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.workload import Workload, from_unsorted, load_scale, rate_scale, select_window, take_ragged


def make(n: int = 100, seed: int = 0, blocks: bool = False) -> Workload:
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, 100, n))
    arrival -= arrival[0] if n else 0.0
    inp, out = rng.integers(1, 4000, n), rng.integers(1, 500, n)
    if not blocks:
        return Workload(arrival, inp, out, name="w")
    counts = rng.integers(0, 5, n)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    return Workload(arrival, inp, out, name="w", block_ids=rng.integers(0, 50, offsets[-1]), block_offsets=offsets)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"arrival_s": [1.0, 0.5]}, "sorted"),
    ({"arrival_s": [-1.0, 0.5]}, "sorted"),
    ({"arrival_s": [0.0, np.nan]}, "finite"),
    ({"input_tokens": [0, 1]}, "input_tokens must be >= 1"),
    ({"output_tokens": [1]}, "one length"),
    ({"block_ids": [1, 2]}, "go together"),
    ({"block_ids": [1, 2], "block_offsets": [0, 1]}, "block_offsets"),
    ({"block_tokens": 0}, "block_tokens"),
], ids=["unsorted", "negative", "nan", "zero-input", "ragged", "ids-alone", "bad-offsets", "block-tokens"])
def test_invalid_workloads_are_refused(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"arrival_s": [0.0, 1.0], "input_tokens": [1, 2], "output_tokens": [3, 4]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Workload(**args)  # type: ignore[arg-type]


def test_arrays_are_columnar_and_typed() -> None:
    w = Workload([0, 1], [1, 2], [3, 4])
    assert w.arrival_s.dtype == np.float64 and w.input_tokens.dtype == np.int64 and len(w) == 2
    assert w.duration_s == 1.0 and not w.has_blocks and w.blocks(0).size == 0
    assert "requests=2" in repr(w)
    with pytest.raises(ValueError, match="read-only"):
        w.arrival_s[0] = 5.0  # a frozen workload: transforms make new ones


def test_from_unsorted_sorts_stably_and_keeps_origin() -> None:
    w = from_unsorted(np.array([5.0, 3.0, 5.0, 4.0]), [1, 2, 3, 4], [1, 1, 1, 1], origin_s=100.0,
                      block_ids=np.array([10, 20, 30, 40]), block_offsets=np.array([0, 1, 2, 3, 4]))
    assert w.arrival_s.tolist() == [0.0, 1.0, 2.0, 2.0]
    assert w.input_tokens.tolist() == [2, 4, 1, 3] and w.block_ids.tolist() == [20, 40, 10, 30]
    assert w.origin_s == 103.0


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(0, 4), max_size=20), data=st.data())
def test_take_ragged_matches_python(lengths: list[int], data: st.DataObject) -> None:
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    ids = np.arange(offsets[-1], dtype=np.int64) * 7
    index = np.array(data.draw(st.lists(st.integers(0, max(len(lengths) - 1, 0)), max_size=30)) if lengths else [],
                     dtype=np.int64)
    got_ids, got_offs = take_ragged(ids, offsets, index)
    want = [ids[offsets[i] : offsets[i + 1]].tolist() for i in index]
    assert [got_ids[got_offs[k] : got_offs[k + 1]].tolist() for k in range(index.size)] == want


def test_select_window_retimes_and_keeps_idle_head() -> None:
    w = Workload([0.0, 10.0, 20.0, 30.0, 40.0], [1, 2, 3, 4, 5], [1, 1, 1, 1, 1], origin_s=1000.0)
    sel = select_window(w, 15.0, 35.0)
    assert sel.arrival_s.tolist() == [5.0, 15.0] and sel.input_tokens.tolist() == [3, 4]
    assert sel.origin_s == 1015.0
    assert len(select_window(w, 20.0, 30.0)) == 1  # [start, end)
    assert len(select_window(w, 10.0)) == 4 and len(select_window(w, 100.0, 200.0)) == 0


@pytest.mark.parametrize(("start", "end"), [(-1.0, 5.0), (5.0, 5.0), (float("nan"), 1.0), (0.0, float("nan"))])
def test_select_window_refuses_bad_bounds(start: float, end: float) -> None:
    with pytest.raises(ValueError, match="select_window"):
        select_window(make(), start, end)


def test_select_window_carries_blocks() -> None:
    w = make(200, blocks=True)
    sel = select_window(w, 20.0, 60.0)
    lo = int(np.searchsorted(w.arrival_s, 20.0))
    for k in range(len(sel)):
        assert sel.blocks(k).tolist() == w.blocks(lo + k).tolist()


@pytest.mark.parametrize("k", [0.5, 2.0, 3.7])
def test_rate_scale_compresses_time(k: float) -> None:
    w = make()
    fast = rate_scale(w, k)
    assert len(fast) == len(w) and fast.duration_s == pytest.approx(w.duration_s / k)
    np.testing.assert_allclose(fast.arrival_s * k, w.arrival_s)  # shape kept
    assert (fast.input_tokens == w.input_tokens).all()


@pytest.mark.parametrize("k", [0.0, -1.0, float("inf"), float("nan"), "x"])
def test_scaling_factors_must_be_positive_and_finite(k: object) -> None:
    with pytest.raises(ValueError, match="factor"):
        rate_scale(make(), k)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="factor"):
        load_scale(make(), k, np.random.default_rng(0))  # type: ignore[arg-type]


def test_load_scale_by_one_is_identity_and_whole_k_is_exact() -> None:
    w = make(blocks=True)
    assert load_scale(w, 1.0, np.random.default_rng(0)) is w
    big = load_scale(w, 3.0, np.random.default_rng(0))
    assert len(big) == 3 * len(w)
    assert big.input_tokens.sum() == 3 * w.input_tokens.sum()
    assert big.block_ids.size == 3 * w.block_ids.size
    assert big.duration_s <= w.duration_s and big.arrival_s[0] >= 0
    assert set(w.arrival_s.tolist()) <= set(big.arrival_s.tolist())  # every original keeps its time


def test_load_scale_keeps_shape_and_duration() -> None:
    w = make(5000, seed=3)
    big = load_scale(w, 2.5, np.random.default_rng(7))
    assert len(big) == pytest.approx(2.5 * len(w), rel=0.03)
    assert big.duration_s == pytest.approx(w.duration_s, abs=0.5)
    before = np.histogram(w.arrival_s, bins=10, range=(0, 100))[0]
    after = np.histogram(big.arrival_s, bins=10, range=(0, 100))[0]
    np.testing.assert_allclose(after / before, 2.5, rtol=0.1)


def test_load_scale_jitter_is_bounded() -> None:
    w = Workload([0.0, 50.0, 100.0], [1, 2, 3], [1, 1, 1])
    big = load_scale(w, 4.0, np.random.default_rng(1), jitter_s=0.5)
    for t, inp in zip(big.arrival_s, big.input_tokens, strict=True):
        assert abs(t - w.arrival_s[inp - 1]) <= 0.5


def test_load_scale_is_deterministic_for_a_seed() -> None:
    w = make(1000)
    a = load_scale(w, 1.3, np.random.default_rng(42))
    b = load_scale(w, 1.3, np.random.default_rng(42))
    c = load_scale(w, 1.3, np.random.default_rng(43))
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.input_tokens, b.input_tokens)
    assert not np.array_equal(a.arrival_s, c.arrival_s) or len(a) != len(c)


@settings(max_examples=60, deadline=None)
@given(k=st.floats(0.05, 6.0), n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_load_scale_counts_stay_within_whole_part_bounds(k: float, n: int, seed: int) -> None:
    w = make(n, seed=seed % 1000)
    out = load_scale(w, k, np.random.default_rng(seed))
    assert int(k) * n <= len(out) <= (int(k) + 1) * n
    assert (np.diff(out.arrival_s) >= 0).all() and np.isfinite(out.arrival_s).all()


def test_summary_counts() -> None:
    s = Workload([0.0, 2.0], [10, 30], [5, 5], skipped_rows=3).summary()
    assert s["requests"] == 2 and s["skipped_rows"] == 3 and s["rate_per_s"] == 1.0 and s["input_mean"] == 20.0
