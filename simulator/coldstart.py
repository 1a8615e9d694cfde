"""Cold-start durations of a new GPU replica, from a one-line spec.

A cold start is everything between "the Deployment asked for a pod" and "vLLM answers /health":
node provisioning and scheduling (Pending), then image pull, weight load, torch.compile and CUDA
graph capture (Loading). Specs:

- ``fixed:120``                      always 120 s
- ``uniform:60,240``                 uniform between 60 and 240 s
- ``lognormal:p50=120,p90=240``      log-normal with that median and 90th percentile
- ``empirical:[95,120,180]``         resampled from the listed durations
- ``empirical:path.csv``             resampled from a file: one duration (seconds) per line, an
                                     optional header line, commas allowed (first column is used)

Each sample is split into Pending and Loading by ``pending_fraction`` (default 0.4: node
provisioning is usually the shorter part); GPU time is counted from Pending either way, so the split
only changes which state a starting replica reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KINDS = ("fixed", "uniform", "lognormal", "empirical")
DEFAULT_SPEC = "lognormal:p50=120,p90=240"
"""The cold start every command and the tuner assume unless told: a median of 2 min, a p90 of 4 min."""
DEFAULT_PENDING_FRACTION = 0.4
_Z90 = 1.2815515655446004  # standard normal quantile at 0.9


class ColdStartError(ValueError):
    """A cold-start spec that cannot be used; the message names the part, the value and what is allowed."""


@dataclass(frozen=True)
class ColdStartSample:
    """One replica's cold start, split into its two lifecycle phases (seconds)."""

    pending_s: float
    loading_s: float

    @property
    def total_s(self) -> float:
        return self.pending_s + self.loading_s


