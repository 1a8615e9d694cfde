"""The KEDA + HPA control loop, as Kubernetes runs it, with time passed in.

NOTE: this follows the HPA controller of Kubernetes 1.33 (``pkg/controller/podautoscaler``:
``GetExternalPerPodMetricReplicas``, ``stabilizeRecommendationWithBehaviors``,
``calculateScaleUp/DownLimitWithBehaviors``) and KEDA 2.20's scale loop (``scale_scaledobjects.go``,
``fallback.go``) for one ScaledObject with one external trigger of type ``AverageValue``:

- HPA sync every 15 s: desired = ceil(metric sum / target), unless the ratio sum / (target x spec
  replicas) is within the tolerance (default 0.1) of 1; metric values travel as milli-quantities.
  The raw recommendation is stabilized (scale-up window 0 s, scale-down window 300 s by default:
  the highest recommendation of the window wins for scale-down, the lowest for scale-up), then
  limited by the Pods/Percent policies per period (``selectPolicy`` Max, Min or Disabled) and by
  min/max. A new HPA seeds its scale-down window with the current size. It does nothing at 0 replicas.
- KEDA polls IsActive every ``pollingInterval`` (30 s): it scales 0 -> max(1, minReplicaCount) when
  a trigger is active and to 0 after ``cooldownPeriod`` (300 s) without activity (only when
  minReplicaCount is 0). KEDA's HPA gets minReplicas = max(1, minReplicaCount).
- Fallback: after ``failureThreshold`` consecutive failed metric reads, KEDA answers the HPA with
  replicas x target, replicas per ``fallback.behavior`` (``static``: fallback.replicas;
  ``currentReplicas[IfHigher|IfLower]``: the current count, or the max/min of both); below the
  threshold a failed read leaves the replica count unchanged (the HPA reports ScalingActive=False).

Left out: several triggers per object, Value/Utilization targets, scaling modifiers, idleReplicaCount.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

SELECT_POLICIES = ("Max", "Min", "Disabled")
POLICY_TYPES = ("Pods", "Percent")
FALLBACK_BEHAVIORS = ("static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower")


@dataclass(frozen=True)
class ScalingPolicy:
    """One HPA scaling policy: at most ``value`` Pods (or Percent) per ``period_s``."""

    type: str
    value: int
    period_s: float

    def __post_init__(self) -> None:
        if self.type not in POLICY_TYPES:
            raise ValueError(f"ScalingPolicy.type={self.type!r}: allowed {', '.join(POLICY_TYPES)}")
        if not (isinstance(self.value, int) and self.value > 0):
            raise ValueError(f"ScalingPolicy.value={self.value!r}: must be an integer > 0")
        if not (0 < self.period_s <= 1800):
            raise ValueError(f"ScalingPolicy.period_s={self.period_s!r}: must be in (0, 1800] (Kubernetes' limit)")


@dataclass(frozen=True)
class ScalingRules:
    """The scaleUp or scaleDown part of an HPA ``behavior``."""

    stabilization_window_s: float
    policies: tuple[ScalingPolicy, ...]
    select_policy: str = "Max"
    tolerance: float = 0.1

    def __post_init__(self) -> None:
        if not (0 <= self.stabilization_window_s <= 3600):
            raise ValueError(
                f"ScalingRules.stabilization_window_s={self.stabilization_window_s!r}: must be in [0, 3600]")
        if self.select_policy not in SELECT_POLICIES:
            raise ValueError(f"ScalingRules.select_policy={self.select_policy!r}: allowed {', '.join(SELECT_POLICIES)}")
        if not self.policies and self.select_policy != "Disabled":
            raise ValueError("ScalingRules.policies=(): at least one policy unless select_policy is Disabled")
        if not (0 <= self.tolerance < 1):
            raise ValueError(f"ScalingRules.tolerance={self.tolerance!r}: must be in [0, 1)")


def default_scale_up() -> ScalingRules:
    """Kubernetes' default scaleUp: no window; max(+4 pods, +100 %) per 15 s."""
    return ScalingRules(0.0, (ScalingPolicy("Pods", 4, 15.0), ScalingPolicy("Percent", 100, 15.0)))


def default_scale_down() -> ScalingRules:
    """Kubernetes' default scaleDown: 300 s window; up to 100 % per 15 s."""
    return ScalingRules(300.0, (ScalingPolicy("Percent", 100, 15.0),))


