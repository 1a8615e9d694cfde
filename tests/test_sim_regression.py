"""Pinned results: the replica model and the autoscaled loop give these exact numbers for these seeds.

Speed work must not change what the simulator says. Each case runs a small workload and hashes the
per-request columns that every summary is computed from (first token, finish, first scheduled,
status, replica, preemptions; floats rounded to 1e-9 s so that a harmless change of float rounding
does not trip it) and pins a few summary values. The digests were computed before the speed work of
issue 15 (``python tests/test_sim_regression.py`` prints them); a change that alters a result, on
purpose or not, fails here and must update them with a reason in its commit.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if __name__ == "__main__":  # printing the digests: run from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scaler.profiles import get_profile
from simulator.engine import simulate
from simulator.synthetic import builtin
from simulator.workload import Workload, select_window

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"


def _columns_digest(log: Any) -> str:
    h = hashlib.sha256()
    for col in (log.first_token_s, log.finish_s, log.first_scheduled_s):
        h.update(np.round(np.nan_to_num(col, nan=-1.0), 9).tobytes())
    for col in (log.status, log.replica, log.preemptions, log.generated):
        h.update(np.ascontiguousarray(col, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def _ttft_digest(arrival: np.ndarray, ttft: np.ndarray, status: np.ndarray | None) -> str:
    h = hashlib.sha256()
    h.update(np.round(np.nan_to_num(ttft, nan=-1.0), 9).tobytes())
    if status is not None:
        h.update(np.ascontiguousarray(status, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def _fixed(w: Workload, profile: str, replicas: int, **kw: Any) -> tuple[str, dict[str, Any]]:
    res = simulate(w, get_profile(profile), replicas=replicas, **kw)
    s = res.summary()
    return _columns_digest(res.log), {k: s[k] for k in ("completed", "preemptions", "ttft_p99", "itl_p50",
                                                        "kv_usage_max", "duration_s")}


def _mooncake() -> Workload:
    from simulator.readers import load_trace

    return select_window(load_trace(TRACES / "mooncake_synthetic.jsonl"), 0, 600)


def _autoscaled(policy: str) -> tuple[str, dict[str, Any]]:
    from simulator.autoscale import run_autoscaled

    w = builtin("default", seed=3, rate=12.0, duration=900.0)
    res = run_autoscaled(w, get_profile("h100-llama3-8b"), policy, "lognormal:p50=60,p90=120", 2.0, 3)
    s = res.summary
    return _ttft_digest(res.arrival_s, res.ttft_s, res.status), {k: s.get(k) for k in ("gpu_hours", "ttft_p95",
                                                                                        "slo_attainment")}


CASES: dict[str, Callable[[], tuple[str, dict[str, Any]]]] = {
    "poisson-30-2rep": lambda: _fixed(builtin("poisson", seed=0, rate=30.0, duration=120.0), "h100-llama3-8b", 2),
    "poisson-100-10rep": lambda: _fixed(builtin("poisson", seed=1, rate=100.0, duration=60.0), "h100-llama3-8b", 10),
    "overload-preempt-a100": lambda: _fixed(builtin("poisson", seed=2, rate=14.0, duration=90.0), "a100-llama3-8b", 1),
    "gamma-random-router": lambda: _fixed(builtin("gamma", seed=4, rate=40.0, duration=60.0, cv=3.0),
                                          "h100-llama3-8b", 3, router="random", seed=7),
    "round-robin-70b": lambda: _fixed(builtin("default", seed=5, rate=6.0, duration=120.0), "a100-llama2-70b-tp4", 2,
                                      router="round-robin"),
    "waiting-limit": lambda: _fixed(builtin("poisson", seed=6, rate=60.0, duration=60.0), "h100-llama3-8b", 1,
                                    waiting_tokens_limit=20_000.0),
    "mooncake-prefix": lambda: _fixed(_mooncake(), "h100-llama3-8b", 3),
    "mooncake-prefix-preempt": lambda: _fixed(_mooncake(), "h100-llama3-8b", 1),
    "preempt-heavy": lambda: _fixed(builtin("poisson", seed=8, rate=80.0, duration=60.0), "h100-llama3-8b", 1),
    "bursty-preempt-2rep": lambda: _fixed(builtin("default", seed=9, rate=40.0, duration=120.0), "h100-llama3-8b", 2),
    "autoscaled-leadscale": lambda: _autoscaled("leadscale"),
    "autoscaled-waiting-requests": lambda: _autoscaled("waiting-requests"),
}

# name -> (digest of the per-request columns or TTFTs, pinned summary values); computed before issue 15,
# re-pinned by issue 12, by vLLM 0.32's admission gate and null block, and by finished requests' hashed
# blocks in the free queue (PrefixCache.retire) where a change of the model moved them (see those commits' messages)
PINNED: dict[str, tuple[str, dict[str, Any]]] = {
    'poisson-30-2rep': ('4c8badcca8e40ff5', {
        'completed': 3602, 'preemptions': 0, 'ttft_p99': 0.17104215394507466,
        'itl_p50': 0.013883533099290456, 'kv_usage_max': 0.26490444722271833, 'duration_s': 134.9420367111554,
    }),
    'poisson-100-10rep': ('2f4d1878848b2df8', {
        'completed': 5986, 'preemptions': 0, 'ttft_p99': 0.13087097291779887,
        'itl_p50': 0.010292005271944286, 'kv_usage_max': 0.094909805322379, 'duration_s': 74.77534798852899,
    }),
    'overload-preempt-a100': ('ca14c7e5680890c3', {
        'completed': 1249, 'preemptions': 0, 'ttft_p99': 55.679535106429356,
        'itl_p50': 0.1747833262418219, 'kv_usage_max': 0.7662739581501671, 'duration_s': 180.72469625199557,
    }),
    'gamma-random-router': ('c529a8e4c15e06bb', {
        'completed': 2380, 'preemptions': 0, 'ttft_p99': 0.38892917471969146,
        'itl_p50': 0.012232071190499313, 'kv_usage_max': 0.3156277906769066, 'duration_s': 78.85812094968288,
    }),
    'round-robin-70b': ('05db14803e36566a', {
        'completed': 811, 'preemptions': 0, 'ttft_p99': 41.095889265301615,
        'itl_p50': 0.13883533099290457, 'kv_usage_max': 0.5792344372591286, 'duration_s': 256.88716077095916,
    }),
    'waiting-limit': ('cfbeef7a97b061f6', {
        'completed': 1562, 'preemptions': 24, 'ttft_p99': 1.278729359643148,
        'itl_p50': 0.0599100938611354, 'kv_usage_max': 0.9993213073763172, 'duration_s': 86.32700249826541,
    }),
    'mooncake-prefix': ('1c85a6ae093ba7a6', {
        'completed': 2251, 'preemptions': 0, 'ttft_p99': 3.797057937300224,
        'itl_p50': 0.01017419366180605, 'kv_usage_max': 0.3613859617788891, 'duration_s': 604.86666820258,
    }),
    'mooncake-prefix-preempt': ('f69e1d60cdbbf7b3', {
        'completed': 2251, 'preemptions': 3, 'ttft_p99': 624.5530700695504,
        'itl_p50': 0.05655877570891538, 'kv_usage_max': 0.999106983389891, 'duration_s': 1233.7212294977896,
    }),
    'preempt-heavy': ('445d4cd02ed6c550', {
        'completed': 4822, 'preemptions': 169, 'ttft_p99': 170.82594220084906,
        'itl_p50': 0.06878599123088075, 'kv_usage_max': 1.0, 'duration_s': 259.0327090015453,
    }),
    'bursty-preempt-2rep': ('479a0993cebd4bc9', {
        'completed': 5055, 'preemptions': 136, 'ttft_p99': 21.194247458964924,
        'itl_p50': 0.05217951042390023, 'kv_usage_max': 0.999607072691552, 'duration_s': 156.44285589519066,
    }),
    'autoscaled-leadscale': ('23cab4882e428c45', {
        'gpu_hours': 0.41215606893737483, 'ttft_p95': 0.21282165799689115, 'slo_attainment': 0.9998197711093089,
    }),
    'autoscaled-waiting-requests': ('96b6eb3d6e2169ee', {
        'gpu_hours': 1.0621535809924292, 'ttft_p95': 2.497753288788609, 'slo_attainment': 0.925475353699198,
    }),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_results_are_pinned(name: str) -> None:
    if name == "mooncake-prefix" and not (TRACES / "mooncake_synthetic.jsonl").exists():
        from tests.conftest import require

        require(False, f"the Mooncake trace {TRACES / 'mooncake_synthetic.jsonl'}")
    digest, values = CASES[name]()
    want_digest, want_values = PINNED[name]
    assert values == pytest.approx(want_values, rel=1e-9, abs=1e-12)
    assert digest == want_digest, f"{name}: per-request results changed ({digest} != {want_digest})"


if __name__ == "__main__":
    for case, fn in CASES.items():
        print(f"    {case!r}: {fn()!r},")  # paste into PINNED (ruff format wraps the lines)
