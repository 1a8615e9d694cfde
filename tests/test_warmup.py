"""A restarted scaler warms up from a REAL Prometheus's history and decides as one that never stopped.

An hour and ten minutes of two vLLM replicas' metrics, written as OpenMetrics and backfilled into a real
Prometheus with ``promtool``: a steady load whose first tokens were late (15 %) for five minutes while
each replica carried most of its modelled capacity, so the policy's efficiency rule learned that a
replica delivers less than the model says. The reference is a scaler that never stopped: ``evaluation.step``
on an instant fetch every 15 s over that hour. A new ``Evaluator`` at the hour's end warms up from a
range read of the same history (``scaler.warmup``) and must end in the reference's state and decision;
one without warm-up starts from the model's word (efficiency 1) and holds the fleet it finds, which the
hour showed too small.
"""

from __future__ import annotations

import logging
import math
import shutil
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import require
from support.openmetrics import TTFT_LE, openmetrics, steady_replica
from support.prometheus import PrometheusServer, eventually

from scaler import evaluation, warmup
from scaler.evaluator import Evaluator
from scaler.metadata import parse_metadata
from scaler.signals import Signals
from scaler.sources.prometheus import PrometheusSource
from simulator.observe import metrics_of

ROOT = Path(__file__).resolve().parent.parent
MODEL = "warm-model"
META = {"model": MODEL, "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000", "maxNumSeqs": "256",
        "kvCacheTokens": "200000", "rateWindow": "60"}
OBJ = ("llm", "chat")
REPLICAS = 2
SPAN_S = 4200  # 70 minutes: the warm-up's hour plus the rate window before it
SCRAPE_S = 15
CALM_SHARE = (0.6, 0.25, 0.14, 0.01, 0.0)  # 1 % of first tokens after the 2 s SLO
LATE_SHARE = (0.5, 0.2, 0.15, 0.1, 0.05)  # 15 %
LATE_S = (3900, 4200)  # the last five minutes before the restart: first tokens late


def snapshot(rid: int, t: float) -> dict[str, Any]:
    """Replica ``rid``'s /metrics at ``t``: 2 requests/s of 2,400-token prompts, first tokens late for
    five minutes (counters integrate the piecewise shares, so every bucket only grows)."""
    rate = 2.0 + 0.05 * rid
    late_for = min(max(t - LATE_S[0], 0.0), LATE_S[1] - LATE_S[0])
    done = math.floor(rate * t)
    cumulative = [math.floor(rate * ((t - late_for) * sum(CALM_SHARE[: i + 1]) + late_for * sum(LATE_SHARE[: i + 1])))
                  for i in range(len(TTFT_LE))]
    return steady_replica(t, done, [float(c) for c in cumulative])


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(Prometheus URL, Unix time of the history's first sample)."""
    require(shutil.which("promtool") is not None, "promtool (apt-get install prometheus)")
    taken = [(rid, float(t), metrics_of(snapshot(rid, float(t))))
             for t in range(0, SPAN_S + 1, SCRAPE_S) for rid in range(REPLICAS)]
    root = tmp_path_factory.mktemp("warmup")
    start = (int(time.time()) // 3600 - 4) * 3600
    (root / "samples.om").write_text(openmetrics(start, taken, [], model=MODEL))
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(root / "samples.om"),
                    str(root / "data")], check=True, capture_output=True, timeout=300)
    with PrometheusServer(scrape_interval_s=15, data_dir=Path(root / "data"), ready_timeout_s=90) as prom:
        yield prom.url, start


END_S = SPAN_S - 0.5  # the restart, half a second off the scrape grid (as a live loop is)
# two replicas: every sum and average over them is one addition, exact in any order, so range and instant
# reads agree to the bit and the states compare with ==


def never_stopped(url: str, start: int, until: float | None) -> evaluation.Held:
    """The reference: a scaler that ran through the hour, deciding on an instant fetch every 15 s, then
    once more at ``until`` (None: not)."""
    config = parse_metadata(META)
    target = config.target(OBJ[0])
    first, last = warmup.window(start + END_S, warmup.DEFAULT_SPAN_S)
    instants = [first + k * warmup.SPACING_S for k in range(round((last - first) / warmup.SPACING_S) + 1)]
    held = evaluation.Held()
    for at in [*instants, *([until] if until is not None else [])]:
        answer = PrometheusSource(url, timeout_s=10, evaluation_time=at).fetch([target], now=at)[target]
        try:
            held = evaluation.step(config, held, evaluation.usable(answer, 60.0), at, (None, None),
                                   f"Prometheus {url}")
        except evaluation.Skipped:
            continue
    return held


