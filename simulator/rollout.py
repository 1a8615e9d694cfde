"""A model rollout in the simulator: stable and canary Deployments behind one weighted route.

``run_rollout(workload, profile, RolloutConfig(schedule), cold_start, slo, seed)`` serves the
workload from two Deployments (two engine pools, two ``Cluster``s), each with its own ScaledObject:
its own leadscale trigger (``labelSelector: version=<name>``) and KEDA/HPA loop (the chart's
settings, ``minReplicaCount`` 0 so the version that lost all traffic goes away). The route sends
each request to the canary with the route's current weight (one seeded uniform draw per request);
a request whose version has no Ready pod waits at that version's gateway queue.

The weight schedule is the rollout's steps, ``(t, canary %)``, as a rollout controller runs them
(Argo Rollouts' ``setCanaryScale`` then ``setWeight``; Flagger's readiness check):

1. at ``t`` it writes the new weights into both ScaledObjects (``trafficWeight``: canary ``w``,
   stable ``100 - w``). As in the live scaler, a changed trigger is a new scaler object: its policy
   state starts fresh;
2. it moves the route's weight when the version whose weight grows is *available* (no pod starting,
   at least one Ready, every pod its spec asks for Ready) and at least ``settle_s`` after the step
   (the scaler's answer has reached the Deployment through KEDA's poll and the HPA), or after
   ``max_wait_s`` regardless; ``gate=False`` moves it at ``t`` (a controller that does not wait).

``route_aware=False`` runs the same rollout with plain triggers (no ``trafficWeight``): each
Deployment sizes itself from its own traffic only, the baseline the route mechanism is measured
against. The result reports, per step (phase), GPU-hours of each version, p95 TTFT and SLO
attainment of the requests that arrived in it, rejections, and when the route really moved.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from scaler.signals import Signals
from scaler.sources.base import SourceError
from simulator.cluster import Cluster, Pod
from simulator.coldstart import ColdStart, as_cold_start
from simulator.control import ControlLoop
from simulator.observe import Observer
from simulator.policies import Leadscale, View, leadscale_control, leadscale_metadata

TIMELINE_STEP_S = 10.0
VERSIONS = ("stable", "canary")


@dataclass(frozen=True)
class WeightStep:
    """At ``at_s`` the rollout sets the canary's share of the route to ``canary`` (0..1)."""

    at_s: float
    canary: float


def parse_schedule(text: str) -> tuple[WeightStep, ...]:
    """``"0:0,600:10,1200:50,1800:100"`` (seconds:canary percent) -> steps; ValueError naming the bad item."""
    steps: list[WeightStep] = []
    for item in (part.strip() for part in text.split(",")):
        at, sep, percent = item.partition(":")
        try:
            step = WeightStep(float(at), float(percent) / 100.0)
        except ValueError:
            step = None
        if (not sep or step is None or not math.isfinite(step.at_s) or step.at_s < 0
                or not (math.isfinite(step.canary) and 0 <= step.canary <= 1)):
            raise ValueError(f"rollout schedule item {item!r}: expected SECONDS:PERCENT with seconds >= 0 and "
                             "0 <= percent <= 100, e.g. 600:10")
        if steps and step.at_s <= steps[-1].at_s:
            raise ValueError(f"rollout schedule item {item!r}: times must increase (after {steps[-1].at_s:g} s)")
        steps.append(step)
    if not steps:
        raise ValueError(f"rollout schedule {text!r}: give at least one SECONDS:PERCENT step")
    return tuple(steps)


def standard_schedules(duration_s: float) -> dict[str, tuple[WeightStep, ...]]:
    """The issue's two scenarios over a workload: 0 -> 10 % -> 50 % -> 100 %, and a rollback at 50 %."""
    fifth = duration_s / 5.0
    forward = (WeightStep(0.0, 0.0), WeightStep(fifth, 0.1), WeightStep(2 * fifth, 0.5), WeightStep(3 * fifth, 1.0))
    rollback = (*forward[:3], WeightStep(3 * fifth, 0.0))
    return {"rollout 0-10-50-100 %": forward, "rollout 0-10-50 %, rollback": rollback}