@dataclass(frozen=True)
class ColdStart:
    """A parsed cold-start distribution; ``sample(rng)`` draws one duration in seconds."""

    kind: str
    params: tuple[float, ...]
    spec: str
    pending_fraction: float = DEFAULT_PENDING_FRACTION

    def sample(self, rng: np.random.Generator) -> float:
        """One cold-start duration (seconds, > 0) drawn with the caller's generator."""
        if self.kind == "fixed":
            return self.params[0]
        if self.kind == "uniform":
            return float(rng.uniform(self.params[0], self.params[1]))
        if self.kind == "lognormal":
            mu, sigma = math.log(self.params[0]), self._sigma()
            return float(math.exp(mu + sigma * rng.standard_normal()))
        return float(self.params[int(rng.integers(len(self.params)))])

    def sample_phases(self, rng: np.random.Generator) -> ColdStartSample:
        """One cold start split into Pending and Loading."""
        total = self.sample(rng)
        pending = total * self.pending_fraction
        return ColdStartSample(pending_s=pending, loading_s=total - pending)

    def quantile(self, q: float) -> float:
        """The q-quantile (0 < q < 1) of the duration: what a scaler would measure as lead time."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"quantile q={q!r}: must be between 0 and 1 (exclusive)")
        if self.kind == "fixed":
            return self.params[0]
        if self.kind == "uniform":
            lo, hi = self.params
            return lo + q * (hi - lo)
        if self.kind == "lognormal":
            from scipy.stats import norm

            return float(math.exp(math.log(self.params[0]) + self._sigma() * norm.ppf(q)))
        return float(np.quantile(np.asarray(self.params), q))

    def mean(self) -> float:
        """Expected duration (seconds)."""
        if self.kind == "fixed":
            return self.params[0]
        if self.kind == "uniform":
            return (self.params[0] + self.params[1]) / 2
        if self.kind == "lognormal":
            return math.exp(math.log(self.params[0]) + self._sigma() ** 2 / 2)
        return float(np.mean(self.params))

    def _sigma(self) -> float:
        return math.log(self.params[1] / self.params[0]) / _Z90


def _number(part: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ColdStartError(f"cold start {part}={text!r}: must be a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise ColdStartError(f"cold start {part}={text!r}: must be a finite number of seconds > 0")
    return value


def _empirical(body: str, spec: str) -> tuple[float, ...]:
    if body.startswith("["):
        if not body.endswith("]"):
            raise ColdStartError(f"cold start spec {spec!r}: an empirical list must be written [a,b,...]")
        items = [s.strip() for s in body[1:-1].split(",") if s.strip()]
        values = [_number(f"empirical[{i}]", s) for i, s in enumerate(items)]
    else:
        path = Path(body)
        if not path.is_file():
            raise ColdStartError(f"cold start empirical file {body!r}: no such file (or write empirical:[a,b,...])")
        values = []
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            first = line.split(",")[0].strip()
            if not first or first.startswith("#"):
                continue
            try:
                float(first)
            except ValueError:
                if n == 1:
                    continue  # a header line
            values.append(_number(f"{body}:{n}", first))
    if not values:
        raise ColdStartError(f"cold start spec {spec!r}: an empirical distribution needs at least one duration")
    return tuple(values)


def parse_cold_start(spec: str, pending_fraction: float = DEFAULT_PENDING_FRACTION) -> ColdStart:
    """Parse a spec such as ``lognormal:p50=120,p90=240``; raise ColdStartError naming what is wrong."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ColdStartError(f"cold start spec {spec!r}: expected KIND:PARAMS with KIND one of {', '.join(KINDS)}")
    if not (isinstance(pending_fraction, (int, float)) and 0.0 <= pending_fraction < 1.0):
        raise ColdStartError(f"cold start pending_fraction={pending_fraction!r}: must be in [0, 1)")
    kind, body = (s.strip() for s in spec.split(":", 1))
    kind = kind.lower()
    if kind == "fixed":
        params: tuple[float, ...] = (_number("fixed", body),)
    elif kind == "uniform":
        parts = [s.strip() for s in body.split(",")]
        if len(parts) != 2:
            raise ColdStartError(f"cold start spec {spec!r}: uniform takes two bounds, uniform:LOW,HIGH")
        lo, hi = _number("uniform low", parts[0]), _number("uniform high", parts[1])
        if hi < lo:
            raise ColdStartError(f"cold start spec {spec!r}: uniform high={hi:g} must be >= low={lo:g}")
        params = (lo, hi)
    elif kind == "lognormal":
        params = _lognormal(body, spec)
    elif kind == "empirical":
        params = _empirical(body, spec)
    else:
        raise ColdStartError(f"cold start kind {kind!r} (in {spec!r}): allowed kinds are {', '.join(KINDS)}")
    return ColdStart(kind=kind, params=params, spec=spec, pending_fraction=float(pending_fraction))


def _lognormal(body: str, spec: str) -> tuple[float, float]:
    keys: dict[str, float] = {}
    for item in (s.strip() for s in body.split(",")):
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if not sep or name not in ("p50", "p90"):
            raise ColdStartError(f"cold start spec {spec!r}: lognormal takes p50=SECONDS,p90=SECONDS, got {item!r}")
        keys[name] = _number(f"lognormal {name}", value.strip())
    missing = [k for k in ("p50", "p90") if k not in keys]
    if missing:
        raise ColdStartError(f"cold start spec {spec!r}: lognormal needs {' and '.join(missing)}")
    if keys["p90"] < keys["p50"]:
        raise ColdStartError(f"cold start spec {spec!r}: p90={keys['p90']:g} must be >= p50={keys['p50']:g}")
    return keys["p50"], keys["p90"]


def as_cold_start(value: str | ColdStart | Sequence[float]) -> ColdStart:
    """Accept a spec string, a parsed ColdStart, or a list of durations (an empirical distribution)."""
    if isinstance(value, ColdStart):
        return value
    if isinstance(value, str):
        return parse_cold_start(value)
    return parse_cold_start("empirical:[" + ",".join(str(float(v)) for v in value) + "]")
