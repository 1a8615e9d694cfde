"""Tune leadscale's settings on a workload: fewest GPU-hours with SLO attainment >= a target.

``tune(inputs, trials=...)`` searches the policy's tunables (target utilization, look-ahead horizon,
backlog drain time, scale-down delay) and the HPA behavior it asks for (``Settings``) with optuna's
TPE sampler (seeded), minimising GPU-hours under the constraint ``attainment >= target``. Every trial
is one ``simulator.autoscale.run_autoscaled`` of the *search window* (the workload's first
``1 - holdout`` of time). Trials are asked in fixed-size batches and evaluated in parallel processes,
then told in order, so the result does not depend on the number of cores or on timing.

Robust, not lucky: the best few distinct candidates are re-run over several seeds (cold starts,
routing) on the search window *and* on the held-out window the search never saw; the recommendation
is the cheapest candidate whose worst run still meets the target (the one with the best worst run if
none does, flagged ``holds_up=False``). The untuned defaults are always trial 0, so the search can
only improve on them. Baseline policies are run on the held-out window for comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from simulator.coldstart import DEFAULT_SPEC as DEFAULT_COLD_START
from simulator.manifests import DEFAULT_SETTINGS, Settings

if TYPE_CHECKING:  # optuna is imported where used (the sim extra)
    from optuna.trial import FrozenTrial

SUMMARY_KEYS = ("gpu_hours", "slo_attainment", "ttft_p95", "ttft_p99", "mean_replicas", "max_replicas",
                "rejected", "aborted", "scale_events")
DEFAULT_BASELINES = ("waiting-requests", "kv-cache", "saturation", "leadscale")


class _Constraints(TypedDict, total=False):
    """TPESampler's constraints on optuna 4.x (5.x reads ``Trial.set_constraint``)."""

    constraints_func: Callable[[FrozenTrial], Sequence[float]]


@dataclass(frozen=True)
class TuneInputs:
    """Everything a run needs besides the settings (picklable: sent once to each worker process)."""

    workload: Any
    profile: Any
    cold_start: str = DEFAULT_COLD_START
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    seed: int = 0
    target: float = 0.99
    holdout: float = 0.3
    min_replicas: int = 1
    max_replicas: int = 100

    def __post_init__(self) -> None:
        if not (0.0 < self.target <= 1.0):
            raise ValueError(f"target={self.target!r}: SLO attainment target must be in (0, 1]")
        if not (0.05 <= self.holdout <= 0.7):
            raise ValueError(f"holdout={self.holdout!r}: held-out fraction of the time must be in [0.05, 0.7]")
        if len(self.workload) < 2 or self.workload.duration_s <= 0:
            raise ValueError(f"workload {self.workload.name!r}: needs at least two requests spread over time")

    @property
    def split_s(self) -> float:
        """Where the held-out window starts (seconds from the first arrival)."""
        return float(self.workload.duration_s) * (1.0 - self.holdout)

    def window(self, name: str) -> Any:
        from simulator.workload import select_window

        bounds = {"search": (0.0, self.split_s), "holdout": (self.split_s, None)}
        if name not in bounds:
            raise ValueError(f"window={name!r}: allowed search, holdout")
        return select_window(self.workload, *bounds[name])


@dataclass(frozen=True)
class Run:
    """One simulated run's numbers that matter here (``None``: not measured, e.g. no request finished)."""

    window: str
    seed: int
    summary: dict[str, Any]

    @property
    def gpu_hours(self) -> float:
        return float(self.summary.get("gpu_hours") or 0.0)

    @property
    def attainment(self) -> float:
        value = self.summary.get("slo_attainment")
        return float(value) if value is not None and math.isfinite(value) else 0.0


@dataclass
class Candidate:
    """Settings with their search score and, after the robust phase, every re-evaluation."""

    settings: Settings
    trial: int
    search: Run
    runs: list[Run] = field(default_factory=list)
    holdout_result: Any = None
    """The full ``AutoscaleResult`` of the held-out run at the main seed (for the report's plots)."""

    def spread(self, target: float) -> dict[str, Any]:
        """Min/mean/max of GPU-hours and attainment per window, and whether every run met the target."""
        out: dict[str, Any] = {}
        for name in sorted({r.window for r in self.runs}):
            runs = [r for r in self.runs if r.window == name]
            out[name] = {"runs": len(runs), "gpu_hours": _stats([r.gpu_hours for r in runs]),
                         "slo_attainment": _stats([r.attainment for r in runs])}
        out["holds_up"] = self.holds_up(target)
        return out

    def holds_up(self, target: float) -> bool:
        return bool(self.runs) and min(r.attainment for r in self.runs) >= target

    def worst_attainment(self) -> float:
        return min((r.attainment for r in self.runs), default=self.search.attainment)

    def mean_gpu_hours(self) -> float:
        return float(np.mean([r.gpu_hours for r in self.runs])) if self.runs else self.search.gpu_hours


