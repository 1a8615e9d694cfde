"""Trigger metadata → one typed, validated ``ScalerConfig``.

KEDA hands a ScaledObject trigger's ``metadata`` map to the scaler as ``scalerMetadata`` (strings
only) on every call. Like KEDA's own scalers, every key is declared once (name, default, allowed
values), one parse gathers *all* problems and raises a single ``MetadataError`` naming key, value
and what is allowed (the service answers ``INVALID_ARGUMENT``). Unknown keys are errors: a typo
must not silently become a default that sizes a GPU fleet. Parsing is cached per distinct map.

A few policy tunables beyond the core keys (e.g. a backlog drain time) are declared in
``POLICY_TUNABLES`` and passed to ``scaler.policy.PolicyConfig``, whose own validation also speaks.

Capacity comes from a ``profile`` or from the explicit rates ``prefillTokensPerSecond`` and
``decodeTokensPerSecond``; then ``kvCacheTokens`` and ``maxNumSeqs`` are overrides of what the engine
reports (``scaler.engine_limits``), and ``policy_config(signals=...)`` resolves them per snapshot.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scaler import keys
from scaler.capacity import ReplicaCapacity
from scaler.engine_limits import CapacityKeys
from scaler.metadata_values import LABEL_NAME, Reader
from scaler.metadata_values import Problem as Problem
from scaler.sources.base import RESERVED_LABELS

if TYPE_CHECKING:  # the policy imports the capacity model, which this module's users import first
    from scaler.policy import PolicyConfig

EXPLICIT_CAPACITY_KEYS = ("prefillTokensPerSecond", "decodeTokensPerSecond", "maxNumSeqs", "kvCacheTokens")
REQUIRED_CAPACITY_KEYS = ("prefillTokensPerSecond", "decodeTokensPerSecond")
"""Without a profile these two are required; ``maxNumSeqs``/``kvCacheTokens`` override the engine's own."""
OPTIONAL_CAPACITY_KEYS = ("prefillAttentionTokens", "decodeContextTokens")
"""With the explicit keys only: K of ``ReplicaCapacity.prefill_attention_tokens`` and K_d of
``decode_context_tokens`` (a profile carries its own)."""
CORE_KEYS = keys.core_names()
"""Every key ``_parse`` reads itself (``scaler.keys.KEYS`` declares them all, tunables after)."""
KEDA_KEYS, FROM_ENV = keys.KEDA_KEYS, keys.FROM_ENV
VALUE_LIMITS = {"activationQuery": 16384, "labelSelector": 4096, "scrapeTargets": 65536}
"""Keys whose values may be longer than ``metadata_values.MAX_VALUE_CHARS`` (a query, lists)."""
MAX_MESSAGE_CHARS = 4000
"""An error lists problems up to this length, then counts the rest: KEDA receives it as gRPC trailing metadata."""
_CACHE_SIZE = 1024
_CACHE_MAX_CHARS = 1 << 16
"""Maps larger than this (only hostile ones are) are parsed every time rather than kept: 1024 of them could
otherwise hold a gigabyte."""
CORE_POLICY_FIELDS = {field: name for field, name in keys.policy_fields().items()
                      if not keys.BY_NAME[name].tunable}
"""PolicyConfig field -> the core key that sets it (to translate the policy's own errors)."""
POLICY_TUNABLES: dict[str, tuple[str, type]] = keys.tunables()
"""Policy tunables a trigger may set: key -> (PolicyConfig field, type), from ``scaler.keys``."""


@functools.cache
def policy_tunables() -> dict[str, tuple[str, type]]:
    """The declared tunables that the installed ``PolicyConfig`` really has."""
    from scaler.policy import PolicyConfig

    fields = {f.name for f in dataclasses.fields(PolicyConfig)}
    return {key: spec for key, spec in POLICY_TUNABLES.items() if spec[0] in fields}