@dataclass(frozen=True)
class RolloutConfig:
    """The rollout's steps and how the controller moves the route (see the module docstring)."""

    schedule: tuple[WeightStep, ...]
    gate: bool = True
    settle_s: float = 30.0
    max_wait_s: float = 900.0
    route_aware: bool = True

    def __post_init__(self) -> None:
        if not self.schedule:
            raise ValueError("RolloutConfig.schedule=(): give at least one step")
        for name in ("settle_s", "max_wait_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"RolloutConfig.{name}={value!r}: must be a finite number of seconds >= 0")


class RouteLeadscale(Leadscale):
    """The leadscale trigger of one version of a route: ``scaler.route.decide_share`` on the evaluator's
    schedule, fed its own and the route's Signals as the live scaler builds them."""

    def __init__(self, metadata: dict[str, str], control: Any, route_view: Callable[[float], View]) -> None:
        super().__init__(metadata, control)
        self.route_view = route_view

    def set_weight(self, weight: float) -> None:
        """The rollout rewrote ``trafficWeight``: a new scaler object, fresh state (as live)."""
        history = self.decisions
        self.__init__({**self.metadata, "trafficWeight": _percent(weight)}, self.control,  # type: ignore[misc]
                      self.route_view)
        self.decisions = history  # one ScaledObject's decisions, across its trigger's versions

    def snapshots(self, now: float, view: View) -> tuple[Signals | SourceError, Signals | SourceError | None]:
        """This version's snapshot and the route's; as live, Prometheus knows no starting pods and the
        Kubernetes observer only this Deployment's. No ``trafficWeight``: no route, no decision."""
        if self.config.traffic_weight is None:
            return SourceError("no trafficWeight"), SourceError("no trafficWeight")
        whole = self.route_view(now)
        route = whole.observer.signals(now, whole.ready_replicas, 0, lead_time_auto=False)
        own = view.observer.signals(now, view.ready_replicas, view.starting_replicas,
                                    lead_time_auto=self.config.lead_time_auto)
        return (own if own is not None else SourceError("no data"),
                route if route is not None else SourceError("no data"))


def _percent(weight: float) -> str:
    return f"{round(weight * 100.0, 6):g}"


@dataclass
class Version:
    """One Deployment of the route: its pods, what Prometheus sees of it, its trigger and KEDA/HPA loop."""

    name: str
    pool: Any
    cluster: Cluster
    observer: Observer
    trigger: Leadscale
    loop: ControlLoop
    weight: float = 0.0
    next_eval: float = 0.0
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)

    def view(self, now: float) -> View:
        counts = self.cluster.counts(now)
        return View(self.observer, self.cluster.spec_replicas, counts.ready, counts.starting)

    def available(self, now: float) -> bool:
        counts = self.cluster.counts(now)
        return counts.starting == 0 and counts.ready >= max(1, self.cluster.spec_replicas)


class _RouteState(TypedDict):
    """The route's weight now, the step declared and not yet taken, and when it was declared."""

    weight: float
    pending: float | None
    declared_at: float


@dataclass
class RolloutResult:
    """One rollout: the summary, one row per step, per-version timelines, per-request outcomes."""

    name: str
    summary: dict[str, Any]
    phases: list[dict[str, Any]]
    timeline: dict[str, dict[str, np.ndarray]]
    arrival_s: np.ndarray
    ttft_s: np.ndarray
    version: np.ndarray
    """1 for requests the route sent to the canary."""
    route_weight: list[tuple[float, float]]
    """(time, canary share) each time the route really moved."""
    decisions: dict[str, list[tuple[float, int, dict[str, float]]]] = field(default_factory=dict)


