"""Faults against the real parts: a real Prometheus, the test vLLM exporter, the real ``leadscale serve`` process.

Each test drives one fault while a poller makes KEDA's calls (``GetMetrics`` and ``IsActive``, each with
KEDA's 3 s deadline) every 0.25 s, and then checks the whole timeline:

- every answer came within the deadline;
- while the fault lasts, an answer is either the last good decision (while the data behind it is
  younger than ``--staleness-limit``) or ``UNAVAILABLE`` naming the reason: never a made-up 0, never a
  value the data does not support;
- once the fault clears, good answers come back; the recovery time is printed (``-s``) and bounded.

docs/scaler.md ("Faults") has the table these tests back. Timings: scrapes every 0.5 s, a 3 s rate window,
an evaluation every 0.5 s, a 5 s staleness limit. Prometheus 2.42 hands a new scrape target over at most
every 5 s, so "recovery" includes that discovery delay where a fresh Prometheus starts.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.http_proxy import HttpProxy
from support.prometheus import PrometheusServer, eventually, free_port
from support.scaler_process import Keda, ScalerProcess
from support.vllm_exporter import VllmExporter

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(300)]

SCRAPE_S, WINDOW_S, INTERVAL_S, STALE_S, DELAY_S = 0.5, 3.0, 0.5, 5.0, 20.0
SLOW_BOX_S = 60.0
"""Deadline for conditions that a loaded 2-core box reaches late, never wrongly."""
DEADLINE_S = Keda.DEADLINE_S
META = {"model": "tiny", "prefillTokensPerSecond": "8000", "decodeTokensPerSecond": "2000", "maxNumSeqs": "64",
        "kvCacheTokens": "100000", "rateWindow": f"{WINDOW_S:g}", "scaleDownDelay": f"{DELAY_S:g}",
        "leadTime": "5"}
BURST = {"prompt_tokens_per_s": 24_000, "generation_tokens_per_s": 2_400, "prompt_len": 1000, "output_len": 100}
SERVE_ARGS = ["--interval", f"{INTERVAL_S:g}", "--staleness-limit", f"{STALE_S:g}", "--log-level", "INFO"]


@dataclass
class Answer:
    t: float
    rpc: str
    code: str
    value: Any
    took_s: float


@dataclass
class Poller:
    """KEDA's polling for one object, in a thread: every answer with its time (monotonic seconds)."""

    keda: Keda
    period_s: float = 0.25
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Poller:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for rpc, call in (("GetMetrics", self.keda.get_metrics), ("IsActive", self.keda.is_active)):
                code, value, took = call()
                self.answers.append(Answer(time.monotonic(), rpc, code, value, took))
            self._stop.wait(self.period_s)

    def since(self, t: float, rpc: str = "GetMetrics") -> list[Answer]:
        return [a for a in self.answers if a.t >= t and a.rpc == rpc]

    def wait(self, what: str, ok: Callable[[Answer], bool], after: float, timeout_s: float = SLOW_BOX_S) -> Answer:
        """The first GetMetrics answer after ``after`` that is ``ok``; fails naming ``what`` and the last answers."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hit = next((a for a in self.since(after) if ok(a)), None)
            if hit is not None:
                return hit
            time.sleep(0.1)
        raise AssertionError(f"{what}: not within {timeout_s} s; last answers {self.since(after)[-5:]}")


def all_within_deadline(answers: list[Answer]) -> None:
    """Every answer within KEDA's deadline, and no IsActive ``false`` while the pods are busy (each test keeps
    its load on throughout): a made-up ``false`` would let KEDA scale to zero."""
    slow = [a for a in answers if a.took_s >= DEADLINE_S]
    assert not slow, f"answers past KEDA's {DEADLINE_S} s deadline: {slow[:5]}"
    only([a for a in answers if a.rpc == "IsActive"], lambda a: a.code == "UNAVAILABLE" or a.value is True,
         "IsActive is true or UNAVAILABLE")


def only(answers: list[Answer], allowed: Callable[[Answer], bool], what: str) -> None:
    bad = [a for a in answers if not allowed(a)]
    assert not bad, f"{what}: {bad[:5]}"


def report(name: str, **figures: float) -> None:
    print(f"\nFAULT {name}: " + ", ".join(f"{k}={v:.1f}" for k, v in figures.items()))


@pytest.fixture
def pod() -> Iterator[VllmExporter]:
    with VllmExporter(model="tiny") as exporter:
        exporter.set_load(**BURST)
        exporter.set_queue(waiting=4, running=48, kv_usage=0.6)
        yield exporter


def steady(poller: Poller, after: float, for_s: float = 2 * WINDOW_S) -> float:
    """Wait for the burst's answer to settle (the same good value for two rate windows); return it."""
    def settled(a: Answer) -> bool:
        recent = [x for x in poller.since(after) if a.t - for_s <= x.t <= a.t]
        return (bool(recent) and recent[0].t - after >= 0 and a.t - for_s >= after
                and all(x.code == "ok" and x.value == a.value for x in recent) and a.value > 1)

    return float(poller.wait("a steady answer under the burst", settled, after).value)