class FollowingSource(PrometheusSource):
    """The real source, its instant queries evaluated at the test's clock (the history lies hours back)."""

    def __init__(self, url: str, clock: Any) -> None:
        super().__init__(url, timeout_s=10)
        self.clock = clock

    def fetch(self, targets: Any, now: float) -> Any:
        self.evaluation_time = self.clock()
        return super().fetch(targets, now)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def restarted(url: str, start: int, warm_up_s: float) -> tuple[Evaluator, Clock]:
    """A new evaluator at the end of the history, its first answer given; the round 5 s later run."""
    clock = Clock(start + END_S)
    evaluator = Evaluator(prometheus_url=url, clock=clock, warm_up_s=warm_up_s,
                          source_factory=lambda key: FollowingSource(str(key[1]), clock))
    evaluator.lookup(*OBJ, META)
    return evaluator, clock


def _ready(entry: Any) -> None:
    assert entry.warm is not None, "the warm-up has not finished"


def entry_of(evaluator: Evaluator) -> Any:
    (entry,) = evaluator._entries.values()
    return entry


def test_a_restarted_scaler_warms_up_to_the_state_of_one_that_never_stopped(history: tuple[str, int]) -> None:
    url, start = history
    evaluator, clock = restarted(url, start, warmup.DEFAULT_SPAN_S)
    try:
        entry = entry_of(evaluator)
        eventually(lambda: _ready(entry), timeout_s=120)
        clock.t += 5.0
        evaluator.run_once()
        reference = never_stopped(url, start, clock.t)
        warmed = entry.held
        assert entry.warmed_from >= 235  # nearly every one of the hour's 241 snapshots was decided on
        assert warmed.state is not None and reference.state is not None
        assert reference.state.capacity.efficiency < 0.95  # the hour taught something the model did not say
        assert warmed.state.capacity == reference.state.capacity
        assert warmed.state.demand == reference.state.demand and warmed.state.kv == reference.state.kv
        assert warmed.decision is not None and reference.decision is not None
        assert warmed.decision.desired_replicas == reference.decision.desired_replicas
        assert warmed.decision.terms == reference.decision.terms
        assert evaluator.snapshot()[0]["warmed_up_from"] == entry.warmed_from
    finally:
        evaluator.stop()


def test_without_warm_up_a_restart_forgets_what_the_hour_taught(history: tuple[str, int]) -> None:
    url, start = history
    cold, clock = restarted(url, start, 0.0)
    try:
        clock.t += 5.0
        cold.run_once()
        forgot = entry_of(cold).held
        assert forgot.state is not None and forgot.state.capacity.efficiency == 1.0
        assert entry_of(cold).warm is None and entry_of(cold).warmed_from == 0
        reference = never_stopped(url, start, clock.t)
        assert reference.decision is not None and forgot.decision is not None
        # the only floor a new scaler has is the fleet it finds (2): the hour said 2 replicas are not enough
        assert reference.decision.desired_replicas > forgot.decision.desired_replicas
        assert forgot.decision.desired_replicas == REPLICAS
    finally:
        cold.stop()


def test_a_history_read_that_fails_leaves_the_object_deciding_as_a_new_one(
        history: tuple[str, int], caplog: pytest.LogCaptureFixture) -> None:
    url, start = history

    class NoHistory(FollowingSource):
        def history(self, *args: Any) -> Any:
            raise ConnectionError("range queries refused")

    clock = Clock(start + END_S)
    evaluator = Evaluator(prometheus_url=url, clock=clock, source_factory=lambda key: NoHistory(str(key[1]), clock))
    try:
        with caplog.at_level(logging.WARNING, logger="leadscale.evaluator"):
            evaluator.lookup(*OBJ, META)
            eventually(lambda: _logged(caplog, "history failed (ConnectionError: range queries refused); "
                                               "1 objects start from nothing"), timeout_s=30)
        clock.t += 5.0
        evaluator.run_once()
        entry = entry_of(evaluator)
        assert entry.warm is None and entry.warmed_from == 0 and entry.error is None
        assert entry.held.decision is not None and entry.held.decision.desired_replicas == REPLICAS
    finally:
        evaluator.stop()


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> None:
    assert any(text in record.getMessage() for record in caplog.records), [r.getMessage() for r in caplog.records]


