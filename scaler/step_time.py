"""How long one vLLM engine step takes: a small parametric model, and its fit.

One step is one forward pass over every token the scheduler picked (chunked prefill and decode mixed).
The model, with ``N`` tokens in the step, ``S`` sequences scheduled, ``C`` the context read by the
decoding sequences (their KV tokens), ``A = sum(chunk * (computed + chunk / 2))`` over prefill chunks
(causal attention work of the prefills) and ``P`` the sequences running a prefill chunk::

    t = overhead + max(floor, intercept + per_token * N) + per_seq * S + per_context_token * C
        + prefill_attention * A + per_prefill_seq * P

- ``max(floor, ...)``: linear layers are memory-bound (read all weights: the decode floor) until the
  batch is large enough to be compute-bound (a slope per token). Vidur's operator profiles show this
  knee clearly (flat to ~128 tokens, linear above ~512).
- ``per_context_token``: decode attention reads each sequence's KV cache: memory-bound, bytes per
  token / bandwidth.
- ``prefill_attention``: prefill attention FLOPs grow with chunk × context: compute-bound.
- ``per_prefill_seq``: what a prefill chunk costs beyond its tokens (the prefill attention path's
  per-sequence setup, and on a prompt's last chunk its first token's logits and output). Timed steps of
  vLLM 0.32's CPU build put it at 1.4–1.9 ms against a 1.2 ms decode step (docs/real-vllm.md); the
  built-in GPU profiles have no measurement of it and keep 0.

A pure-decode batch whose membership does not change has step times that grow by a constant
(``per_context_token * D``) per step, so ``k`` steps sum in closed form: the engine uses that to jump
over whole stretches of decode steps (``DecodeRun``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

import numpy as np


class StepTimeModel(Protocol):
    """A step-time model: one-method seam, plus the decode-run form the engine's fast path needs."""

    def step_time(self, tokens: int, seqs: int, decode_context: float, prefill_attention: float,
                  prefill_seqs: int = 0) -> float:
        """Seconds for one step (see the module docstring for the arguments)."""
        ...

    def decode_run(self, decode_seqs: int, context0: float) -> DecodeRun:
        """Step times of a constant pure-decode batch: step ``i`` takes ``first_s + growth_s * i``."""
        ...