@dataclass
class TuneResult:
    """The recommendation and its evidence (see ``to_json``)."""

    inputs: TuneInputs
    trials: list[Candidate]
    robust: list[Candidate]
    best: Candidate
    baselines: dict[str, Run]
    details: dict[str, Any] = field(default_factory=dict)
    """Full ``AutoscaleResult``s on the held-out window (main seed) for the report: name -> result."""

    @property
    def holds_up(self) -> bool:
        return self.best.holds_up(self.inputs.target)

    def to_json(self) -> dict[str, Any]:
        i = self.inputs
        return {
            "recommendation": {"settings": asdict(self.best.settings), "metadata": self.best.settings.metadata(),
                               "trial": self.best.trial, "holds_up": self.holds_up},
            "evidence": {
                "workload": i.workload.name, "requests": len(i.workload), "profile": getattr(i.profile, "name", ""),
                "cold_start": i.cold_start, "slo_ttft_s": i.slo_ttft_s, "slo_tpot_s": i.slo_tpot_s,
                "target_attainment": i.target, "seed": i.seed,
                "search_window_s": [0.0, i.split_s], "holdout_window_s": [i.split_s, float(i.workload.duration_s)],
                "trials": len(self.trials),
                "feasible_trials": sum(c.search.attainment >= i.target for c in self.trials),
                "candidates": [{"trial": c.trial, "settings": asdict(c.settings), "search": _brief(c.search),
                                "spread": c.spread(i.target)} for c in self.robust],
                "recommended_holdout": _brief(self.best_holdout()),
                "baselines_holdout": {name: _brief(run) for name, run in self.baselines.items()},
                "beats": {name: beats(self.best_holdout(), run, i.target) for name, run in self.baselines.items()},
            },
        }

    def best_holdout(self) -> Run:
        """The recommendation's held-out run at the main seed (the one compared with the baselines)."""
        return next(r for r in self.best.runs if r.window == "holdout" and r.seed == self.inputs.seed)


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"min": float(min(values)), "mean": float(np.mean(values)), "max": float(max(values))}


def _brief(run: Run) -> dict[str, Any]:
    return {k: run.summary.get(k) for k in SUMMARY_KEYS}


