"""Built-in synthetic workloads: the CLI's default, and arrival shapes no trace file has to provide.

Arrivals are a renewal process with Gamma gaps (mean 1, coefficient of variation ``cv``: 1 is Poisson,
larger is burstier) run in "operational time" and mapped through the cumulative rate ``Λ(t) = ∫ λ``
of a shape (constant, steps, pulses, diurnal), so burstiness and the rate curve combine. Lengths are
lognormal from a mean and a median (``σ = sqrt(2 ln(mean/median))``), or resampled as (prompt, output)
pairs from any trace file. Arrivals and lengths draw from separate seeded streams, so changing the
lengths keeps the arrival times.

Spec strings (what ``--trace`` accepts): ``builtin:NAME`` or ``builtin:NAME?key=value&key=value``, e.g.
``builtin:gamma?rate=8&cv=3&duration=600`` or ``builtin:steps?rates=2,8,4&step_s=300``. Lists are
comma-separated; unknown keys and bad values are reported together, naming key, value and what is allowed.
``list_builtins()`` gives every name with its parameters and defaults.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast
from urllib.parse import parse_qsl

import numpy as np

from simulator.readers import TraceFormatError, load_lengths, load_trace
from simulator.workload import Workload

PREFIX = "builtin:"
MAX_REQUESTS = 50_000_000  # a spec that asks for more is a typo, not a workload
RateFn = Callable[[np.ndarray], np.ndarray]


class SpecError(ValueError):
    """Bad builtin name or parameters; lists every problem (key, value, what is allowed)."""

    def __init__(self, spec: str, problems: list[str]):
        self.spec, self.problems = spec, problems
        super().__init__(f"workload spec {spec!r}: " + "; ".join(problems))


@dataclass(frozen=True)
class Param:
    """One builtin parameter: type (float, int, str or a float list), default, bounds, meaning."""

    name: str
    kind: str  # "float" | "int" | "str" | "floats"
    default: object
    help: str
    low: float = 0.0
    high: float = math.inf
    low_open: bool = False

    def convert(self, raw: object) -> object:
        """The value in its kind, or ValueError naming what is allowed."""
        allowed = f"{'>' if self.low_open else '>='} {self.low:g}" + ("" if self.high == math.inf else
                                                                       f" and <= {self.high:g}")
        if self.kind == "str":
            if not isinstance(raw, str | Path) or not str(raw):
                raise ValueError(f"{self.name}={raw!r}: expected a non-empty string ({self.help})")
            return str(raw)
        items = raw.split(",") if self.kind == "floats" and isinstance(raw, str) else raw
        values = list(items) if self.kind == "floats" and isinstance(items, list | tuple) else [items]
        out = []
        for item in values:
            try:
                v = float(item) if self.kind != "int" else _to_int(item)  # type: ignore[arg-type]  # TypeError caught
            except (TypeError, ValueError):
                raise ValueError(f"{self.name}={raw!r}: expected {self._what()} {allowed}") from None
            if not math.isfinite(v) or v < self.low or (self.low_open and v == self.low) or v > self.high:
                raise ValueError(f"{self.name}={raw!r}: expected {self._what()} {allowed}")
            out.append(v)
        if self.kind == "floats":
            if not out:
                raise ValueError(f"{self.name}={raw!r}: expected at least one number")
            return tuple(out)
        return out[0]

    def _what(self) -> str:
        return {"float": "a number", "int": "an integer", "floats": "comma-separated numbers"}[self.kind]


def _to_int(item: object) -> int:
    if isinstance(item, bool):
        raise ValueError(item)
    if isinstance(item, int):
        return item
    f = float(item)  # type: ignore[arg-type]
    if not f.is_integer():
        raise ValueError(item)
    return int(f)


COMMON = (
    Param("cv", "float", 1.0, "coefficient of variation of inter-arrival gaps (1 = Poisson)", 0.0, 20.0, True),
    Param("in_mean", "float", 1155.0, "prompt tokens, lognormal mean", 1.0),
    Param("in_median", "float", 1020.0, "prompt tokens, lognormal median (<= in_mean)", 1.0),
    Param("out_mean", "float", 211.0, "output tokens, lognormal mean", 1.0),
    Param("out_median", "float", 129.0, "output tokens, lognormal median (<= out_mean)", 1.0),
    Param("in_max", "int", 16384, "prompt tokens are clipped to this", 1),
    Param("out_max", "int", 2048, "output tokens are clipped to this", 1),
    Param("lengths", "str", None, "resample (prompt, output) pairs from this trace file instead of lognormal"),
    Param("lengths_format", "str", None, "format of the lengths file (detected when absent)"),
    Param("long_share", "float", 0.0, "share of requests replaced by long-prompt ones (e.g. summaries)", 0.0, 1.0),
    Param("long_in_min", "int", 20_000, "long prompts: fewest tokens (uniform between min and max)", 1),
    Param("long_in_max", "int", 30_000, "long prompts: most tokens", 1),
    Param("long_out_mean", "float", 300.0, "long requests: output tokens, lognormal mean", 1.0),
    Param("long_out_median", "float", 250.0, "long requests: output tokens, lognormal median", 1.0),
)


@dataclass(frozen=True)
class Builtin:
    """A named synthetic workload: its own parameters (plus COMMON) and how they make a rate curve."""

    name: str
    description: str
    params: tuple[Param, ...]
    shape: Callable[[Mapping[str, object]], tuple[RateFn, float]]  # -> rate(t), duration_s
    fixed: tuple[str, ...] = ()  # COMMON parameters this builtin does not take

    def all_params(self) -> tuple[Param, ...]:
        """Its own parameters, then the COMMON ones it takes (its own win on a shared name)."""
        own = {p.name for p in self.params}
        return self.params + tuple(p for p in COMMON if p.name not in own and p.name not in self.fixed)


def _const(rate: float) -> RateFn:
    return lambda t: np.full(t.shape, rate)


def _steps(p: Mapping[str, object]) -> tuple[RateFn, float]:
    rates, step = np.asarray(p["rates"], float), float(p["step_s"])  # type: ignore[arg-type]
    duration = float(p["duration"]) if p["duration"] else rates.size * step  # type: ignore[arg-type]
    return (lambda t: rates[(t // step).astype(np.int64) % rates.size]), duration


def _pulses(p: Mapping[str, object]) -> tuple[RateFn, float]:
    base, peak = float(p["base"]), float(p["peak"])  # type: ignore[arg-type]
    period, width = float(p["period_s"]), float(p["width_s"])  # type: ignore[arg-type]
    return (lambda t: np.where((t % period) < width, peak, base)), float(p["duration"])  # type: ignore[arg-type]


def _diurnal_fn(rate: float, amplitude: float, period: float) -> RateFn:
    return lambda t: rate * (1.0 - amplitude * np.cos(2.0 * math.pi * t / period))


def _diurnal(p: Mapping[str, object]) -> tuple[RateFn, float]:
    duration = float(p["duration"])  # type: ignore[arg-type]
    period = float(p["period_s"]) if p["period_s"] else duration  # type: ignore[arg-type]
    return _diurnal_fn(float(p["rate"]), float(p["amplitude"]), period), duration  # type: ignore[arg-type]


def _default(p: Mapping[str, object]) -> tuple[RateFn, float]:
    """One compressed day (trough, peak, trough) with two short surges at a quarter and at 60% of it."""
    duration = float(p["duration"])  # type: ignore[arg-type]
    day = _diurnal_fn(float(p["rate"]), 0.5, duration)  # type: ignore[arg-type]
    surges = ((0.25, 0.29), (0.60, 0.64))

    def rate(t: np.ndarray) -> np.ndarray:
        x = t / duration
        boost = np.ones(t.shape)
        for lo, hi in surges:
            boost[(x >= lo) & (x < hi)] = 1.6
        return day(t) * boost

    return rate, duration


def _dur(default: float) -> Param:
    return Param("duration", "float", default, "seconds of arrivals", 0.0, 365 * 86400.0, True)


def _rate(default: float) -> Param:
    return Param("rate", "float", default, "mean requests per second", 0.0, 1e6, True)


BUILTINS: dict[str, Builtin] = {b.name: b for b in (
    Builtin("default", "bursty chat for 30 min: a compressed day (rate swings x0.5..x1.5) with two 1.6x surges, "
            "Gamma gaps cv=2, Azure-conversation-like lengths (mean 1155/211); several H100 8B replicas at peak",
            (_rate(25.0), _dur(1800.0), Param("cv", "float", 2.0, "gap CV", 0.0, 20.0, True)), _default),
    Builtin("poisson", "constant-rate Poisson arrivals", (_rate(10.0), _dur(600.0)),
            lambda p: (_const(float(p["rate"])), float(p["duration"])), ("cv",)),  # type: ignore[arg-type]
    Builtin("gamma", "constant-rate Gamma arrivals: burstiness as the gap CV",
            (_rate(10.0), _dur(600.0), Param("cv", "float", 2.0, "gap CV", 0.0, 20.0, True)),
            lambda p: (_const(float(p["rate"])), float(p["duration"]))),  # type: ignore[arg-type]
    Builtin("steps", "piecewise-constant rates, each held step_s seconds, repeated to fill duration",
            (Param("rates", "floats", (2.0, 8.0, 4.0), "requests per second of each step"),
             Param("step_s", "float", 300.0, "seconds per step", 0.0, 365 * 86400.0, True),
             Param("duration", "float", 0.0, "seconds (0: one pass through the steps)", 0.0, 365 * 86400.0)),
            _steps),
    Builtin("pulses", "a base rate with a peak for width_s seconds every period_s seconds",
            (Param("base", "float", 1.0, "requests per second between pulses"),
             Param("peak", "float", 20.0, "requests per second during a pulse"),
             Param("period_s", "float", 120.0, "seconds from one pulse to the next", 0.0, math.inf, True),
             Param("width_s", "float", 10.0, "seconds per pulse", 0.0, math.inf, True), _dur(600.0)), _pulses),
    Builtin("diurnal", "a daily cycle rate*(1 - amplitude*cos(2 pi t/period_s)), starting at the trough",
            (_rate(10.0), Param("amplitude", "float", 0.8, "swing around the mean rate", 0.0, 1.0), _dur(3600.0),
             Param("period_s", "float", 0.0, "seconds per cycle (0: the duration)", 0.0, math.inf)), _diurnal),
)}


def list_builtins() -> list[Builtin]:
    """Every builtin workload, the default first."""
    return list(BUILTINS.values())


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``builtin:NAME?k=v&k=v`` (the prefix is optional) into the name and raw parameters."""
    body = spec.removeprefix(PREFIX).strip()
    name, _, query = body.partition("?")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise SpecError(spec, [f"parameters {query!r}: expected key=value pairs joined by '&'"]) from None
    params: dict[str, str] = {}
    for key, value in pairs:
        if key in params:
            raise SpecError(spec, [f"{key} is given twice"])
        params[key] = value
    return name.strip(), params