def run_rollout(workload: Any, profile: Any, rollout: RolloutConfig, cold_start: str | ColdStart, slo: float,
                seed: int, *, max_replicas: int = 100, initial_replicas: int | None = None,
                drain_grace_s: float | None = None, leadscale_extra: dict[str, str] | None = None,
                backend_options: dict[str, Any] | None = None, name: str = "rollout",
                model: str = "llama") -> RolloutResult:
    """Simulate ``workload`` through a rollout (see the module docstring); deterministic for a seed."""
    from simulator.autoscale import default_backend, default_drain_grace, profile_keys, starting_fleet

    slo_ttft_s = float(slo)
    if not (math.isfinite(slo_ttft_s) and slo_ttft_s > 0):
        raise ValueError(f"slo={slo!r}: the TTFT SLO must be a finite number of seconds > 0")
    cold = as_cold_start(cold_start)
    options = dict(backend_options or {})
    if initial_replicas is None:
        initial_replicas = starting_fleet(workload, profile, slo_ttft_s, seed, max_replicas=max_replicas,
                                          backend_options=options)
    grace = drain_grace_s if drain_grace_s is not None else default_drain_grace(workload, profile, slo_ttft_s, seed,
                                                                                 options, initial_replicas)
    backend = default_backend(workload, profile, seed, slo_ttft_s, **options)
    engine = backend.engine
    pools = {"stable": engine.fleet, "canary": engine.add_pool("canary")}
    rng = np.random.default_rng([seed, 4])  # cold starts, as in run_autoscaled
    draws = np.random.default_rng([seed, 7]).random(len(workload))  # the route's choice per request
    route_observer = Observer()
    versions: dict[str, Version] = {}
    first = rollout.schedule[0].canary if rollout.schedule[0].at_s <= 0 else 0.0
    base = leadscale_metadata(profile_keys(profile, slo_ttft_s), slo_ttft_s, leadscale_extra)
    base["model"] = model

    def route_view(now: float) -> View:
        counts = [v.cluster.counts(now) for v in versions.values()]
        return View(route_observer, sum(v.cluster.spec_replicas for v in versions.values()),
                    sum(c.ready for c in counts), sum(c.starting for c in counts))

    for vname in VERSIONS:
        weight = first if vname == "canary" else 1.0 - first
        pool = pools[vname]
        cluster = Cluster(pool, cold, rng, is_idle=lambda rid: backend.in_flight(rid) == 0, drain_grace_s=grace)
        observer = Observer()
        meta = {**base, "labelSelector": f"version={vname}"}
        control = leadscale_control(0, max_replicas)
        trigger: Leadscale
        if rollout.route_aware:
            trigger = RouteLeadscale({**meta, "routeSelector": f"app={model}", "trafficWeight": _percent(weight)},
                                     control, route_view)
        else:
            trigger = Leadscale(meta, control)
        version = Version(vname, pool, cluster, observer, trigger, loop=None, weight=weight)  # type: ignore[arg-type]

        def metric(now: float, v: Version = version) -> float | None:
            return v.trigger.metric(now, v.view(now))

        def active(now: float, v: Version = version) -> bool | None:
            return v.trigger.active(now, v.view(now))

        version.loop = ControlLoop(control, metric, active)
        cluster.on_ready = _recorder(observer, route_observer)
        versions[vname] = version
    stable, canary = versions["stable"], versions["canary"]
    stable.cluster.warm_start(0.0, initial_replicas)
    route_weight = [(0.0, first)]
    steps = [s for s in rollout.schedule if s.at_s > 0]
    state: _RouteState = {"weight": first, "pending": None, "declared_at": 0.0}
    engine.route_by(lambda rid, now: canary.pool if draws[rid] < state["weight"] else stable.pool)

    def control_route(now: float) -> None:
        while steps and steps[0].at_s <= now + 1e-9:
            step = steps.pop(0)
            state["pending"], state["declared_at"] = step.canary, now
            for v in versions.values():
                v.weight = step.canary if v.name == "canary" else 1.0 - step.canary
                if isinstance(v.trigger, RouteLeadscale):
                    v.trigger.set_weight(v.weight)
        target = state["pending"]
        if target is None:
            return
        gaining = canary if target > state["weight"] else stable
        waited = now - state["declared_at"]
        if (not rollout.gate or waited >= rollout.max_wait_s
                or (waited >= rollout.settle_s and gaining.available(now))):
            state["weight"], state["pending"] = target, None
            route_weight.append((now, target))

    last_sample = -math.inf

    def tick(now: float) -> None:
        nonlocal last_sample
        control_route(now)
        every: dict[int, Any] = {}
        for v in versions.values():
            v.cluster.advance(now)
            ready = {rid: (lambda r=rid: backend.metrics(r)) for rid in v.cluster.ready_replica_ids()}
            v.observer.scrape(now, ready, len(v.pool.gateway))
            every.update(ready)
        route_observer.scrape(now, every, backend.gateway_waiting())
        for v in versions.values():
            if now + 1e-9 >= v.next_eval:
                v.trigger.evaluate(now, v.view(now))
                v.next_eval = now + v.trigger.evaluation_period_s
            if now + 1e-9 >= v.loop.next_due():
                v.cluster.set_replicas(now, v.loop.tick(now, v.cluster.spec_replicas))
            if now - last_sample >= TIMELINE_STEP_S - 1e-9:
                c = v.cluster.counts(now)
                v.timeline.append((now, c.ready, c.starting, c.draining))
        if now - last_sample >= TIMELINE_STEP_S - 1e-9:
            last_sample = now

    backend.every(1.0, tick)
    outcome = backend.run()
    # the route's weight when each request arrived (ticks run before arrivals at the same instant)
    times = np.array([t for t, _ in route_weight])
    shares = np.array([w for _, w in route_weight])
    to_canary = draws < shares[np.searchsorted(times, outcome.arrival_s, side="right") - 1]
    result = _result(name, outcome, versions, route_weight, rollout, to_canary, slo_ttft_s)
    result.summary.update(drain_grace_s=float(grace), initial_replicas=initial_replicas)
    return result


