"""The policies a comparison runs, each wired into KEDA + HPA the way people really deploy it.

Every autoscaling policy is a KEDA trigger: a metric the HPA sizes with ``AverageValue`` and an
``IsActive`` answer, both read only from what a live system sees (``observe.Observer``: scraped vLLM
metrics, Kubernetes pod phases). The HPA and KEDA settings are their defaults unless a recipe says
otherwise (``ControlConfig``).

- ``leadscale``: the scaler's own code. The trigger metadata goes through ``scaler.metadata.
  parse_metadata`` and ``ScalerConfig.policy_config`` (as in ``scaler.evaluator``), the Signals are
  built like ``scaler.sources.prometheus`` plus the Kubernetes view, and ``scaler.policy.decide``
  runs every 5 s (the evaluator's interval), the HPA reading the cached ``desired_replicas`` with
  target 1; KEDA and HPA set up as the chart's example ScaledObject (``leadscale_control``).
- ``waiting-requests``: vLLM production-stack's recipe, a Prometheus trigger on
  ``sum(vllm:num_requests_waiting)``, threshold 5, AverageValue.
- ``kv-cache``: ``sum(vllm:kv_cache_usage_perc)``, target 0.8 per replica (AverageValue).
- ``saturation``: llm-d's workload-variant-autoscaler v1 saturation analyzer (KV >= 0.8 or queue
  >= 5 saturates a replica; +1 when the average spare KV < 0.1 or spare queue < 3 across the
  non-saturated replicas and none is pending; -1 only if the load spread over one fewer replica
  keeps both margins); its desired count reaches the HPA as a metric with target 1.
- ``fixed:N``: N replicas, no autoscaler. ``static``: the smallest fixed fleet that meets the SLO on the whole run
  (``StaticSpec``). ``oracle``: see ``simulator.oracle``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from scaler import evaluation
from scaler import policy as live_policy
from scaler.metadata import ScalerConfig, parse_metadata
from scaler.signals import Signals
from scaler.sources.base import SourceError
from simulator.control import ControlConfig, ScalingPolicy, ScalingRules, default_scale_up
from simulator.observe import Observer

NAMES = ("leadscale", "waiting-requests", "kv-cache", "saturation", "fixed:N", "static", "oracle")
EVALUATOR_INTERVAL_S = evaluation.DEFAULT_INTERVAL_S
STALENESS_LIMIT_S = evaluation.DEFAULT_STALENESS_LIMIT_S


@dataclass(frozen=True)
class View:
    """What a live autoscaler can read at one instant: Prometheus (via the observer) and pod phases."""

    observer: Observer
    spec_replicas: int
    ready_replicas: int
    starting_replicas: int


class TriggerPolicy:
    """A KEDA trigger: ``metric`` (None = the read failed) and ``active`` at ``now``."""

    name = "trigger"
    evaluation_period_s: float | None = None  # own evaluation loop (None: computed when asked)

    def __init__(self, control: ControlConfig) -> None:
        self.control = control

    def evaluate(self, now: float, view: View) -> None:
        """Run the policy's own loop once (only for policies with ``evaluation_period_s``)."""

    def metric(self, now: float, view: View) -> float | None:
        raise NotImplementedError

    def active(self, now: float, view: View) -> bool | None:
        value = self.metric(now, view)
        return None if value is None else value > self.control.activation_threshold


class PrometheusTrigger(TriggerPolicy):
    """KEDA's ``prometheus`` scaler on ``sum(<gauge>)``; an empty answer is 0 (``ignoreNullValues``)."""

    def __init__(self, name: str, gauge: str, threshold: float, control: ControlConfig) -> None:
        super().__init__(replace(control, target_value=threshold))
        self.name, self.gauge = name, gauge

    def metric(self, now: float, view: View) -> float | None:
        value = view.observer.gauges_sum(self.gauge, now)
        return 0.0 if value is None else value


@dataclass(frozen=True)
class SaturationConfig:
    """WVA's capacity-scaling defaults (``capacity-scaling-config``)."""

    kv_cache_threshold: float = 0.8
    queue_length_threshold: float = 5.0
    kv_spare_trigger: float = 0.1
    queue_spare_trigger: float = 3.0


