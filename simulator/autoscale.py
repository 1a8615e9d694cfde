"""One autoscaled run: the workload through the engine, pods through the cluster, KEDA/HPA in between.

``run_autoscaled(workload, profile, policy, cold_start, slo, seed)`` replays a workload on a fleet
whose size a policy controls, exactly as in production: every ``tick_s`` (1 s) pods change phase
(``cluster``), Prometheus scrapes Ready pods (``observe``), the policy's own loop runs when due,
KEDA polls and the HPA syncs (``control``), and the Deployment's new spec creates or deletes pods.
The oracle instead follows its precomputed schedule (``oracle``), its headroom searched by
re-running this same function.

Every policy, the oracle included, starts from the same warm fleet (``initial_replicas``; default:
``initial_fleet``, the smallest fixed fleet that meets the SLO on the first five minutes) and is
charged GPU time from each pod's creation to its end (``cluster``). A deleted pod drains for the
chart's termination grace period (``drain_grace_s``; default: ``scaler.kube.drain.drain_timing`` of
the p99 end-to-end request time that warm fleet measured on those five minutes, the rule the chart
and ``shutdown-advice`` apply to Prometheus history); the summary says which (``drain_grace_s``,
``drain_grace_from``). The summary adds ``gpu_hours``,
``max_replicas``, ``mean_replicas``, ``rejected``, ``aborted`` and ``scale_events`` to the core's
per-request statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np

from simulator import oracle as oracle_mod
from simulator.cluster import Cluster, Pod
from simulator.coldstart import ColdStart, as_cold_start
from simulator.control import ControlLoop
from simulator.engine_backend import EngineBackend
from simulator.observe import ObserveConfig, Observer
from simulator.oracle_run import OracleBudget, OracleInputs, run_oracle
from simulator.policies import Fixed, OracleSpec, StaticSpec, TriggerPolicy, View, make_policy
from simulator.results import Outcome
from simulator.workload import select_window

TIMELINE_STEP_S = 10.0
INITIAL_WINDOW_S = 300.0


class Backend(Protocol):
    """The engine as the autoscaling layer drives it (``simulator.engine_backend`` adapts the real one)."""

    def add_replica(self, now: float) -> int: ...
    def drain_replica(self, replica_id: int, now: float) -> None: ...
    def remove_replica(self, replica_id: int, now: float) -> int: ...
    def metrics(self, replica_id: int) -> Any: ...
    def in_flight(self, replica_id: int) -> int: ...
    def gateway_waiting(self) -> int: ...
    def every(self, period_s: float, fn: Callable[[float], None]) -> None: ...
    def run(self) -> Outcome: ...


@dataclass
class AutoscaleResult:
    """One policy's run: the summary, the replica timeline, per-request TTFTs, leadscale's decisions."""

    policy: str
    summary: dict[str, Any]
    timeline: dict[str, np.ndarray]
    arrival_s: np.ndarray
    ttft_s: np.ndarray
    decisions: list[tuple[float, int, dict[str, float]]] = field(default_factory=list)
    status: np.ndarray | None = None


def default_backend(workload: Any, profile: Any, seed: int, slo_ttft_s: float, **options: Any) -> EngineBackend:
    """The real engine behind the Backend protocol."""
    return EngineBackend(workload, profile, seed=seed, slo_ttft_s=slo_ttft_s, **options)


def profile_keys(profile: Any, slo_ttft_s: float) -> str | dict[str, str]:
    """How leadscale's trigger names this profile: by name when the live scaler resolves that name to the
    same capacity, else by the explicit capacity keys (e.g. a calibrated YAML profile)."""
    capacity = profile.capacity(slo_ttft_s)
    name = getattr(profile, "name", None)
    try:
        from scaler.profiles import get_profile

        if isinstance(name, str) and get_profile(name).capacity(slo_ttft_s) == capacity:
            return name
    except (ImportError, KeyError, ValueError):
        pass
    keys = {"prefillTokensPerSecond": repr(float(capacity.prefill_tokens_per_s)),
            "decodeTokensPerSecond": repr(float(capacity.decode_tokens_per_s)),
            "maxNumSeqs": str(capacity.max_num_seqs), "kvCacheTokens": str(capacity.kv_cache_tokens)}
    if capacity.prefill_attention_tokens is not None:
        keys["prefillAttentionTokens"] = repr(float(capacity.prefill_attention_tokens))
    if capacity.decode_context_tokens is not None:
        keys["decodeContextTokens"] = repr(float(capacity.decode_context_tokens))
    return keys


def demand_replicas(workload: Any, profile: Any, capacity: Any, duration_s: float) -> np.ndarray:
    """Replicas the load needs per oracle bucket (work model, no headroom): the plots' demand line."""
    work = oracle_mod.request_work(workload.input_tokens, workload.output_tokens, capacity, profile)
    return oracle_mod.bucket_need(workload.arrival_s, work, duration_s)


