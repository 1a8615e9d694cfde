"""Calibration recovers a known replica: a replay folder written from a simulation of a known profile.

The fake replay carries what a real one does (per-request times, the server's token counts, and a
/metrics timeline whose histogram sums and counts are the simulated engine's), so ``fit`` must find
step-time coefficients that reproduce it, and the check of another slice must agree as well.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scaler.profiles import PerformanceProfile, get_profile, save_profile
from simulator import calibrate
from simulator.engine import simulate
from simulator.replay_records import RequestRecord, summarize, write_records
from simulator.workload import Workload


def _truth() -> PerformanceProfile:
    from dataclasses import replace

    from scaler.step_time import LinearStepTime

    base = get_profile("h100-llama3-8b")
    step = LinearStepTime(overhead_s=0.004, floor_s=0.0, intercept_s=0.0, per_token_s=4e-5, per_seq_s=6e-4,
                          per_context_token_s=2e-8, prefill_attention_s=0.0)
    return replace(base, name="truth", step_time=step, max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096)


def _workload(seed: int, n: int = 120, rate: float = 6.0) -> Workload:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    return Workload(arrival - arrival[0], rng.integers(50, 800, n), rng.integers(20, 300, n))


def _fake_replay(path: Path, profile: PerformanceProfile, w: Workload) -> None:
    """Write what `leadscale replay` writes, from a simulation of ``profile``."""
    log = simulate(w, profile, seed=0).log
    path.mkdir(parents=True)
    records = [RequestRecord(index=i, endpoint="http://sim", scheduled_s=float(log.arrival_s[i]),
                             sent_s=float(log.arrival_s[i]), first_token_s=float(log.first_token_s[i]),
                             finish_s=float(log.finish_s[i]), status="ok", http_status=200,
                             trace_input_tokens=int(w.input_tokens[i]), trace_output_tokens=int(w.output_tokens[i]),
                             sent_input_tokens=int(w.input_tokens[i]), requested_output_tokens=int(w.output_tokens[i]),
                             prompt_tokens=int(w.input_tokens[i]), output_tokens=int(w.output_tokens[i]),
                             chunks=int(w.output_tokens[i])) for i in range(len(w))]
    write_records(path / "requests.csv", records)
    wall = float(np.nanmax(log.finish_s))
    (path / "summary.json").write_text(json.dumps(summarize(records, wall, 1)))
    ttft = log.first_token_s - log.arrival_s
    sums = {"time_to_first_token_seconds": (ttft.sum(), len(w)),
            "e2e_request_latency_seconds": ((log.finish_s - log.arrival_s).sum(), len(w)),
            "request_queue_time_seconds": ((log.first_scheduled_s - log.arrival_s).sum(), len(w)),
            "inter_token_latency_seconds": ((log.finish_s - log.first_token_s).sum(), int((w.output_tokens - 1).sum())),
            "request_prefill_time_seconds": ((log.first_token_s - log.first_scheduled_s).sum(), len(w)),
            "request_decode_time_seconds": ((log.finish_s - log.first_token_s).sum(), len(w))}
    end = {f'vllm:{k}_{part}{{model_name="m"}}': float(v[i]) for k, v in sums.items()
           for i, part in enumerate(("sum", "count"))}
    end['vllm:num_requests_running{model_name="m"}'] = 8.0
    end['vllm:num_requests_waiting{model_name="m"}'] = 3.0
    lines = [{"t": 0.0, "endpoint": "http://sim", "ok": True, "samples": {k: 0.0 for k in end}},
             {"t": wall, "endpoint": "http://sim", "ok": True, "samples": end}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    kv_tokens = profile.memory.kv_cache_tokens
    cache = {"block_size": "16", "num_gpu_blocks": str(kv_tokens // 16),
             "kv_cache_memory_bytes": str(kv_tokens * 131072), "kv_cache_size_tokens": str(kv_tokens)}
    (path / "replay.json").write_text(json.dumps({"model": "m", "max_model_len": 4096,
                                                  "cache_config": {"http://sim": cache}}))


@pytest.fixture(scope="module")
def replays(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cal")
    _fake_replay(root / "a", _truth(), _workload(1))
    _fake_replay(root / "b", _truth(), _workload(2, rate=4.0))
    return root / "a", root / "b"


def test_load_replay_reads_limits_and_engine_means(replays: tuple[Path, Path]) -> None:
    m = calibrate.load_replay(replays[0])
    assert len(m.workload) == 120 and m.max_running == 8 and m.saw_waiting
    assert m.engine["server_ttft_mean"] > 0 and m.engine["server_itl_mean"] > 0
    seqs, budget, note = calibrate.scheduler_limits(m, None, 512)
    assert (seqs, budget) == (8, 512) and "given" in note
    assert calibrate.memory_from_cache(m.cache, 4096).num_gpu_blocks == int(m.cache["num_gpu_blocks"])


def test_the_engine_sees_requests_when_they_reached_it_not_when_they_were_sent(replays: tuple[Path, Path],
                                                                            tmp_path: Path) -> None:
    """A client or frontend that fell behind hands the engine later arrivals: calibration simulates those."""
    import shutil

    from simulator.replay_records import read_records, write_records

    late = tmp_path / "late"
    shutil.copytree(replays[0], late)
    records = read_records(late / "requests.csv")
    for i, rec in enumerate(records):
        rec.accepted_s = rec.sent_s + (5.0 if i % 2 else 0.0)  # every other request held up 5 s
    write_records(late / "requests.csv", records)
    arrival = calibrate.load_replay(late).workload.arrival_s
    want = np.sort(np.array([r.accepted_s for r in records if r.status == "ok" and r.output_tokens > 0]))
    assert np.allclose(arrival, want - want[0])
    for rec in records:  # a replay written before accepted_s existed: the send time stands in
        rec.accepted_s = float("nan")
    write_records(late / "requests.csv", records)
    sent = np.sort(np.array([r.sent_s for r in records if r.status == "ok" and r.output_tokens > 0]))
    assert np.allclose(calibrate.load_replay(late).workload.arrival_s, sent - sent[0])


@pytest.mark.slow
def test_fit_reproduces_the_known_replica_and_checks_another_slice(replays: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    a, b = replays
    fitted = calibrate.fit(calibrate.load_replay(a), max_num_seqs=8, max_num_batched_tokens=512)
    save_profile(fitted, tmp_path / "p.yaml")
    again = get_profile(str(tmp_path / "p.yaml"))
    assert again == fitted
    for replay, tolerance in ((a, 0.10), (b, 0.20)):
        m = calibrate.load_replay(replay)
        rows = {r[0]: r for r in calibrate.fidelity(m, calibrate.simulate_replay(again, m))}
        for key in ("ttft_mean (engine)", "e2e_mean (engine)", "itl_mean (engine)", "throughput_tokens_per_s",
                    "e2e_p50", "e2e_p90"):
            assert abs(rows[key][3]) < tolerance, (replay.name, rows[key])


def test_missing_files_and_too_few_requests_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"summary\.json is missing"):
        calibrate.load_replay(tmp_path)
    _fake_replay(tmp_path / "small", _truth(), _workload(3, n=3))
    with pytest.raises(ValueError, match="only 3 completed requests"):
        calibrate.load_replay(tmp_path / "small")


def test_table_formats_every_row_and_undefined_errors() -> None:
    text = calibrate.format_table([("ttft_p50", 1.0, 1.1, 0.1), ("itl_p50", None, 0.2, None)])
    assert "+10.0%" in text and text.count("\n") == 2 and " - " in text + " "


def _measured(engine: dict[str, float | None]) -> calibrate.Measured:
    w = Workload(np.zeros(1), np.ones(1, np.int64), np.ones(1, np.int64))
    return calibrate.Measured(path=Path("."), workload=w, summary={}, engine=engine, cache={}, max_running=1,
                              saw_waiting=False, max_step_tokens=None, model="m", max_model_len=2048)


def test_latencies_below_one_engine_step_are_no_difference_to_fit() -> None:
    """A queue of 20 us against 100 us both mean "scheduled in the step it arrived" (steps of 2 ms): no loss,
    where the ITL's threefold error is; above the step, a queue twice too long still counts."""
    m = _measured({"server_itl_mean": 0.002, "server_queue_mean": 2e-5})
    assert calibrate._loss({"itl_mean": 0.002, "queue_mean": 1e-4}, m) == 0.0
    assert calibrate._loss({"itl_mean": 0.0007, "queue_mean": 2e-5}, m) == pytest.approx(np.log(0.002 / 0.0007) ** 2)
    slow = _measured({"server_itl_mean": 0.002, "server_queue_mean": 0.01})
    assert calibrate._loss({"itl_mean": 0.002, "queue_mean": 0.02}, slow) == pytest.approx(np.log(2.0) ** 2)