def builtin(name: str, seed: int = 0, **params: object) -> Workload:
    """Generate builtin workload ``name`` (see ``list_builtins()``) with a seeded, reproducible draw."""
    shown = {k: ",".join(map(str, v)) if isinstance(v, list | tuple) else v for k, v in params.items()}
    spec = PREFIX + name + ("?" + "&".join(f"{k}={v}" for k, v in shown.items()) if params else "")
    if name not in BUILTINS:
        raise SpecError(spec, [f"name {name!r} is unknown; allowed: {', '.join(BUILTINS)}"])
    b = BUILTINS[name]
    values, problems = _resolve(b, params)
    if problems:
        raise SpecError(spec, problems)
    rate_fn, duration = b.shape(values)
    rng_arrivals, rng_lengths = np.random.default_rng(seed).spawn(2)
    try:
        arrival = arrivals(rate_fn, duration, float(values.get("cv", 1.0)), rng_arrivals)  # type: ignore[arg-type]
        inp, out = _lengths(values, arrival.size, rng_lengths)
    except TraceFormatError:
        raise
    except ValueError as exc:
        raise SpecError(spec, [str(exc)]) from None
    if arrival.size == 0:
        raise SpecError(spec, ["no requests arrive: expected a higher rate or a longer duration"])
    return Workload(arrival, inp, out, name=spec, meta={"format": "builtin", "seed": str(seed)})


