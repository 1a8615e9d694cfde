"""The event loop and the hooks the autoscaling layer drives: fleet changes, gateway, timers, traces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scaler.profiles import get_profile
from simulator.engine import Engine, EngineConfig, simulate
from simulator.readers import load_trace
from simulator.results import ABORTED, FINISHED, REJECTED
from simulator.workload import Workload, select_window
from tests.conftest import TRACES, require

H100 = get_profile("h100-llama3-8b")


def poisson(n: int, rate: float, seed: int = 0, inp: int = 1000, out: int = 200) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(inp // 2, inp * 3 // 2, n),
                    rng.integers(out // 2, out * 3 // 2, n))


def test_same_seed_same_summary() -> None:
    w = poisson(2000, 30, seed=1)
    a = simulate(w, H100, replicas=2, router="random", seed=5).summary()
    b = simulate(w, H100, replicas=2, router="random", seed=5).summary()
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b
    c = simulate(w, H100, replicas=2, router="random", seed=6).summary()
    assert c["ttft_p99"] != a["ttft_p99"]


def test_light_load_throughput_equals_offered_load() -> None:
    w = poisson(3000, 5, seed=2)
    res = simulate(w, H100, replicas=2)
    s = res.summary()
    offered = (w.input_tokens + w.output_tokens).sum() / res.end_s
    assert s["completed"] == 3000
    assert s["throughput_tokens_per_s"] == pytest.approx(offered, rel=1e-9)
    # light load: nobody queues long, TTFT near a lone prefill
    assert s["ttft_p50"] < 0.1 and s["queue_p99"] < 0.5


@pytest.mark.parametrize("router", ["least-tokens", "round-robin", "random"])
def test_routers_spread_the_load(router: str) -> None:
    res = simulate(poisson(1200, 40, seed=3), H100, replicas=3, router=router, seed=1)
    counts = np.bincount(res.log.replica, minlength=3)
    assert counts.min() > 250, counts


def test_unknown_router_names_choices() -> None:
    with pytest.raises(ValueError, match=r"router='fastest'.*least-tokens"):
        EngineConfig(router="fastest")


def test_gateway_holds_requests_until_a_replica_is_added() -> None:
    engine = Engine(poisson(200, 20, seed=4), H100, EngineConfig())
    seen: list[int] = []
    engine.at(5.0, lambda now: seen.append(engine.gateway_waiting))
    engine.at(5.0, lambda now: engine.fleet.add_replica(now))
    res = engine.run()
    assert seen and seen[0] > 50
    assert (res.log.status == FINISHED).all()
    held = res.log.arrival_s < 5.0
    assert (res.log.first_scheduled_s[held] >= 5.0).all()


def test_gateway_limit_rejects_the_overflow() -> None:
    engine = Engine(poisson(100, 50, seed=5), H100, EngineConfig(gateway_limit=10))
    engine.at(100.0, lambda now: engine.fleet.add_replica(now))
    res = engine.run()
    assert (res.log.status == REJECTED).sum() == 90
    assert (res.log.status == FINISHED).sum() == 10


def test_drain_and_remove() -> None:
    engine = Engine(poisson(600, 30, seed=6), H100, EngineConfig(), initial_replicas=2)
    aborted: list[int] = []
    engine.at(5.0, lambda now: engine.fleet.drain_replica(0, now))
    engine.at(5.0, lambda now: aborted.append(engine.fleet.in_flight(0)))
    engine.at(8.0, lambda now: aborted.append(engine.fleet.remove_replica(1, now)))
    engine.at(8.0, lambda now: engine.fleet.add_replica(now))
    res = engine.run()
    log = res.log
    assert not ((log.replica == 0) & (log.arrival_s > 5.0)).any(), "a draining replica got new work"
    assert (log.status == ABORTED).sum() == aborted[1] > 0
    assert ((log.status == ABORTED) == ((log.replica == 1) & (log.status != FINISHED))).all()
    assert (log.status[log.arrival_s > 8.0] == FINISHED).all()
    with pytest.raises(KeyError, match="replica 1 is not in the fleet"):
        engine.fleet.metrics(1, 9.0)


def test_every_and_metrics_snapshot() -> None:
    engine = Engine(poisson(1500, 40, seed=7), H100, EngineConfig(), initial_replicas=1)
    snaps = []
    engine.every(1.0, lambda now: snaps.append(engine.fleet.metrics(0, now)))
    res = engine.run()
    times = [s.at for s in snaps]
    assert times[:3] == [0.0, 1.0, 2.0]
    for a, b in itertools.pairwise(snaps):
        assert b.generation_tokens_total >= a.generation_tokens_total
        assert b.prompt_tokens_total >= a.prompt_tokens_total
        assert 0.0 <= b.kv_cache_usage_perc <= 1.0
    last = snaps[-1]
    assert last.request_success_total <= 1500
    assert last.num_gpu_blocks == H100.num_gpu_blocks and last.block_size == 16
    assert res.summary()["completed"] == 1500
    assert max(s.num_requests_running for s in snaps) > 1


def test_too_long_requests_are_rejected_and_outputs_capped() -> None:
    prof = get_profile("a100-llama2-70b-tp4")  # max_model_len 4096
    w = Workload(np.array([0.0, 1.0]), np.array([5000, 4000]), np.array([10, 500]))
    res = simulate(w, prof)
    assert res.log.status.tolist() == [REJECTED, FINISHED]
    assert res.log.generated[1] == 96
    assert res.summary()["gpu_hours"] == pytest.approx(4 * res.end_s / 3600)


@pytest.mark.parametrize("name", ["azure_conv_2023.csv", "mooncake_synthetic.jsonl", "sharegpt_300_at_10rps.csv"])
def test_shared_traces_short_windows(name: str) -> None:
    path = TRACES / name
    require(path.is_file(), f"trace {path}")
    w = select_window(load_trace(path), 0.0, 120.0)
    res = simulate(w, H100, replicas=2)
    s = res.summary()
    assert s["requests"] == len(w) > 0
    assert s["completed"] + s["rejected"] == len(w)
    assert s["ttft_p50"] is not None and s["ttft_p50"] > 0
    if w.has_blocks:
        assert 0.0 <= s["prefix_cache_hit_rate"] <= 1.0
    else:
        assert s["prefix_cache_hit_rate"] is None


def test_metrics_reads_do_not_change_the_run() -> None:
    """Reading metrics splits decode runs; the outcome must not depend on when anyone looks."""
    w = poisson(1500, 40, seed=8)
    quiet = simulate(w, H100, replicas=2, router="round-robin")
    engine = Engine(w, H100, EngineConfig(router="round-robin"), initial_replicas=2)
    engine.every(0.37, lambda now: [engine.fleet.metrics(r, now) for r in list(engine.fleet.replicas)])
    busy = engine.run()
    assert np.allclose(quiet.log.first_token_s, busy.log.first_token_s, rtol=1e-9, atol=1e-9)
    assert np.allclose(quiet.log.finish_s, busy.log.finish_s, rtol=1e-9, atol=1e-9)


def test_engine_backend_outcome() -> None:
    from simulator.engine_backend import EngineBackend

    backend = EngineBackend(poisson(300, 10, seed=9), "h100-llama3-8b", seed=1, slo_ttft_s=1.0)
    ready: list[int] = []
    backend.every(2.0, lambda now: ready.append(backend.add_replica(now)) if not ready else None)
    outcome = backend.run()
    assert outcome.rejected == 0 and outcome.arrival_s.size == 300
    assert np.isfinite(outcome.ttft_s).all() and outcome.summary["completed"] == 300
    assert backend.in_flight(ready[0]) == 0 and backend.gateway_waiting() == 0
    assert backend.metrics(ready[0]).request_success_total == 300