class Saturation(TriggerPolicy):
    """WVA v1 saturation analysis: one replica more or less at a time, from per-replica KV and queue."""

    name = "saturation"

    def __init__(self, control: ControlConfig, config: SaturationConfig | None = None) -> None:
        super().__init__(replace(control, target_value=1.0))
        self.config = config or SaturationConfig()

    def desired(self, now: float, view: View) -> int:
        cfg = self.config
        kv = view.observer.gauge("vllm:kv_cache_usage_perc", now)
        queue = view.observer.gauge("vllm:num_requests_waiting", now)
        ids = sorted(set(kv) & set(queue))
        current = view.spec_replicas
        if not ids:
            return current
        free = [i for i in ids if kv[i] < cfg.kv_cache_threshold and queue[i] < cfg.queue_length_threshold]
        if not free:
            return current + 1 if view.starting_replicas == 0 else current
        spare_kv = sum(cfg.kv_cache_threshold - kv[i] for i in free) / len(free)
        spare_queue = sum(cfg.queue_length_threshold - queue[i] for i in free) / len(free)
        if spare_kv < cfg.kv_spare_trigger or spare_queue < cfg.queue_spare_trigger:
            return current + 1 if view.starting_replicas == 0 else current
        if len(free) >= 2 and len(free) == len(ids):
            remaining = len(free) - 1
            kv_after = cfg.kv_cache_threshold - sum(kv[i] for i in free) / remaining
            queue_after = cfg.queue_length_threshold - sum(queue[i] for i in free) / remaining
            if kv_after >= cfg.kv_spare_trigger and queue_after >= cfg.queue_spare_trigger:
                return current - 1
        return current

    def metric(self, now: float, view: View) -> float | None:
        return float(self.desired(now, view))

    def active(self, now: float, view: View) -> bool | None:
        return True  # WVA keeps at least minReplicas; it does not drive scale-to-zero in v1


class Leadscale(TriggerPolicy):
    """``scaler.policy.decide`` fed the Signals the live scaler builds, on the evaluator's schedule."""

    name = "leadscale"
    evaluation_period_s = EVALUATOR_INTERVAL_S

    def __init__(self, metadata: dict[str, str], control: ControlConfig) -> None:
        super().__init__(replace(control, target_value=1.0))
        self.metadata = dict(metadata)
        self.config: ScalerConfig = parse_metadata(self.metadata)
        self.held = evaluation.Held()
        self.decisions: list[tuple[float, int, dict[str, float]]] = []

    @property
    def decision(self) -> live_policy.Decision | None:
        return self.held.decision

    def policy_config(self, signals: Signals | None = None) -> live_policy.PolicyConfig:
        """Exactly what the evaluator builds: metadata first, the ScaledObject's min/max otherwise, engine
        limits the metadata leaves open from ``signals`` (``scaler.engine_limits``)."""
        capacity = self.config.replica_capacity(signals, WHERE)
        return self.config.policy_config(self.control.min_replicas, self.control.max_replicas, capacity=capacity)

    def snapshots(self, now: float, view: View) -> tuple[Signals | SourceError, Signals | SourceError | None]:
        """What the live evaluator's source would answer: this Deployment's snapshot (and the route's)."""
        signals = view.observer.signals(now, view.ready_replicas, view.starting_replicas,
                                        lead_time_auto=self.config.lead_time_auto)
        return (signals if signals is not None else SourceError("no data")), None

    def evaluate(self, now: float, view: View) -> None:
        """One ``scaler.evaluation`` step, as the live evaluator runs it; a skipped step keeps the last decision."""
        own, route = self.snapshots(now, view)
        try:
            signals, whole = evaluation.inputs(own, route, STALENESS_LIMIT_S)
            # the Kubernetes view: this Deployment's pods, also under an empty snapshot of its own
            signals = replace(signals, ready_replicas=view.ready_replicas, starting_replicas=view.starting_replicas)
            self.held = evaluation.step(self.config, self.held, signals, now,
                                        (self.control.min_replicas, self.control.max_replicas), WHERE, whole)
        except evaluation.Skipped:
            return
        decision = self.held.decision
        assert decision is not None
        self.decisions.append((now, decision.desired_replicas, dict(decision.terms)))

    def metric(self, now: float, view: View) -> float | None:
        decision = evaluation.fresh(self.held, now, STALENESS_LIMIT_S)
        return None if decision is None else float(decision.desired_replicas)

    def active(self, now: float, view: View) -> bool | None:
        decision = evaluation.fresh(self.held, now, STALENESS_LIMIT_S)
        return None if decision is None else bool(decision.active)


WHERE = "the simulated Prometheus"


@dataclass(frozen=True)
class Fixed:
    """N replicas for the whole run; no control loop."""

    replicas: int
    name: str = field(default="fixed")


@dataclass(frozen=True)
class StaticSpec:
    """Marker: the cheapest fixed fleet that meets the SLO on the whole run, found by simulation
    (``simulator.autoscale.best_static_fleet``). Static provisioning sized in hindsight: what a team would
    pay without an autoscaler; on a load whose rate does not move it is also what a causal policy can
    approach at best (nothing in its past says which future minute will be busy)."""

    name: str = "static"