@dataclass(frozen=True)
class ControlConfig:
    """One ScaledObject (KEDA) and the HPA it generates; defaults are KEDA's and Kubernetes'."""

    target_value: float = 1.0
    activation_threshold: float = 0.0
    min_replicas: int = 0
    max_replicas: int = 100
    polling_interval_s: float = 30.0
    cooldown_period_s: float = 300.0
    hpa_sync_period_s: float = 15.0
    scale_up: ScalingRules = field(default_factory=default_scale_up)
    scale_down: ScalingRules = field(default_factory=default_scale_down)
    fallback_failure_threshold: int | None = None
    fallback_replicas: int = 0
    fallback_behavior: str = "static"

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.target_value) and self.target_value > 0):
            problems.append(f"target_value={self.target_value!r}: must be a finite number > 0")
        if not (isinstance(self.min_replicas, int) and self.min_replicas >= 0):
            problems.append(f"min_replicas={self.min_replicas!r}: must be an integer >= 0")
        if not (isinstance(self.max_replicas, int) and self.max_replicas >= max(1, self.min_replicas)):
            problems.append(f"max_replicas={self.max_replicas!r}: must be an integer >= max(1, min_replicas)")
        for name in ("polling_interval_s", "cooldown_period_s", "hpa_sync_period_s"):
            if not getattr(self, name) > 0:
                problems.append(f"{name}={getattr(self, name)!r}: must be > 0")
        if self.fallback_failure_threshold is not None and not (
            self.fallback_failure_threshold >= 1 and self.fallback_replicas >= 1
        ):
            problems.append(f"fallback_failure_threshold={self.fallback_failure_threshold!r}, fallback_replicas="
                            f"{self.fallback_replicas!r}: both must be >= 1 when fallback is set")
        if self.fallback_behavior not in FALLBACK_BEHAVIORS:
            problems.append(f"fallback_behavior={self.fallback_behavior!r}: allowed {', '.join(FALLBACK_BEHAVIORS)}")
        if problems:
            raise ValueError("invalid ControlConfig: " + "; ".join(problems))

    def fallback_target(self, current: int) -> int:
        """Replicas KEDA's fallback asks for (``fallback.behavior``), given the current count."""
        return {"static": self.fallback_replicas, "currentReplicas": current,
                "currentReplicasIfHigher": max(current, self.fallback_replicas),
                "currentReplicasIfLower": min(current, self.fallback_replicas)}[self.fallback_behavior]

    @property
    def hpa_min_replicas(self) -> int:
        """KEDA writes minReplicas = max(1, minReplicaCount) into its HPA."""
        return max(1, self.min_replicas)


def to_milli(value: float) -> int:
    """KEDA sends metric values to the HPA as milli-quantities (int64(value * 1000))."""
    return int(value * 1000)


def average_value_replicas(metric_sum: float, target: float, current: int, tolerance_up: float = 0.1,
                           tolerance_down: float = 0.1) -> int:
    """The HPA's replica proposal for an external AverageValue metric (tolerance keeps ``current``)."""
    usage, target_milli = to_milli(metric_sum), to_milli(target)
    if current > 0:
        ratio = usage / (target_milli * current)
        if 1.0 - tolerance_down <= ratio <= 1.0 + tolerance_up:
            return current
    return math.ceil(usage / target_milli)


@dataclass
class _Event:
    at: float
    value: int


