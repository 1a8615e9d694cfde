"""How long the prompts behind the prompt-token rate are, from vLLM's prompt-length histogram.

Prefill is not linear in tokens: each prompt token attends to the tokens before it, so a 30k-token
prompt costs more per token than a 300-token one (``ReplicaCapacity.prefill_cost_factor``). What
matters for the fleet's prefill work is the *token-weighted* mean prompt length ``Σn² / Σn`` (the
length of the prompt an average prompt token belongs to), not the request mean ``Σn / N``: a few long
prompts carry most of the tokens. vLLM exports ``vllm:request_prompt_tokens`` as a histogram with
1-2-5 buckets; the rates of its buckets over the rate window give the moments, assuming prompt
lengths spread uniformly inside each bucket, with the overflow bucket's mean taken from the
histogram's sum. The live sources and the simulator's observer call the same function.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

HISTOGRAM = "vllm:request_prompt_tokens"


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


def token_weighted_mean(cumulative: Mapping[float, float], mean_length: float | None = None) -> float | None:
    """``Σn² / Σn`` estimated from cumulative bucket rates ``{le: rate}`` (``math.inf`` for ``+Inf``).

    Inside a finite bucket ``(a, b]`` lengths are taken as uniform: mean ``(a + b) / 2``, mean square
    ``(a² + ab + b²) / 3``. The overflow bucket ``(last, +Inf)`` gets the mean that the histogram's
    own mean length (sum / count) leaves for it (at least ``last``; ``last`` when no mean is known). None when no
    request finished in the window or the buckets are malformed (negative, NaN or decreasing counts).
    """
    points = sorted((float(le), float(rate)) for le, rate in cumulative.items())
    if not points or any(not (rate >= 0 and math.isfinite(rate)) for _, rate in points):
        return None
    first_order = second_order = 0.0
    lower, below = 0.0, 0.0
    overflow = 0.0
    for le, rate in points:
        count = rate - below
        if count < -1e-9 * max(rate, 1.0):
            return None  # cumulative counts must not decrease
        count = max(count, 0.0)
        if math.isinf(le):
            overflow = count
        else:
            first_order += count * (lower + le) / 2.0
            second_order += count * (lower * lower + lower * le + le * le) / 3.0
            lower = le
        below = max(below, rate)
    if overflow > 0:
        mean = lower
        if mean_length is not None and math.isfinite(mean_length):
            mean = max(lower, (mean_length * below - first_order) / overflow)
        first_order += overflow * mean
        second_order += overflow * mean * mean
    if first_order <= 0:
        return None
    value = second_order / first_order
    return value if math.isfinite(value) else None
