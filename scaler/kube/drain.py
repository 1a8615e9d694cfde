"""Drain-aware scale-down: which pod the ReplicaSet should remove first, and how long to let it drain.

The ReplicaSet controller deletes pods with the lowest ``controller.kubernetes.io/pod-deletion-cost``
first. Before a scale-down the scaler sets each ready pod's cost to its in-flight work, so the
idlest replica goes and the fewest requests are cut off. vLLM exposes no token gauges, so the work is
estimated from one scrape of the pod's ``/metrics``::

    in_flight_tokens = waiting × mean_prompt + running × (mean_prompt + mean_output)

with the pod's own mean prompt/output lengths (request histograms' sum / count), or the fleet's when
the pod has finished no request yet. Costs are rounded to two significant figures so that noise does
not turn every evaluation into a round of PATCHes; pods whose scrape failed keep their annotation.

``shutdown_advice`` turns the fleet's request-duration histogram into the drain settings of a vLLM
pod (``drain_timing``, the one rule the chart's example, the docs and the simulator's default drain
grace share). On deletion Kubernetes removes the pod from the Service's endpoints and runs its
``preStop`` hook at the same time; the endpoint removal takes seconds to reach kube-proxy and the
gateway, and requests keep arriving meanwhile. So:

- ``preStop: sleep PRE_STOP_SLEEP_S`` (10 s) keeps serving until the endpoint is gone everywhere;
- then SIGTERM: vLLM ``--shutdown-timeout`` = ⌈p99 end-to-end request time⌉ (vLLM 0.32 drains
  in-flight requests for that long instead of aborting them, which ``0`` does);
- ``terminationGracePeriodSeconds`` = preStop + shutdown timeout + ``ENGINE_STOP_S`` (5 s for the
  engine to exit), after which the kubelet kills what is left.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

INT32_MAX = 2**31 - 1
E2E = "vllm:e2e_request_latency_seconds"
PRE_STOP_SLEEP_S = 10
"""Seconds a deleted pod keeps serving while its endpoint removal propagates (kube-proxy, the gateway)."""
ENGINE_STOP_S = 5
"""Seconds for vLLM to exit once its drain is over."""


@dataclass(frozen=True)
class DrainTiming:
    """What a vLLM pod sets so that a scale-down lets its streaming requests finish."""

    pre_stop_sleep_s: int
    shutdown_timeout_s: int
    termination_grace_period_s: int

    def pod_settings(self) -> dict[str, object]:
        """The pod spec's fields (``terminationGracePeriodSeconds``, the container's ``lifecycle``) and the
        vLLM argument, as the chart's example Deployment writes them."""
        return {"terminationGracePeriodSeconds": self.termination_grace_period_s,
                "lifecycle": {"preStop": {"sleep": {"seconds": self.pre_stop_sleep_s}}},
                "vllmArgs": [f"--shutdown-timeout={self.shutdown_timeout_s}"]}


def drain_timing(p99_request_s: float, margin_s: float = PRE_STOP_SLEEP_S + ENGINE_STOP_S,
                 pre_stop_s: int = PRE_STOP_SLEEP_S) -> DrainTiming:
    """The rule: shutdown timeout = ⌈p99 request duration⌉, grace = timeout + ``margin_s`` (the preStop
    sleep plus the engine's stop). ValueError for a duration that is not a finite number >= 0."""
    if not (isinstance(p99_request_s, (int, float)) and math.isfinite(p99_request_s) and p99_request_s >= 0):
        raise ValueError(f"p99_request_s={p99_request_s!r}: must be a finite number of seconds >= 0")
    if not (math.isfinite(margin_s) and margin_s >= pre_stop_s >= 0):
        raise ValueError(f"margin_s={margin_s!r}: must cover the preStop sleep ({pre_stop_s} s)")
    timeout = max(1, math.ceil(p99_request_s - 1e-9))
    return DrainTiming(pre_stop_sleep_s=int(pre_stop_s), shutdown_timeout_s=timeout,
                       termination_grace_period_s=math.ceil(timeout + margin_s))


@dataclass(frozen=True)
class PodLoad:
    """One pod's scrape, reduced to what the drain ranking and the shutdown advice need."""

    running: float
    waiting: float
    prompt_sum: float = 0.0
    prompt_count: float = 0.0
    output_sum: float = 0.0
    output_count: float = 0.0
    e2e_buckets: tuple[tuple[float, float], ...] = ()
    """Cumulative (upper bound, count) pairs of vllm:e2e_request_latency_seconds, +Inf last."""


