"""PrometheusSource: PromQL building (pure) and every signal against a real Prometheus scraping exporters."""

from __future__ import annotations

import ast
import math
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.prometheus import PrometheusServer, eventually
from support.vllm_exporter import VllmExporter

from scaler.histograms import share_above
from scaler.signals import Signals
from scaler.sources import SignalSource, SourceError, Target
from scaler.sources.prometheus import PrometheusSource, group_queries, promql_duration, promql_string, regex_any_of

WEIRD = 'meta-llama/we"ird\\model.v1 (a|b)+[x]{2}^$'
WINDOW_S = 3.0
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))

# --- pure: PromQL text --------------------------------------------------------------------------------------------


@settings(deadline=None)  # timing-free: a loaded CI box must not fail a property
@given(TEXT)
def test_promql_string_round_trips(value: str) -> None:
    assert ast.literal_eval(promql_string(value)) == value  # PromQL strings use Go's escapes, as Python does here


@settings(deadline=None)
@given(st.lists(TEXT.filter(bool), min_size=1, max_size=4), TEXT)
def test_regex_any_of_matches_exactly_the_listed_values(values: list[str], other: str) -> None:
    pattern = ast.literal_eval(regex_any_of(values))
    assert all(re.fullmatch(pattern, v, flags=re.DOTALL) for v in values)
    assert bool(re.fullmatch(pattern, other, flags=re.DOTALL)) == (other in values)


@pytest.mark.parametrize(("seconds", "text"), [(60, "60s"), (1.5, "1500ms"), (0.0001, "1ms"), (300.0, "300s")])
def test_promql_duration(seconds: float, text: str) -> None:
    assert promql_duration(seconds) == text


def test_group_queries_one_per_signal_grouped_by_model_and_labels() -> None:
    queries = group_queries(["a", "b"], {"namespace": ["llm", "x"]}, 60)
    assert set(queries) >= {"prompt_tokens_per_s", "generation_tokens_per_s", "requests_waiting", "ready_replicas"}
    assert queries["prompt_tokens_per_s"] == ('sum by (model_name, namespace) (rate(vllm:prompt_tokens_total'
                                              '{model_name=~"a|b",namespace=~"llm|x"}[60s]))')
    assert "/" in queries["mean_prompt_tokens"] and "vllm:request_prompt_tokens_count" in queries["mean_prompt_tokens"]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"model": ""}, "Target.model"),
    ({"model": "m", "rate_window_s": 0}, "Target.rate_window_s"),
    ({"model": "m", "rate_window_s": math.inf}, "Target.rate_window_s"),
    ({"model": "m", "label_matchers": (("bad-name", "x"),)}, "bad-name"),
    ({"model": "m", "label_matchers": (("model_name", "x"),)}, "model_name"),
    ({"model": "m", "label_matchers": (("ns", "a"), ("ns", "b"))}, "at most once"),
], ids=["empty-model", "zero-window", "inf-window", "bad-label", "reserved-label", "dup-label"])
def test_target_rejects_bad_fields_naming_them(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        Target(**kwargs)


@pytest.mark.parametrize(("url", "timeout"), [("prom:9090", 2), ("http://p", 0), ("http://p", math.nan)])
def test_source_rejects_bad_settings(url: str, timeout: float) -> None:
    with pytest.raises(ValueError, match="PrometheusSource"):
        PrometheusSource(url, timeout)


def test_unreachable_prometheus_is_a_source_error_for_every_target_quickly() -> None:
    source = PrometheusSource("http://127.0.0.1:9", timeout_s=1)
    assert isinstance(source, SignalSource)
    targets = [Target("a"), Target("b", label_matchers=(("namespace", "x"),))]
    started = time.monotonic()
    result = source.fetch(targets, now=0.0)
    assert time.monotonic() - started < 3
    assert set(result) == set(targets)
    assert all(isinstance(v, SourceError) and "127.0.0.1:9" in str(v) for v in result.values())


# --- a real Prometheus -------------------------------------------------------------------------------------------

class CountingSource(PrometheusSource):
    """Counts queries, to check batching."""

    calls = 0

    def query(self, address: str, promql: str) -> list[Any]:
        self.calls += 1
        return super().query(address, promql)


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, Any]]:
    """Six "pods" of four models in two namespaces, scraped every 0.5 s by a real Prometheus."""
    pods = {"weird": VllmExporter(model=WEIRD), "x1": VllmExporter(model="m", engines=2),
            "x2": VllmExporter(model="m"), "y": VllmExporter(model="m"), "reset": VllmExporter(model="r"),
            "stale": VllmExporter(model="s")}
    for pod in pods.values():
        pod.start()
    pods["weird"].set_load(1000, 100, prompt_len=100, output_len=10)
    pods["x1"].set_load(2000, 400, prompt_len=200, output_len=40)
    pods["x2"].set_load(1000, 100, prompt_len=100, output_len=10)
    pods["y"].set_load(500, 50, prompt_len=50, output_len=5)
    pods["reset"].set_load(1000, 100)
    pods["x1"].set_queue(waiting=4, running=6, kv_usage=0.5)
    pods["x2"].set_queue(waiting=2, running=1, kv_usage=0.1)
    targets = [(p.address, {"namespace": "y" if name == "y" else "x"}) for name, p in pods.items()]
    prom = PrometheusServer(targets, scrape_interval_s=0.5)
    try:
        prom.start()
        prom.wait_until_up(len(pods))
        series = sum(p.engines for p in pods.values())  # every engine's counter has a rate over the window
        prom.wait_until(f"count(rate(vllm:prompt_tokens_total[{promql_duration(WINDOW_S)}]))",
                        lambda r: bool(r) and float(r[0]["value"][1]) >= series)
        yield {"prom": prom, **pods}
    finally:
        prom.stop()
        for pod in pods.values():
            pod.stop()