def run_autoscaled(workload: Any, profile: Any, policy: str | TriggerPolicy | Fixed | StaticSpec | OracleSpec,
                   cold_start: str | ColdStart, slo: float, seed: int, *, min_replicas: int = 1,
                   max_replicas: int = 100, initial_replicas: int | None = None, drain_grace_s: float | None = None,
                   tick_s: float = 1.0, observe: ObserveConfig | None = None,
                   backend_factory: Callable[..., Backend] = default_backend, oracle_alpha: float | None = None,
                   oracle_steps: int = 5, backend_options: dict[str, Any] | None = None,
                   leadscale_metadata: dict[str, str] | None = None,
                   oracle_budget: OracleBudget | None = None) -> AutoscaleResult:
    """Simulate ``workload`` under ``policy`` (a name or a built policy); deterministic for a seed.

    ``leadscale_metadata`` adds or overrides trigger metadata keys of ``leadscale`` (e.g.
    ``{"targetUtilization": "0.9"}``), validated by the live scaler's own parser. The oracle
    (``simulator.oracle_run``) runs its own search; ``oracle_alpha`` runs just the headroom-alpha
    schedule at that alpha, ``oracle_steps`` sets the alpha bisection's runs, ``oracle_budget`` the
    rest of its simulation budget.
    """
    slo_ttft_s = float(slo)
    if not (math.isfinite(slo_ttft_s) and slo_ttft_s > 0):
        raise ValueError(f"slo={slo!r}: the TTFT SLO must be a finite number of seconds > 0")
    cold = as_cold_start(cold_start)
    built = make_policy(policy, profile_keys(profile, slo_ttft_s), slo_ttft_s, min_replicas, max_replicas,
                        leadscale_metadata) if isinstance(policy, str) else policy
    need = _need(workload, profile, slo_ttft_s)
    options = dict(backend_options or {})
    if initial_replicas is None:
        initial_replicas = starting_fleet(workload, profile, slo_ttft_s, seed, min_replicas=min_replicas,
                                          max_replicas=max_replicas, backend_factory=backend_factory,
                                          backend_options=options)
    grace_from = "--drain-grace"
    if drain_grace_s is None:
        drain_grace_s, grace_from = default_drain_grace(workload, profile, slo_ttft_s, seed, options, initial_replicas,
                                                        backend_factory), "p99 e2e of the warm fleet's first 5 min"
    grace = float(drain_grace_s)

    if isinstance(built, StaticSpec):
        def fixed_run(replicas: int) -> AutoscaleResult:
            backend = backend_factory(workload, profile, seed, slo_ttft_s, **options)
            run = _simulate(backend, Fixed(replicas, name=built.name), cold, seed, slo_ttft_s, need, replicas,
                            grace, tick_s, observe, None, min_replicas)
            run.summary.update(drain_grace_s=grace, drain_grace_from=grace_from)
            return run

        return best_static_fleet(fixed_run, need, slo_ttft_s, min_replicas, max_replicas)
    scaled: TriggerPolicy | Fixed | OracleSpec = built

    def once(plans: list[oracle_mod.PodPlan] | None) -> AutoscaleResult:
        backend = backend_factory(workload, profile, seed, slo_ttft_s, **options)
        run = _simulate(backend, scaled, cold, seed, slo_ttft_s, need, initial_replicas, grace, tick_s,
                        observe, plans, min_replicas)
        run.summary.update(drain_grace_s=grace, drain_grace_from=grace_from)
        return run

    if not isinstance(built, OracleSpec):
        return once(None)
    if oracle_alpha is not None:
        result = once(oracle_mod.alpha_plans(need, oracle_alpha, cold, seed, initial_replicas, min_replicas))
        result.summary["oracle_alpha"] = oracle_alpha
        return result
    def part_run(part: Any, plans: list[oracle_mod.PodPlan]) -> AutoscaleResult:
        backend = backend_factory(part, profile, seed, slo_ttft_s, **options)
        return _simulate(backend, built, cold, seed, slo_ttft_s, need, len([p for p in plans if p.warm]), 0.0,
                         tick_s, None, plans, min_replicas)

    inputs = OracleInputs(workload, profile, cold, seed, slo_ttft_s, need, initial_replicas, min_replicas,
                          max_replicas, lambda part: backend_factory(part, profile, seed, slo_ttft_s, **options),
                          once, part_run)
    # run_oracle answers one of the runs ``inputs`` simulate (typed Any there: oracle_run does not import autoscale)
    return cast(AutoscaleResult, run_oracle(inputs, OracleBudget(alpha_steps=oracle_steps) if oracle_budget is None
                                            else oracle_budget))