class DecodeRun:
    """Step ``i`` (0-based) of a constant decode batch takes ``first_s + growth_s * i`` seconds.

    A plain slotted class, not a dataclass: the engine makes one per decode run, in its hot loop.
    """

    __slots__ = ("first_s", "growth_s")

    def __init__(self, first_s: float, growth_s: float) -> None:
        self.first_s = first_s
        self.growth_s = growth_s

    def total(self, k: int) -> float:
        """Seconds taken by the first ``k`` steps."""
        return k * self.first_s + self.growth_s * k * (k - 1) / 2.0

    def steps_within(self, elapsed_s: float) -> int:
        """How many whole steps end at or before ``elapsed_s`` (largest k with total(k) <= elapsed)."""
        if elapsed_s < self.first_s:
            return 0
        if self.growth_s <= 0.0:
            k = int(elapsed_s // self.first_s)
        else:
            b = self.first_s - self.growth_s / 2.0
            k = int((-b + math.sqrt(b * b + 2.0 * self.growth_s * elapsed_s)) / self.growth_s)
        # correct float rounding on either side
        while k > 0 and self.total(k) > elapsed_s:
            k -= 1
        while self.total(k + 1) <= elapsed_s:
            k += 1
        return k

    def add_to(self, itl: Any, done: int, j: int, weight: float) -> None:
        """Steps ``done .. done + j - 1`` into an inter-token histogram (``simulator.results.LatencyHistogram``)."""
        itl.add_arithmetic(self.first_s + self.growth_s * done, self.growth_s, j, weight)

    def step_durations(self, k: int) -> np.ndarray:
        """The first ``k`` step durations (used for histograms of short runs)."""
        return self.first_s + self.growth_s * np.arange(k, dtype=np.float64)


@dataclass(frozen=True)
class LinearStepTime:
    """The default step-time model (seconds; see the module docstring). All coefficients >= 0."""

    overhead_s: float
    floor_s: float
    intercept_s: float
    per_token_s: float
    per_seq_s: float
    per_context_token_s: float
    prefill_attention_s: float
    per_prefill_seq_s: float = 0.0
    """Optional in ``from_dict``: profiles written before the term existed had none, which is 0 exactly."""

    def __post_init__(self) -> None:
        problems = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                    if not (isinstance(getattr(self, f.name), (int, float)) and math.isfinite(getattr(self, f.name))
                            and getattr(self, f.name) >= 0)]
        if problems:
            raise ValueError("invalid LinearStepTime: " + ", ".join(problems) + ": each must be a finite number >= 0")
        if self.floor_s + self.overhead_s <= 0:
            raise ValueError("invalid LinearStepTime: floor_s + overhead_s must be > 0 (a step takes time)")

    def step_time(self, tokens: int, seqs: int, decode_context: float, prefill_attention: float,
                  prefill_seqs: int = 0) -> float:
        linear = max(self.floor_s, self.intercept_s + self.per_token_s * tokens)
        return (self.overhead_s + linear + self.per_seq_s * seqs + self.per_context_token_s * decode_context
                + self.prefill_attention_s * prefill_attention + self.per_prefill_seq_s * prefill_seqs)

    def decode_run(self, decode_seqs: int, context0: float) -> DecodeRun:
        linear = self.intercept_s + self.per_token_s * decode_seqs
        first = (self.overhead_s + (linear if linear > self.floor_s else self.floor_s) + self.per_seq_s * decode_seqs
                 + self.per_context_token_s * context0)
        return DecodeRun(first, self.per_context_token_s * decode_seqs)

    def prefill_time(self, prompt_tokens: int, chunk: int) -> float:
        """Seconds to prefill one lone prompt in chunks of ``chunk`` tokens (its TTFT on an idle replica)."""
        total, done = 0.0, 0
        while done < prompt_tokens:
            n = min(chunk, prompt_tokens - done)
            total += self.step_time(n, 1, 0.0, n * (done + n / 2.0), 1)
            done += n
        return total

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> LinearStepTime:
        """Build from a mapping, naming missing or unknown keys (``per_prefill_seq_s`` may be absent: 0)."""
        names = {f.name for f in fields(cls)}
        missing = sorted(names - set(data) - {"per_prefill_seq_s"})
        unknown = sorted(set(data) - names)
        if missing or unknown:
            raise ValueError(f"step_time: missing keys {missing}, unknown keys {unknown}; expected {sorted(names)}")
        values: dict[str, float] = {}
        for k in names & set(data):
            try:
                values[k] = float(data[k])  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise ValueError(f"step_time.{k}={data[k]!r}: must be a number >= 0") from None
        return cls(**values)


def table_mean(table: Sequence[float]) -> float:
    """The mean of a step-jitter table (``simulator.step_jitter``): of the piecewise-linear inverse CDF it
    defines, which the trapezoid rule gives exactly."""
    t = np.asarray(table, dtype=float)
    return float(((t[:-1] + t[1:]) / 2.0).mean())


def check_jitter_table(table: object, where: str = "step_jitter") -> tuple[float, ...]:
    """``table`` as a validated tuple, or a ValueError naming what is wrong (empty: no jitter)."""
    if not isinstance(table, (list, tuple)):
        raise ValueError(f"{where}={table!r}: must be a list of numbers (quantiles of real / modelled step time)")
    if len(table) == 0:
        return ()
    values = []
    for i, x in enumerate(table):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise ValueError(f"{where}[{i}]={x!r}: must be a finite number > 0")
        values.append(float(x))
    if len(values) < 2:
        raise ValueError(f"{where}: {len(values)} value; need at least 2 quantiles (or none: no jitter)")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(f"{where}[{i}]={values[i]!r} < {where}[{i - 1}]={values[i - 1]!r}: quantiles must "
                             "not decrease")
    mean = table_mean(values)
    if abs(mean - 1.0) > 1e-6:
        raise ValueError(f"{where}: its mean is {mean:.6g}; must be 1 (within 1e-6) so that the step-time model "
                         "keeps the mean step (rescale the quantiles by 1 / mean)")
    return tuple(values)