def _ns(model: str, ns: str, **kw: Any) -> Target:
    return Target(model, label_matchers=(("namespace", ns),), rate_window_s=kw.pop("rate_window_s", WINDOW_S), **kw)


# Scrapes on a loaded box land late, so each test waits (``eventually``) for the exact behaviour it asserts.


@pytest.mark.prometheus
@pytest.mark.slow
def test_signals_follow_the_exporters_in_one_batch(fleet: dict[str, Any]) -> None:
    x, y, w = _ns("m", "x"), _ns("m", "y"), _ns(WEIRD, "x")

    def check() -> None:
        source = CountingSource(fleet["prom"].url)
        result = source.fetch([x, y, w], now=123.0)
        assert source.calls == len(group_queries(["m"], {}, 1))  # one query per signal for all three targets
        sx, sy, sw = result[x], result[y], result[w]
        assert isinstance(sx, Signals) and isinstance(sy, Signals) and isinstance(sw, Signals), result
        assert sx.at == 123.0
        assert sx.prompt_tokens_per_s == pytest.approx(3000, rel=0.3)
        assert sx.generation_tokens_per_s == pytest.approx(500, rel=0.3)
        assert sy.prompt_tokens_per_s == pytest.approx(500, rel=0.3)
        assert sw.prompt_tokens_per_s == pytest.approx(1000, rel=0.3)  # quotes, backslash, regex characters escaped
        assert (sx.requests_waiting, sx.requests_running) == (6, 7)
        assert sx.ready_replicas == 2  # x1 has two engines but is one pod
        assert sx.kv_cache_usage == pytest.approx(0.3)  # mean over replicas, not over engine series
        assert sx.mean_prompt_tokens is not None and 100 < sx.mean_prompt_tokens < 200
        assert sy.mean_prompt_tokens == pytest.approx(50) and sy.mean_output_tokens == pytest.approx(5)
        # sum by (le) of the prompt-length buckets: every prompt in (20, 50], read as uniform
        assert sy.prompt_tokens_weighted_mean == pytest.approx((20**2 + 20 * 50 + 50**2) / 3 / 35)
        # sum by (le) of the TTFT buckets: the exporter's first tokens all came at 0.1 s
        assert sy.ttft_buckets is not None and share_above(dict(sy.ttft_buckets), 2.0) == 0.0
        assert share_above(dict(sy.ttft_buckets), 0.05) == pytest.approx(1.0)
        assert sx.waiting_tokens is None  # vLLM exports none; the policy estimates it
        # vllm:cache_config_info joined by instance: x2's one engine (1024 blocks x 16) < x1's two
        assert (sx.kv_cache_tokens, sy.kv_cache_tokens) == (1024 * 16, 1024 * 16)
        assert 0 <= sx.data_age_s < 3.0

    eventually(check)


@pytest.mark.prometheus
@pytest.mark.slow
def test_missing_model_is_no_data_never_zeros(fleet: dict[str, Any]) -> None:
    result = PrometheusSource(fleet["prom"].url).fetch([_ns("absent", "x"), _ns("m", "nowhere")], now=0)
    for error in result.values():
        assert isinstance(error, SourceError) and str(error).startswith("no data")


@pytest.mark.prometheus
@pytest.mark.slow
def test_activation_query_reports_demand_at_zero_replicas(fleet: dict[str, Any]) -> None:
    source = PrometheusSource(fleet["prom"].url)
    cold, bad, ok = (_ns("absent", "x", activation_query="vector(2) + vector(1)"),
                     _ns("m", "x", activation_query="sum("), _ns("m", "x", activation_query="scalar(vector(4))"))
    result = source.fetch([cold, bad, ok], now=0)
    assert isinstance(result[cold], Signals)
    assert (result[cold].ready_replicas, result[cold].activation_value, result[cold].prompt_tokens_per_s) == (0, 3, 0)
    assert isinstance(result[bad], SourceError) and "sum(" in str(result[bad])  # only that target fails
    assert isinstance(result[ok], Signals) and result[ok].activation_value == 4


