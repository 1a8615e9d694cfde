"""Signals from Prometheus: one PromQL per signal, batched over every target on the same server.

Targets that share a Prometheus address, a rate window and the same label-matcher *names* form one
group. Each signal is one query over the whole group, ``sum by (model_name, <names>)`` with regex
filters listing the group's models and label values; the answer is then split per target. So the
cost per evaluation round is about ten queries per group, however many scaled objects there are.

What each number means, and why (``docs/signals.md`` has every query):
- Token rates use ``rate()``, which already handles counter resets (a pod restart).
- Mean prompt / output lengths are ``rate(_sum) / rate(_count)`` of vLLM's request histograms;
  with no finished request in the window they are ``None`` (not measured), never zero.
- Ready replicas are distinct ``instance`` values reporting ``vllm:num_requests_running`` (a pod
  with several data-parallel engines is one replica); KV usage is the mean over those replicas.
- Data age is the Prometheus evaluation time minus the newest sample's ``timestamp()``: both come
  from Prometheus, so the scaler's own clock and clock skew do not enter.
- A Prometheus that has not seen the older half of the rate window (it just started, or came back
  after an outage longer than that) is "warming up", a ``SourceError``: ``rate()`` extrapolates only
  half a scrape interval past the first sample, so over a window it saw a third of it would report a
  third of the load. Pods that are new themselves (a cold start) are measured as usual.
- ``waiting_tokens`` stays ``None``: vLLM exports no waiting-token count; the policy estimates it.
- ``kv_cache_tokens`` is ``num_gpu_blocks`` × ``block_size`` from ``vllm:cache_config_info`` (labels, not
  a value, and no ``model_name`` label): those series are joined to the model's replicas by
  ``instance`` here, not in PromQL (a ``group_left`` would fail the whole query on a pod serving two
  models), summed over a pod's engines, the smallest replica's; ``None`` when no replica exports it.

Credentials (``PrometheusAuth``: bearer token, basic auth, client certificate, CA) go only to the
source's own URL, never to a trigger's ``prometheusAddress``; messages show neither them nor a URL's
``user:password@``.

A model with no series at all is ``SourceError("no data")``, never zeros, unless the target has an
activation query that answered: then the model really has no ready replica and the snapshot says so
(``ready_replicas=0``) with the activation value, which is what lets KEDA scale from zero.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from scaler import histograms
from scaler.assemble import FleetTotals, assemble_signals
from scaler.signals import Signals
from scaler.sources.base import SourceError, Target
from scaler.sources.prometheus_auth import REDACTED, Material, PrometheusAuth

GroupKey = tuple[str, float, tuple[str, ...]]
NO_AUTH = Material()
OBSERVED_LOOKBACK_S = 120.0
HISTORY_TIMEOUT_S = 10.0
"""A range query over an hour reads 240 times the samples of an instant one: its own, longer timeout."""
MAX_HISTORY_POINTS = 11_000
"""Prometheus refuses range queries of more than 11,000 points per series."""
MAX_CLIENTS = 64
"""HTTP clients kept (one per Prometheus address, each with its connection pool)."""
SeriesKey = tuple[str, tuple[str, ...]]  # (model_name, values of the group's label names)


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, default ports filled in: where credentials may go."""
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return ("", url, None)
    return (parts.scheme, (parts.hostname or "").lower(), port)


def shown(url: str) -> str:
    """``url`` without a ``user:password@`` part, for messages, logs and ``/decisions``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return parts._replace(netloc=f"{REDACTED}@{host}").geturl()


def promql_string(value: str) -> str:
    """Quote ``value`` as a PromQL double-quoted string literal (backslashes, quotes, newlines)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def regex_any_of(values: Sequence[str]) -> str:
    """A PromQL regex-matcher literal that matches exactly one of ``values`` (Prometheus anchors it)."""
    return promql_string("|".join(RE2_SPECIAL.sub(r"\\\1", v) for v in sorted(set(values))))


