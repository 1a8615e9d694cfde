"""What vLLM's histograms say: how long the prompts are, and how many first tokens came late.

**Prompt lengths.**
Prefill is not linear in tokens: each prompt token attends to the tokens before it, so a 30k-token
prompt costs more per token than a 300-token one (``ReplicaCapacity.prefill_cost_factor``). What
matters for the fleet's prefill work is the *token-weighted* mean prompt length ``Σn² / Σn`` (the
length of the prompt an average prompt token belongs to), not the request mean ``Σn / N``: a few long
prompts carry most of the tokens. vLLM exports ``vllm:request_prompt_tokens`` as a histogram with
1-2-5 buckets; the rates of its buckets over the rate window give the moments, assuming prompt
lengths spread uniformly inside each bucket, with the overflow bucket's mean taken from the
histogram's sum.

**TTFT tail.** ``vllm:time_to_first_token_seconds`` buckets give the share of requests whose first
token came after the SLO (``share_above``): the SLO itself, measured, where a queue-length proxy
misses a tail made of long prompts' own prefills.

The live sources and the simulator's observer call the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

PROMPT_HISTOGRAM = "vllm:request_prompt_tokens"
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
"""vLLM's ``vllm:time_to_first_token_seconds`` bucket bounds (v1 loggers)."""


def vllm_token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)`` upper bounds: 1, 2, 5, 10, 20, 50, ..."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


def _buckets(cumulative: Mapping[float, float]) -> list[tuple[float, float, float]] | None:
    """``(lower, le, count)`` per bucket from cumulative rates ``{le: rate}``, in order; None when empty or
    malformed (a negative, NaN or decreasing cumulative count)."""
    points = sorted((float(le), float(rate)) for le, rate in cumulative.items())
    if not points or any(not (rate >= 0 and math.isfinite(rate)) for _, rate in points):
        return None
    out, lower, below = [], 0.0, 0.0
    for le, rate in points:
        if rate < below - 1e-9 * max(rate, 1.0):
            return None  # cumulative counts must not decrease
        out.append((lower, le, max(rate - below, 0.0)))
        lower, below = le, max(below, rate)
    return out


def token_weighted_mean(cumulative: Mapping[float, float], mean_length: float | None = None) -> float | None:
    """``Σn² / Σn`` estimated from cumulative bucket rates ``{le: rate}`` (``math.inf`` for ``+Inf``).

    Inside a finite bucket ``(a, b]`` lengths are taken as uniform: mean ``(a + b) / 2``, mean square
    ``(a² + ab + b²) / 3``. The overflow bucket ``(last, +Inf)`` gets the mean that the histogram's own
    mean length (sum / count) leaves for it (at least ``last``; ``last`` when no mean is known). None when
    no request finished in the window or the buckets are malformed (negative, NaN or decreasing counts).
    """
    buckets = _buckets(cumulative)
    if buckets is None:
        return None
    first_order = second_order = overflow = last = total = 0.0
    for lower, le, count in buckets:
        total += count
        if math.isinf(le):
            overflow = count
        else:
            first_order += count * (lower + le) / 2.0
            second_order += count * (lower * lower + lower * le + le * le) / 3.0
            last = le
    if overflow > 0:
        mean = last
        if mean_length is not None and math.isfinite(mean_length):
            mean = max(last, (mean_length * total - first_order) / overflow)
        first_order += overflow * mean
        second_order += overflow * mean * mean
    if first_order <= 0:
        return None
    value = second_order / first_order
    return value if math.isfinite(value) else None


def share_above(cumulative: Mapping[float, float], threshold: float) -> float | None:
    """Share of observations above ``threshold`` from cumulative bucket rates ``{le: rate}``.

    Inside the bucket holding ``threshold`` the tail is taken as exponential: the share above ``t`` is
    interpolated *geometrically* between the shares above the bucket's bounds, ``S(t) = S(lo)^(1-f) S(hi)^f``
    with ``f = (t - lo) / (hi - lo)``. Why not Prometheus' uniform assumption: a TTFT's tail past a bucket's
    lower bound is a queue's wait, whose density falls through the bucket, and vLLM's (1, 2.5] bucket
    straddles the usual 2 s SLO. Measured on the simulator's windows of 60 s (their own TTFTs against the
    buckets): uniform read mooncake x 3's late share 2.4 points high (85 % of windows over 5 % against 31 %
    truly), geometric 0.25 high (46 %); on bursty code completion, uniform +1.3 points, geometric -0.1
    (docs/policy.md, section 5; ``benchmarks/bench_late_share.py``). Where nothing lies above the bucket,
    nothing is taken as above ``t`` in it.
    None when nothing was observed, there is no ``+Inf`` bucket, or the buckets are malformed.
    """
    buckets = _buckets(cumulative)
    if buckets is None or not math.isinf(buckets[-1][1]):
        return None
    total = math.fsum(count for _, _, count in buckets)
    if total <= 0:
        return None
    below = 0.0
    for lower, le, count in buckets:
        if threshold <= le:
            above_lower = max(total - below, 0.0)
            above_upper = max(above_lower - count, 0.0)
            if math.isinf(le) or le <= lower or above_lower <= 0 or above_upper >= above_lower:
                return min(above_lower / total, 1.0)
            f = min(max((threshold - lower) / (le - lower), 0.0), 1.0)
            if f == 0.0:
                return min(above_lower / total, 1.0)
            if above_upper <= 0:
                return 0.0
            if f == 1.0:
                return min(above_upper / total, 1.0)
            return min(above_lower * math.pow(above_upper / above_lower, f) / total, 1.0)
        below += count
    return None
