"""Derive the built-in profiles' step-time coefficients from the measured data in ``shared/profiles``.

``scaler.profiles`` hard-codes the results (so ``get_profile`` reads no file and stays cheap); this
module is the code that produced them, and ``tests/test_profiles.py`` re-runs it to check that the
constants still match the data. Run ``python -m simulator.profile_fit DIR`` to print them.

Sources and method (each built-in profile repeats this in its ``source`` note):
- Llama-3-8B linear layers: Vidur operator timings (``vidur/a100_llama3_8b_mlp.csv``, TP 1, median ms
  per layer x 32 layers + embedding), fitted as ``max(floor, intercept + per_token * N)``.
- H100: the A100 Llama-3-8B curve times the H100/A100 ratio measured on Llama-2-7B at the same token
  count (Vidur has no H100 Llama-3-8B file). H200: H100 with the memory-bound terms
  scaled by bandwidth 3.35/4.8 TB/s (floor, intercept, KV reads); same compute.
- Terms Vidur does not measure, from hardware facts: LM head weight read (floor) and FLOPs (per
  sequence), decode attention = KV bytes / (70 % of HBM bandwidth), prefill attention = 4 * layers *
  hidden FLOPs per (query, key) pair at 50 % of dense BF16 peak, 1 ms CPU/scheduling overhead per
  step and 10 us per sequence (assumptions; calibration replaces them).
- Llama-2-70B TP4: a robust least-squares fit of every coefficient to Splitwise's end-to-end
  ``prompt_time`` (prefill) and ``token_time`` (decode) measurements (``splitwise/perf_model.csv``).
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scaler.step_time import LinearStepTime, StepSample, fit_linear_knee, fit_step_samples

VIDUR_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
CPU_OVERHEAD_S = 1.0e-3
CPU_PER_SEQ_S = 10e-6
HBM_EFFICIENCY = 0.7
FLOP_EFFICIENCY = 0.5


@dataclass(frozen=True)
class Gpu:
    """Published per-GPU facts (dense BF16 FLOP/s, HBM bytes/s, memory as the driver reports it)."""

    name: str
    memory_gib: float
    bandwidth: float
    flops: float


GPUS = {
    "a100": Gpu("a100-sxm4-80gb", 80.0, 2.039e12, 312e12),
    "h100": Gpu("h100-sxm5-80gb", 79.6, 3.35e12, 989e12),
    "h200": Gpu("h200-sxm-141gb", 140.4, 4.8e12, 989e12),
}


@dataclass(frozen=True)
class Model:
    """Architecture facts that set memory and the analytic terms."""

    name: str
    params: float
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


MODELS = {
    "llama3-8b": Model("Llama-3.1-8B", 8.03e9, 32, 32, 8, 128, 128256),
    "llama2-70b": Model("Llama-2-70B", 68.98e9, 80, 64, 8, 128, 32000),
}


def vidur_linear_stack(path: Path, layers: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, seconds) of one forward pass's linear layers and norms from a Vidur MLP profile (TP 1)."""
    tokens, seconds = [], []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["num_tensor_parallel_workers"] != "1":
                continue
            per_layer = sum(float(row[f"time_stats.{op}.median"]) for op in VIDUR_OPS)
            tokens.append(int(row["num_tokens"]))
            seconds.append((layers * per_layer + float(row["time_stats.emb.median"])) / 1e3)
    order = np.argsort(tokens, kind="stable")
    return np.asarray(tokens)[order], np.asarray(seconds)[order]


def _mean_by_tokens(tokens: np.ndarray, seconds: np.ndarray) -> dict[int, float]:
    return {int(n): float(seconds[tokens == n].mean()) for n in np.unique(tokens)}