def _shifted(rate_fn: RateFn, t0: float) -> RateFn:
    """The rate curve seen from ``t0``."""
    def rate(t: np.ndarray) -> np.ndarray:
        return rate_fn(t + t0)
    return rate


def builtin_chunks(name: str, seed: int = 0, span_s: float = 3600.0, **params: object) -> Iterator[Workload]:
    """Builtin workload ``name`` span by span (``fast_stream`` simulates a week without holding it): each
    ``span_s`` of the rate curve is drawn with its own seeded streams, so memory is one span's requests.
    A different draw than ``builtin`` (one stream for the whole duration) of the same process."""
    if name not in BUILTINS:
        raise SpecError(PREFIX + name, [f"name {name!r} is unknown; allowed: {', '.join(BUILTINS)}"])
    b = BUILTINS[name]
    values, problems = _resolve(b, params)
    if problems or not (math.isfinite(span_s) and span_s > 0):
        raise SpecError(PREFIX + name, problems or [f"span_s={span_s!r}: expected a finite number > 0"])
    rate_fn, duration = b.shape(values)
    cv = float(values.get("cv", 1.0))  # type: ignore[arg-type]
    for k, start in enumerate(np.arange(0.0, duration, span_s)):
        length = min(span_s, duration - float(start))
        rng_arrivals, rng_lengths = np.random.default_rng([seed, k]).spawn(2)
        arrival = arrivals(_shifted(rate_fn, float(start)), length, cv, rng_arrivals) + float(start)
        inp, out = _lengths(values, arrival.size, rng_lengths)
        yield Workload(arrival, inp, out, name=f"{PREFIX}{name} span {k}",
                       meta={"format": "builtin", "seed": f"{seed},{k}"})


