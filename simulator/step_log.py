"""A replay's timed engine steps (``steps.csv``) and the step-time fit on them.

vLLM's server exports no per-step timing, so only an engine run in process can time its steps against
their batches (``benchmarks/fidelity_engine.py`` does, from vLLM's own ``SchedulerOutput``). Where a
replay has them, calibration fits the step time on every step's batch instead of on the replay's
outcomes: a slice that runs at nearly constant concurrency cannot tell a step's fixed cost from its
per-sequence cost by its outcomes (docs/real-vllm.md measured the outcome fit off by 27 % on ITL one way
and 77 % the other on two runs), while thousands of steps of different sizes can.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from scaler.step_time import LinearStepTime

COLUMNS = ("tokens", "seqs", "decode_context", "prefill_attention", "prefill_seqs", "seconds")
"""One row per engine step, in ``scaler.step_time``'s terms: tokens ``N``, sequences ``S``, decode
context ``C``, prefill attention ``A``, sequences running a prefill chunk ``P``, and the step's wall
time in seconds."""
SECONDS = COLUMNS.index("seconds")
PREFILL_SEQS = COLUMNS.index("prefill_seqs")
MIN_STEPS = 10
STEP_TIME_METHODS = ("auto", "steps", "outcomes")
"""``leadscale calibrate --step-time``: fit on the timed steps, on the replay's outcomes, or (auto) the steps
where there are at least ``MIN_STEPS``."""
STEPS_FILE = "steps.csv"


class StepLogError(ValueError):
    """A ``steps.csv`` that cannot be read: names the file, line, column, value and what is allowed."""


@dataclass(frozen=True)
class StepFitResiduals:
    """How well the fitted model times the steps it was fitted on: ``|predicted / measured - 1|``."""

    steps: int
    knee_tokens: float
    """Tokens below which a step's linear layers cost the same (0: none found)."""
    abs_rel_p50: float
    abs_rel_p95: float
    mean_rel: float

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    def describe(self) -> str:
        return (f"{self.steps} timed steps (knee at {self.knee_tokens:.0f} tokens), |relative residual| p50 "
                f"{self.abs_rel_p50:.1%}, p95 {self.abs_rel_p95:.1%}, mean residual {self.mean_rel:+.1%}")


def write_steps(path: str | Path, steps: np.ndarray) -> Path:
    """Write ``steps`` (one row per step, ``COLUMNS`` in order) as CSV with a header."""
    steps = np.asarray(steps, dtype=float)
    if steps.size == 0:
        steps = steps.reshape(0, len(COLUMNS))
    if steps.ndim != 2 or steps.shape[1] != len(COLUMNS):
        raise ValueError(f"write_steps: steps of shape {steps.shape}; expected (n, {len(COLUMNS)}): {COLUMNS}")
    path = Path(path)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        writer.writerows([repr(float(v)) for v in row] for row in steps)
    return path


def _cell(path: Path, line: int, column: str, raw: str) -> float:
    """One value: a finite number >= 0; ``seqs`` at least 1, ``prefill_seqs`` a whole number and ``seconds``
    above 0 (a step ran and took time)."""
    allowed = {"seqs": "a number >= 1 (a step schedules at least one sequence)",
               "prefill_seqs": "a whole number >= 0",
               "seconds": "a finite number > 0 (a step takes time)"}.get(column, "a finite number >= 0")
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    low_ok = value >= 1 if column == "seqs" else value > 0 if column == "seconds" else value >= 0
    if column == "prefill_seqs" and math.isfinite(value) and value != round(value):
        low_ok = False
    if not (math.isfinite(value) and low_ok):
        raise StepLogError(f"{path}: line {line}, column {column!r}: {raw[:40]!r} is not {allowed}")
    return value


def read_steps(path: str | Path) -> np.ndarray:
    """The timed steps of ``path``, an ``(n, 6)`` array in ``COLUMNS`` order; every bad cell is an error."""
    path = Path(path)
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != COLUMNS:
            raise StepLogError(f"{path}: line 1: header {header!r}; expected {','.join(COLUMNS)} (a replay "
                               "written before prefill_seqs was timed needs to be run again)")
        rows = []
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != len(COLUMNS):
                raise StepLogError(f"{path}: line {line}: {len(row)} fields; expected {len(COLUMNS)} "
                                   f"({','.join(COLUMNS)})")
            rows.append([_cell(path, line, column, raw.strip()) for column, raw in zip(COLUMNS, row, strict=True)])
    return np.array(rows, dtype=float).reshape(-1, len(COLUMNS))


KNEE_CANDIDATES = 24
"""Batch sizes tried as the knee: the quantiles of the steps' token counts (and 0, no knee)."""