def test_replay_skips_what_a_live_round_would_skip() -> None:
    """Errors and stale snapshots are passed over and the state carries on, as in a live round."""
    from scaler.sources.base import SourceError

    config = parse_metadata(META)
    good = Signals(at=0.0, prompt_tokens_per_s=4000.0, generation_tokens_per_s=300.0, requests_waiting=0.0,
                   requests_running=6.0, ready_replicas=2, data_age_s=1.0)
    stale = Signals(at=0.0, prompt_tokens_per_s=4000.0, generation_tokens_per_s=300.0, requests_waiting=0.0,
                    requests_running=6.0, ready_replicas=2, data_age_s=600.0)
    how = warmup.Replay(config, "test", 60.0)
    done = warmup.replay(how, [(0.0, good, None), (15.0, SourceError("down"), None), (30.0, stale, None),
                               (45.0, good, None)])
    assert (done.used, done.offered, done.last_at) == (2, 4, 45.0)
    alone = evaluation.step(config, evaluation.step(config, evaluation.Held(), good, 0.0, (None, None), "test"),
                            good, 45.0, (None, None), "test")
    assert done.held == alone


@pytest.mark.parametrize(("now", "span", "spacing"), [(math.nan, 60.0, 15.0), (0.0, 0.0, 15.0),
                                                       (0.0, 60.0, -1.0), (0.0, math.inf, 15.0)])
def test_a_bad_warm_up_window_names_its_values(now: float, span: float, spacing: float) -> None:
    with pytest.raises(ValueError, match="warm-up window"):
        warmup.window(now, span, spacing)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf, "1h"])
def test_a_bad_warm_up_setting_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="warm_up_s"):
        Evaluator(prometheus_url="http://127.0.0.1:9", warm_up_s=value)