def from_spec(spec: str, seed: int = 0) -> Workload:
    """Generate the workload a ``builtin:NAME?k=v`` string names."""
    name, params = parse_spec(spec)
    return builtin(name, seed, **params)


def load_workload(source: str | Path | None = None, fmt: str | None = None, seed: int = 0,
                  bad_rows: str = "fail") -> Workload:
    """What ``--trace`` means: None → ``builtin:default``, ``builtin:...`` → generated, else a trace file
    (``bad_rows``: ``fail`` or ``skip`` malformed rows, see ``readers.load_trace``)."""
    if source is None:
        return builtin("default", seed)
    if isinstance(source, str) and source.startswith(PREFIX):
        if fmt not in (None, "builtin"):
            raise SpecError(source, [f"format {fmt!r} does not apply to a builtin workload"])
        return from_spec(source, seed)
    return load_trace(source, fmt, bad_rows=bad_rows)


def _resolve(b: Builtin, params: Mapping[str, object]) -> tuple[dict[str, object], list[str]]:
    spec_params = {p.name: p for p in b.all_params()}
    problems = [f"{k} is not a parameter of {b.name}; allowed: {', '.join(sorted(spec_params))}"
                for k in params if k not in spec_params]
    values: dict[str, object] = {}
    for key, p in spec_params.items():
        if key not in params or params[key] is None:
            values[key] = p.default
            continue
        try:
            values[key] = p.convert(params[key])
        except ValueError as exc:
            problems.append(str(exc))
    if not problems and int(values["long_in_min"]) > int(values["long_in_max"]):  # type: ignore[call-overload]
        problems.append(f"long_in_min={values['long_in_min']}: expected <= long_in_max={values['long_in_max']}")
    for what in ("in", "out", "long_out"):
        mean, median = values[f"{what}_mean"], values[f"{what}_median"]
        if not problems and float(median) > float(mean):  # type: ignore[arg-type]
            problems.append(f"{what}_median={median}: expected <= {what}_mean={mean} (a lognormal's median "
                            "is at most its mean)")
    return values, problems