def promql_duration(seconds: float) -> str:
    """A PromQL range duration; milliseconds keep fractional windows exact (``1500ms``)."""
    millis = max(1, round(seconds * 1000))
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def group_queries(models: Sequence[str], matchers: dict[str, list[str]], window_s: float) -> dict[str, str]:
    """The PromQL of every signal for one group of targets, keyed by signal name."""
    selector = ",".join([f"model_name=~{regex_any_of(models)}",
                         *(f"{name}=~{regex_any_of(values)}" for name, values in sorted(matchers.items()))])
    by = ", ".join(["model_name", *sorted(matchers)])
    window, half = promql_duration(window_s), promql_duration(window_s / 2)
    # any sample in the window's length (2 minutes at most) before its middle will do: a scrape loop starved
    # for a while leaves gaps shorter than that and is no restart (a half-window range read "warming up" for
    # 48 s of a burst on a loaded 2-core machine, 3 s scrapes, 15 s window); every `up` series costs its
    # samples in this range, so a 1 h window must not read 30 min of all of them each round
    look = promql_duration(min(window_s, OBSERVED_LOOKBACK_S))

    def rate(metric: str) -> str:
        return f"sum by ({by}) (rate({metric}{{{selector}}}[{window}]))"

    def buckets(histogram: str) -> str:
        return f"sum by ({by}, le) (rate({histogram}_bucket{{{selector}}}[{window}]))"

    def mean(histogram: str) -> str:
        return f"{rate(histogram + '_sum')} / {rate(histogram + '_count')}"

    label_selector = ",".join(f"{name}=~{regex_any_of(values)}" for name, values in sorted(matchers.items()))

    return {
        "prompt_tokens_per_s": rate("vllm:prompt_tokens_total"),
        "generation_tokens_per_s": rate("vllm:generation_tokens_total"),
        "requests_waiting": f"sum by ({by}) (vllm:num_requests_waiting{{{selector}}})",
        "requests_running": f"sum by ({by}) (vllm:num_requests_running{{{selector}}})",
        "ready_replicas": f"count by ({by}) (count by ({by}, instance) (vllm:num_requests_running{{{selector}}}))",
        "mean_prompt_tokens": mean("vllm:request_prompt_tokens"),
        "mean_output_tokens": mean("vllm:request_generation_tokens"),
        "prompt_length_buckets": buckets(histograms.PROMPT_HISTOGRAM),
        "ttft_buckets": buckets(histograms.TTFT_HISTOGRAM),
        "prefix_cache_hit_share": f"{rate('vllm:prefix_cache_hits_total')} / {rate('vllm:prefix_cache_queries_total')}",
        "kv_cache_usage": f"avg by ({by}) (avg by ({by}, instance) (vllm:kv_cache_usage_perc{{{selector}}}))",
        "newest_sample": f"max by ({by}) (timestamp(vllm:num_requests_running{{{selector}}}))",
        "replica_instances": f"group by ({by}, instance) (vllm:num_requests_running{{{selector}}})",
        "cache_config": f"max by (instance, engine, num_gpu_blocks, block_size) "
                        f"(vllm:cache_config_info{{{label_selector}}})" if label_selector else
                        "max by (instance, engine, num_gpu_blocks, block_size) (vllm:cache_config_info)",
        # has this Prometheus seen the older half of the window? (0: it started or came back since; empty:
        # it has no `up` series at all, as behind some remote-write setups, and then we cannot tell)
        "observed_window": f"count(count_over_time(up[{look}] offset {half})) or count(up) * 0",
    }

SIGNAL_NAMES = tuple(group_queries(("model",), {}, 60.0))
"""Every signal ``group_queries`` asks for, in its order."""
INSTANCE_SIGNALS = ("replica_instances", "cache_config")
"""Signals kept as rows: joined by ``instance`` in ``_kv_cache_tokens``."""


def _float(raw: Any) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _sample(row: Any) -> tuple[float, float]:
    """(evaluation time, value) of one instant-vector row; NaN for anything malformed."""
    value = row.get("value") if isinstance(row, dict) else None
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _float(value[0]), _float(value[1])
    return math.nan, math.nan