# --- Prometheus absent at start -------------------------------------------------------------------------------------
def test_prometheus_absent_at_start_is_unavailable_until_it_comes(pod: VllmExporter, tmp_path: Path) -> None:
    port = free_port()
    with ScalerProcess(["--prometheus-url", f"http://127.0.0.1:{port}", *SERVE_ARGS], tmp_path) as scaler:
        keda = scaler.keda(META)
        assert keda.spec()[0] == "ok"  # the spec needs no signal
        with Poller(keda) as poller:
            t0 = time.monotonic()
            time.sleep(3.0)
            absent = list(poller.answers)
            with PrometheusServer([pod.address], scrape_interval_s=SCRAPE_S, port=port):
                started = time.monotonic()
                first = poller.wait("a good answer once Prometheus is up", lambda a: a.code == "ok", started)
                time.sleep(2.0)
            recovery = first.t - started
    assert absent, "the poller made no call"
    only(absent, lambda a: a.code == "UNAVAILABLE" and "Prometheus" in a.value and "failed query" in a.value,
         "while Prometheus is absent every answer is UNAVAILABLE naming it")
    warming = [a for a in poller.since(started) if a.t < first.t]
    only(warming, lambda a: a.code == "UNAVAILABLE", "until the first good answer, UNAVAILABLE")
    assert any("warming up" in a.value for a in warming), "no answer said that Prometheus is warming up"
    good = poller.since(first.t)
    only(good, lambda a: a.code == "ok", "once good, good")
    truth = good[-1].value
    assert truth >= 4, good[-1]
    # Prometheus has seen at least half the rate window when the first answer comes: at most 2x understated,
    # never a 0, and the values only rise to the truth (a lower answer would tell KEDA to scale down)
    assert first.value >= truth / 2, (first, truth)
    assert all(b.value >= a.value for a, b in itertools.pairwise(good)), [a.value for a in good]
    all_within_deadline(poller.answers)
    assert recovery < 30, recovery
    report("prometheus-absent-at-start", recovery_s=recovery, since_fault_s=first.t - t0, first_value=first.value,
           true_value=truth)