@pytest.mark.prometheus
@pytest.mark.slow
def test_counter_reset_is_absorbed_by_rate(fleet: dict[str, Any]) -> None:
    window_s = 10.0  # long enough that the reset stays inside it while a loaded box polls
    pod, source = _ns("r", "x", rate_window_s=window_s), PrometheusSource(fleet["prom"].url)
    naive = f'sum(delta(vllm:prompt_tokens_total{{model_name="r"}}[{promql_duration(window_s)}]))'

    def rate_is_steady() -> None:
        signals = source.fetch([pod], now=0)[pod]
        assert isinstance(signals, Signals)
        assert signals.prompt_tokens_per_s == pytest.approx(1000, rel=0.4)

    eventually(rate_is_steady)  # the window holds enough samples before the restart
    fleet["reset"].restart()  # a pod restart: counters drop to zero and grow again

    def reset_in_window_and_rate_unchanged() -> None:
        raw = fleet["prom"].query(naive)
        assert raw and float(raw[0]["value"][1]) < 0, raw  # what a naive difference sees: the reset is in the window
        rate_is_steady()

    eventually(reset_in_window_and_rate_unchanged, poll_s=0.1)


@pytest.mark.prometheus
@pytest.mark.slow
def test_pod_that_stops_answering_goes_stale_and_means_no_data(fleet: dict[str, Any]) -> None:
    source, pod = PrometheusSource(fleet["prom"].url), _ns("s", "x")
    assert isinstance(source.fetch([pod], now=0)[pod], Signals)
    fleet["stale"].set_serving(False)  # scrapes fail: Prometheus writes stale markers

    def check() -> None:
        result = source.fetch([pod], now=0)[pod]
        assert isinstance(result, SourceError) and "no data" in str(result), result

    eventually(check)


# --- whatever Prometheus answers, fetch never raises ----------------------------------------------------------------

NUMBER_TEXT = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.sampled_from(["NaN", "+Inf", "x"]))
ROW = st.one_of(
    st.fixed_dictionaries({
        "metric": st.dictionaries(st.sampled_from(["model_name", "namespace", "instance"]),
                                  st.sampled_from(["m", "llm", "", "other"]), max_size=3),
        "value": st.one_of(st.tuples(st.floats(-1e308, 1e308), NUMBER_TEXT).map(list), st.just([]), st.text(max_size=3),
                           st.none()),
    }),
    st.integers(), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2),
)


class ScriptedSource(PrometheusSource):
    """Answers every query from a hypothesis-drawn script instead of HTTP."""

    def __init__(self, answers: list[list[Any]]) -> None:
        super().__init__("http://127.0.0.1:9")
        self.answers = answers

    def query(self, address: str, promql: str) -> list[Any]:
        return self.answers.pop(0) if self.answers else []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(ROW, max_size=4), min_size=10, max_size=12))
def test_garbage_answers_give_signals_or_source_errors_never_exceptions(answers: list[list[Any]]) -> None:
    targets = [_ns("m", "llm", activation_query="q"), Target("m", rate_window_s=WINDOW_S)]
    result = ScriptedSource(answers).fetch(targets, now=0.0)
    assert set(result) == set(targets)
    for value in result.values():
        assert isinstance(value, (Signals, SourceError))
        if isinstance(value, Signals):
            assert all(math.isfinite(v) for v in (value.prompt_tokens_per_s, value.requests_waiting, value.data_age_s))


class WarmingSource(PrometheusSource):
    """A Prometheus that started moments ago: ``up`` exists, but nothing older than half the window."""

    def query(self, address: str, promql: str) -> list[Any]:
        if "count_over_time(up" in promql:
            return [{"metric": {}, "value": [100.0, "0"]}]
        return [{"metric": {"model_name": "m", "namespace": "x"}, "value": [100.0, "5"]}]


def test_a_prometheus_that_saw_less_than_half_the_window_is_warming_up_for_every_group() -> None:
    """rate() extrapolates half an interval past the first sample: a window seen a third understates by 3x."""
    targets = [Target("m", rate_window_s=WINDOW_S), _ns("m", "x")]  # with and without label matchers
    result = WarmingSource("http://127.0.0.1:9").fetch(targets, now=0.0)
    for target in targets:
        assert isinstance(result[target], SourceError) and str(result[target]).startswith("warming up"), result


