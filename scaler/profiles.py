"""Performance profiles: everything the simulator needs to know about one vLLM replica.

A profile is a step-time model (``step_time.LinearStepTime``), vLLM's scheduler limits and the KV
memory ledger (``kv_cache.MemoryLedger``), plus a ``source`` note saying where each number came from.
Built-in names read ``<gpu>-<model>[-tp<N>]``; a profile can also be a YAML file (calibration writes
them with ``save_profile``). The built-in step-time coefficients are the output of
``simulator.profile_fit`` on ``shared/profiles`` (Vidur, Splitwise) and published hardware facts,
rounded to 4 significant digits; ``tests/test_profiles.py`` checks they still match.

Scheduler defaults follow vLLM (0.11, v1 engine): ``max_num_seqs``/``max_num_batched_tokens`` are
256/2048 on A100 and 1024/8192 on other GPUs with >= 70 GiB; ``gpu_memory_utilization`` 0.9; block 16;
``scheduler_reserve_full_isl`` on (vLLM 0.32's default; 0.11 had no such gate: set it false for that).

``capacity(ttft_slo_s)`` turns a profile into the ``ReplicaCapacity`` the scaler's policy divides
demand by (see ``capacity`` for the method). It is cached and reads no file, so the live scaler can
resolve ``profile: h100-llama3-8b`` on every metadata parse.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from scaler.capacity import DECODE_REFERENCE_CONTEXT, ReplicaCapacity
from scaler.kv_memory import GIB, MemoryLedger
from scaler.step_time import LinearStepTime, check_jitter_table

DEFAULT_TPOT_SLO_S = 0.1
DEFAULT_CONTEXT_TOKENS = DECODE_REFERENCE_CONTEXT


@dataclass(frozen=True)
class PerformanceProfile:
    """One replica: step-time model, scheduler limits, KV memory ledger, and provenance."""

    name: str
    gpu: str
    model: str
    step_time: LinearStepTime
    memory: MemoryLedger
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    source: str = ""
    scheduler_reserve_full_isl: bool = True
    """vLLM's ``--scheduler-reserve-full-isl`` (default on since it exists; vLLM 0.11 had no such check):
    admit a waiting request only if the free KV blocks hold its whole sequence, not just its first chunk."""
    step_jitter: tuple[float, ...] = ()
    """How real steps without a prefill chunk (decode steps) scatter around ``step_time``: quantiles of real /
    modelled step time at equally spaced probabilities, mean 1 (``simulator.step_jitter``); empty: those steps
    take the model's time. Calibration on timed steps writes it; the built-in profiles have no per-step
    measurement and leave it empty."""
    prefill_step_jitter: tuple[float, ...] = ()
    """The same for steps that run a prefill chunk: measured apart, because a longer step scatters less
    (vLLM 0.32's CPU build: p90 1.17 of the model against 1.34 for decode steps, docs/real-vllm.md)."""

    def __post_init__(self) -> None:
        for key in ("step_jitter", "prefill_step_jitter"):  # a list from YAML or a caller: stored as a tuple
            object.__setattr__(self, key, check_jitter_table(getattr(self, key), f"profile {self.name!r}: {key}"))
        problems = [f"{k}={getattr(self, k)!r}: must be an integer > 0"
                    for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len")
                    if not (isinstance(getattr(self, k), int) and getattr(self, k) > 0)]
        if not problems and self.max_model_len > self.memory.kv_cache_tokens:
            problems.append(f"max_model_len={self.max_model_len}: exceeds the KV cache "
                            f"({self.memory.kv_cache_tokens} tokens); vLLM refuses to start")
        if not isinstance(self.scheduler_reserve_full_isl, bool):
            problems.append(f"scheduler_reserve_full_isl={self.scheduler_reserve_full_isl!r}: must be true or false")
        if problems:
            raise ValueError(f"invalid profile {self.name!r}: " + "; ".join(problems))

    @property
    def tensor_parallel(self) -> int:
        return self.memory.tensor_parallel

    @property
    def block_size(self) -> int:
        return self.memory.block_size

    @property
    def num_gpu_blocks(self) -> int:
        return self.memory.num_gpu_blocks

    @property
    def usable_blocks(self) -> int:
        """KV blocks that hold tokens: vLLM's ``BlockPool`` keeps one of ``num_gpu_blocks`` as its null block."""
        return self.memory.num_gpu_blocks - 1

    @property
    def admission_cap(self) -> int:
        """Tokens of a waiting request the whole-sequence admission gate must fit (``max_model_len``); 0: off."""
        return self.max_model_len if self.scheduler_reserve_full_isl else 0

    def capacity(self, ttft_slo_s: float, tpot_slo_s: float = DEFAULT_TPOT_SLO_S,
                 context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> ReplicaCapacity:
        """What one replica sustains within the SLO; the two rates are *time-shared* by one GPU.

        - Prefill: a full-budget step's linear part ``s_lin`` gives the short-prompt rate ``budget / s_lin``
          and its attention coefficient the length ``K`` at which a prompt token's cost doubles
          (``ReplicaCapacity.prefill_attention_tokens``); derated by the utilisation at which an M/D/1 queue
          of full-budget steps ``s`` (``max_num_batched_tokens`` of a fresh prompt) keeps
          the mean TTFT (``s`` + mean wait ``rho s / 2(1 - rho)``) within the SLO: ``rho = 2(SLO - s) /
          (2 SLO - s)``, clamped to [0.05, 1] (0.05 when one full step alone exceeds the SLO).
        - Decode: the largest batch ``D <= max_num_seqs`` (and within the KV cache at ``context_tokens``
          per sequence) whose decode step stays within ``tpot_slo_s``; ``D / step`` tokens/s.
        The policy adds the two utilisations (rate / capacity) to get the share of a GPU in use.
        """
        return _capacity(self, float(ttft_slo_s), float(tpot_slo_s), int(context_tokens))

    def to_dict(self) -> dict[str, Any]:
        """A plain mapping for YAML and ``leadscale profiles``."""
        return {"name": self.name, "gpu": self.gpu, "model": self.model,
                "max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_model_len": self.max_model_len, "num_gpu_blocks": self.num_gpu_blocks,
                "scheduler_reserve_full_isl": self.scheduler_reserve_full_isl,
                "memory": asdict(self.memory), "step_time": self.step_time.to_dict(),
                **{key: list(getattr(self, key)) for key in ("step_jitter", "prefill_step_jitter")
                   if getattr(self, key)},
                "source": self.source}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "profile") -> PerformanceProfile:
        """Build from a mapping (``num_gpu_blocks`` is derived and ignored); errors name the key."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
        required = ("name", "memory", "step_time", "max_num_seqs", "max_num_batched_tokens", "max_model_len")
        missing = [k for k in required if k not in data]
        known = {*required, "gpu", "model", "source", "num_gpu_blocks", "scheduler_reserve_full_isl", "step_jitter",
                 "prefill_step_jitter"}
        unknown = sorted(set(data) - known)
        if missing or unknown:
            raise ValueError(f"{where}: missing keys {missing}, unknown keys {unknown}; allowed {sorted(known)}")
        try:
            memory = MemoryLedger(**data["memory"])
        except TypeError as exc:
            raise ValueError(f"{where}.memory: {exc}; allowed {sorted(MemoryLedger.__dataclass_fields__)}") from None
        limits = {}
        for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = data[k]
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{where}.{k}={value!r}: must be an integer > 0")
            limits[k] = value
        return cls(name=str(data["name"]), gpu=str(data.get("gpu", "")), model=str(data.get("model", "")),
                   step_time=LinearStepTime.from_dict(data["step_time"]), memory=memory,
                   source=str(data.get("source", "")),
                   scheduler_reserve_full_isl=data.get("scheduler_reserve_full_isl", True),
                   step_jitter=check_jitter_table(data.get("step_jitter", []), f"{where}.step_jitter"),
                   prefill_step_jitter=check_jitter_table(data.get("prefill_step_jitter", []),
                                                          f"{where}.prefill_step_jitter"), **limits)


@functools.lru_cache(maxsize=256)
def _capacity(profile: PerformanceProfile, ttft_slo_s: float, tpot_slo_s: float,
              context_tokens: int) -> ReplicaCapacity:
    for name, value in (("ttft_slo_s", ttft_slo_s), ("tpot_slo_s", tpot_slo_s)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}={value!r}: must be a finite number of seconds > 0")
    if context_tokens < 1:
        raise ValueError(f"context_tokens={context_tokens!r}: must be an integer >= 1")
    st = profile.step_time
    budget = profile.max_num_batched_tokens
    s = st.step_time(budget, 1, 0.0, budget * budget / 2.0, 1)
    rho = min(1.0, max(0.05, 2.0 * (ttft_slo_s - s) / (2.0 * ttft_slo_s - s))) if ttft_slo_s > s else 0.05
    kv_tokens = profile.memory.kv_cache_tokens
    d_max = max(1, min(profile.max_num_seqs, kv_tokens // context_tokens))
    batch = np.arange(1, d_max + 1, dtype=np.float64)
    times = np.array([st.step_time(int(d), int(d), d * context_tokens, 0.0) for d in batch])
    within = np.nonzero(times <= tpot_slo_s)[0]
    best = int(within[-1]) if within.size else 0
    # prefill: the linear part of a full-budget step sets the short-prompt rate; causal attention
    # (seconds = prefill_attention_s x n^2 / 2) adds n / 2K per token with K = linear seconds per token / a
    linear = st.step_time(budget, 1, 0.0, 0.0, 1)
    attention = float(getattr(st, "prefill_attention_s", 0.0) or 0.0)
    # decode: a generated token costs per_token + per_seq (its share of the linear layers and of the
    # per-sequence work) plus per_context_token x its context; K_d is their ratio
    per_context = float(getattr(st, "per_context_token_s", 0.0) or 0.0)
    marginal = float(getattr(st, "per_token_s", 0.0) or 0.0) + float(getattr(st, "per_seq_s", 0.0) or 0.0)
    return ReplicaCapacity(prefill_tokens_per_s=float(rho * budget / linear),
                           decode_tokens_per_s=float(batch[best] / times[best]),
                           max_num_seqs=profile.max_num_seqs, kv_cache_tokens=int(kv_tokens),
                           prefill_attention_tokens=float(linear / budget / attention) if attention > 0 else None,
                           decode_context_tokens=(marginal / per_context if per_context > 0 and marginal > 0
                                                  and context_tokens == DEFAULT_CONTEXT_TOKENS else None))


def _llama3_8b(gpu: str, gib: float, seqs: int, budget: int, activation: float,
               step: dict[str, float], how: str) -> PerformanceProfile:
    memory = MemoryLedger(gpu_memory_gib=gib, gpu_memory_utilization=0.9, weights_gib=round(8.03e9 * 2 / GIB, 2),
                          activation_gib=activation, kv_bytes_per_token=131072)
    return PerformanceProfile(
        name=f"{gpu}-llama3-8b", gpu=gpu, model="Llama-3.1-8B (32 layers, 8 KV heads x 128, bf16)",
        step_time=LinearStepTime(**step), memory=memory, max_num_seqs=seqs, max_num_batched_tokens=budget,
        max_model_len=131072,
        source=(f"step time: {how}; analytic LM head, attention and 1 ms CPU overhead (simulator/profile_fit.py). "
                f"Memory: {gib} GiB GPU, weights 8.03e9 x 2 B, activation/graphs {activation} GiB (estimate), "
                f"KV 128 KiB/token. Limits: vLLM 0.11 defaults for this GPU."))


def _llama2_70b(gpu: str, gib: float, seqs: int, budget: int, step: dict[str, float]) -> PerformanceProfile:
    memory = MemoryLedger(gpu_memory_gib=gib, gpu_memory_utilization=0.9, weights_gib=round(68.98e9 * 2 / GIB, 2),
                          activation_gib=2.5, kv_bytes_per_token=327680, tensor_parallel=4)
    return PerformanceProfile(
        name=f"{gpu}-llama2-70b-tp4", gpu=gpu, model="Llama-2-70B (80 layers, 8 KV heads x 128, bf16), TP 4",
        step_time=LinearStepTime(**step), memory=memory, max_num_seqs=seqs, max_num_batched_tokens=budget,
        max_model_len=4096,
        source=(f"step time: robust least-squares fit to Splitwise end-to-end prompt/token times, llama2-70b "
                f"{gpu}-80gb TP4 (shared/profiles/splitwise/perf_model.csv, simulator/profile_fit.py). Memory: "
                f"{gib} GiB per GPU, weights 68.98e9 x 2 B over 4 GPUs, activation 2.5 GiB/GPU (estimate), "
                f"KV 320 KiB/token. Limits: vLLM 0.11 defaults for this GPU."))


_VIDUR_A100 = "Vidur a100_llama3_8b linear layers x 32, fitted max(floor, intercept + per_token N)"
_VIDUR_H100 = "Vidur a100_llama3_8b x (h100/a100 llama2_7b ratio per token count), fitted"
_BUILTIN: dict[str, PerformanceProfile] = {p.name: p for p in (
    _llama3_8b("a100", 80.0, 256, 2048, 1.5, dict(
        overhead_s=0.001, floor_s=0.0112, intercept_s=0.005444, per_token_s=6.695e-05, per_seq_s=1.674e-05,
        per_context_token_s=9.183e-08, prefill_attention_s=3.361e-09), _VIDUR_A100),
    _llama3_8b("h100", 79.6, 1024, 8192, 2.0, dict(
        overhead_s=0.001, floor_s=0.006896, intercept_s=0.005171, per_token_s=2.045e-05, per_seq_s=1.212e-05,
        per_context_token_s=5.589e-08, prefill_attention_s=1.06e-09), _VIDUR_H100),
    _llama3_8b("h200", 140.4, 1024, 8192, 2.0, dict(
        overhead_s=0.001, floor_s=0.004813, intercept_s=0.003609, per_token_s=2.045e-05, per_seq_s=1.212e-05,
        per_context_token_s=3.901e-08, prefill_attention_s=1.06e-09),
        _VIDUR_H100 + "; floor, intercept and KV reads x 3.35/4.8 (HBM bandwidth H100/H200)"),
    _llama2_70b("a100", 80.0, 256, 2048, dict(
        overhead_s=0.0, floor_s=0.04378, intercept_s=0.0, per_token_s=0.0002495, per_seq_s=0.0002452,
        per_context_token_s=2.398e-07, prefill_attention_s=2.151e-09)),
    _llama2_70b("h100", 79.6, 1024, 8192, dict(
        overhead_s=0.0, floor_s=0.02903, intercept_s=0.008166, per_token_s=9.989e-05, per_seq_s=0.0002885,
        per_context_token_s=4.083e-08, prefill_attention_s=3.517e-09)),
)}


def list_profiles() -> list[str]:
    """Names of the built-in profiles, sorted."""
    return sorted(_BUILTIN)


def get_profile(name_or_path: str | Path) -> PerformanceProfile:
    """A built-in profile by name, or a YAML profile file by path (``.yaml``/``.yml`` or an existing file)."""
    key = str(name_or_path)
    if key in _BUILTIN:
        return _BUILTIN[key]
    path = Path(key)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return load_profile(path)
    raise KeyError(f"unknown profile {key!r}: use one of {list_profiles()} or a path to a YAML profile")


def load_profile(path: str | Path) -> PerformanceProfile:
    """Read a YAML profile (as ``save_profile`` writes it)."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"profile file {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"profile file {path}: not valid YAML ({exc})") from None
    return PerformanceProfile.from_dict(data, where=str(path))


def save_profile(profile: PerformanceProfile, path: str | Path) -> None:
    """Write ``profile`` as YAML (round-trips through ``load_profile``)."""
    import yaml

    Path(path).write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False))


def with_overrides(profile: PerformanceProfile, **changes: Any) -> PerformanceProfile:
    """A copy with scheduler limits or fields replaced (validated again)."""
    return replace(profile, **changes)