# --- Prometheus killed mid-run, then restarted ----------------------------------------------------------------------
def test_prometheus_killed_serves_the_last_decision_then_unavailable_then_recovers(pod: VllmExporter,
                                                                                   tmp_path: Path) -> None:
    with PrometheusServer([pod.address], scrape_interval_s=SCRAPE_S) as prom, \
            ScalerProcess(["--prometheus-url", prom.url, *SERVE_ARGS], tmp_path) as scaler:
        prom.wait_until_up(1)
        keda = scaler.keda(META)
        keda.spec()
        with Poller(keda) as poller:
            value = steady(poller, time.monotonic())
            killed = time.monotonic()
            prom.kill()
            gone = poller.wait("UNAVAILABLE after the staleness limit", lambda a: a.code == "UNAVAILABLE", killed)
            time.sleep(1.0)
            restarted = time.monotonic()
            prom.restart()
            back = poller.wait("a good answer after the restart", lambda a: a.code == "ok", restarted)
            time.sleep(2.0)
    during = [a for a in poller.since(killed) if a.t < back.t]
    only([a for a in during if a.code == "ok"], lambda a: a.value == value,
         "during the outage a good answer is the last decision, unchanged")
    only(during, lambda a: a.code in ("ok", "UNAVAILABLE"), "only the last decision or UNAVAILABLE")
    only([a for a in during if a.t >= gone.t], lambda a: a.code == "UNAVAILABLE" and "Prometheus" in a.value,
         "once UNAVAILABLE, it stays so until Prometheus is back")
    only(poller.since(back.t), lambda a: a.code == "ok" and abs(a.value - value) <= 1,
         "after the restart, the burst's value again (Prometheus kept its history)")
    all_within_deadline(poller.answers)
    # the staleness limit counts from the data's own time, which trails the kill by a scrape or two
    assert 0.5 <= gone.t - killed <= STALE_S + 10, gone.t - killed
    assert back.t - restarted < 30
    report("prometheus-killed", last_decision_served_s=gone.t - killed, recovery_after_restart_s=back.t - restarted)


# --- Prometheus answering slowly (a loopback proxy adding 5 s) ------------------------------------------------------
def test_slow_prometheus_never_makes_keda_wait(pod: VllmExporter, tmp_path: Path) -> None:
    with PrometheusServer([pod.address], scrape_interval_s=SCRAPE_S) as prom, HttpProxy(prom.url) as proxy, \
            ScalerProcess(["--prometheus-url", proxy.url, *SERVE_ARGS], tmp_path) as scaler:
        prom.wait_until_up(1)
        keda = scaler.keda(META)
        keda.spec()
        with Poller(keda) as poller:
            value = steady(poller, time.monotonic())
            slowed = time.monotonic()
            proxy.delay_s = 5.0
            newcomer = scaler.keda(META, name="new-while-slow").get_metrics()
            gone = poller.wait("UNAVAILABLE after the staleness limit", lambda a: a.code == "UNAVAILABLE", slowed)
            time.sleep(2.0)
            cleared = time.monotonic()
            proxy.delay_s = 0.0
            back = poller.wait("a good answer once Prometheus is fast again", lambda a: a.code == "ok", cleared)
            time.sleep(2.0)
    during = [a for a in poller.since(slowed) if a.t < back.t]
    only([a for a in during if a.code == "ok"], lambda a: a.value == value, "while slow, the last decision")
    only(during, lambda a: a.code in ("ok", "UNAVAILABLE"), "only the last decision or UNAVAILABLE")
    assert "UNAVAILABLE" in [a.code for a in during]
    only([a for a in during if a.code == "UNAVAILABLE"], lambda a: "timed out" in a.value.lower()
         or "no fresh signal" in a.value, "UNAVAILABLE says why")
    assert newcomer[0] == "UNAVAILABLE" and "first evaluation still running" in newcomer[1], newcomer
    assert newcomer[2] < DEADLINE_S, newcomer  # a new object is bounded too (2 s), not left to KEDA's deadline
    only(poller.since(back.t), lambda a: a.code == "ok" and abs(a.value - value) <= 1, "the burst's value again")
    all_within_deadline(poller.answers)
    report("prometheus-slow-5s", last_decision_served_s=gone.t - slowed, recovery_s=back.t - cleared,
           new_object_answer_s=newcomer[2])