def beats(a: Run, b: Run, target: float) -> bool:
    """``a`` is at least as good as ``b``: meets the target with no more GPU-hours than a ``b`` that also
    meets it (any GPU-hours when ``b`` misses), or, when neither meets it, attains strictly more."""
    if a.attainment >= target:
        return b.attainment < target or a.gpu_hours <= b.gpu_hours
    return b.attainment < target and a.attainment > b.attainment


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (GPU-hours, attainment) points no other point beats on both (fewer hours, more
    attainment), sorted by GPU-hours."""
    order = sorted(range(len(points)), key=lambda k: (points[k][0], -points[k][1]))
    front: list[int] = []
    best = -math.inf
    for k in order:
        if points[k][1] > best:
            front.append(k)
            best = points[k][1]
    return front


def search_space() -> dict[str, tuple[float, float, float]]:
    """Name -> (low, high, step) of every searched setting; the look-ahead is 0-3x the measured lead time
    (the p90 of the run's own cold starts, as ``leadTime: auto`` measures it live)."""
    return {
        "headroom_quantile": (0.5, 0.95, 0.01),
        "lead_time_scale": (0.0, 3.0, 0.05),
        "backlog_drain_s": (10.0, 300.0, 5.0),
        "scale_down_delay_s": (0.0, 1200.0, 15.0),
        "scale_up_pods": (1, 10, 1),
        "scale_down_pods": (1, 4, 1),
        "scale_down_period_s": (15, 120, 15),
        "scale_down_percent": (0, 100, 10),
        "scale_down_window_s": (0, 300, 15),
    }


def suggest(trial: Any, space: dict[str, tuple[float, float, float]]) -> Settings:
    """The optuna trial's point of ``space`` as Settings (integers where Kubernetes wants integers)."""
    values: dict[str, Any] = {}
    for name, (low, high, step) in space.items():
        if isinstance(low, int) and isinstance(step, int):
            values[name] = trial.suggest_int(name, low, int(high), step=step)
        else:
            values[name] = trial.suggest_float(name, float(low), float(high), step=float(step))
    return Settings(**values)


def default_point(space: dict[str, tuple[float, float, float]]) -> dict[str, Any]:
    """The untuned defaults, clipped into ``space`` (trial 0)."""
    params = DEFAULT_SETTINGS.params()
    return {k: min(max(params[k], low), high) for k, (low, high, _step) in space.items()}


_INPUTS: TuneInputs | None = None
_WINDOWS: dict[str, Any] = {}
_STARTS: dict[tuple[str, int], int] = {}
_GRACES: dict[tuple[str, int], float] = {}


def _init(inputs: TuneInputs) -> None:
    global _INPUTS
    _INPUTS = inputs
    _WINDOWS.clear()
    _STARTS.clear()
    _GRACES.clear()


def _job(job: tuple[Any, ...]) -> tuple[dict[str, Any], Any]:
    """Run ``job`` = (settings or baseline name, window, seed, keep full result[, overrides]) in this
    process; ``overrides`` may set ``waiting_tokens_limit`` (the gateway's 429 limit) and
    ``initial_fraction`` (start from that share of the warm fleet)."""
    from simulator.autoscale import default_drain_grace, run_autoscaled, starting_fleet

    assert _INPUTS is not None, "_init() first"
    what, window, seed, keep = job[:4]
    overrides: dict[str, Any] = job[4] if len(job) > 4 else {}
    i = _INPUTS
    if window not in _WINDOWS:
        _WINDOWS[window] = i.window(window)
    policy: Any = what.policy(getattr(i.profile, "name", str(i.profile)), i.slo_ttft_s, i.min_replicas,
                              i.max_replicas) if isinstance(what, Settings) else what
    options = {"slo_tpot_s": i.slo_tpot_s}
    if (window, seed) not in _STARTS:  # the same for every trial on this window and seed
        _STARTS[window, seed] = starting_fleet(_WINDOWS[window], i.profile, i.slo_ttft_s, seed,
                                               min_replicas=i.min_replicas, max_replicas=i.max_replicas,
                                               backend_options=options)
        _GRACES[window, seed] = default_drain_grace(_WINDOWS[window], i.profile, i.slo_ttft_s, seed, options,
                                                    _STARTS[window, seed])
    initial = _STARTS[window, seed]
    if "initial_fraction" in overrides:
        initial = max(1, i.min_replicas, math.floor(initial * float(overrides["initial_fraction"])))
    if overrides.get("waiting_tokens_limit") is not None:
        options["waiting_tokens_limit"] = float(overrides["waiting_tokens_limit"])
    result = run_autoscaled(_WINDOWS[window], i.profile, policy, i.cold_start, i.slo_ttft_s, seed,
                            min_replicas=i.min_replicas, max_replicas=i.max_replicas,
                            initial_replicas=initial, backend_options=options,
                            drain_grace_s=_GRACES[window, seed])
    summary = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in result.summary.items()}
    return summary, (result if keep else None)


class Pool:
    """``map`` over jobs: in-process for one worker, else a process pool initialised with the inputs."""

    def __init__(self, inputs: TuneInputs, jobs: int) -> None:
        self.inputs, self.jobs = inputs, max(1, jobs)
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Pool:
        _init(self.inputs)
        if self.jobs > 1:
            self._pool = ProcessPoolExecutor(self.jobs, initializer=_init, initargs=(self.inputs,))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def map(self, jobs: Sequence[tuple[Any, ...]]) -> list[tuple[dict[str, Any], Any]]:
        return list(self._pool.map(_job, jobs)) if self._pool is not None else [_job(j) for j in jobs]


