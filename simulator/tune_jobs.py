"""Tuning runs beyond one machine: optuna's RDB storage as the job queue, the result record and ``--resume``.

The tuner's search stays in one process (the coordinator): it alone asks and tells optuna's seeded
sampler, in a fixed order, so the recommendation is the same whoever evaluates the runs. What is
distributed is the runs (``tuner._job``: one simulation each). With ``--storage URL`` (any SQLAlchemy
URL optuna takes: ``sqlite:///tune.db`` on one machine, ``postgresql://...`` shared by Kubernetes Jobs):

- every run is a trial of the study ``NAME`` (``--study``), keyed by a digest of the run (settings,
  window, seed, overrides); its summary is a user attribute once done. ``--resume`` replays the search
  from the start and takes every recorded summary instead of simulating again, so a stopped study
  continues where it stopped and ends exactly as an uninterrupted one would;
- with ``--backend rdb`` the coordinator only enqueues runs (optuna's WAITING trials) and waits;
  workers (``leadscale tune-worker --storage URL --study NAME``, as many as you like, anywhere that
  reaches the database) claim them one at a time (optuna's atomic WAITING -> RUNNING update), simulate
  and write the summary. A worker that dies stops its heartbeat; its run goes back to the queue.
  The workload and profile travel in the study itself (arrays as ``.npz``, no pickle), so workers need
  no trace file, only the same leadscale version.
Runs whose full result the report plots (``keep``) are simulated by the coordinator itself.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

if TYPE_CHECKING:  # optuna is imported where used (the sim extra; a tune-worker's start-up)
    import optuna
    from optuna.trial import FrozenTrial

VERSION = 1  # of the job and inputs encodings below
HEARTBEAT_S = 20
GRACE_S = 120  # a RUNNING run whose worker is silent this long goes back to the queue


class StudyError(ValueError):
    """A storage, study or resume problem, naming the flag to change."""


# ----- encodings ------------------------------------------------------------------------------------------
def encode_job(job: tuple[Any, ...]) -> dict[str, Any]:
    """``tuner._job``'s tuple as JSON: settings (or a baseline policy name), window, seed, overrides."""
    from simulator.manifests import Settings

    what, window, seed = job[:3]
    overrides = dict(job[4]) if len(job) > 4 else {}
    return {"settings": asdict(what) if isinstance(what, Settings) else None,
            "policy": None if isinstance(what, Settings) else str(what),
            "window": str(window), "seed": int(seed), "overrides": overrides}


def decode_job(data: dict[str, Any]) -> tuple[Any, ...]:
    from simulator.manifests import Settings

    what: Any = Settings(**data["settings"]) if data["settings"] is not None else data["policy"]
    return (what, data["window"], int(data["seed"]), False, dict(data["overrides"]))


def job_key(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:24]


def plain(value: Any) -> Any:
    """JSON-able copy of a summary (numpy scalars to Python, tuples to lists, non-finite floats to None)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def encode_inputs(inputs: Any) -> dict[str, Any]:
    """``TuneInputs`` as JSON: the workload's arrays in a base64 ``.npz``, the profile as its mapping."""
    w = inputs.workload
    arrays = {"arrival_s": w.arrival_s, "input_tokens": w.input_tokens, "output_tokens": w.output_tokens}
    if w.block_ids is not None:
        arrays.update(block_ids=w.block_ids, block_offsets=w.block_offsets)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    rest = {f.name: getattr(inputs, f.name) for f in fields(inputs) if f.name not in ("workload", "profile")}
    return {"version": VERSION, "profile": inputs.profile.to_dict(), **rest,
            "workload": {"npz": base64.b64encode(buf.getvalue()).decode(), "name": w.name,
                         "skipped_rows": w.skipped_rows, "origin_s": w.origin_s, "block_tokens": w.block_tokens,
                         "meta": dict(w.meta)}}