class HPA:
    """The HorizontalPodAutoscaler's memory (recommendations, scale events) and its sync step."""

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        self.recommendations: list[_Event] = []
        self.up_events: list[_Event] = []
        self.down_events: list[_Event] = []

    def sync(self, now: float, current: int, metric_sum: float | None) -> int:
        """One sync: the new spec replicas (``current`` when nothing should change)."""
        cfg = self.config
        if current == 0:
            return 0  # scaling disabled at zero: KEDA owns 0 <-> 1
        if current > cfg.max_replicas:
            desired = cfg.max_replicas
        elif current < cfg.hpa_min_replicas:
            desired = cfg.hpa_min_replicas
        elif metric_sum is None:
            return current  # failed metric: ScalingActive=False, no change
        else:
            raw = average_value_replicas(metric_sum, cfg.target_value, current, cfg.scale_up.tolerance,
                                         cfg.scale_down.tolerance)
            stabilized = self._stabilize(now, current, raw)
            desired = self._limit_rate(now, current, stabilized)
        if desired != current:
            self._store_event(now, current, desired)
        return desired

    def _stabilize(self, now: float, current: int, raw: int) -> int:
        if not self.recommendations and self.config.scale_down.stabilization_window_s > 0:
            # maybeInitScaleDownStabilizationWindow: a new HPA remembers the current size as a recommendation
            self.recommendations.append(_Event(now, current))
        up_cut = now - self.config.scale_up.stabilization_window_s
        down_cut = now - self.config.scale_down.stabilization_window_s
        up_rec = down_rec = raw
        old_index = None
        for i, rec in enumerate(self.recommendations):
            if rec.at > up_cut:
                up_rec = min(up_rec, rec.value)
            if rec.at > down_cut:
                down_rec = max(down_rec, rec.value)
            if rec.at < up_cut and rec.at < down_cut:
                old_index = i
        recommendation = min(max(current, up_rec), down_rec)
        if old_index is None:
            self.recommendations.append(_Event(now, raw))
        else:
            self.recommendations[old_index] = _Event(now, raw)
        return recommendation

    def _limit_rate(self, now: float, current: int, desired: int) -> int:
        cfg = self.config
        if desired > current:
            limit = max(current, self._limit(now, current, cfg.scale_up, up=True))
            return min(desired, cfg.max_replicas, limit)
        if desired < current:
            limit = min(current, self._limit(now, current, cfg.scale_down, up=False))
            return max(desired, cfg.hpa_min_replicas, limit)
        return desired

    def _limit(self, now: float, current: int, rules: ScalingRules, up: bool) -> int:
        if rules.select_policy == "Disabled":
            return current
        # scale-up: Max picks the biggest proposal; scale-down: Max picks the lowest (the biggest change)
        pick = max if (rules.select_policy == "Max") == up else min
        proposals = []
        for policy in rules.policies:
            added = sum(e.value for e in self.up_events if e.at > now - policy.period_s)
            deleted = sum(e.value for e in self.down_events if e.at > now - policy.period_s)
            start = current - added + deleted
            if policy.type == "Pods":
                proposals.append(start + policy.value if up else start - policy.value)
            elif up:
                proposals.append(math.ceil(start * (1 + policy.value / 100)))
            else:
                proposals.append(int(start * (1 - policy.value / 100)))
        return pick(proposals)

    def _store_event(self, now: float, current: int, desired: int) -> None:
        longest = max((p.period_s for r in (self.config.scale_up, self.config.scale_down) for p in r.policies),
                      default=0.0)
        events = self.up_events if desired > current else self.down_events
        events[:] = [e for e in events if e.at > now - longest]
        events.append(_Event(now, abs(desired - current)))


class ControlLoop:
    """KEDA's polling loop plus its HPA for one scaled Deployment, driven by ``tick(now, ...)``.

    ``metric(now)`` returns the trigger's metric value (``None``: the read failed); ``active(now)``
    returns IsActive (``None``: failed). ``tick`` is called with the Deployment's spec replicas at
    every multiple of the HPA sync period and of the polling interval; it returns the new spec
    replicas. The caller (the cluster) creates or deletes pods to match.
    """

    def __init__(self, config: ControlConfig, metric: Callable[[float], float | None],
                 active: Callable[[float], bool | None]) -> None:
        self.config = config
        self.hpa = HPA(config)
        self._metric, self._active = metric, active
        self.last_active_at: float | None = None
        self.failures = 0
        self._next_poll = 0.0
        self._next_sync = 0.0

    def next_due(self) -> float:
        """When the next poll or sync is due."""
        return min(self._next_poll, self._next_sync)

    def tick(self, now: float, replicas: int) -> int:
        """Run whatever is due at ``now`` (KEDA poll first, then the HPA sync)."""
        eps = 1e-9
        if now + eps >= self._next_poll:
            replicas = self.poll(now, replicas)
            self._next_poll = now + self.config.polling_interval_s
        if now + eps >= self._next_sync:
            replicas = self.sync(now, replicas)
            self._next_sync = now + self.config.hpa_sync_period_s
        return replicas

    def poll(self, now: float, replicas: int) -> int:
        """KEDA's scale loop: activation from zero, cooldown to zero, minReplicaCount."""
        cfg = self.config
        active = self._active(now)
        if active:
            self.last_active_at = now
            if replicas == 0:
                return max(1, cfg.min_replicas)
        elif active is False and replicas > 0 and cfg.min_replicas == 0:
            since = self.last_active_at if self.last_active_at is not None else -math.inf
            if now - since >= cfg.cooldown_period_s:
                return 0
        return max(replicas, cfg.min_replicas)

    def sync(self, now: float, replicas: int) -> int:
        """One HPA sync reading the metric through KEDA (with KEDA's fallback on repeated failures)."""
        cfg = self.config
        value = self._metric(now) if replicas > 0 else None
        if replicas > 0:
            if value is None:
                self.failures += 1
                if cfg.fallback_failure_threshold is not None and self.failures >= cfg.fallback_failure_threshold:
                    value = cfg.fallback_target(replicas) * cfg.target_value
            else:
                self.failures = 0
        return self.hpa.sync(now, replicas, value)