def arrivals(rate_fn: RateFn, duration_s: float, cv: float, rng: np.random.Generator,
             max_requests: int = MAX_REQUESTS) -> np.ndarray:
    """Sorted arrival times in [0, duration_s): Gamma(cv) renewal gaps in operational time, mapped by Λ⁻¹."""
    steps = int(min(max(math.ceil(duration_s / 0.1), 1), 2_000_000))
    grid = np.linspace(0.0, duration_s, steps + 1)
    lam = np.asarray(rate_fn(0.5 * (grid[1:] + grid[:-1])), dtype=float)
    if not np.isfinite(lam).all() or (lam < 0).any():
        raise ValueError("the rate curve must be finite and >= 0")
    cum = np.concatenate(([0.0], np.cumsum(lam * np.diff(grid))))
    total = float(cum[-1])
    if total > max_requests:
        raise ValueError(f"about {total:.0f} requests: expected at most {max_requests} (lower rate or duration)")
    shape = 1.0 / (cv * cv)
    n_draw = int(total + 10.0 * math.sqrt(total + 1.0) * max(cv, 1.0) + 16)
    ops = np.cumsum(rng.gamma(shape, 1.0 / shape, n_draw))
    while ops.size and ops[-1] < total:
        ops = np.concatenate((ops, ops[-1] + np.cumsum(rng.gamma(shape, 1.0 / shape, n_draw))))
    ops = ops[ops < total]
    seg = np.clip(np.searchsorted(cum, ops, side="right") - 1, 0, steps - 1)
    width = cum[seg + 1] - cum[seg]
    frac = np.where(width > 0, (ops - cum[seg]) / np.where(width > 0, width, 1.0), 0.0)
    return cast(np.ndarray, np.minimum(grid[seg] + frac * (grid[seg + 1] - grid[seg]), np.nextafter(duration_s, 0.0)))


def lognormal_lengths(n: int, mean: float, median: float, high: int, rng: np.random.Generator) -> np.ndarray:
    """Integer lengths from a lognormal with this mean and median, clipped to [1, high]."""
    sigma = math.sqrt(2.0 * math.log(mean / median)) if mean > median else 0.0
    draws = rng.lognormal(math.log(median), sigma, n) if sigma > 0 else np.full(n, median)
    return np.clip(np.rint(draws), 1, high).astype(np.int64)


def _lengths(v: Mapping[str, object], n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) tokens per request: resampled pairs or lognormal ones, then a ``long_share`` of
    them replaced by long-prompt requests (a chat service that also summarises documents), drawn from
    a stream of their own so the share changes nothing else."""
    rng_long = rng.spawn(1)[0]
    if v["lengths"]:
        pool_in, pool_out = load_lengths(str(v["lengths"]), v["lengths_format"])  # type: ignore[arg-type]
        pick = rng.integers(0, pool_in.size, n)
        inp, out = pool_in[pick], pool_out[pick]
    else:
        inp = lognormal_lengths(n, float(v["in_mean"]), float(v["in_median"]), int(v["in_max"]), rng)  # type: ignore[arg-type, call-overload]
        out = lognormal_lengths(n, float(v["out_mean"]), float(v["out_median"]), int(v["out_max"]), rng)  # type: ignore[arg-type, call-overload]
    share = float(v["long_share"])  # type: ignore[arg-type]
    if share > 0:
        long = np.flatnonzero(rng_long.random(n) < share)
        inp, out = inp.copy(), out.copy()
        inp[long] = rng_long.integers(int(v["long_in_min"]), int(v["long_in_max"]) + 1, long.size)  # type: ignore[call-overload]
        out[long] = lognormal_lengths(long.size, float(v["long_out_mean"]), float(v["long_out_median"]),  # type: ignore[arg-type]
                                      int(v["out_max"]), rng_long)  # type: ignore[call-overload]
    return inp, out