def meets_slo(run: AutoscaleResult, slo_ttft_s: float) -> bool:
    """Whether a run's p95 TTFT is within the SLO (a run with no first token, or a non-finite p95, is not)."""
    p95 = run.summary.get("ttft_p95")
    return p95 is not None and math.isfinite(p95) and p95 <= slo_ttft_s


def best_static_fleet(fixed_run: Callable[[int], AutoscaleResult], need: np.ndarray, slo_ttft_s: float,
                      min_replicas: int, max_replicas: int) -> AutoscaleResult:
    """The run of the smallest fixed fleet whose p95 TTFT meets the SLO over the whole workload; its summary
    adds ``static_replicas`` and ``static_search`` (each size tried, with its p95 TTFT).

    p95 TTFT falls as replicas are added, so the edge is found by search: from the capacity model's mean
    need, down one at a time while the size below still meets the SLO, or up in doubling steps until one
    meets it and then by bisection between the last miss and that size. When no size up to
    ``max_replicas`` meets it, the largest is reported (its summary shows the miss)."""
    tried: dict[int, AutoscaleResult] = {}

    def at(replicas: int) -> AutoscaleResult:
        if replicas not in tried:
            tried[replicas] = fixed_run(replicas)
        return tried[replicas]

    low = max(min_replicas, 1)
    size = min(max(low, math.ceil(float(np.mean(need)) - 1e-9) if len(need) else low), max_replicas)
    if meets_slo(at(size), slo_ttft_s):
        while size > low and meets_slo(at(size - 1), slo_ttft_s):
            size -= 1
    else:
        miss, step = size, 1
        while size < max_replicas and not meets_slo(at(size), slo_ttft_s):
            miss, size, step = size, min(size + step, max_replicas), step * 2
        while size - miss > 1 and meets_slo(at(size), slo_ttft_s):  # the smallest meeting size is in (miss, size]
            middle = (miss + size) // 2
            if meets_slo(at(middle), slo_ttft_s):
                size = middle
            else:
                miss = middle
    best = at(size)
    best.summary["static_replicas"] = size
    best.summary["static_search"] = {str(n): tried[n].summary.get("ttft_p95") for n in sorted(tried)}
    return best


def _need(workload: Any, profile: Any, slo_ttft_s: float) -> np.ndarray:
    duration = float(workload.arrival_s[-1]) if len(workload.arrival_s) else 0.0
    return demand_replicas(workload, profile, profile.capacity(slo_ttft_s), max(duration, oracle_mod.BUCKET_S))


def starting_fleet(workload: Any, profile: Any, slo_ttft_s: float, seed: int, *, min_replicas: int = 1,
                   max_replicas: int = 100, backend_factory: Callable[..., Backend] = default_backend,
                   backend_options: dict[str, Any] | None = None) -> int:
    """``initial_fleet`` exactly as ``run_autoscaled`` computes it by default: callers that run many
    policies or settings on one workload and seed (the tuner) compute it once and pass it on."""
    options = dict(backend_options or {})
    return initial_fleet(workload, profile, _need(workload, profile, slo_ttft_s), slo_ttft_s, seed, min_replicas,
                         max_replicas, lambda head: backend_factory(head, profile, seed, slo_ttft_s, **options))


LEGACY_DRAIN_GRACE_S = 30.0
"""Kubernetes' default terminationGracePeriodSeconds: the grace when no request finished to measure."""


