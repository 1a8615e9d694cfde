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

    Inside the bucket holding ``threshold`` observations are taken as uniform (what Prometheus'
    ``histogram_quantile`` assumes). None when nothing was observed, there is no ``+Inf`` bucket, or the
    buckets are malformed.
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
            inside = 0.0 if math.isinf(le) else (threshold - lower) / (le - lower) if le > lower else 1.0
            return min(max((total - below - inside * count) / total, 0.0), 1.0)
        below += count
    return None