def _recorder(own: Observer, route: Observer) -> Callable[[Pod], None]:
    def on_ready(pod: Pod) -> None:  # the warm fleet's pods never started here
        if pod.ready_at is not None and pod.due_ready_at > pod.created_at:
            own.record_cold_start(pod.ready_at - pod.created_at)
            route.record_cold_start(pod.ready_at - pod.created_at)
    return on_ready


def _gpu_hours(cluster: Cluster, start: float, end: float) -> float:
    """GPU-hours the Deployment's pods held within [start, end)."""
    total = 0.0
    for pod in cluster.pods:
        gone = pod.gone_at if pod.gone_at is not None else end
        total += max(0.0, min(gone, end) - max(pod.created_at, start))
    return total / 3600.0


def _stats(ttft: np.ndarray, slo_ttft_s: float) -> dict[str, Any]:
    """p95 TTFT of served requests, attainment (unserved count as misses) and how many."""
    served = ttft[np.isfinite(ttft)]
    return {"requests": int(ttft.size), "ttft_p95": float(np.percentile(served, 95)) if served.size else None,
            "slo_attainment": float(np.mean(np.nan_to_num(ttft, nan=np.inf) <= slo_ttft_s)) if ttft.size else None}


def _result(name: str, outcome: Any, versions: dict[str, Version], route_weight: list[tuple[float, float]],
            rollout: RolloutConfig, to_canary: np.ndarray, slo_ttft_s: float) -> RolloutResult:
    end = max(outcome.end_s, max((v.timeline[-1][0] for v in versions.values() if v.timeline), default=0.0), 1e-9)
    arrival, ttft = outcome.arrival_s, outcome.ttft_s
    bounds = [s.at_s for s in rollout.schedule] + [end]
    if bounds[0] > 0:
        bounds.insert(0, 0.0)
    weights = [0.0 if rollout.schedule[0].at_s > 0 else rollout.schedule[0].canary]
    weights += [s.canary for s in rollout.schedule if s.at_s > 0]
    phases = []
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        inside = (arrival >= a) & (arrival < b)
        moved = [t for t, _ in route_weight if a <= t < b and t > 0]
        row: dict[str, Any] = {"from_s": a, "to_s": b, "canary_weight": weights[min(k, len(weights) - 1)],
                               "route_moved_s": moved[0] if moved else None,
                               "gpu_hours_stable": _gpu_hours(versions["stable"].cluster, a, b),
                               "gpu_hours_canary": _gpu_hours(versions["canary"].cluster, a, b),
                               **_stats(ttft[inside], slo_ttft_s),
                               "stable_p95": _stats(ttft[inside & ~to_canary], slo_ttft_s)["ttft_p95"],
                               "canary_p95": _stats(ttft[inside & to_canary], slo_ttft_s)["ttft_p95"]}
        row["gpu_hours"] = row["gpu_hours_stable"] + row["gpu_hours_canary"]
        # no breach for anyone: the phase's p95, and the p95 of each version's own users
        row["meets_slo"] = row["ttft_p95"] is not None and all(
            row[k] is None or row[k] <= slo_ttft_s for k in ("ttft_p95", "stable_p95", "canary_p95"))
        phases.append(row)
    summary = dict(outcome.summary)
    summary.update({
        "policy": name, "gpu_hours": sum(p["gpu_hours"] for p in phases),
        "gpu_hours_stable": _gpu_hours(versions["stable"].cluster, 0.0, end),
        "gpu_hours_canary": _gpu_hours(versions["canary"].cluster, 0.0, end),
        "rejected": int(outcome.rejected),
        "aborted": sum(v.cluster.aborted for v in versions.values()),
        "scale_events": sum(v.cluster.scale_events for v in versions.values()),
        "max_replicas": max((sum(row[1] + row[2] for row in rows) for rows in zip(
            *(v.timeline for v in versions.values()), strict=False)), default=0),
        "phases_meeting_slo": sum(p["meets_slo"] for p in phases), "phases": len(phases),
        "gated": rollout.gate, "route_aware": rollout.route_aware,
    })
    timeline = {}
    for vname, v in versions.items():
        rows = v.timeline
        timeline[vname] = {"t": np.array([r[0] for r in rows]), "ready": np.array([r[1] for r in rows], float),
                           "starting": np.array([r[2] for r in rows], float),
                           "draining": np.array([r[3] for r in rows], float)}
    return RolloutResult(name, summary, phases, timeline, arrival, ttft, to_canary.astype(np.int8), route_weight,
                         {vname: v.trigger.decisions for vname, v in versions.items()})