def default_drain_grace(workload: Any, profile: Any, slo_ttft_s: float, seed: int,
                        backend_options: dict[str, Any] | None = None, replicas: int | None = None,
                        backend_factory: Callable[..., Backend] = default_backend) -> float:
    """The termination grace the chart's rule gives (``scaler.kube.drain.drain_timing``: preStop sleep +
    ⌈p99 request duration⌉ + the engine's stop) for the p99 end-to-end time that the warm fleet measures
    on the first ``INITIAL_WINDOW_S``. Kubernetes' default 30 s when no request finished there."""
    from scaler.kube.drain import drain_timing

    options = dict(backend_options or {})
    head = select_window(workload, 0.0, INITIAL_WINDOW_S)
    if len(head.arrival_s) == 0:
        return LEGACY_DRAIN_GRACE_S
    if replicas is None:
        replicas = starting_fleet(workload, profile, slo_ttft_s, seed, backend_factory=backend_factory,
                                  backend_options=options)
    never = as_cold_start("fixed:1")
    run = _simulate(backend_factory(head, profile, seed, slo_ttft_s, **options), Fixed(replicas), never, seed,
                    slo_ttft_s, _need(head, profile, slo_ttft_s), replicas, 0.0, 1.0, None, None, 1)
    p99 = run.summary.get("e2e_p99")
    if p99 is None or not math.isfinite(p99):
        return LEGACY_DRAIN_GRACE_S
    return float(drain_timing(p99).termination_grace_period_s)