@pytest.mark.parametrize("bad", ["-1", "nan", "86401", "1h"])
def test_serve_refuses_a_bad_warm_up_naming_it(bad: str) -> None:
    result = subprocess.run([sys.executable, "-m", "leadscale", "serve", "--warm-up", bad], cwd=ROOT,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "--warm-up" in result.stderr and f"'{bad}'" in result.stderr and "seconds" in result.stderr


@pytest.mark.parametrize(("argv", "env", "want"), [([], {}, 3600.0), (["--warm-up", "0"], {}, 0.0),
                                                   ([], {"LEADSCALE_WARM_UP": "900"}, 900.0)])
def test_the_warm_up_setting_reaches_the_decision_process(argv: list[str], env: dict[str, str], want: float,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from scaler import serve_cli
    from scaler.decision_process import DecisionSettings

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    args = serve_cli.resolve(parser.parse_args(["serve", "--prometheus-url", "http://127.0.0.1:9", *argv]))
    assert DecisionSettings.from_args(args).warm_up_s == want


class SlowHistory:
    """A source with history whose range reads hang until released (a Prometheus struggling with them)."""

    def __init__(self, release: threading.Event) -> None:
        self.release, self.reads = release, 0

    def fetch(self, targets: Any, now: float) -> Any:
        return {t: Signals(at=now, prompt_tokens_per_s=4000.0, generation_tokens_per_s=300.0, requests_waiting=0.0,
                           requests_running=6.0, ready_replicas=2, data_age_s=1.0) for t in targets}

    def history(self, targets: Any, start: float, end: float, step_s: float) -> Any:
        self.reads += 1
        self.release.wait(30)
        return []


def test_warm_ups_never_hold_up_the_rounds() -> None:
    """Twelve objects on twelve Prometheus servers, every history read hanging: the rounds still decide every
    object at once (warm-ups run one at a time, on their own thread, never on the rounds' eight workers)."""
    release = threading.Event()
    sources: dict[Any, SlowHistory] = {}
    clock = Clock(1_000.0)
    evaluator = Evaluator(prometheus_url="http://127.0.0.1:9", clock=clock,
                          source_factory=lambda key: sources.setdefault(key, SlowHistory(release)))
    try:
        for k in range(12):
            evaluator.lookup("llm", f"chat-{k}", {**META, "prometheusAddress": f"http://127.0.0.1:{9000 + k}"})
        eventually(lambda: _reading(sources), timeout_s=10)
        clock.t += 5.0
        began = time.monotonic()
        evaluator.run_once()
        assert time.monotonic() - began < 5.0
        assert all(e.held.data_at == clock.t - 1.0 for e in evaluator._entries.values())
        assert sum(s.reads for s in sources.values()) == 1  # the others wait their turn
    finally:
        release.set()
        evaluator.stop()


def _reading(sources: dict[Any, SlowHistory]) -> None:
    assert sum(s.reads for s in sources.values()) >= 1


class Kube:
    """The Kubernetes observer's view now: measured cold starts, the ScaledObject's bounds (or a failing API)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def observe(self, namespace: str, name: str) -> Any:
        if self.fail:
            raise ConnectionError("api server down")
        return types.SimpleNamespace(ready_replicas=2, starting_replicas=0, lead_time_s=240.0,
                                     cold_starts_s=(200.0, 240.0, 260.0), min_replicas=1, max_replicas=3)


def _warm_decision(url: str, start: int, kube: Kube | None) -> Any:
    """The decision a new evaluator's replay of the hour ends in, with ``leadTime: auto``."""
    clock = Clock(start + END_S)
    evaluator = Evaluator(prometheus_url=url, clock=clock, kube=kube,
                          source_factory=lambda key: FollowingSource(str(key[1]), clock))
    try:
        evaluator.lookup(*OBJ, {**META, "leadTime": "auto"})
        entry = entry_of(evaluator)
        eventually(lambda: _ready(entry), timeout_s=120)
        assert entry.warm.used >= 235
        return entry.warm.held.decision
    finally:
        evaluator.stop()


def test_the_replay_takes_what_prometheus_cannot_say_from_kubernetes_now(history: tuple[str, int]) -> None:
    """With ``--kubernetes`` the hour is replayed with the lead time measured now (240 s) and the ScaledObject's
    bounds (max 3; the hour's last decision without them is 4); with the API down, exactly as without
    ``--kubernetes`` (the configured lead time, no bound)."""
    url, start = history
    alone, seen, down = (_warm_decision(url, start, kube) for kube in (None, Kube(), Kube(fail=True)))
    assert (alone.terms["lead_time_s"], alone.desired_replicas) == (180.0, 4)
    assert (seen.terms["lead_time_s"], seen.desired_replicas) == (240.0, 3)
    assert down == alone


def test_shadow_writes_what_the_scaler_would_have_asked_over_the_hour(history: tuple[str, int], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``leadscale shadow`` replays the live decision over the same hour and writes each one beside the fleet
    that served: its last row is the warm-up's last decision, every term included."""
    import csv

    from leadscale.cli import main

    url, start = history
    out = tmp_path / "shadow.csv"
    argv = ["shadow", "--prometheus-url", url, "--namespace", OBJ[0], "--until", repr(start + END_S), "--out", str(out),
            *(x for k, v in META.items() for x in ("--metadata", f"{k}={v}"))]
    assert main(argv) == 0
    rows = list(csv.DictReader(out.open()))
    reference = never_stopped(url, start, None)  # the same instants: the hour's, ending at --until
    assert reference.decision is not None
    assert len(rows) >= 235 and int(rows[-1]["desired_replicas"]) == reference.decision.desired_replicas == 4
    assert float(rows[-1]["efficiency"]) == reference.decision.terms["efficiency"] < 0.7
    assert {int(r["ready_replicas"].split(".")[0]) for r in rows} == {REPLICAS}
    printed = capsys.readouterr().out
    assert "replicas that served: mean 2.00" in printed and "leadscale would have asked" in printed


@pytest.mark.parametrize(("argv", "message"), [
    (["--metadata", "model=m", "--metadata", "prefillTokensPerSecond=-5"], "prefillTokensPerSecond"),
    (["--metadata", "noequals"], "KEY=VALUE"),
    (["--metadata", "model=m", "--since", "0"], "--since"),
    ([*(x for k, v in META.items() for x in ("--metadata", f"{k}={v}")), "--since", "86400", "--step", "1"],
     "at most 11000"),
])
def test_shadow_refuses_bad_input_naming_it(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from leadscale.cli import main

    try:
        code = main(["shadow", "--prometheus-url", "http://127.0.0.1:9", *argv])
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err