def _cell(value: Any, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def section_lines(results: dict[str, RolloutResult], slo_ttft_s: float) -> list[str]:
    """Markdown: per scenario, one row per step (GPU-hours and p95 TTFT of each version's requests)."""
    lines = ["Stable and canary Deployments behind one weighted route, each with its own leadscale ScaledObject "
             "(`trafficWeight`, `routeSelector`; docs/rollouts.md). At each step the rollout writes the new weights "
             "into both ScaledObjects and moves the route once the version gaining traffic is available"
             " (`route moved at`). p95 TTFT is over the requests that arrived in the step; a step meets the SLO when "
             f"that p95 and each version's own p95 are within {slo_ttft_s:g} s.", ""]
    for name, r in results.items():
        s = r.summary
        lines += [f"**{name}**: {s['gpu_hours']:.2f} GPU-hours ({s['gpu_hours_stable']:.2f} stable, "
                  f"{s['gpu_hours_canary']:.2f} canary), p95 TTFT {_cell(s.get('ttft_p95'), '.2f')} s, SLO "
                  f"attainment {_cell(s.get('slo_attainment'), '.4f')}, {s['phases_meeting_slo']} of {s['phases']} "
                  f"steps meet the SLO, rejected {s['rejected']}, aborted {s['aborted']}"
                  f"{'' if s['gated'] else ' (route moved at once: not gated)'}.", "",
                  "| step (s) | canary weight | route moved at (s) | GPU-h stable | GPU-h canary | p95 TTFT (s) "
                  "| p95 stable | p95 canary | SLO attainment | meets SLO |", "|---" * 10 + "|"]
        for p in r.phases:
            lines.append(f"| {p['from_s']:.0f}-{p['to_s']:.0f} | {p['canary_weight']:.0%} | "
                         f"{_cell(p['route_moved_s'], '.0f')} | {p['gpu_hours_stable']:.2f} | "
                         f"{p['gpu_hours_canary']:.2f} | {_cell(p['ttft_p95'], '.2f')} | "
                         f"{_cell(p['stable_p95'], '.2f')} | {_cell(p['canary_p95'], '.2f')} | "
                         f"{_cell(p['slo_attainment'], '.4f')} | {'yes' if p['meets_slo'] else 'NO'} |")
        lines.append("")
    return lines


def plot(results: dict[str, RolloutResult], path: Any) -> None:
    """Per scenario: each version's ready + starting replicas and the route's canary weight over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(10, 2.8 * len(results) + 0.5), squeeze=False, sharex=True)
    for ax, (name, r) in zip(axes[:, 0], results.items(), strict=True):
        for vname, color in (("stable", "tab:blue"), ("canary", "tab:orange")):
            tl = r.timeline[vname]
            t = np.asarray(tl["t"]) / 60.0
            ax.step(t, tl["ready"], where="post", color=color, lw=1.2, label=f"{vname} ready")
            ax.step(t, np.asarray(tl["ready"]) + np.asarray(tl["starting"]), where="post", color=color, lw=0.8,
                    ls="--", label=f"{vname} ready + starting")
        twin = ax.twinx()
        times = [t / 60.0 for t, _ in r.route_weight] + [float(r.timeline["stable"]["t"][-1]) / 60.0]
        weights = [w for _, w in r.route_weight]
        twin.step(times, [*weights, weights[-1]], where="post", color="black", lw=1.0, label="route: canary weight")
        twin.set_ylim(-0.05, 1.05)
        twin.set_ylabel("canary weight")
        ax.set_ylabel("replicas")
        ax.set_title(name, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        handles = ax.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel("time (min)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