def initial_fleet(workload: Any, profile: Any, need: np.ndarray, slo_ttft_s: float, seed: int, min_replicas: int,
                  max_replicas: int, make_backend: Callable[[Any], Backend]) -> int:
    """The warm fleet every run starts from: the smallest fixed fleet that meets the SLO (p95 TTFT) on
    the first ``INITIAL_WINDOW_S`` of the workload, searched upward from the capacity model's estimate
    (the most the first five minutes' buckets need) to twice it.

    Why: a run should measure the policy, not how the fleet was sized before it took over. A start
    below what the load needs costs every causal policy the same minutes of late first tokens (no pod
    ordered at t = 0 is ready before its cold start), which only the clairvoyant oracle could avoid.
    When no fleet up to twice the estimate meets the SLO there (first tokens late at any size), the
    estimate is kept.
    """
    first = need[: max(1, int(INITIAL_WINDOW_S // oracle_mod.BUCKET_S))]
    estimate = min(max(min_replicas, 1, math.ceil(float(first.max()) - 1e-9)), max_replicas)
    head = select_window(workload, 0.0, INITIAL_WINDOW_S)
    if len(head.arrival_s) == 0:
        return estimate
    never = as_cold_start("fixed:1")  # a fixed fleet starts no pod
    for replicas in range(estimate, min(2 * estimate, max_replicas) + 1):
        run = _simulate(make_backend(head), Fixed(replicas), never, seed, slo_ttft_s, need, replicas, 0.0, 1.0,
                        None, None, min_replicas)
        if meets_slo(run, slo_ttft_s):
            return replicas
    return estimate


def _simulate(backend: Backend, policy: TriggerPolicy | Fixed | OracleSpec, cold: ColdStart, seed: int,
              slo_ttft_s: float, need: np.ndarray, initial: int, drain_grace_s: float, tick_s: float,
              observe: ObserveConfig | None, oracle_plans: list[oracle_mod.PodPlan] | None,
              min_replicas: int) -> AutoscaleResult:
    rng = np.random.default_rng([seed, 4])  # cold starts: a stream of their own, the same for every policy
    cluster = Cluster(backend, cold, rng, is_idle=lambda rid: backend.in_flight(rid) == 0,
                      drain_grace_s=drain_grace_s)
    observer = Observer(observe)

    def on_ready(pod: Pod) -> None:  # what scaler.kube.leadtime measures; the warm fleet's pods never started here
        if pod.ready_at is not None and pod.due_ready_at > pod.created_at:
            observer.record_cold_start(pod.ready_at - pod.created_at)

    cluster.on_ready = on_ready
    timeline: list[tuple[float, int, int, int]] = []
    name = getattr(policy, "name", "policy")
    plans: list[oracle_mod.PodPlan] = []
    if isinstance(policy, OracleSpec):
        if oracle_plans is None:
            raise ValueError("the oracle's run needs its pods (oracle_plans)")
        plans = list(oracle_plans)
        warm = [p for p in plans if p.warm]
        cluster.warm_start(0.0, len(warm))
        plan_pods: dict[int, Pod] = dict(enumerate(p for p in cluster.pods))
        pending = sorted((p for p in plans if not p.warm), key=lambda p: p.create_at)
        deletions = sorted(((p.delete_at, i) for i, p in enumerate(warm)), reverse=True)
    else:
        cluster.warm_start(0.0, policy.replicas if isinstance(policy, Fixed) else initial)
    loop = None
    if isinstance(policy, TriggerPolicy):
        loop = ControlLoop(policy.control, lambda now: policy.metric(now, view(now)),
                           lambda now: policy.active(now, view(now)))
    next_eval = 0.0
    last_sample = -math.inf

    def view(now: float) -> View:
        counts = cluster.counts(now)
        return View(observer, cluster.spec_replicas, counts.ready, counts.starting)

    def tick(now: float) -> None:
        nonlocal next_eval, last_sample
        if plans:
            _follow_plan(now, cluster, pending, deletions, plan_pods)
        cluster.advance(now)
        ready = cluster.ready_replica_ids()
        observer.scrape(now, {rid: (lambda r=rid: backend.metrics(r)) for rid in ready}, backend.gateway_waiting())
        if isinstance(policy, TriggerPolicy) and loop is not None:
            if policy.evaluation_period_s and now + 1e-9 >= next_eval:
                policy.evaluate(now, view(now))
                next_eval = now + policy.evaluation_period_s
            if now + 1e-9 >= loop.next_due():
                cluster.set_replicas(now, loop.tick(now, cluster.spec_replicas))
        if now - last_sample >= TIMELINE_STEP_S - 1e-9:
            c = cluster.counts(now)
            timeline.append((now, c.ready, c.starting, c.draining))
            last_sample = now

    backend.every(tick_s, tick)
    outcome = backend.run()
    return _result(name, outcome, cluster, timeline, need, policy, cold, slo_ttft_s)


def _follow_plan(now: float, cluster: Cluster, pending: list[oracle_mod.PodPlan],
                 deletions: list[tuple[float, int]], pods: dict[int, Pod]) -> None:
    """Create the oracle's pods at their times (with their known cold starts) and delete them at theirs."""
    while pending and pending[0].create_at <= now + 1e-9:
        plan = pending.pop(0)
        pod = cluster.create_pod(now, cold_start_s=plan.ready_at - now if plan.ready_at > now else 0.0)
        key = len(pods)
        pods[key] = pod
        deletions.append((plan.delete_at, key))
        deletions.sort(reverse=True)
    while deletions and deletions[-1][0] <= now + 1e-9:
        _, key = deletions.pop()
        cluster.delete_pod(pods[key], now)
    live = len(cluster.live())
    if live != cluster.spec_replicas:
        cluster.scale_events += 1
        cluster.spec_replicas = live


def _result(name: str, outcome: Outcome, cluster: Cluster, timeline: list[tuple[float, int, int, int]],
            need: np.ndarray, policy: Any, cold: ColdStart, slo_ttft_s: float) -> AutoscaleResult:
    end = max(outcome.end_s, timeline[-1][0] if timeline else 0.0, 1e-9)
    gpu_s = cluster.gpu_seconds(end)
    t = np.array([row[0] for row in timeline])
    holding = [c.holding_gpus for c in cluster.timeline]
    summary = dict(outcome.summary)
    ttft = outcome.ttft_s[np.isfinite(outcome.ttft_s)]
    summary.update({
        "policy": name,
        "cold_start": cold.spec,
        "gpu_hours": float(gpu_s / 3600.0),
        "mean_replicas": float(gpu_s / end),
        "max_replicas": int(max(holding)) if holding else 0,
        "rejected": int(outcome.rejected),
        "aborted": int(cluster.aborted),
        "scale_events": int(cluster.scale_events),
        "pods_started": len(cluster.pods),
    })
    for q in (50, 95, 99):
        key = f"ttft_p{q}"
        if summary.get(key) is None and ttft.size:
            summary[key] = float(np.percentile(ttft, q))
    summary["ttft_late_share"] = float(np.mean(ttft > slo_ttft_s)) if ttft.size else None
    if "slo_attainment" not in summary and outcome.ttft_s.size:
        summary["slo_attainment"] = float(np.mean(np.nan_to_num(outcome.ttft_s, nan=np.inf) <= slo_ttft_s))
    centers = np.arange(need.size) * oracle_mod.BUCKET_S
    tl = {
        "t": t,
        "ready": np.array([row[1] for row in timeline], dtype=float),
        "starting": np.array([row[2] for row in timeline], dtype=float),
        "draining": np.array([row[3] for row in timeline], dtype=float),
        "demand": np.interp(t, centers, need) if t.size else t,
    }
    decisions = list(getattr(policy, "decisions", []))
    return AutoscaleResult(name, summary, tl, outcome.arrival_s, outcome.ttft_s, decisions,
                           getattr(outcome, "status", None))