def parse_pod_metrics(text: str, model: str | None = None) -> PodLoad:
    """Read a vLLM ``/metrics`` page; with ``model``, only series whose ``model_name`` matches.

    Raises ``ValueError`` naming what is missing when the page has no vLLM request gauges.
    """
    sums: dict[str, float] = defaultdict(float)
    buckets: dict[float, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if model is not None and sample.labels.get("model_name", model) != model:
                continue
            if not math.isfinite(sample.value) and sample.name != f"{E2E}_bucket":
                continue
            if sample.name == f"{E2E}_bucket":
                buckets[float(sample.labels.get("le", "+Inf"))] += sample.value
            else:
                sums[sample.name] += sample.value
    if "vllm:num_requests_running" not in sums or "vllm:num_requests_waiting" not in sums:
        raise ValueError("metrics page: vllm:num_requests_running and vllm:num_requests_waiting are required"
                         + (f" for model_name={model!r}" if model else ""))
    return PodLoad(
        running=sums["vllm:num_requests_running"], waiting=sums["vllm:num_requests_waiting"],
        prompt_sum=sums.get("vllm:request_prompt_tokens_sum", 0.0),
        prompt_count=sums.get("vllm:request_prompt_tokens_count", 0.0),
        output_sum=sums.get("vllm:request_generation_tokens_sum", 0.0),
        output_count=sums.get("vllm:request_generation_tokens_count", 0.0),
        e2e_buckets=tuple(sorted(buckets.items())),
    )


def _mean(total: float, count: float) -> float | None:
    return total / count if count > 0 and math.isfinite(total / count) else None


def in_flight_tokens(loads: Mapping[str, PodLoad]) -> dict[str, float]:
    """Estimated tokens each pod still has to process (see the module docstring for the formula)."""
    fleet = PodLoad(0.0, 0.0, sum(x.prompt_sum for x in loads.values()), sum(x.prompt_count for x in loads.values()),
                    sum(x.output_sum for x in loads.values()), sum(x.output_count for x in loads.values()))
    fleet_prompt = _mean(fleet.prompt_sum, fleet.prompt_count) or 1.0
    fleet_output = _mean(fleet.output_sum, fleet.output_count) or 1.0
    out = {}
    for pod, load in loads.items():
        prompt = _mean(load.prompt_sum, load.prompt_count) or fleet_prompt
        output = _mean(load.output_sum, load.output_count) or fleet_output
        out[pod] = max(0.0, load.waiting) * prompt + max(0.0, load.running) * (prompt + output)
    return out


def _two_figures(value: float) -> int:
    if value < 1.0:
        return 0
    drop = math.floor(math.log10(value)) - 1  # digits below the second significant one
    return round(value / 10**drop) * 10**drop if drop > 0 else round(value)


def deletion_costs(work: Mapping[str, float]) -> dict[str, int]:
    """Pod name → deletion cost: its in-flight tokens, two significant figures, within int32."""
    return {pod: min(INT32_MAX, _two_figures(max(0.0, tokens))) for pod, tokens in work.items()
            if math.isfinite(tokens)}


def patches_needed(costs: Mapping[str, int], current: Mapping[str, int | None]) -> dict[str, int]:
    """Only the pods whose annotation differs from the cost they should carry."""
    return {pod: cost for pod, cost in costs.items() if current.get(pod) != cost}


@dataclass(frozen=True)
class ShutdownAdvice:
    """What to set so a removed replica finishes its requests before Kubernetes kills it."""

    vllm_shutdown_timeout_s: int
    termination_grace_period_s: int
    p99_request_s: float
    requests: int
    lower_bound: bool
    """True when p99 fell in the +Inf bucket: the real tail is longer than the histogram shows."""
    pre_stop_sleep_s: int = PRE_STOP_SLEEP_S

    def explain(self, current_grace_s: int | None = None) -> str:
        """One paragraph for a human (and the CLI)."""
        bound = "at least " if self.lower_bound else ""
        text = (f"p99 request duration {bound}{self.p99_request_s:g} s over {self.requests} requests: run vLLM with "
                f"--shutdown-timeout={self.vllm_shutdown_timeout_s}, give its container a preStop sleep of "
                f"{self.pre_stop_sleep_s} s (endpoint removal) and set the pod's terminationGracePeriodSeconds "
                f"to {self.termination_grace_period_s}.")
        if current_grace_s is not None and current_grace_s < self.termination_grace_period_s:
            text += (f" The Deployment's {current_grace_s} s is shorter: Kubernetes would kill requests "
                     "still in flight.")
        return text


def shutdown_advice(loads: Mapping[str, PodLoad], margin_s: float = PRE_STOP_SLEEP_S + ENGINE_STOP_S,
                    quantile: float = 0.99) -> ShutdownAdvice:
    """Recommend vLLM's shutdown timeout and the grace period from the fleet's e2e latency histogram.

    Raises ``ValueError`` when no pod has finished a request (nothing to base advice on).
    """
    merged: dict[float, float] = defaultdict(float)
    for load in loads.values():
        for bound, count in load.e2e_buckets:
            merged[bound] += count
    ordered = sorted(merged.items())
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        raise ValueError(f"{E2E}: no finished requests in {len(loads)} pod scrape(s); nothing to base advice on")
    finite = [b for b, _ in ordered if math.isfinite(b)]
    p_value, lower = (finite[-1] if finite else 0.0), True
    for bound, count in ordered:
        if count >= quantile * total:
            if math.isfinite(bound):
                p_value, lower = bound, False
            break
    timing = drain_timing(p_value, margin_s=margin_s, pre_stop_s=min(PRE_STOP_SLEEP_S, int(margin_s)))
    return ShutdownAdvice(vllm_shutdown_timeout_s=timing.shutdown_timeout_s,
                          termination_grace_period_s=timing.termination_grace_period_s, p99_request_s=p_value,
                          requests=int(total), lower_bound=lower, pre_stop_sleep_s=timing.pre_stop_sleep_s)