class MetadataError(ValueError):
    """Every problem found in one trigger metadata map; ``str`` lists them all."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        shown: list[str] = []
        length = 0
        for problem in self.problems:
            text = str(problem)
            if shown and length + len(text) > MAX_MESSAGE_CHARS:
                break
            shown.append(text)
            length += len(text) + 2
        rest = len(self.problems) - len(shown)
        more = f"; and {rest} more problem{'s' if rest > 1 else ''}" if rest else ""
        super().__init__("invalid trigger metadata: " + "; ".join(shown) + more)


@dataclass(frozen=True)
class ScalerConfig:
    """One trigger's configuration, validated; build with ``parse_metadata``."""

    model: str
    capacity: ReplicaCapacity | None
    """The replica's capacity when fully known from metadata; None: engine limits read per snapshot."""
    profile: str | None = None
    prometheus_address: str | None = None
    ttft_s: float = keys.default("ttftSeconds")
    target_utilization: float = keys.default("targetUtilization")
    lead_time_s: float = keys.default("leadTime")
    lead_time_auto: bool = False
    scale_down_delay_s: float = keys.default("scaleDownDelay")
    min_replicas: int | None = None
    """None: not set in metadata (the ScaledObject's minReplicaCount via the Kubernetes observer, else 0)."""
    max_replicas: int | None = None
    activation_query: str | None = None
    activation_threshold: float = keys.default("activationThreshold")
    namespace_label: str | None = None
    label_selector: tuple[tuple[str, str], ...] = ()
    rate_window_s: float = keys.default("rateWindow")
    scrape_targets: tuple[str, ...] = ()
    tunables: tuple[tuple[str, float | int], ...] = ()
    """Extra ``PolicyConfig`` fields set from metadata, as (field name, value)."""
    capacity_keys: CapacityKeys | None = None
    """The explicit capacity keys (None with a profile); unset limits come from the engine."""
    traffic_weight: float | None = None
    """This Deployment's share of its route, 0..1 (``trafficWeight`` / 100); None: not part of a route."""
    route_selector: tuple[tuple[str, str], ...] = ()
    """Label matchers selecting every version's series of the route (``routeSelector``)."""

    @functools.cached_property
    def metric_name(self) -> str:
        """Lowercase metric name KEDA registers with the HPA (it prefixes ``s<N>-`` itself)."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.model.lower()).strip("-")[:48].strip("-")
        return f"leadscale-{slug or 'model'}"

    def replica_capacity(self, signals: Any = None, where: str = "the signal source") -> ReplicaCapacity:
        """The capacity for one snapshot: the metadata's, else with the engine's limits from ``signals``
        (``scaler.engine_limits``; raises ``EngineLimitMissing`` naming what is missing and where from)."""
        if self.capacity is not None:
            return self.capacity
        assert self.capacity_keys is not None
        return self.capacity_keys.resolve(signals, where)

    def policy_config(self, min_replicas: int | None = None, max_replicas: int | None = None,
                      capacity: ReplicaCapacity | None = None) -> PolicyConfig:
        """The policy's config; min/max from metadata win over the ScaledObject's (passed by the caller).
        ``capacity`` (from ``replica_capacity``) is needed when the metadata leaves engine limits open."""
        from scaler.policy import PolicyConfig

        capacity = capacity if capacity is not None else self.capacity
        if capacity is None:
            from scaler.engine_limits import EngineLimitMissing

            raise EngineLimitMissing("policy_config() needs capacity=replica_capacity(signals): the metadata leaves "
                                     "kvCacheTokens/maxNumSeqs to the engine")
        kwargs: dict[str, Any] = dict(
            capacity=capacity, ttft_slo_s=self.ttft_s, target_utilization=self.target_utilization,
            lead_time_s=self.lead_time_s, scale_down_delay_s=self.scale_down_delay_s,
            activation_threshold=self.activation_threshold, rate_window_s=self.rate_window_s, **dict(self.tunables),
        )
        low = self.min_replicas if self.min_replicas is not None else min_replicas
        high = self.max_replicas if self.max_replicas is not None else max_replicas
        if low is not None:
            kwargs["min_replicas"] = low
        if high is not None:
            kwargs["max_replicas"] = max(high, low or 0)
        return PolicyConfig(**kwargs)

    def target(self, namespace: str | None = None) -> Any:
        """What the sources measure; ``namespace`` (the ScaledObject's) fills ``namespaceLabel``."""
        return self._target(self.label_selector, namespace, self.activation_query)

    def route_target(self, namespace: str | None = None) -> Any:
        """The whole route's series (every version), or None when this trigger is not part of a route."""
        if self.traffic_weight is None:
            return None
        return self._target(self.route_selector, namespace, None)

    def _target(self, selector: tuple[tuple[str, str], ...], namespace: str | None, activation: str | None) -> Any:
        from scaler.sources.base import Target

        matchers = dict(selector)
        if self.namespace_label and namespace:
            matchers[self.namespace_label] = namespace
        return Target(model=self.model, prometheus_address=self.prometheus_address,
                      label_matchers=tuple(sorted(matchers.items())), activation_query=activation,
                      rate_window_s=self.rate_window_s)


def _read(reader: Reader, name: str, required: bool = False) -> Any:
    """Key ``name`` as ``scaler.keys`` declares it (kind, default, range); a problem recorded when invalid."""
    key = keys.BY_NAME[name]
    return reader.number(name, keys.default(name) if not key.tunable else None, keys.limit(name),
                         required=required, kind=key.kind, allowed=keys.allowed(name))


def known_keys() -> tuple[str, ...]:
    """Every accepted metadata key: the core ones, then the policy's tunables."""
    return CORE_KEYS + tuple(policy_tunables())


def _capacity(reader: Reader, ttft_s: float | None) -> tuple[ReplicaCapacity | CapacityKeys | None, str | None]:
    profile = reader.text("profile")
    explicit = [key for key in EXPLICIT_CAPACITY_KEYS + OPTIONAL_CAPACITY_KEYS if reader.raw.get(key)]
    if profile is not None and explicit:
        both = "either profile or the explicit " + "/".join(EXPLICIT_CAPACITY_KEYS) + ", not both"
        reader.problem(explicit[0], reader.raw[explicit[0]], both)
        return None, profile
    if profile is not None:
        from scaler.profiles import get_profile, list_profiles

        known = list(list_profiles())
        if profile not in known:  # names only: metadata must not make the scaler read files by path
            reader.problem("profile", profile, "one of " + ", ".join(known))
            return None, profile
        try:
            return get_profile(profile).capacity(ttft_s if ttft_s is not None else 2.0), profile
        except (KeyError, ValueError) as exc:
            reader.problem("profile", profile, f"a profile valid at ttftSeconds={ttft_s} ({exc})")
            return None, profile
    if not set(explicit) - set(OPTIONAL_CAPACITY_KEYS):
        reader.problem("profile", None, "a profile name, or " + " and ".join(REQUIRED_CAPACITY_KEYS)
                       + " (maxNumSeqs and kvCacheTokens are read from the engine unless given)")
        return None, None
    prefill = _read(reader, "prefillTokensPerSecond", required=True)
    decode = _read(reader, "decodeTokensPerSecond", required=True)
    seqs, kv = _read(reader, "maxNumSeqs"), _read(reader, "kvCacheTokens")
    attention, context = _read(reader, "prefillAttentionTokens"), _read(reader, "decodeContextTokens")
    if prefill is None or decode is None or (reader.raw.get("maxNumSeqs") and seqs is None) or (
            reader.raw.get("kvCacheTokens") and kv is None):
        return None, None
    given = CapacityKeys(prefill, decode, seqs, kv, attention, context)
    return (given.capacity(1, 1) if given.complete else given), None


def _label_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a matcher label (``Target`` would raise), or None when it can."""
    if not LABEL_NAME.fullmatch(name):
        return "a Prometheus label name matching [a-zA-Z_][a-zA-Z0-9_]*"
    if name in RESERVED_LABELS or name.startswith("__"):
        return f"a label name other than {', '.join(sorted(RESERVED_LABELS))} (set by the scaler) and not __-prefixed"
    return None


def _selector(reader: Reader, key: str, namespace_label: str | None) -> tuple[tuple[str, str], ...]:
    """``name=value,name2=value2`` of ``key`` as sorted pairs (problems recorded under ``key``)."""
    pairs: dict[str, str] = {}
    selector = reader.text(key)
    for item in (selector or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not LABEL_NAME.fullmatch(name) or not value or name in pairs:
            reader.problem(key, selector, "comma-separated name=value pairs, label names unique and "
                                          "matching [a-zA-Z_][a-zA-Z0-9_]*, values non-empty")
            break
        why = _label_name_problem(name)
        if why:
            reader.problem(key, selector, f"label {name!r} not allowed: want {why}")
            break
        pairs[name] = value
    if namespace_label and namespace_label in pairs:
        reader.problem(key, selector, f"no matcher on {namespace_label!r} (namespaceLabel sets it)")
    return tuple(sorted(pairs.items()))


def _labels(reader: Reader) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    namespace_label = reader.text("namespaceLabel")
    why = _label_name_problem(namespace_label) if namespace_label is not None else None
    if why:
        reader.problem("namespaceLabel", namespace_label, why)
    return namespace_label, _selector(reader, "labelSelector", namespace_label)


def _route(reader: Reader, namespace_label: str | None, own: tuple[tuple[str, str], ...],
           scrape_targets: tuple[str, ...]) -> tuple[float | None, tuple[tuple[str, str], ...]]:
    """``trafficWeight`` (percent -> share) and ``routeSelector``: both or neither (scaler.route)."""
    weight = _read(reader, "trafficWeight")
    route = _selector(reader, "routeSelector", namespace_label)
    given_weight, given_route = bool(reader.raw.get("trafficWeight", "").strip()), bool(route)
    if given_weight != given_route:
        missing = "routeSelector" if given_weight else "trafficWeight"
        present = "trafficWeight" if given_weight else "routeSelector"
        reader.problem(missing, None, f"set together with {present} (a Deployment's share of a route needs both: "
                                      "its weight in percent and the label matchers of every version's pods)")
    if given_route and route == own:
        reader.problem("routeSelector", reader.raw.get("routeSelector"),
                       "matchers of every version's pods, not the same as labelSelector (this version's)")
    if given_weight and scrape_targets:
        reader.problem("trafficWeight", reader.raw.get("trafficWeight"),
                       "only with Prometheus: the route is read through routeSelector's label matchers, which "
                       "scrapeTargets cannot apply")
    return (weight / 100.0 if weight is not None and given_route else None), route


def _resolve_keys(given: Mapping[str, str], known: tuple[str, ...], problems: list[Problem]) -> dict[str, str]:
    """Drop KEDA's own keys, map ``<key>FromEnv`` (KEDA resolved the value) to ``<key>``, flag unknown keys."""
    raw: dict[str, str] = {}
    for key, value in given.items():
        base = key[: -len(FROM_ENV)] if key.endswith(FROM_ENV) else None
        if key in KEDA_KEYS:
            continue
        if key in known:
            raw[key] = value
        elif base in known:
            if base in given:
                problems.append(Problem(key, value, f"either {base} or {key}, not both"))
            else:
                raw[base] = value
        else:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(Problem(key, value, f"a known key{hint}: " + ", ".join(known)))
    return raw


def _parse(given: Mapping[str, str]) -> ScalerConfig:
    tunable_specs = policy_tunables()
    problems: list[Problem] = []
    raw = _resolve_keys(given, known_keys(), problems)
    reader = Reader(raw, VALUE_LIMITS)
    model = reader.text("model", required=True)
    prometheus_address = reader.url("prometheusAddress")
    ttft = _read(reader, "ttftSeconds")
    utilization = _read(reader, "targetUtilization")
    lead_auto = raw.get("leadTime", "").strip().lower() == "auto"
    lead = keys.default("leadTime") if lead_auto else _read(reader, "leadTime")
    delay = _read(reader, "scaleDownDelay")
    window = _read(reader, "rateWindow")
    low = _read(reader, "minReplicas")
    high = _read(reader, "maxReplicas")
    if low is not None and high is not None and high < low:
        reader.problem("maxReplicas", raw["maxReplicas"], f"an integer >= minReplicas ({low})")
    activation_query = reader.text("activationQuery")
    threshold = _read(reader, "activationThreshold")
    if "activationThreshold" in raw and activation_query is None:
        reader.problem("activationThreshold", raw["activationThreshold"], "set only together with activationQuery")
    namespace_label, selector = _labels(reader)
    scrape_targets = reader.url_list("scrapeTargets")
    traffic_weight, route_selector = _route(reader, namespace_label, selector, scrape_targets)
    capacity, profile = _capacity(reader, ttft)
    tunables = []
    for key, (field_name, _) in sorted(tunable_specs.items()):
        value = _read(reader, key)
        if value is not None:
            tunables.append((field_name, value))
    reader.problems.extend(problems)  # unknown keys last: a hundred of them must not hide a bad known one
    if reader.problems or capacity is None or model is None:
        raise MetadataError(reader.problems or [Problem("profile", None, "a replica capacity")])
    explicit = capacity if isinstance(capacity, CapacityKeys) else None
    known = capacity if isinstance(capacity, ReplicaCapacity) else None
    config = ScalerConfig(
        model=model, capacity=known, capacity_keys=explicit, profile=profile,
        prometheus_address=prometheus_address, ttft_s=ttft,
        target_utilization=utilization, lead_time_s=lead, lead_time_auto=lead_auto, scale_down_delay_s=delay,
        min_replicas=low, max_replicas=high, activation_query=activation_query, activation_threshold=threshold,
        namespace_label=namespace_label, label_selector=selector, rate_window_s=window,
        scrape_targets=scrape_targets, tunables=tuple(tunables), traffic_weight=traffic_weight,
        route_selector=route_selector,
    )
    _check_policy(config, raw, {field: key for key, (field, _) in tunable_specs.items()})
    return config


def _check_policy(config: ScalerConfig, raw: Mapping[str, str], key_of_field: dict[str, str]) -> None:
    """Let the policy's own validation speak too (what no single key's range can say), each complaint
    under the metadata key that sets its field."""
    from scaler.policy import PolicyConfigError

    try:  # engine limits left open are checked per snapshot; any valid ones stand in here
        config.policy_config(capacity=config.capacity or (config.capacity_keys.capacity(1, 1)
                                                           if config.capacity_keys is not None else None))
    except PolicyConfigError as exc:
        key_of = {**CORE_POLICY_FIELDS, **key_of_field}
        problems = [Problem(key_of.get(field_name, "metadata"), raw.get(key_of.get(field_name, "")), allowed)
                    for field_name, _, allowed in exc.problems]
        raise MetadataError(problems) from None


_cache: dict[frozenset[tuple[str, str]], ScalerConfig | list[Problem]] = {}
_cache_lock = threading.Lock()


def parse_metadata(raw: Mapping[str, str]) -> ScalerConfig:
    """Validate one trigger's metadata map; raises ``MetadataError`` listing every problem."""
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in getattr(raw, "items", dict)()):
        raise MetadataError([Problem("metadata", repr(raw)[:200], "a map of strings to strings")])
    key = frozenset(raw.items())
    with _cache_lock:
        hit = _cache.get(key)
    if hit is None:  # parse outside the lock: two threads may both parse a new map, harmlessly
        try:
            hit = _parse(raw)
        except MetadataError as exc:
            hit = exc.problems
        if sum(len(k) + len(v) for k, v in raw.items()) <= _CACHE_MAX_CHARS:
            with _cache_lock:
                if len(_cache) >= _CACHE_SIZE:
                    _cache.clear()
                _cache[key] = hit
    if isinstance(hit, list):
        raise MetadataError(hit)
    return hit