def decode_inputs(data: dict[str, Any]) -> Any:
    from scaler.profiles import PerformanceProfile
    from simulator.tuner import TuneInputs
    from simulator.workload import Workload

    if data.get("version") != VERSION:
        raise StudyError(f"the study's inputs have encoding version {data.get('version')!r}, this leadscale reads "
                         f"{VERSION}: run workers of the coordinator's leadscale version")
    wd = dict(data["workload"])
    with np.load(io.BytesIO(base64.b64decode(wd.pop("npz"))), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    workload = Workload(**arrays, **wd)
    rest = {k: v for k, v in data.items() if k not in ("version", "profile", "workload")}
    return TuneInputs(workload=workload, profile=PerformanceProfile.from_dict(data["profile"]), **rest)


def inputs_digest(encoded: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(encoded, sort_keys=True).encode()).hexdigest()[:24]


# ----- the study ------------------------------------------------------------------------------------------
class _RetryCallback(TypedDict, total=False):
    """RDBStorage's retry of a run whose worker went silent, by the name this optuna gives it."""

    heartbeat_stale_trial_callback: Callable[[optuna.Study, FrozenTrial], None]
    failed_trial_callback: Callable[[optuna.Study, FrozenTrial], None]


def open_storage(url: str) -> optuna.storages.RDBStorage:
    import optuna

    # SQLite: writers from several processes wait for the lock instead of failing at once
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    try:
        with warnings.catch_warnings():  # heartbeats are "experimental" in optuna's words since 2.8
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # a run whose worker went silent goes back to the queue (optuna >= 4.9 renamed the callback)
            retry: _RetryCallback
            if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):
                retry = {"heartbeat_stale_trial_callback": optuna.storages.RetryHeartbeatStaleTrialCallback(3)}
            else:
                retry = {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback(max_retry=3)}
            return optuna.storages.RDBStorage(url, engine_kwargs=engine, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S, **retry)
    except Exception as exc:  # SQLAlchemy's errors: bad URL, unreachable server, missing driver
        raise StudyError(f"--storage {url!r}: cannot open it ({type(exc).__name__}: {exc}); expected an "
                         "SQLAlchemy URL such as sqlite:///tune.db or postgresql://user:pass@host/db") from None