# --- Prometheus returning partial results ---------------------------------------------------------------------------
@pytest.mark.parametrize("verdict", ["error", "empty"])
def test_a_required_signal_missing_from_the_answer_is_never_guessed(pod: VllmExporter, tmp_path: Path,
                                                                    verdict: str) -> None:
    """One query of the round fails (503) or comes back with no series while the others answer."""
    with PrometheusServer([pod.address], scrape_interval_s=SCRAPE_S) as prom, HttpProxy(prom.url) as proxy, \
            ScalerProcess(["--prometheus-url", proxy.url, *SERVE_ARGS], tmp_path) as scaler:
        prom.wait_until_up(1)
        keda = scaler.keda(META)
        keda.spec()
        with Poller(keda) as poller:
            value = steady(poller, time.monotonic())
            broke = time.monotonic()
            proxy.rewrite = lambda query: verdict if "vllm:prompt_tokens_total" in query else None
            gone = poller.wait("UNAVAILABLE after the staleness limit", lambda a: a.code == "UNAVAILABLE", broke)
            time.sleep(1.0)
            cleared = time.monotonic()
            proxy.rewrite = None
            back = poller.wait("a good answer once the answers are whole", lambda a: a.code == "ok", cleared)
            time.sleep(1.0)
    during = [a for a in poller.since(broke) if a.t < back.t]
    only([a for a in during if a.code == "ok"], lambda a: a.value == value, "the last decision, unchanged")
    reason = "503" if verdict == "error" else "no data: prompt_tokens_per_s"
    only([a for a in during if a.t >= gone.t], lambda a: a.code == "UNAVAILABLE" and reason in a.value,
         f"UNAVAILABLE naming {reason!r}")
    only(poller.since(back.t), lambda a: a.code == "ok" and abs(a.value - value) <= 1, "the burst's value again")
    all_within_deadline(poller.answers)
    report(f"partial-{verdict}", last_decision_served_s=gone.t - broke, recovery_s=back.t - cleared)


def test_optional_signals_missing_from_the_answer_never_lower_the_answer(pod: VllmExporter, tmp_path: Path) -> None:
    """The histograms (prompt lengths, TTFT) answer with no series: the policy goes on without them."""
    with PrometheusServer([pod.address], scrape_interval_s=SCRAPE_S) as prom, HttpProxy(prom.url) as proxy, \
            ScalerProcess(["--prometheus-url", proxy.url, *SERVE_ARGS], tmp_path) as scaler:
        prom.wait_until_up(1)
        keda = scaler.keda(META)
        keda.spec()
        with Poller(keda) as poller:
            value = steady(poller, time.monotonic())
            broke = time.monotonic()
            proxy.rewrite = lambda query: "empty" if "_bucket" in query or "_count" in query else None
            time.sleep(3 * WINDOW_S)
            terms = next(d["terms"] for d in scaler.decisions() if d["name"] == "chat")
    during = poller.since(broke)
    only(during, lambda a: a.code == "ok" and value <= a.value <= value + 2,
         "good answers, never below the last (a queue without a mean prompt length is not a light one)")
    assert terms["waiting_tokens_estimated"] == 1.0 and terms["ttft_measured"] == 0.0, terms
    all_within_deadline(poller.answers)
    report("partial-optional", before=value, highest_after=max(a.value for a in during))


# --- a vLLM pod restarting: its counters start again from zero --------------------------------------------------------
def test_a_pod_restart_counter_reset_moves_nothing(pod: VllmExporter, tmp_path: Path) -> None:
    with PrometheusServer([pod.address], scrape_interval_s=SCRAPE_S) as prom, \
            ScalerProcess(["--prometheus-url", prom.url, *SERVE_ARGS], tmp_path) as scaler:
        prom.wait_until_up(1)
        keda = scaler.keda(META)
        keda.spec()
        with Poller(keda) as poller:
            value = steady(poller, time.monotonic())
            restarted = time.monotonic()
            pod.restart()  # counters and histograms back to 0; the same load goes on
            pod.set_queue(waiting=4, running=48, kv_usage=0.6)
            time.sleep(2 * WINDOW_S)
    during = poller.since(restarted)
    only(during, lambda a: a.code == "ok" and abs(a.value - value) <= 1,
         "the same answer through the reset (rate() absorbs it: no drop to 0, no spike)")
    all_within_deadline(poller.answers)
    report("pod-restart", before=value, low=min(a.value for a in during), high=max(a.value for a in during))


