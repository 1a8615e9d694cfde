"""Decisions in a process of their own: the same answers as in-process, and a dead child never answered for."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from support.file_source import FileSourceFactory, write_load
from support.scaler_process import ScalerProcess

from scaler.decision_process import DecisionProcess, DecisionSettings
from scaler.evaluator import Evaluator, TooManyObjects, Unavailable
from scaler.metadata import MetadataError
from scaler.telemetry import Telemetry

META = {"model": "llama", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000",
        "maxNumSeqs": "256", "kvCacheTokens": "200000", "scaleDownDelay": "0"}


@pytest.fixture
def load_file(tmp_path: Path) -> Path:
    path = tmp_path / "load.json"
    write_load(path, {"llama": 20_000.0, "mistral": 3_000.0})
    return path


def settings(load_file: Path, **overrides: object) -> DecisionSettings:
    values: dict[str, object] = {"prometheus_url": "http://127.0.0.1:9", "interval_s": 0.2,
                                 "source_factory": FileSourceFactory(str(load_file)), "log_level": "WARNING"}
    return DecisionSettings(**{**values, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def decisions(load_file: Path) -> object:
    process = DecisionProcess(settings(load_file), Telemetry())
    process.start()
    yield process
    process.stop()


def test_answers_what_an_evaluator_in_this_process_answers(decisions: DecisionProcess, load_file: Path) -> None:
    here = Evaluator(prometheus_url="http://127.0.0.1:9", source_factory=FileSourceFactory(str(load_file)),
                     telemetry=Telemetry())
    try:
        for model in ("llama", "mistral"):
            meta = {**META, "model": model}
            remote, local = decisions.lookup("llm", model, meta), here.lookup("llm", model, meta)
            assert (remote.desired_replicas, remote.active) == (local.desired_replicas, local.active)
            assert remote.config == local.config and 0 <= remote.data_age_s < 60
        assert decisions.lookup("llm", "llama", META).desired_replicas > decisions.lookup(
            "llm", "mistral", {**META, "model": "mistral"}).desired_replicas  # the numbers come from the load
    finally:
        here.stop()


def test_bad_metadata_and_too_many_objects_are_answered_here(load_file: Path) -> None:
    process = DecisionProcess(settings(load_file, max_objects=1), Telemetry())
    process.start()
    try:
        with pytest.raises(MetadataError, match="prefillTokensPerSecond"):
            process.lookup("llm", "chat", {**META, "prefillTokensPerSecond": "-3"})
        process.lookup("llm", "chat", META)
        with pytest.raises(TooManyObjects, match="--max-objects 1"):
            process.lookup("llm", "other", META)
    finally:
        process.stop()


def test_a_decision_change_wakes_stream_waiters_and_reaches_the_answer(decisions: DecisionProcess,
                                                                       load_file: Path) -> None:
    before = decisions.lookup("llm", "chat", META)
    seen = decisions.generation
    write_load(load_file, {"llama": 200_000.0})
    with decisions.changed:
        assert decisions.changed.wait_for(lambda: decisions.generation != seen, timeout=10)
    after = decisions.lookup("llm", "chat", META)
    assert after.desired_replicas > before.desired_replicas


def test_decisions_and_evaluator_metrics_come_from_the_child(decisions: DecisionProcess) -> None:
    from prometheus_client import generate_latest

    decisions.lookup("llm", "chat", META)
    (row,) = decisions.snapshot()
    assert (row["namespace"], row["name"], row["model"]) == ("llm", "chat", "llama")
    assert row["desired_replicas"] == decisions.lookup("llm", "chat", META).desired_replicas
    text = generate_latest(decisions.telemetry.registry).decode()
    assert "leadscale_scaled_objects 1.0" in text
    assert 'leadscale_desired_replicas{metric="leadscale-llama",name="chat",namespace="llm"}' in text
    assert text.count("# TYPE leadscale_scaled_objects gauge") == 1  # ours left out, the child's in


def test_idle_objects_are_dropped_there_and_forgotten_here(load_file: Path) -> None:
    process = DecisionProcess(settings(load_file, idle_timeout_s=1.5), Telemetry())
    process.start()
    try:
        process.lookup("llm", "asked", META)
        process.lookup("llm", "idle", META)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and len(process._mirrors) > 1:
            process.lookup("llm", "asked", META)  # touches reach the child once a second: it stays
            time.sleep(0.2)
        assert [key[1] for key in process._mirrors] == ["asked"]
        assert [row["name"] for row in process.snapshot()] == ["asked"]
    finally:
        process.stop()


def test_a_dead_child_is_never_answered_for(load_file: Path) -> None:
    process = DecisionProcess(settings(load_file, staleness_limit_s=3.0), Telemetry())
    process.start()
    try:
        assert process.lookup("llm", "chat", META).desired_replicas >= 1
        os.kill(process._process.pid, signal.SIGKILL)
        assert process.failed.wait(10)
        time.sleep(2.1)  # the last answer's data (1 s old when fetched) ages past the limit
        with pytest.raises(Unavailable, match="decision process has exited"):
            process.lookup("llm", "chat", META)
        with pytest.raises(RuntimeError, match="exited"):
            process.snapshot()
        with pytest.raises(Unavailable, match="decision process has exited"):  # a new object, too
            process.lookup("llm", "new", META)
    finally:
        process.stop()


def test_a_child_that_cannot_start_says_why(load_file: Path, tmp_path: Path) -> None:
    process = DecisionProcess(settings(load_file, prometheus_auth_modes="bearer",
                                       prometheus_auth_dir=str(tmp_path / "missing")), Telemetry())
    with pytest.raises(RuntimeError, match=r"--prometheus-auth-dir=.*not a directory"):
        process.start()
    process.stop()


def test_lookups_meanwhile_do_not_wait_on_rounds(load_file: Path) -> None:
    """A thousand objects re-decided every 0.2 s elsewhere; here a lookup is a dictionary read."""
    process = DecisionProcess(settings(load_file), Telemetry())
    process.start()
    try:
        metas = [{**META, "model": "llama", "maxNumSeqs": str(100 + i)} for i in range(300)]
        for i, meta in enumerate(metas):
            process.lookup("llm", f"chat-{i}", meta)
        worst = 0.0
        for _ in range(3):
            for i, meta in enumerate(metas):
                started = time.perf_counter()
                process.lookup("llm", f"chat-{i}", meta)
                worst = max(worst, time.perf_counter() - started)
        assert worst < 0.5  # never a first-call wait: every object stays known while rounds run
    finally:
        process.stop()


@pytest.mark.slow
def test_serve_exits_when_its_decision_process_dies(tmp_path: Path) -> None:
    with ScalerProcess(["--prometheus-url", "http://127.0.0.1:9"], tmp_path) as scaler:
        assert scaler.proc is not None
        (child,) = [c for c in psutil.Process(scaler.proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        child.kill()
        assert scaler.proc.wait(timeout=20) == 1
        assert "the decision process exited" in scaler.log()


def test_an_object_asked_again_under_a_new_id_is_answered_at_once(load_file: Path) -> None:
    """The child's side of an ask, in this process: a known, evaluated object asked under a new id (the
    serving side forgot it) is answered now, not a round later, and only the new id is kept."""
    from scaler.decision_process import _ask

    sent: list[tuple[object, ...]] = []
    entries: dict[int, object] = {}
    here = Evaluator(prometheus_url="http://127.0.0.1:9", source_factory=FileSourceFactory(str(load_file)),
                     telemetry=Telemetry())
    try:
        _ask(here, entries, sent.append, 1, "llm", "chat", META)  # type: ignore[arg-type]
        assert entries[1].evaluated.wait(5)  # type: ignore[attr-defined]
        sent.clear()
        _ask(here, entries, sent.append, 7, "llm", "chat", META)  # type: ignore[arg-type]
        assert list(entries) == [7]
        ((kind, rows),) = sent
        assert kind == "update" and rows[0][0] == 7 and rows[0][1] == here.lookup("llm", "chat", META).desired_replicas
        _ask(here, entries, sent.append, 8, "llm", "bad", {**META, "maxNumSeqs": "many"})  # type: ignore[arg-type]
        assert sent[-1][:3] == ("refused", 8, "metadata") and "maxNumSeqs" in str(sent[-1][3])
        assert 8 not in entries
    finally:
        here.stop()


@pytest.mark.slow
def test_serve_stops_cleanly_when_its_whole_group_gets_sigterm_again_and_again(tmp_path: Path) -> None:
    """timeout(1) and shells signal the whole process group, the decision process included, and often more than
    once: serve still stops, exit 0, and stops its child itself (the child ignores the group's SIGTERM, so it is
    never lost mid-answer; serve's handler takes no lock: one that set an Event deadlocked when signals nested)."""
    import subprocess
    import sys

    from conftest import ROOT

    log = tmp_path / "serve.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "leadscale", "serve", "--host", "127.0.0.1", "--port", "0",
                                 "--metrics-port", "0", "--prometheus-url", "http://127.0.0.1:9"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "serving ExternalScaler" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.05)
        family = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        for _ in range(5):
            os.killpg(proc.pid, signal.SIGTERM)
            time.sleep(0.01)
        assert proc.wait(timeout=30) == 0, log.read_text(errors="replace")[-2000:]
        time.sleep(1)
        assert not [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert "decision process exited" not in log.read_text(errors="replace")  # it was stopped, not lost
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