# --- the search ------------------------------------------------------------------------------------
def tune(inputs: TuneInputs, trials: int = 30, jobs: int = 2, batch: int = 2, top: int = 3, seeds: int = 3,
         baselines: Sequence[str] = DEFAULT_BASELINES, progress: Callable[[str], None] | None = None,
         runner: Callable[[TuneInputs, int], Any] | None = None,
         on_trial: Callable[[int, int, float | None], None] | None = None) -> TuneResult:
    """Search, re-evaluate the best ``top`` over ``seeds`` seeds on both windows, compare baselines.

    ``runner(inputs, jobs)`` makes what evaluates the runs (default ``Pool``: local processes; see
    ``tune_jobs.Recorded`` for a shared study and workers); ``on_trial(done, trials, best)`` follows the
    search (``best``: the fewest GPU-hours of a trial meeting the target so far, None before one does).
    """
    import optuna

    for name, value, low in (("trials", trials, 1), ("batch", batch, 1), ("top", top, 1), ("seeds", seeds, 1)):
        if not (isinstance(value, int) and value >= low):
            raise ValueError(f"{name}={value!r}: must be an integer >= {low}")
    from simulator.policies import parse_policies

    baseline_names = parse_policies(",".join(baselines)) if baselines else []
    say = progress or (lambda _msg: None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # optuna >= 5 takes constraints from Trial.set_constraint; 4.x only through constraints_func
    native = hasattr(optuna.trial.Trial, "set_constraint")
    constraints: _Constraints = {} if native else {"constraints_func": lambda t: (
        float(t.user_attrs.get("violation", 1.0)),)}
    sampler = optuna.samplers.TPESampler(seed=inputs.seed, n_startup_trials=min(10, max(2, trials // 3)),
                                         **constraints)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    space = search_space()
    study.enqueue_trial(default_point(space))
    found: list[Candidate] = []
    best_so_far: float | None = None
    with (runner or Pool)(inputs, jobs) as pool:
        while len(found) < trials:
            asked = [study.ask() for _ in range(min(batch, trials - len(found)))]
            chosen = [suggest(t, space) for t in asked]
            for trial, s, (summary, _) in zip(asked, chosen, pool.map([(s, "search", inputs.seed, False)
                                                                       for s in chosen]), strict=True):
                run = Run("search", inputs.seed, summary)
                violation = inputs.target - run.attainment  # <= 0: feasible
                trial.set_user_attr("violation", violation)
                if native:
                    trial.set_constraint("slo_attainment", violation)
                study.tell(trial, run.gpu_hours)
                found.append(Candidate(s, trial.number, run))
                if violation <= 0 and (best_so_far is None or run.gpu_hours < best_so_far):
                    best_so_far = run.gpu_hours
            say(f"trial {len(found)}/{trials}")
            if on_trial is not None:
                on_trial(len(found), trials, best_so_far)
        robust = _shortlist(found, inputs.target, top)
        run_seeds = [inputs.seed + k for k in range(seeds)]
        for c in robust:
            c.runs = [c.search]  # the search already ran it on the search window at the main seed
        plan = [(c, w, sd) for c in robust for w in ("search", "holdout") for sd in run_seeds
                if (w, sd) != ("search", inputs.seed)]
        say(f"re-evaluating {len(robust)} candidates: {len(plan)} runs")
        outcomes = pool.map([(c.settings, w, sd, w == "holdout" and sd == inputs.seed) for c, w, sd in plan])
        for (c, w, sd), (summary, full) in zip(plan, outcomes, strict=True):
            c.runs.append(Run(w, sd, summary))
            c.holdout_result = full or c.holdout_result
        best = _pick(robust, inputs.target)
        details = {"recommended": best.holdout_result}
        say(f"baselines on the held-out window: {', '.join(baseline_names)}")
        base_out = pool.map([(n, "holdout", inputs.seed, True) for n in baseline_names])
    base_runs = {}
    for name, (summary, full) in zip(baseline_names, base_out, strict=True):
        base_runs[name] = Run("holdout", inputs.seed, summary)
        details[name] = full
    return TuneResult(inputs, found, robust, best, base_runs, details)


def _shortlist(found: Sequence[Candidate], target: float, top: int) -> list[Candidate]:
    """The ``top`` best distinct candidates: feasible ones by GPU-hours, then the rest by attainment."""
    ranked = sorted(found, key=lambda c: (c.search.attainment < target, c.search.gpu_hours
                                          if c.search.attainment >= target else -c.search.attainment, c.trial))
    out: list[Candidate] = []
    for c in ranked:
        if all(c.settings != o.settings for o in out):
            out.append(c)
        if len(out) == top:
            break
    return out


def _pick(robust: Sequence[Candidate], target: float) -> Candidate:
    """The cheapest candidate whose worst run meets the target; else the one with the best worst run."""
    holding = [c for c in robust if c.holds_up(target)]
    if holding:
        return min(holding, key=lambda c: (c.mean_gpu_hours(), c.trial))
    return max(robust, key=lambda c: (c.worst_attainment(), -c.mean_gpu_hours(), -c.trial))


def limit_runs(inputs: TuneInputs, settings: Settings, limits: Sequence[float | None], jobs: int = 2,
               window: str = "holdout", runner: Callable[[TuneInputs, int], Any] | None = None) -> list[Any]:
    """One run of ``settings`` per gateway limit (None: no limit) on ``window``, starting from half the
    warm fleet so that replicas start at once (``simulator.queue_limit``); full ``AutoscaleResult``s."""
    plan = [(settings, window, inputs.seed, True, {"waiting_tokens_limit": limit, "initial_fraction": 0.5})
            for limit in limits]
    with (runner or Pool)(inputs, min(jobs, len(plan))) as pool:
        return [full for _, full in pool.map(plan)]