def unheld_answer(scaler: ScalerProcess, name: str = "chat") -> float:
    """Wait until the latest decision's answer is its own recommendation (no stabilization window holding a
    larger, older one) and return it."""
    deadline = time.monotonic() + SLOW_BOX_S
    last: dict[str, float] = {}
    while time.monotonic() < deadline:
        last = next((d["terms"] for d in scaler.decisions() if d["name"] == name), {})
        if last and last["recommended_replicas"] == last["desired_replicas"] > 1:
            return float(last["desired_replicas"])
        time.sleep(0.1)
    raise AssertionError(f"no decision answered its own recommendation within {SLOW_BOX_S} s; last {last}")


# --- a scrape target vanishing ---------------------------------------------------------------------------------------
def test_a_vanishing_pod_lowers_nothing_before_the_scale_down_delay(tmp_path: Path) -> None:
    half = {k: v / 2 if k.endswith("_per_s") else v for k, v in BURST.items()}
    with VllmExporter(model="tiny") as a, VllmExporter(model="tiny") as b:
        for p in (a, b):
            p.set_load(**half)
            p.set_queue(waiting=2, running=24, kv_usage=0.6)
        with PrometheusServer([a.address, b.address], scrape_interval_s=SCRAPE_S) as prom, \
                ScalerProcess(["--prometheus-url", prom.url, *SERVE_ARGS], tmp_path) as scaler:
            prom.wait_until_up(2)
            keda = scaler.keda(META)
            keda.spec()
            with Poller(keda) as poller:
                steady(poller, time.monotonic())
                # the answer may still hold an earlier, larger recommendation that leaves the window soon:
                # vanish only when the answer is today's own recommendation, so its hold starts now
                value = unheld_answer(scaler)
                vanished = time.monotonic()
                b.stop()  # connection refused: Prometheus marks its series stale at the next scrape
                prom.wait_until('count(vllm:num_requests_running{model_name="tiny"})',
                                lambda r: bool(r) and float(r[0]["value"][1]) == 1)
                seen_gone = time.monotonic()
                time.sleep(max(0.0, DELAY_S - 4 - (seen_gone - vanished)))
                ready = next(d["terms"]["ready_replicas"] for d in scaler.decisions() if d["name"] == "chat")
    held = [x for x in poller.since(vanished) if x.t < vanished + DELAY_S - 4]
    only(held, lambda x: x.code == "ok" and x.value >= value,
         "one pod still reports: good answers, and none lower before scaleDownDelay")
    assert ready == 1.0, "the decision knows only one pod is left"
    all_within_deadline(poller.answers)
    report("target-vanishing", before=value, seen_gone_s=seen_gone - vanished, held_s=DELAY_S - 4)


# --- stale samples: Prometheus comes back, the pod does not ----------------------------------------------------------
def test_stale_samples_are_never_served_as_fresh(pod: VllmExporter, tmp_path: Path) -> None:
    """Killed, Prometheus writes no staleness markers: after a restart it still returns the old samples
    (for its 5 min lookback) while the pod it can no longer scrape stays silent."""
    window = 10.0
    meta = {**META, "rateWindow": f"{window:g}"}
    with PrometheusServer([pod.address], scrape_interval_s=SCRAPE_S) as prom, \
            ScalerProcess(["--prometheus-url", prom.url, *SERVE_ARGS], tmp_path) as scaler:
        prom.wait_until_up(1)
        keda = scaler.keda(meta)
        keda.spec()
        with Poller(keda) as poller:
            value = steady(poller, time.monotonic(), for_s=window)
            killed = time.monotonic()
            prom.kill()
            pod.set_serving(False)
            prom.restart()
            restarted = time.monotonic()
            old = prom.query('vllm:num_requests_running{model_name="tiny"}')
            time.sleep(STALE_S + 2)
            back_at = time.monotonic()
            pod.set_serving(True)
            back = poller.wait("a good answer once the pod is scraped again", lambda a: a.code == "ok", back_at)
            time.sleep(1.0)
    assert old, "precondition: the restarted Prometheus still returns the old sample"
    after = [a for a in poller.since(restarted) if a.t < back_at]
    only([a for a in poller.since(killed) if a.t < back_at and a.code == "ok"], lambda a: a.value == value,
         "a good answer is the last decision, unchanged")
    late = [a for a in after if a.t >= killed + STALE_S + 1]
    assert late
    only(late, lambda a: a.code == "UNAVAILABLE" and ("old" in a.value or "warming up" in a.value
                                                      or "failed query" in a.value),
         "stale data: UNAVAILABLE saying so")
    only(poller.since(back.t), lambda a: a.code == "ok", "good answers again")
    all_within_deadline(poller.answers)
    kinds = {k: sum(k in a.value for a in late) for k in ("old", "warming up", "failed query")}
    report("stale-samples", recovery_s=back.t - back_at, **{f"answers_{k.replace(' ', '_')}": n
                                                          for k, n in kinds.items()})


