"""A streamed run (``simulator.fast_stream``) is the in-memory compiled run, request for request, in a window."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scaler.profiles import get_profile
from simulator.engine import simulate
from simulator.fast_stream import simulate_stream
from simulator.results import PERCENTILES
from simulator.synthetic import builtin, builtin_chunks
from simulator.workload import Workload

PROFILE = get_profile("h100-llama3-8b")
COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "generated", "preemptions", "replica",
           "status", "output_tokens")


def pieces(w: Workload, size: int) -> list[Workload]:
    return [Workload(w.arrival_s[a:a + size], w.input_tokens[a:a + size], w.output_tokens[a:a + size],
                     name=f"{w.name}[{a}:]") for a in range(0, len(w), size)]


def streamed(w: Workload, replicas: int, size: int, window: int, **kw: Any) -> tuple[Any, dict[str, np.ndarray]]:
    batches: list[dict[str, np.ndarray]] = []
    run = simulate_stream(pieces(w, size), PROFILE, replicas, window=window, on_retired=batches.append, **kw)
    return run, {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.mark.parametrize(("replicas", "kw"), [(4, {}), (2, {}), (2, {"waiting_tokens_limit": 20_000.0}),
                                              (3, {"router": "round-robin"})],
                         ids=["keeps-up", "falls-behind", "gateway-429", "round-robin"])
def test_streamed_requests_are_the_in_memory_ones(replicas: int, kw: dict[str, Any]) -> None:
    """Every column of every request equals the in-memory run's, through windows that slide and grow."""
    w = builtin("default", seed=3, duration=600.0)
    full = simulate(w, PROFILE, replicas=replicas, engine="compiled", **kw)
    run, got = streamed(w, replicas, size=997, window=512, **kw)
    for name in COLUMNS:
        want = getattr(full.log, name)
        assert got[name].shape == want.shape, name
        assert np.array_equal(got[name], want, equal_nan=True), f"{name}: {int((got[name] != want).sum())} differ"
    a, b = full.summary(), run.summary()
    exact = ("requests", "completed", "rejected", "aborted", "unfinished", "preemptions", "slo_attainment",
             "slo_missed", "goodput", "goodput_tokens_per_s", "throughput_tokens_per_s", "duration_s", "gpu_hours",
             "overload_rejected", "kv_usage_max", *(f"itl_p{q}" for q in PERCENTILES))
    assert {k: a[k] for k in exact} == {k: b[k] for k in exact}
    for name in ("ttft", "tpot", "e2e", "queue"):
        assert b[f"{name}_mean"] == pytest.approx(a[f"{name}_mean"], rel=1e-9, abs=1e-12)
        for q in PERCENTILES:  # histogram bins are ~1.2 % wide: the bin's centre is within ~0.6 %
            assert b[f"{name}_p{q}"] == pytest.approx(a[f"{name}_p{q}"], rel=0.012, abs=1e-5), (name, q)
    assert b["kv_usage_mean"] == pytest.approx(a["kv_usage_mean"], rel=1e-12)


def test_the_window_grows_only_with_requests_in_flight() -> None:
    """A fleet that keeps up never needs more than its window, however long the stream."""
    chunks = builtin_chunks("poisson", seed=1, span_s=60.0, rate=20.0, duration=6 * 3600.0)  # 1200 a chunk
    run = simulate_stream(chunks, PROFILE, 4, window=4096)
    summary = run.summary()
    assert summary["requests"] > 400_000 and summary["completed"] == summary["requests"]
    assert run.peak_window == 4096  # 430 k requests through a 4 k window: memory does not follow length


def test_a_fleet_far_behind_grows_the_window_and_loses_nothing() -> None:
    w = builtin("poisson", seed=2, rate=60.0, duration=120.0)
    run, got = streamed(w, 1, size=500, window=256)
    assert run.peak_window > 256 and got["status"].size == len(w)
    assert run.summary()["requests"] == len(w)


def test_chunks_out_of_order_and_a_different_slo_are_refused() -> None:
    a, b = pieces(builtin("poisson", seed=0, rate=5.0, duration=60.0), 100)[:2]
    with pytest.raises(ValueError, match="chunks go in order"):
        simulate_stream([b, a], PROFILE, 1)
    run = simulate_stream([a, b], PROFILE, 1, slo_ttft_s=1.0)
    assert run.summary(slo_ttft_s=1.0)["slo_ttft_s"] == 1.0
    with pytest.raises(ValueError, match=r"slo_ttft_s=2\.0: a streamed run was tallied at 1"):
        run.summary(slo_ttft_s=2.0)


def test_builtin_chunks_are_seeded_ordered_and_at_the_rate() -> None:
    one = list(builtin_chunks("diurnal", seed=4, span_s=900.0, rate=10.0, duration=3600.0))
    two = list(builtin_chunks("diurnal", seed=4, span_s=900.0, rate=10.0, duration=3600.0))
    assert len(one) == 4 and all(np.array_equal(x.arrival_s, y.arrival_s) for x, y in zip(one, two, strict=True))
    arrival = np.concatenate([c.arrival_s for c in one])
    assert (np.diff(arrival) >= 0).all() and arrival[0] >= 0 and arrival[-1] < 3600.0
    assert arrival.size == pytest.approx(36_000, rel=0.05)
    first_quarter = one[0].arrival_s.size  # diurnal starts at its trough: the first quarter is the quietest
    assert first_quarter < min(c.arrival_s.size for c in one[1:])