def _solve(design: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, float]:
    """Bounded (>= 0) linear least squares, columns scaled to their largest value so that no coefficient's
    units dominate the solve; returns the coefficients and the sum of squared residuals."""
    from scipy.optimize import lsq_linear

    scale = design.max(axis=0)
    scale[scale == 0] = 1.0
    coef = lsq_linear(design / scale, seconds, bounds=(0.0, np.inf)).x / scale
    return coef, float(np.sum((design @ coef - seconds) ** 2))


def fit_step_time(steps: np.ndarray) -> tuple[LinearStepTime, StepFitResiduals]:
    """``scaler.step_time``'s model fitted on timed steps::

        t = overhead + per_token * max(knee, N) + per_seq * S + per_context_token * C + prefill_attention * A
            + per_prefill_seq * P

    i.e. ``floor = per_token * knee`` and ``intercept = 0``: below ``knee`` tokens a step's linear layers
    cost the same (reading the weights bounds them, not the arithmetic), above it each token adds
    ``per_token``. For each candidate knee (0, no floor, and the quantiles of ``N``) the coefficients come
    from bounded linear least squares (``scipy.optimize.lsq_linear``, each >= 0); the knee with the least
    squared error wins, and where the steps show none (the CPU build measured in docs/real-vllm.md) it is 0,
    the straight line. Absolute,
    not relative, error: the long steps are the ones that set the latencies, and the short ones' relative
    noise is the largest. ``P`` is what separates a prefill chunk's fixed cost from its tokens' (a pure
    decode step has ``N = S``, so without prefill steps of every size ``per_token`` and ``per_seq`` are one
    number): on the CPU build a chunk costs 1.4–1.9 ms beyond its tokens, and without the term the fit
    charged it to every token instead (docs/real-vllm.md)."""
    steps = np.asarray(steps, dtype=float)
    if steps.ndim != 2 or steps.shape[1] != len(COLUMNS):
        raise ValueError(f"fit_step_time: steps of shape {steps.shape}; expected (n, {len(COLUMNS)}): {COLUMNS}")
    if steps.shape[0] < MIN_STEPS:
        raise ValueError(f"fit_step_time: {steps.shape[0]} timed steps; need at least {MIN_STEPS}")
    if not (np.all(np.isfinite(steps)) and np.all(steps[:, :SECONDS] >= 0) and np.all(steps[:, SECONDS] > 0)):
        raise ValueError("fit_step_time: every value must be finite, the batch columns >= 0 and seconds > 0")
    tokens, seconds = steps[:, 0], steps[:, SECONDS]
    knees = np.unique(np.concatenate([[0.0], np.quantile(tokens, np.linspace(0.0, 0.95, KNEE_CANDIDATES))]))
    best: tuple[float, float, np.ndarray] | None = None
    for knee in knees:
        design = np.column_stack([np.ones(tokens.size), np.maximum(tokens, knee), steps[:, 1:SECONDS]])
        coef, sse = _solve(design, seconds)
        if best is None or sse < best[0] * (1 - 1e-9):  # ties keep the smaller knee
            best = (sse, float(knee), coef)
    assert best is not None
    _, knee, coef = best
    if coef[0] <= 0 and coef[1] * knee <= 0:  # a step takes time even when empty
        coef[0] = float(np.min(seconds)) * 1e-3
    model = LinearStepTime(overhead_s=float(coef[0]), floor_s=float(coef[1] * knee), intercept_s=0.0,
                           per_token_s=float(coef[1]), per_seq_s=float(coef[2]), per_context_token_s=float(coef[3]),
                           prefill_attention_s=float(coef[4]), per_prefill_seq_s=float(coef[5]))
    return model, residuals(model, steps, knee)


def modelled_seconds(model: LinearStepTime, steps: np.ndarray) -> np.ndarray:
    """``model.step_time`` of every timed step at once (one array op per term, not a call per step)."""
    tokens, seqs, context, attention, prefills = (steps[:, i] for i in range(SECONDS))
    return (model.overhead_s + np.maximum(model.floor_s, model.intercept_s + model.per_token_s * tokens)
            + model.per_seq_s * seqs + model.per_context_token_s * context + model.prefill_attention_s * attention
            + model.per_prefill_seq_s * prefills)


def residuals(model: LinearStepTime, steps: np.ndarray, knee: float | None = None) -> StepFitResiduals:
    """How well ``model`` times ``steps``: its relative errors' summary, with the fit's ``knee`` (by default
    read back from the model's floor)."""
    seconds = steps[:, SECONDS]
    relative = (modelled_seconds(model, steps) - seconds) / seconds
    if knee is None:
        knee = model.floor_s / model.per_token_s if model.per_token_s > 0 else 0.0
    return StepFitResiduals(steps=int(steps.shape[0]), knee_tokens=knee,
                            abs_rel_p50=float(np.percentile(np.abs(relative), 50)),
                            abs_rel_p95=float(np.percentile(np.abs(relative), 95)),
                            mean_rel=float(relative.mean()))