class JobStore:
    """The runs of one tuning study in an optuna RDB storage: queue, results, resume."""

    def __init__(self, url: str, study: str) -> None:
        import optuna

        self.url, self.name = url, study
        self.reused = 0  # runs taken from the record instead of simulated (resume)
        self.storage = open_storage(url)
        self._optuna = optuna
        try:
            self.study: optuna.Study | None = optuna.load_study(study_name=study, storage=self.storage)
            self.existed = True
        except KeyError:
            self.study = None
            self.existed = False

    def create(self, inputs: Any, resume: bool | str | None, extra: dict[str, Any] | None = None) -> None:
        """Coordinator: a new study holding ``inputs``, or (``resume``) the existing one if its inputs match;
        ``resume="auto"``: the existing one if there is one, else a new one."""
        encoded = encode_inputs(inputs)
        digest = inputs_digest({**encoded, "extra": extra or {}})
        if self.existed and not resume:
            raise StudyError(f"--study {self.name!r} already exists in {self.url}: --resume to continue it, or "
                             "another --study name")
        if not self.existed:
            if resume and resume != "auto":
                raise StudyError(f"--resume: there is no study {self.name!r} in {self.url} to continue")
            self.study = self._optuna.create_study(study_name=self.name, storage=self.storage, direction="minimize")
            self.study.set_user_attr("inputs", encoded)
            self.study.set_user_attr("digest", digest)
            self.existed = True
        elif self._opened().user_attrs.get("digest") != digest:
            raise StudyError(f"--resume: study {self.name!r} was started with other inputs (workload, profile, SLO, "
                             "seed, target, holdout, replicas or search sizes): give the same flags, or a new --study")
        self._opened().set_user_attr("finished", False)

    def _opened(self) -> optuna.Study:
        """The study, which ``__init__`` found or ``create`` made: what every method past those needs."""
        assert self.study is not None
        return self.study

    def inputs(self) -> Any:
        assert self.study is not None
        return decode_inputs(self.study.user_attrs["inputs"])

    def finish(self) -> None:
        if self.study is not None:
            self.study.set_user_attr("finished", True)

    @property
    def finished(self) -> bool:
        return bool(self.study is not None and self._study_attrs().get("finished"))

    def _study_attrs(self) -> dict[str, Any]:
        return self.storage.get_study_user_attrs(self._opened()._study_id)

    def done(self) -> dict[str, dict[str, Any]]:
        """key -> summary of every finished run."""
        from optuna.trial import TrialState

        out = {}
        for t in self.storage.get_all_trials(self._opened()._study_id, deepcopy=False, states=(TrialState.COMPLETE,)):
            if "summary" in t.user_attrs:
                out[t.user_attrs["key"]] = t.user_attrs["summary"]
        return out

    def failed(self) -> dict[str, str]:
        """key -> error of every run a worker gave up on (its exception)."""
        from optuna.trial import TrialState

        return {t.user_attrs["key"]: t.user_attrs["error"] for t in self.storage.get_all_trials(
            self._opened()._study_id, deepcopy=False, states=(TrialState.FAIL,)) if "error" in t.user_attrs}

    def pending_keys(self) -> set[str]:
        from optuna.trial import TrialState

        return {t.user_attrs["key"] for t in self.storage.get_all_trials(
            self._opened()._study_id, deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))}

    def enqueue(self, data: dict[str, Any]) -> None:
        self._opened().enqueue_trial({}, user_attrs={"key": job_key(data), "job": data})

    def record(self, data: dict[str, Any], summary: dict[str, Any]) -> None:
        """A run done here (not through the queue): a finished trial with its summary."""
        from optuna.trial import TrialState, create_trial

        self._opened().add_trial(create_trial(state=TrialState.COMPLETE, value=0.0,
                                          user_attrs={"key": job_key(data), "job": data, "summary": plain(summary)}))

    def requeue_stale(self) -> None:
        """Runs whose worker stopped its heartbeat: failed, and (optuna's retry callback) enqueued again."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", self._optuna.exceptions.ExperimentalWarning)
            self._optuna.storages.fail_stale_trials(self._opened())

    def claim(self) -> tuple[int, dict[str, Any]] | None:
        """Worker: take one waiting run (atomically), or None when there is none."""
        from optuna.trial import TrialState

        for t in self.storage.get_all_trials(self._opened()._study_id, deepcopy=False, states=(TrialState.WAITING,)):
            try:
                if self.storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                    return t._trial_id, t.user_attrs["job"]
            except self._optuna.exceptions.UpdateFinishedTrialError:
                continue
        return None


# ----- runners --------------------------------------------------------------------------------------------
class Recorded:
    """Any runner with a record: runs already in the store are taken from it, new ones are written to it.

    ``queue``: send the runs that need no full result to the store's workers instead of ``inner``.
    """

    def __init__(self, inner: Any, store: JobStore, queue: bool = False, poll_s: float = 0.5,
                 worker_timeout_s: float = 900.0, on_wait: Callable[[int, int], None] | None = None) -> None:
        self.inner, self.store, self.queue = inner, store, queue
        self.poll_s, self.worker_timeout_s, self.on_wait = poll_s, worker_timeout_s, on_wait

    def __enter__(self) -> Recorded:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.__exit__(*exc)

    def map(self, jobs: Sequence[tuple[Any, ...]]) -> list[tuple[dict[str, Any], Any]]:
        encoded = [encode_job(j) for j in jobs]
        keys = [job_key(d) for d in encoded]
        have = self.store.done()
        out: list[tuple[dict[str, Any], Any] | None] = [None] * len(jobs)
        local, remote = [], []
        for i, (job, key) in enumerate(zip(jobs, keys, strict=True)):
            keep = len(job) > 3 and bool(job[3])
            if key in have and not keep:
                out[i] = (have[key], None)
                self.store.reused += 1
            elif self.queue and not keep:
                remote.append(i)
            else:
                local.append(i)
        if remote:
            pending = self.store.pending_keys()
            for i in dict.fromkeys(remote):
                if keys[i] not in pending:
                    self.store.enqueue(encoded[i])
                    pending.add(keys[i])
        for i, result in zip(local, self.inner.map([jobs[i] for i in local]), strict=True):
            summary = plain(result[0])
            out[i] = (summary, result[1])
            if keys[i] not in have:
                self.store.record(encoded[i], summary)
        if remote:
            self._wait(remote, keys, out)
        return out  # type: ignore[return-value]

    def _wait(self, remote: list[int], keys: list[str], out: list[Any]) -> None:
        last_progress, left = time.monotonic(), set(remote)
        while left:
            have = self.store.done()
            for i in [i for i in left if keys[i] in have]:
                out[i] = (have[keys[i]], None)
                left.discard(i)
                last_progress = time.monotonic()
            if not left:
                break
            self.store.requeue_stale()
            errors = self.store.failed()
            bad = [i for i in left if keys[i] in errors]
            if bad:
                raise StudyError(f"--backend rdb: a worker failed run {keys[bad[0]]} of study {self.store.name!r}: "
                                 f"{errors[keys[bad[0]]]}")
            if self.on_wait is not None:
                self.on_wait(len(remote) - len(left), len(remote))
            if time.monotonic() - last_progress > self.worker_timeout_s:
                raise StudyError(f"--backend rdb: no worker finished a run in {self.worker_timeout_s:g} s "
                                 f"({len(left)} waiting in study {self.store.name!r}); start workers: leadscale "
                                 f"tune-worker --storage URL --study {self.store.name}")
            time.sleep(self.poll_s)


def work(url: str, study: str, idle_exit_s: float = 60.0, max_runs: int | None = None,
         say: Callable[[str], None] | None = None) -> int:
    """Worker loop: claim runs of ``study`` and simulate them until it is finished (or idle ``idle_exit_s``,
    or ``max_runs`` done); returns the runs done here."""
    from simulator import tuner

    store = JobStore(url, study)
    deadline = time.monotonic() + idle_exit_s
    while store.study is None:  # the coordinator may not have created it yet
        if time.monotonic() > deadline:
            raise StudyError(f"--study {study!r}: not in {url} after {idle_exit_s:g} s (is the coordinator running?)")
        time.sleep(1.0)
        store = JobStore(url, study)
    tuner._init(store.inputs())
    done, idle_since = 0, time.monotonic()
    while max_runs is None or done < max_runs:
        claimed = store.claim()
        if claimed is None:
            if store.finished or time.monotonic() - idle_since > idle_exit_s:
                break
            time.sleep(0.5)
            continue
        trial_id, data = claimed
        beat = _Heartbeat(store.storage, trial_id)
        try:
            summary, _ = tuner._job(decode_job(data))
        except Exception as exc:
            from optuna.trial import TrialState

            beat.stop()
            store.storage.set_trial_user_attr(trial_id, "error", f"{type(exc).__name__}: {exc}")
            store.storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
            raise
        beat.stop()
        idle_since = time.monotonic()
        from optuna.trial import TrialState

        try:
            store.storage.set_trial_user_attr(trial_id, "summary", plain(summary))
            store.storage.set_trial_user_attr(trial_id, "worker", f"{os.uname().nodename}:{os.getpid()}")
            store.storage.set_trial_state_values(trial_id, state=TrialState.COMPLETE, values=[0.0])
        except store._optuna.exceptions.UpdateFinishedTrialError:
            # our heartbeat was judged stale (a starved machine) and the run was failed and requeued:
            # its retry computes the same seeded result, so this copy is dropped, not an error
            if say is not None:
                say(f"run of trial {trial_id} was requeued while it ran; its retry stands")
            continue
        done += 1
        if say is not None:
            say(f"run {done} done (trial {trial_id})")
    return done


class _Heartbeat:
    """Records the worker's heartbeat on a running trial while it simulates (optuna's stale-trial rule)."""

    def __init__(self, storage: Any, trial_id: int) -> None:
        self._stop = threading.Event()
        storage.record_heartbeat(trial_id)

        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                storage.record_heartbeat(trial_id)

        self._thread = threading.Thread(target=beat, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