def _kv_cache_tokens(rows_of: dict[str, list[Any]], target: Target, names: tuple[str, ...]) -> float | None:
    """One replica's KV cache (tokens) from ``vllm:cache_config_info``, the smallest over the target's
    replicas: their instances from ``replica_instances``, each one's engines' ``num_gpu_blocks`` ×
    ``block_size`` summed. Malformed rows are skipped (an optional signal: None rather than a wrong one)."""
    values = dict(target.label_matchers)
    want = (target.model, tuple(values[n] for n in names))
    instances = set()
    for row in rows_of.get("replica_instances", []):
        labels = row.get("metric") if isinstance(row, dict) else None
        if isinstance(labels, dict) and (str(labels.get("model_name", "")),
                                         tuple(str(labels.get(n, "")) for n in names)) == want:
            instances.add(str(labels.get("instance", "")))
    engines: dict[str, dict[str, float]] = defaultdict(dict)
    for row in rows_of.get("cache_config", []):
        labels = row.get("metric") if isinstance(row, dict) else None
        if not isinstance(labels, dict) or str(labels.get("instance", "")) not in instances:
            continue
        blocks, size = _float(labels.get("num_gpu_blocks")), _float(labels.get("block_size"))
        if math.isfinite(blocks) and math.isfinite(size) and blocks > 0 and size > 0:
            engines[str(labels["instance"])][str(labels.get("engine", ""))] = blocks * size
    totals = [math.fsum(per.values()) for per in engines.values()]
    return min(totals) if totals and all(math.isfinite(t) for t in totals) else None


