"""Tuning on optuna RDB storage: SQLite-backed workers in other processes, ``--resume``, the CLI flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from leadscale.cli import main
from scaler.profiles import get_profile
from simulator.synthetic import load_workload
from simulator.tune_jobs import (
    JobStore,
    Recorded,
    StudyError,
    decode_inputs,
    decode_job,
    encode_inputs,
    encode_job,
    job_key,
)
from simulator.tuner import Pool, TuneInputs, tune

ROOT = Path(__file__).resolve().parent.parent
TINY = "builtin:poisson?rate=3&duration=400"
SIZES = dict(trials=3, top=2, seeds=2, baselines=["waiting-requests"])


def inputs() -> TuneInputs:
    return TuneInputs(load_workload(TINY, None, seed=0), get_profile("a100-llama3-8b"), target=0.95, seed=3)


def dumps(result: Any) -> str:
    return json.dumps(result.to_json(), sort_keys=True)


def test_inputs_and_jobs_survive_the_database_exactly() -> None:
    from simulator.manifests import DEFAULT_SETTINGS

    i = inputs()
    back = decode_inputs(json.loads(json.dumps(encode_inputs(i))))
    assert np.array_equal(back.workload.arrival_s, i.workload.arrival_s)
    assert np.array_equal(back.workload.input_tokens, i.workload.input_tokens)
    assert back.profile == i.profile and back.workload.name == i.workload.name
    assert (back.target, back.seed, back.cold_start) == (i.target, i.seed, i.cold_start)
    job = (DEFAULT_SETTINGS, "holdout", 4, False, {"waiting_tokens_limit": 2e4})
    assert decode_job(json.loads(json.dumps(encode_job(job)))) == job
    assert job_key(encode_job(job)) != job_key(encode_job((DEFAULT_SETTINGS, "holdout", 5, False)))


def _worker(url: str, study: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "leadscale", "tune-worker", "--storage", url, "--study", study,
                             "--idle-exit", "60"], cwd=ROOT, env=env, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_two_sqlite_workers_give_the_local_result(tmp_path: Path) -> None:
    local = tune(inputs(), jobs=1, **SIZES)  # type: ignore[arg-type]
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    store = JobStore(url, "two-workers")
    store.create(inputs(), resume=False)
    workers = [_worker(url, "two-workers") for _ in range(2)]
    try:
        remote = tune(inputs(), jobs=1, runner=lambda i, j: Recorded(Pool(i, j), store, queue=True, poll_s=0.1,
                                                                    worker_timeout_s=120), **SIZES)  # type: ignore[arg-type]
        store.finish()
        logs = [w.communicate(timeout=120)[1].decode() for w in workers]
    finally:
        for w in workers:
            w.kill()
    assert dumps(remote) == dumps(local)
    done = [int(line.split()[2]) for log in logs for line in log.splitlines() if line.endswith("runs done")]
    assert len(done) == 2 and all(n > 0 for n in done), logs  # both workers simulated some runs
    # every search and re-evaluation run is in the study, each once, with the worker that did it
    runs = store.done()
    assert len(runs) >= 3 + 2 * 3  # 3 trials + 2 candidates x 3 more (window, seed) pairs - repeats


class _Stop(Exception):
    pass


class _StopAfter(Pool):
    """A pool that dies after ``n`` runs (Ctrl-C, a preempted node)."""

    left = 0

    def map(self, jobs: Any) -> Any:
        if _StopAfter.left < len(jobs):
            raise _Stop
        _StopAfter.left -= len(jobs)
        return super().map(jobs)


@pytest.mark.slow
def test_resume_continues_a_stopped_study_and_ends_as_an_uninterrupted_one(tmp_path: Path) -> None:
    plain = tune(inputs(), jobs=1, **SIZES)  # type: ignore[arg-type]
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    store = JobStore(url, "stopped")
    store.create(inputs(), resume=False)
    _StopAfter.left = 4  # two search batches, then it dies
    with pytest.raises(_Stop):
        tune(inputs(), jobs=1, runner=lambda i, j: Recorded(_StopAfter(i, j), store), **SIZES)  # type: ignore[arg-type]
    recorded = len(store.done())
    assert recorded == 3  # the 3 trials (2 + 1) of the search; the re-evaluation never ran
    again = JobStore(url, "stopped")
    with pytest.raises(StudyError, match=r"already exists.*--resume"):
        again.create(inputs(), resume=False)
    again.create(inputs(), resume=True)
    resumed = tune(inputs(), jobs=1, runner=lambda i, j: Recorded(Pool(i, j), again), **SIZES)  # type: ignore[arg-type]
    assert dumps(resumed) == dumps(plain)
    assert again.reused == recorded  # none of them simulated again
    fresh = JobStore(url, "restarted-job")  # --resume=auto: a Job's first attempt starts the study
    fresh.create(inputs(), resume="auto")
    assert fresh.existed and fresh.done() == {}
    other = JobStore(url, "stopped")
    changed = TuneInputs(load_workload(TINY, None, seed=1), get_profile("a100-llama3-8b"), target=0.95, seed=3)
    with pytest.raises(StudyError, match="started with other inputs"):
        other.create(changed, resume=True)


@pytest.mark.parametrize(("extra", "message"), [
    (["--backend", "rdb"], "--backend rdb needs --storage URL"),
    (["--resume"], "--resume needs --storage URL"),
    (["--storage", "sqlite:///{tmp}/x.db", "--resume"], "--resume: there is no study 'leadscale-tune'"),
    (["--storage", "nosuchdb://x"], "--storage 'nosuchdb://x': cannot open it"),
], ids=["rdb-no-storage", "resume-no-storage", "resume-nothing", "bad-url"])
def test_tune_refuses_bad_distribution_flags(extra: list[str], message: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", "--trace", TINY, "--trials", "1", "--out", str(tmp_path / "out"),
            *[a.replace("{tmp}", str(tmp_path)) for a in extra]]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_worker_without_a_study_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune-worker", "--storage", f"sqlite:///{tmp_path / 'w.db'}", "--study", "none",
                 "--idle-exit", "0"]) == 2
    assert "--study 'none': not in" in capsys.readouterr().err