@dataclass(frozen=True)
class StepSample:
    """One measured step (or forward pass): the model's inputs and the seconds it took."""

    tokens: int
    seqs: int
    decode_context: float
    prefill_attention: float
    seconds: float
    prefill_seqs: int = 0


def fit_linear_knee(tokens: np.ndarray, seconds: np.ndarray, knee_below: int = 64,
                    linear_from: int = 512, linear_to: int = 16384) -> tuple[float, float, float]:
    """Fit ``max(floor, intercept + slope * tokens)`` to forward-pass timings.

    ``floor`` is the median up to ``knee_below`` tokens (memory-bound regime); the line is a least-squares
    fit on relative error between ``linear_from`` and ``linear_to`` tokens (compute-bound regime, the step
    sizes a scheduler budget allows). Returns (floor, intercept, slope), each >= 0.
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    small, large = tokens <= knee_below, (tokens >= linear_from) & (tokens <= linear_to)
    if small.sum() < 1 or large.sum() < 2:
        raise ValueError(f"fit_linear_knee needs points <= {knee_below} tokens and >= 2 points in "
                         f"[{linear_from}, {linear_to}]")
    floor = float(np.median(seconds[small]))
    slope, intercept = np.polyfit(tokens[large], seconds[large], 1, w=1.0 / seconds[large])
    return floor, max(0.0, float(intercept)), max(0.0, float(slope))


def fit_step_samples(samples: list[StepSample], base: LinearStepTime) -> LinearStepTime:
    """Least-squares fit of every coefficient to end-to-end step samples, starting from ``base``.

    Non-negative (bounded) robust fit (soft-L1 on relative error), so a few noisy points do not drag the
    model. Used for the 70B profiles (Splitwise end-to-end timings) and by calibration.
    """
    from scipy.optimize import least_squares

    if len(samples) < 4:
        raise ValueError(f"fit_step_samples needs at least 4 samples, got {len(samples)}")
    x = np.array([[s.tokens, s.seqs, s.decode_context, s.prefill_attention, s.prefill_seqs] for s in samples],
                 dtype=np.float64)
    y = np.array([s.seconds for s in samples], dtype=np.float64)
    held = {"per_prefill_seq_s": base.per_prefill_seq_s} if not np.any(x[:, 4]) else {}  # no sample shows it
    names = [f.name for f in fields(LinearStepTime) if f.name not in held]

    def model(p: np.ndarray) -> np.ndarray:
        d = {**held, **dict(zip(names, p, strict=True))}
        lin = np.maximum(d["floor_s"], d["intercept_s"] + d["per_token_s"] * x[:, 0])
        out: np.ndarray = (d["overhead_s"] + lin + d["per_seq_s"] * x[:, 1] + d["per_context_token_s"] * x[:, 2]
                           + d["prefill_attention_s"] * x[:, 3] + d["per_prefill_seq_s"] * x[:, 4])
        return out

    p0 = np.array([getattr(base, n) for n in names], dtype=np.float64)
    scale = np.where(p0 > 0, p0, 1e-9)
    res = least_squares(lambda q: (model(q * scale) - y) / y, p0 / scale, bounds=(0.0, np.inf), loss="soft_l1",
                        f_scale=0.05)
    return LinearStepTime(**held, **{n: float(v) for n, v in zip(names, res.x * scale, strict=True)})