# --- the scaler itself restarted mid-burst ---------------------------------------------------------------------------
def test_a_restarted_scaler_answers_from_prometheus_history_not_from_zero(pod: VllmExporter, tmp_path: Path) -> None:
    with PrometheusServer([pod.address], scrape_interval_s=SCRAPE_S) as prom, \
            ScalerProcess(["--prometheus-url", prom.url, *SERVE_ARGS], tmp_path) as scaler:
        prom.wait_until_up(1)
        keda = scaler.keda(META)
        keda.spec()
        with Poller(keda) as poller:
            value = steady(poller, time.monotonic())
            scaler.kill()
            scaler.start()  # same port: KEDA's channel reconnects
            up = time.monotonic()
            first = poller.wait("a good answer from the new process", lambda a: a.code == "ok", up)
            # the new process also replays what Prometheus kept through the policy (scaler.warmup), in its
            # decision process; the round after that decides from the replayed state
            (row,) = eventually(lambda: _warmed(scaler.decisions()), timeout_s=SLOW_BOX_S)
            warmed_at = time.monotonic()
            time.sleep(1.0)
    assert first.t - up < WINDOW_S, "answered within one rate window of starting"
    assert abs(first.value - value) <= 1, (first.value, value)  # from Prometheus's history, not from zero
    only(poller.since(first.t), lambda a: a.code == "ok" and abs(a.value - value) <= 1,
         "and it stays there, through the warm-up")
    assert "warmed up from" in scaler.log()
    all_within_deadline(poller.answers)
    report("scaler-restart", before=value, first_after=first.value, first_answer_s=first.t - up,
           warmed_after_s=warmed_at - up, warmed_from=row["warmed_up_from"])


def _warmed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert [r["warmed_up_from"] >= 1 for r in rows] == [True], rows
    return rows


# --- label values that try to break out of PromQL ------------------------------------------------------------------
def test_label_values_cannot_break_out_of_the_selector(tmp_path: Path) -> None:
    hostile = 'a"} or vector(100) or {x="'
    with VllmExporter(model="tiny") as pod:
        pod.set_load(**BURST)
        pod.set_queue(waiting=4, running=48, kv_usage=0.6)
        with PrometheusServer([(pod.address, {"team": hostile})], scrape_interval_s=SCRAPE_S) as prom, \
                ScalerProcess(["--prometheus-url", prom.url, *SERVE_ARGS], tmp_path) as scaler:
            prom.wait_until_up(1)
            answers = {}
            for name, meta in (("exact", {**META, "labelSelector": f"team={hostile}"}),
                               ("other", {**META, "labelSelector": 'team=b"} or vector(100) or {x="'}),
                               ("regex", {**META, "labelSelector": "team=.+"}),
                               ("model", {**META, "model": 'tiny"} or vector(100) or {x="'})):
                keda = scaler.keda(meta, name=name)
                deadline = time.monotonic() + SLOW_BOX_S
                while True:
                    answers[name] = keda.get_metrics()
                    if answers[name][0] == "ok" or "no vllm:num_requests_running series" in str(answers[name][1]) \
                            or time.monotonic() > deadline:
                        break
                    time.sleep(0.25)
    assert answers["exact"][0] == "ok" and answers["exact"][1] >= 1, answers["exact"]  # the value matched exactly
    for name in ("other", "regex", "model"):  # matched nothing: no series, never vector(100)
        assert answers[name][0] == "UNAVAILABLE" and "no vllm:num_requests_running series" in answers[name][1], \
            answers[name]