def test_the_window_check_asks_prometheus_about_the_older_half() -> None:
    queries = group_queries(["m"], {}, 60)
    # any sample in the window's length before its middle: a starved scrape loop's gaps are no restart
    assert queries["observed_window"] == "count(count_over_time(up[60s] offset 30s)) or count(up) * 0"
    long = group_queries(["m"], {}, 3600)  # two minutes of samples at most
    assert long["observed_window"] == "count(count_over_time(up[120s] offset 1800s)) or count(up) * 0"


def test_http_clients_are_bounded_as_trigger_addresses_come_and_go() -> None:
    from scaler.sources.prometheus import MAX_CLIENTS

    source = PrometheusSource("http://127.0.0.1:9")
    for port in range(MAX_CLIENTS + 20):
        source._client(f"http://127.0.0.1:{10000 + port}")
    assert len(source._clients) == MAX_CLIENTS
    assert f"http://127.0.0.1:{10000 + MAX_CLIENTS + 19}" in source._clients  # the newest stay


# --- history: range reads split into instants ---------------------------------------------------------------------
class ScriptedRanges(PrometheusSource):
    """Answers every range query from a hypothesis-drawn script instead of HTTP."""

    def __init__(self, answers: list[Any]) -> None:
        super().__init__("http://127.0.0.1:9")
        self.answers = answers

    def query_range(self, address: str, promql: str, start: float, end: float, step_s: float) -> list[Any]:
        return self.answers.pop(0) if self.answers else []


GRID = [1000.5 + 15.0 * k for k in range(6)]
POINT = st.one_of(st.sampled_from(GRID), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3))
SERIES = st.one_of(
    st.fixed_dictionaries({"metric": st.dictionaries(st.sampled_from(["model_name", "namespace", "le", "instance"]),
                                                     st.sampled_from(["m", "llm", "0.5", "+Inf", "p"]), max_size=4),
                           "values": st.lists(st.one_of(st.tuples(POINT, st.sampled_from(["1", "2.5", "NaN", "x"])),
                                                        st.just([1.0]), st.none()), max_size=8)}),
    st.none(), st.integers(), st.text(max_size=4), st.fixed_dictionaries({"metric": st.just({}), "values": st.none()}))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(SERIES, max_size=4), min_size=20, max_size=22))
def test_garbage_range_answers_give_signals_or_source_errors_at_every_instant(answers: list[list[Any]]) -> None:
    """Whatever comes back from the range queries (series off the grid, malformed points, junk), ``history``
    answers every target at every instant with a Signals or a SourceError, never an exception."""
    targets = [_ns("m", "llm", activation_query="q"), Target("m", rate_window_s=WINDOW_S)]
    result = ScriptedRanges(answers).history(targets, GRID[0], GRID[-1], 15.0)
    assert [at for at, _ in result] == GRID
    for _, answers_at in result:
        assert set(answers_at) == set(targets)
        assert all(isinstance(v, (Signals, SourceError)) for v in answers_at.values())


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(GRID))), st.floats(-1e6, 1e6)), max_size=20),
       st.lists(st.floats(0.0, 0.4999).filter(lambda d: d > 0.001), max_size=5))
def test_each_range_point_lands_at_its_own_instant_and_off_grid_points_nowhere(
        on_grid: list[tuple[int, float]], offsets: list[float]) -> None:
    from scaler.sources.prometheus import _split_range

    points = [[GRID[k], str(v)] for k, v in on_grid] + [[GRID[0] + d, "1"] for d in offsets]
    split = _split_range([{"metric": {"model_name": "m"}, "values": points}], GRID)
    assert sum(len(rows) for rows in split.values()) == len(on_grid)
    for k, rows in split.items():
        assert all(row["value"][0] == GRID[k] and row["metric"] == {"model_name": "m"} for row in rows)


def test_an_unreachable_prometheus_is_a_source_error_at_every_instant_naming_the_range_query() -> None:
    targets = [Target("m", rate_window_s=WINDOW_S)]
    result = PrometheusSource("http://user:secret@127.0.0.1:9", timeout_s=1).history(targets, 0.0, 45.0, 15.0)
    assert len(result) == 4
    for _, answers_at in result:
        error = answers_at[targets[0]]
        assert isinstance(error, SourceError)
        assert "failed range query" in str(error) and "127.0.0.1:9" in str(error) and "secret" not in str(error)


@pytest.mark.parametrize(("start", "end", "step"), [(0.0, -1.0, 15.0), (0.0, 10.0, 0.0), (math.nan, 10.0, 15.0),
                                                    (0.0, 1e9, 1.0)])
def test_a_bad_history_window_is_refused_naming_it(start: float, end: float, step: float) -> None:
    with pytest.raises(ValueError, match=r"PrometheusSource\.history"):
        PrometheusSource("http://127.0.0.1:9").history([Target("m")], start, end, step)