@dataclass(frozen=True)
class OracleSpec:
    """Marker: the clairvoyant schedule is computed by ``simulator.oracle`` from the workload itself."""

    name: str = "oracle"


def leadscale_metadata(profile: str | dict[str, str], slo_ttft_s: float,
                       extra: dict[str, str] | None = None) -> dict[str, str]:
    """The trigger metadata a user would write for this profile and SLO (see charts/ and docs).

    ``profile`` is a profile name, or the capacity keys (``prefillTokensPerSecond``...) for a profile
    the live scaler could not look up by name.
    """
    keys = {"profile": profile} if isinstance(profile, str) else dict(profile)
    meta = {"model": "simulated", **keys, "ttftSeconds": f"{slo_ttft_s:g}", **CHART_METADATA,
            "activationQuery": "sum(gateway_queue_requests)"}
    meta.update(extra or {})
    return meta


CHART_METADATA = {"leadTime": "auto", "scaleDownDelay": "60"}
"""Trigger metadata of the chart's example ScaledObject besides ``model`` (a test keeps the two equal)."""

CHART_TOLERANCE = 0.01
CHART_SCALE_DOWN = ScalingRules(60.0, (ScalingPolicy("Percent", 100, 15.0),), "Max", tolerance=CHART_TOLERANCE)
CHART_SCALE_UP = replace(default_scale_up(), tolerance=CHART_TOLERANCE)


def leadscale_control(min_replicas: int, max_replicas: int) -> ControlConfig:
    """The example ScaledObject of ``charts/leadscale/values.yaml`` (a test keeps the two equal): polling
    15 s, cooldown 300 s, fallback after 3 failures with ``currentReplicasIfHigher``, HPA tolerance 0.01,
    scale-up as Kubernetes' default, scale-down at Kubernetes' default rate (100 % per 15 s) after a 60 s
    window; target 1. No pods-per-minute limit: the policy sizes every removal so the fleet left carries the
    next lead time's peak, and a fixed rate does not scale with the fleet (one pod a minute held an
    overshoot of 25 pods for 25 minutes on azure x64: docs/autoscaling.md)."""
    return ControlConfig(min_replicas=min_replicas, max_replicas=max_replicas, polling_interval_s=15.0,
                         cooldown_period_s=300.0, scale_up=CHART_SCALE_UP, scale_down=CHART_SCALE_DOWN,
                         fallback_failure_threshold=3, fallback_replicas=1,
                         fallback_behavior="currentReplicasIfHigher")


def make_policy(name: str, profile: str | dict[str, str], slo_ttft_s: float, min_replicas: int = 1,
                max_replicas: int = 100, leadscale_extra: dict[str, str] | None = None,
                ) -> TriggerPolicy | Fixed | StaticSpec | OracleSpec:
    """Build a policy by name; ``ValueError`` naming the value and the allowed names otherwise."""
    text = name.strip()
    control = ControlConfig(min_replicas=min_replicas, max_replicas=max_replicas)
    if text == "leadscale":
        return Leadscale(leadscale_metadata(profile, slo_ttft_s, leadscale_extra),
                         leadscale_control(min_replicas, max_replicas))
    if text == "waiting-requests":
        return PrometheusTrigger(text, "vllm:num_requests_waiting", 5.0, control)
    if text == "kv-cache":
        return PrometheusTrigger(text, "vllm:kv_cache_usage_perc", 0.8, control)
    if text == "saturation":
        return Saturation(control)
    if text == "oracle":
        return OracleSpec()
    if text == "static":
        return StaticSpec()
    if text.startswith("fixed:"):
        count = text.split(":", 1)[1]
        if count.isdigit() and int(count) >= 1:
            return Fixed(int(count), name=text)
        raise ValueError(f"policy {name!r}: fixed:N needs an integer N >= 1")
    raise ValueError(f"policy {name!r}: allowed {', '.join(NAMES)}")


def parse_policies(text: str) -> list[str]:
    """``a,b,c`` -> names, each checked (no duplicates); ``ValueError`` naming the bad one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--policies {text!r}: give at least one of {', '.join(NAMES)}")
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValueError(f"--policies {text!r}: {n!r} is listed twice")
        seen.add(n)
        if n not in NAMES and not (n.startswith("fixed:") and n[6:].isdigit() and int(n[6:]) >= 1):
            raise ValueError(f"--policies: {n!r} is not a policy; allowed {', '.join(NAMES)}")
    return names