class PrometheusSource:
    """Reads vLLM's metrics from Prometheus with prometheus-api-client.

    ``PrometheusSource("http://prometheus:9090", timeout_s=2).fetch(targets, now=time.time())``
    returns ``{target: Signals | SourceError}``. A target's ``prometheus_address`` overrides ``url``.
    One failed query fails only the targets it serves, each with a ``SourceError`` naming the query.
    """

    def __init__(self, url: str, timeout_s: float = 2.0, auth: PrometheusAuth | None = None,
                 evaluation_time: float | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"PrometheusSource url={shown(url)!r}: must be an http:// or https:// URL")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"PrometheusSource timeout_s={timeout_s!r}: must be a finite number > 0")
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.auth = auth
        """Sent only to ``url``'s origin: a trigger's own ``prometheusAddress`` could be anyone's server."""
        if evaluation_time is not None and not (isinstance(evaluation_time, (int, float))
                                                and math.isfinite(evaluation_time)):
            raise ValueError(f"PrometheusSource evaluation_time={evaluation_time!r}: must be finite Unix seconds")
        self.evaluation_time = evaluation_time
        """Evaluate every query at this Unix time instead of Prometheus's now (replaying its history)."""
        self._clients: dict[str, tuple[Any, Material]] = {}
        self._lock = threading.Lock()

    def _material(self, address: str) -> Material:
        return self.auth.material() if self.auth is not None and origin(address) == origin(self.url) else NO_AUTH

    def _redact(self, address: str, text: str) -> str:
        text = self._material(address).redact(text)
        try:
            password = urlsplit(address).password
        except ValueError:
            password = None
        return text.replace(password, REDACTED) if password else text

    def _client(self, address: str) -> Any:
        """One PrometheusConnect per address, without urllib3's retries and backoff (the loop retries);
        rebuilt when the credentials' files change."""
        material = self._material(address)
        with self._lock:
            client, built_with = self._clients.get(address, (None, None))
            if client is None or built_with is not material:
                import requests
                from prometheus_api_client import PrometheusConnect
                from urllib3.util.retry import Retry

                session = requests.Session()
                session.verify, session.cert = material.verify, material.cert
                client = PrometheusConnect(url=address, headers=dict(material.headers) or None, auth=material.basic,
                                           retry=Retry(total=0, raise_on_status=False), session=session,
                                           timeout=self.timeout_s)
                self._clients.pop(address, None)
                while len(self._clients) >= MAX_CLIENTS:  # triggers' own addresses come and go: oldest out
                    self._clients.pop(next(iter(self._clients)))
                self._clients[address] = (client, material)
            return client

    def query(self, address: str, promql: str) -> list[Any]:
        """Run one instant query; any failure (unreachable, HTTP error, bad answer) is a SourceError.

        Messages name the address without its user:password and show no credential.
        """
        params = None if self.evaluation_time is None else {"time": repr(float(self.evaluation_time))}
        return self._ask(address, "query", promql, lambda client: client.custom_query(promql, params=params))

    def query_range(self, address: str, promql: str, start: float, end: float, step_s: float) -> list[Any]:
        """Run one range query (``start`` and ``end`` sent exactly, not rounded to seconds as the client does);
        any failure is a SourceError, as for ``query``."""
        return self._ask(address, "range query", promql, lambda client: client.custom_query_range(
            promql, start_time=datetime.fromtimestamp(start, tz=UTC), end_time=datetime.fromtimestamp(end, tz=UTC),
            step=f"{step_s:g}s", params={"start": repr(float(start)), "end": repr(float(end))},
            timeout=max(self.timeout_s, HISTORY_TIMEOUT_S)))

    def _ask(self, address: str, what: str, promql: str, call: Callable[[Any], Any]) -> list[Any]:
        """``call(client)``'s answer, which must be a list; anything else, or any failure, a redacted SourceError."""
        try:
            result = call(self._client(address))
        except Exception as exc:  # requests, urllib3 and the client each raise their own types
            detail = self._redact(address, str(exc))[:300]
            raise SourceError(f"Prometheus {shown(address)} failed {what} {promql!r}: {type(exc).__name__}: "
                              f"{detail}") from exc
        if not isinstance(result, list):
            raise SourceError(f"Prometheus {shown(address)} answered {'' if what == 'query' else what + ' '}"
                              f"{promql!r} with {type(result).__name__}, not a list")
        return result

    def fetch(self, targets: Sequence[Target], now: float) -> dict[Target, Signals | SourceError]:
        """Measure every target; ``now`` (Unix seconds) stamps the snapshots."""
        out: dict[Target, Signals | SourceError] = {}
        for (address, window_s, names), members in self._groups(targets).items():
            out.update(self._fetch_group(address, window_s, names, members, now))
        return out

    def _fetch_group(self, address: str, window_s: float, names: tuple[str, ...], members: list[Target],
                     now: float) -> dict[Target, Signals | SourceError]:
        try:
            rows = {signal: self.query(address, promql)
                    for signal, promql in group_queries([t.model for t in members], _matchers(names, members),
                                                        window_s).items()}
        except SourceError as exc:
            return {target: exc for target in members}
        return self._group_signals(address, window_s, names, members, rows, now,
                                   lambda target: self._activation(target, address))

    def history(self, targets: Sequence[Target], start: float, end: float,
                step_s: float) -> list[tuple[float, dict[Target, Signals | SourceError]]]:
        """Every target's snapshot at ``start``, ``start + step_s``, ... up to ``end`` (Unix seconds), as
        ``fetch`` would have measured it at that instant: the same PromQL and the same assembly, read with
        one range query per signal and group (``HISTORY_TIMEOUT_S``) instead of an instant query per signal,
        group and instant. What a restarted scaler replays to learn what it knew (``scaler.warmup``)."""
        for label, value in (("start", start), ("end", end), ("step_s", step_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"PrometheusSource.history {label}={value!r}: must be a finite number")
        if step_s <= 0 or end < start:
            raise ValueError(f"PrometheusSource.history step_s={step_s!r}, start={start!r}, end={end!r}: want "
                             "step_s > 0 and start <= end")
        count = int((end - start) // step_s) + 1
        if count > MAX_HISTORY_POINTS:
            raise ValueError(f"PrometheusSource.history: {count} instants; at most {MAX_HISTORY_POINTS} "
                             "(Prometheus refuses longer range queries)")
        instants = [start + k * step_s for k in range(count)]
        out: list[dict[Target, Signals | SourceError]] = [{} for _ in instants]
        for (address, window_s, names), members in self._groups(targets).items():
            queries = group_queries([t.model for t in members], _matchers(names, members), window_s)
            queries.update({_activation_key(t): t.activation_query for t in members if t.activation_query})
            try:
                by_instant: list[dict[str, list[Any]]] = [{} for _ in instants]
                for signal, promql in queries.items():
                    split = _split_range(self.query_range(address, promql, instants[0], instants[-1], step_s), instants)
                    for k, answers_at in enumerate(by_instant):
                        answers_at[signal] = split.get(k, [])
            except SourceError as exc:
                for answers in out:
                    answers.update({target: exc for target in members})
                continue
            for answers, at, rows in zip(out, instants, by_instant, strict=True):
                answers.update(self._group_signals(address, window_s, names, members, rows, at,
                                                   functools.partial(self._activation_at, address=address, rows=rows)))
        return list(zip(instants, out, strict=True))

    def _groups(self, targets: Sequence[Target]) -> dict[GroupKey, list[Target]]:
        groups: dict[GroupKey, list[Target]] = defaultdict(list)
        for target in dict.fromkeys(targets):
            address = (target.prometheus_address or self.url).rstrip("/")
            groups[(address, target.rate_window_s, tuple(sorted(k for k, _ in target.label_matchers)))].append(target)
        return groups

    def _group_signals(self, address: str, window_s: float, names: tuple[str, ...], members: list[Target],
                       rows_by_signal: dict[str, list[Any]], now: float,
                       activation: Callable[[Target], float | None]) -> dict[Target, Signals | SourceError]:
        """One group's snapshots from its queries' rows (instant-vector rows, as at one instant)."""
        tables: dict[str, dict[SeriesKey, float]] = {}
        rows_of: dict[str, list[Any]] = {}
        eval_time = observed = math.nan
        try:
            for signal in SIGNAL_NAMES:
                rows = rows_by_signal.get(signal, [])
                if signal == "observed_window":  # one number for the whole Prometheus, no labels
                    observed = _sample(rows[0])[1] if rows else math.nan
                    continue
                if signal in INSTANCE_SIGNALS:
                    rows_of[signal] = rows
                    continue
                tables[signal] = self._table(rows, (*names, "le") if signal.endswith("_buckets") else names)
                if rows and signal == "newest_sample":
                    eval_time = _sample(rows[0])[0]
        except SourceError as exc:
            return {target: exc for target in members}
        if observed == 0:
            warming = SourceError(
                f"warming up: Prometheus {shown(address)} has no sample older than half the rate window "
                f"({promql_duration(window_s)}): it started or came back moments ago, and rate() over a window "
                "it has only partly seen would understate the load")
            return {target: warming for target in members}
        out: dict[Target, Signals | SourceError] = {}
        for target in members:
            try:
                out[target] = self._assemble(target, address, names, tables, eval_time, now,
                                             _kv_cache_tokens(rows_of, target, names), activation(target))
            except SourceError as exc:
                out[target] = exc
            except ValueError as exc:  # Signals refused a value (absurd but finite sums overflowing, ...)
                out[target] = SourceError(f"Prometheus {shown(address)} gave unusable numbers for "
                                          f"{target.model!r}: {exc}")
        return out

    @staticmethod
    def _table(rows: list[Any], names: tuple[str, ...]) -> dict[SeriesKey, float]:
        table: dict[SeriesKey, float] = {}
        for row in rows:
            if not isinstance(row, dict) or not isinstance(row.get("metric"), dict):
                raise SourceError(f"unexpected Prometheus row {row!r}: want {{'metric': {{...}}, 'value': [t, v]}}")
            labels = row["metric"]
            key = (str(labels.get("model_name", "")), tuple(str(labels.get(n, "")) for n in names))
            table[key] = _sample(row)[1]
        return table

    def _assemble(self, target: Target, address: str, names: tuple[str, ...], tables: dict[str, dict[SeriesKey, float]],
                  eval_time: float, now: float, kv_cache_tokens: float | None = None,
                  activation_value: float | None = None) -> Signals:
        values = dict(target.label_matchers)
        key = (target.model, tuple(values[n] for n in names))
        where = (f"model_name={target.model!r}" + "".join(f", {n}={values[n]!r}" for n in names)
                 + f" on Prometheus {shown(address)}")

        def value(signal: str) -> float:
            return tables[signal].get(key, math.nan)

        newest = value("newest_sample")
        return assemble_signals(FleetTotals(
            at=now, where=where, rate_window_s=target.rate_window_s, has_series=key in tables["ready_replicas"],
            ready_replicas=tables["ready_replicas"].get(key, 0.0),
            prompt_tokens_per_s=value("prompt_tokens_per_s"), generation_tokens_per_s=value("generation_tokens_per_s"),
            requests_waiting=value("requests_waiting"), requests_running=value("requests_running"),
            mean_prompt_tokens=value("mean_prompt_tokens"), mean_output_tokens=value("mean_output_tokens"),
            prompt_length_buckets=self._buckets(tables["prompt_length_buckets"], key),
            ttft_buckets=self._buckets(tables["ttft_buckets"], key),
            kv_cache_usage=value("kv_cache_usage"), kv_cache_tokens=kv_cache_tokens,
            prefix_cache_hit_share=value("prefix_cache_hit_share"),
            activation_value=activation_value,
            data_age_s=eval_time - newest if math.isfinite(eval_time) and math.isfinite(newest) else 0.0))

    @staticmethod
    def _buckets(table: dict[SeriesKey, float], key: SeriesKey) -> dict[float, float]:
        """This target's cumulative bucket rates {le: per second} from a ``sum by (..., le)`` table."""
        model, values = key
        out: dict[float, float] = {}
        for (row_model, row_values), rate in table.items():
            if row_model == model and row_values[:-1] == values and math.isfinite(rate):
                try:
                    out[float(row_values[-1])] = rate
                except ValueError:
                    return {}  # a malformed le label: no histogram rather than a wrong one
        return out

    def _activation(self, target: Target, address: str) -> float | None:
        """The target's own activation query, summed over its series; None when it returns nothing."""
        if target.activation_query is None:
            return None
        return self._activation_total(target, address, self.query(address, target.activation_query))

    def _activation_at(self, target: Target, address: str, rows: dict[str, list[Any]]) -> float | None:
        """The target's activation value from a range query's rows at one instant."""
        return self._activation_total(target, address, rows.get(_activation_key(target), []))

    @staticmethod
    def _activation_total(target: Target, address: str, rows: list[Any]) -> float | None:
        """An activation query's answer summed over its series; None when it returned nothing."""
        if target.activation_query is None:
            return None
        if len(rows) == 2 and not isinstance(rows[0], dict):  # a scalar result: [time, "value"]
            values = [_float(rows[1])]
        else:
            values = [_sample(r)[1] for r in rows]
        if not values:
            return None
        total = math.fsum(values)
        if not math.isfinite(total):
            raise SourceError(f"activation query {target.activation_query!r} on {shown(address)} gave {values!r}: "
                              "want finite numbers")
        return total


def _matchers(names: tuple[str, ...], members: Sequence[Target]) -> dict[str, list[str]]:
    """Every value each of the group's label names takes over its members, for ``group_queries``."""
    matchers: dict[str, list[str]] = {name: [] for name in names}
    for target in members:
        for name, value in target.label_matchers:
            matchers[name].append(value)
    return matchers


def _activation_key(target: Target) -> str:
    """The key a target's activation query's rows travel under beside the group's signals."""
    return f"activation:{target.activation_query}"


def _split_range(matrix: list[Any], instants: Sequence[float]) -> dict[int, list[Any]]:
    """A range query's series split into the instant-vector rows each of ``instants`` would have answered
    (``{index: [{"metric": ..., "value": [t, v]}, ...]}``); malformed series are passed on as rows for the
    assembly to refuse. Prometheus steps from the exact start, so the samples fall on the instants (to the ms)."""
    index = {round(t * 1000): k for k, t in enumerate(instants)}
    out: dict[int, list[Any]] = defaultdict(list)
    for series in matrix:
        values = series.get("values") if isinstance(series, dict) else None
        if not isinstance(values, list):
            for k in range(len(instants)):  # the assembly names what is wrong with it
                out[k].append(series)
            continue
        for point in values:
            at = _float(point[0]) if isinstance(point, (list, tuple)) and len(point) == 2 else math.nan
            k = index.get(round(at * 1000), -1) if math.isfinite(at * 1000) else -1  # 1e308 s: no instant
            if k >= 0:
                out[k].append({"metric": series.get("metric"), "value": point})
    return out