def llama3_8b_linear(data: Path, gpu: str) -> tuple[float, float, float]:
    """(floor, intercept, per_token) of Llama-3-8B's linear layers on ``gpu`` (a100, h100 or h200)."""
    tok, sec = vidur_linear_stack(data / "vidur" / "a100_llama3_8b_mlp.csv")
    if gpu == "a100":
        return fit_linear_knee(tok, sec)
    a100_l2 = _mean_by_tokens(*vidur_linear_stack(data / "vidur" / "a100_llama2_7b_mlp.csv"))
    h100_l2 = _mean_by_tokens(*vidur_linear_stack(data / "vidur" / "h100_llama2_7b_mlp.csv"))
    l3 = _mean_by_tokens(tok, sec)
    common = sorted(set(l3) & set(a100_l2) & set(h100_l2))
    scaled = np.array([l3[n] * h100_l2[n] / a100_l2[n] for n in common])
    floor, intercept, per_token = fit_linear_knee(np.array(common), scaled)
    if gpu == "h200":  # the fixed per-pass cost is the weight read: memory-bound
        ratio = GPUS["h100"].bandwidth / GPUS["h200"].bandwidth
        floor, intercept = floor * ratio, intercept * ratio
    return floor, intercept, per_token


def analytic_terms(model: Model, gpu: Gpu, tp: int = 1) -> dict[str, float]:
    """Terms Vidur's linear-layer profiles leave out (see the module docstring)."""
    lm_head_bytes = model.vocab * model.hidden * 2 / tp
    return {
        "lm_head_floor_s": lm_head_bytes / (gpu.bandwidth * HBM_EFFICIENCY),
        "per_seq_s": 2 * model.vocab * model.hidden / tp / (gpu.flops * FLOP_EFFICIENCY) + CPU_PER_SEQ_S,
        "per_context_token_s": model.kv_bytes_per_token / tp / (gpu.bandwidth * HBM_EFFICIENCY),
        "prefill_attention_s": 4 * model.layers * model.hidden / tp / (gpu.flops * FLOP_EFFICIENCY),
    }


def derive_llama3_8b(data: Path, gpu: str) -> LinearStepTime:
    floor, intercept, per_token = llama3_8b_linear(data, gpu)
    extra = analytic_terms(MODELS["llama3-8b"], GPUS[gpu])
    return LinearStepTime(overhead_s=CPU_OVERHEAD_S, floor_s=floor + extra["lm_head_floor_s"],
                          intercept_s=intercept, per_token_s=per_token, per_seq_s=extra["per_seq_s"],
                          per_context_token_s=extra["per_context_token_s"],
                          prefill_attention_s=extra["prefill_attention_s"])


def splitwise_samples(path: Path, model: str, hardware: str, tp: int) -> list[StepSample]:
    """Splitwise end-to-end rows as step samples: a batched prefill and an average decode step each."""
    samples = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if (row["model"], row["hardware"], int(row["tensor_parallel"])) != (model, hardware, tp):
                continue
            p, b, t = int(row["prompt_size"]), int(row["batch_size"]), int(row["token_size"])
            samples.append(StepSample(b * p, b, 0.0, b * p * p / 2.0, float(row["prompt_time"]) / 1e3))
            samples.append(StepSample(b, b, b * (p + t / 2.0), 0.0, float(row["token_time"]) / 1e3))
    if not samples:
        raise ValueError(f"{path}: no rows for model={model} hardware={hardware} tensor_parallel={tp}")
    return samples


def derive_llama2_70b(data: Path, gpu: str, tp: int = 4) -> LinearStepTime:
    samples = splitwise_samples(data / "splitwise" / "perf_model.csv", "llama2-70b", f"{gpu}-80gb", tp)
    extra = analytic_terms(MODELS["llama2-70b"], GPUS[gpu], tp)
    base = LinearStepTime(overhead_s=CPU_OVERHEAD_S, floor_s=0.04, intercept_s=0.001, per_token_s=2.5e-4,
                          per_seq_s=extra["per_seq_s"], per_context_token_s=extra["per_context_token_s"],
                          prefill_attention_s=extra["prefill_attention_s"])
    return fit_step_samples(samples, base)


def derive_all(data: Path) -> dict[str, LinearStepTime]:
    """Step-time models of every built-in profile, by profile name."""
    return {
        "a100-llama3-8b": derive_llama3_8b(data, "a100"),
        "h100-llama3-8b": derive_llama3_8b(data, "h100"),
        "h200-llama3-8b": derive_llama3_8b(data, "h200"),
        "a100-llama2-70b-tp4": derive_llama2_70b(data, "a100"),
        "h100-llama2-70b-tp4": derive_llama2_70b(data, "h100"),
    }


if __name__ == "__main__":  # pragma: no cover - a maintenance helper
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "profiles"
    for name, model in derive_all(folder).items():
        print(name, {k: float(f"{v:.4g}") for k, v in model.to_dict().items()})
