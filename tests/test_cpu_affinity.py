"""``--pin-serving-cpu``: where ``leadscale serve``'s two processes run, read back from the kernel."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given
from hypothesis import strategies as st
from support.scaler_process import ScalerProcess

from scaler import cpu_affinity

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")


@given(st.frozensets(st.integers(0, 4095), min_size=0, max_size=64))
def test_the_serving_process_gets_the_highest_cpu_when_there_is_a_choice(allowed: frozenset[int]) -> None:
    cpu = cpu_affinity.serving_cpu(allowed)
    assert cpu == ({max(allowed)} if len(allowed) >= 2 else None)


def _masks(pid: int) -> dict[int, frozenset[int]]:
    """Every live thread of ``pid`` and the CPUs it may run on."""
    masks = {}
    for thread in psutil.Process(pid).threads():
        try:
            masks[thread.id] = frozenset(os.sched_getaffinity(thread.id))
        except ProcessLookupError:  # ended since the listing
            continue
    return masks


def _serving(scaler: ScalerProcess) -> bool:
    assert scaler.channel is not None
    answer = health_pb2_grpc.HealthStub(scaler.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def _decision_process(pid: int) -> psutil.Process:
    (child,) = [c for c in psutil.Process(pid).children()
                if "spawn_main" in " ".join(c.cmdline()) and "resource_tracker" not in " ".join(c.cmdline())]
    return child


def _placed(pin: str, tmp_path: Path) -> tuple[dict[int, frozenset[int]], dict[int, frozenset[int]], str]:
    """A real ``leadscale serve --pin-serving-cpu pin``, once serving: its threads' CPUs, its decision process's
    threads' CPUs, and its log."""
    with ScalerProcess(["--prometheus-url", "http://127.0.0.1:9", "--pin-serving-cpu", pin], tmp_path) as scaler:
        assert scaler.proc is not None
        assert _serving(scaler)
        return _masks(scaler.proc.pid), _masks(_decision_process(scaler.proc.pid).pid), scaler.log()


@pytest.mark.slow
def test_every_serving_thread_runs_on_one_cpu_and_the_decisions_anywhere(tmp_path: Path) -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    serving, decisions, log = _placed("true", tmp_path)
    assert set(decisions.values()) == {allowed}  # started before the pin: every CPU, as the kernel likes
    cpu = cpu_affinity.serving_cpu(allowed)
    if cpu is None:  # one CPU: nothing to choose, nothing pinned, and the log says why
        assert set(serving.values()) == {allowed}
        assert "nothing is pinned" in log
        return
    # gRPC's threads started after the pin, the decisions' receiver before it: all on the one CPU
    assert len(serving) >= 5 and set(serving.values()) == {cpu}
    assert f"serving threads on CPU {max(allowed)}" in log


@pytest.mark.slow
def test_false_leaves_placement_to_the_kernel(tmp_path: Path) -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    serving, decisions, log = _placed("false", tmp_path)
    assert set(serving.values()) == set(decisions.values()) == {allowed}
    assert "serving threads wherever the kernel puts them" in log


def test_a_cpu_the_kernel_refuses_is_a_warning_not_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    before = frozenset(os.sched_getaffinity(0))
    impossible = frozenset({max(before) + 4096})  # no such CPU: sched_setaffinity says EINVAL
    with caplog.at_level(logging.WARNING, logger="leadscale.cpu_affinity"):
        assert cpu_affinity.pin_or_warn(impossible, "serving") is False
    assert f"cannot place the serving process on CPU {max(before) + 4096}" in caplog.text
    assert frozenset(os.sched_getaffinity(0)) == before
    assert cpu_affinity.pin_or_warn(None, "serving") is False


def test_a_bad_value_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from leadscale.cli import build_parser
    from scaler import serve_cli

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--pin-serving-cpu", "both"])
    assert "--pin-serving-cpu" in capsys.readouterr().err
    monkeypatch.setenv("LEADSCALE_PIN_SERVING_CPU", "both")
    with pytest.raises(SystemExit, match="LEADSCALE_PIN_SERVING_CPU='both'"):
        serve_cli.resolve(build_parser().parse_args(["serve"]))
