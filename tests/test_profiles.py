"""Built-in profiles, YAML round trips, errors, capacity, and that the defaults still match the data."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.capacity import ReplicaCapacity
from scaler.profiles import get_profile, list_profiles, load_profile, save_profile
from tests.conftest import PROFILES_DATA, require

NAMES = ["a100-llama2-70b-tp4", "a100-llama3-8b", "h100-llama2-70b-tp4", "h100-llama3-8b", "h200-llama3-8b"]


def test_names_and_provenance() -> None:
    assert list_profiles() == NAMES
    for name in NAMES:
        p = get_profile(name)
        assert p.name == name and p.source, name
        assert p.max_model_len <= p.memory.kv_cache_tokens


def test_vllm_scheduler_defaults() -> None:
    a100, h100 = get_profile("a100-llama3-8b"), get_profile("h100-llama3-8b")
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)
    assert (h100.max_num_seqs, h100.max_num_batched_tokens) == (1024, 8192)
    assert a100.block_size == 16 and a100.memory.gpu_memory_utilization == 0.9


def test_hardware_ordering() -> None:
    decode = {n: get_profile(n).step_time.step_time(1, 1, 1000, 0) for n in NAMES}
    assert decode["h200-llama3-8b"] < decode["h100-llama3-8b"] < decode["a100-llama3-8b"]
    assert get_profile("h200-llama3-8b").num_gpu_blocks > 1.9 * get_profile("h100-llama3-8b").num_gpu_blocks


def test_unknown_name_lists_known() -> None:
    with pytest.raises(KeyError, match="h100-llama3-8b"):
        get_profile("h100-llama3-7b")


def test_yaml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    save_profile(get_profile("h100-llama3-8b"), path)
    assert load_profile(path) == get_profile("h100-llama3-8b")
    assert get_profile(str(path)) == get_profile("h100-llama3-8b")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("step_time"), r"missing keys \['step_time'\]"),
    (lambda d: d.update(colour="red"), r"unknown keys \['colour'\]"),
    (lambda d: d.update(max_num_seqs="many"), "max_num_seqs='many'"),
    (lambda d: d["memory"].update(gpu_memory_utilization=2), "gpu_memory_utilization=2"),
    (lambda d: d["memory"].update(hbm=1), "hbm"),
    (lambda d: d["step_time"].update(floor_s=-1), "floor_s=-1"),
    (lambda d: d.update(max_model_len=10**7), "max_model_len=10000000"),
])
def test_bad_yaml_names_the_field(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    data = get_profile("a100-llama3-8b").to_dict()
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=message):
        load_profile(path)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        load_profile(tmp_path / "missing.yaml")
    (tmp_path / "x.yaml").write_text("a: [")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_profile(tmp_path / "x.yaml")


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(NAMES), slo=st.floats(0.05, 30.0))
def test_capacity_is_valid_and_monotone(name: str, slo: float) -> None:
    p = get_profile(name)
    cap = p.capacity(slo)
    assert isinstance(cap, ReplicaCapacity)
    assert cap == p.capacity(slo)
    assert p.capacity(slo * 2).prefill_tokens_per_s >= cap.prefill_tokens_per_s
    assert cap.kv_cache_tokens == p.memory.kv_cache_tokens and cap.max_num_seqs == p.max_num_seqs
    # the decode rate respects the TPOT target: D / step <= D / tpot is implied by step <= tpot
    assert p.capacity(slo, tpot_slo_s=0.2).decode_tokens_per_s >= cap.decode_tokens_per_s


def test_capacity_rejects_bad_slo() -> None:
    with pytest.raises(ValueError, match=r"ttft_slo_s=0\.0"):
        get_profile("h100-llama3-8b").capacity(0.0)
    with pytest.raises(ValueError, match="tpot_slo_s=nan"):
        get_profile("h100-llama3-8b").capacity(1.0, tpot_slo_s=float("nan"))


def test_builtin_constants_match_the_shared_data() -> None:
    require((PROFILES_DATA / "vidur").is_dir() and (PROFILES_DATA / "splitwise").is_dir(), "shared/profiles data")
    from simulator.profile_fit import derive_all

    # compare what the models predict, not their coefficients: overhead and intercept are collinear above
    # the floor, so solvers on different numpy/scipy builds split the same fit differently (we saw 0.5 % apart)
    steps = [(tokens, seqs, context, attention) for tokens in (1, 16, 256, 2048, 8192) for seqs in (1, 64)
             for context in (0.0, 1e5) for attention in (0.0, tokens * tokens / 2.0)]
    for name, fitted in derive_all(PROFILES_DATA).items():
        builtin = get_profile(name).step_time
        for step in steps:
            assert builtin.step_time(*step) == pytest.approx(fitted.step_time(*step), rel=1e-2), (name, step)


@pytest.mark.parametrize("name", list_profiles())
def test_decode_context_term_predicts_the_decode_rate_at_other_contexts(name: str) -> None:
    """K_d from the step-time model: the rate at the reference context over the cost factor stays within
    30 % of the TPOT-limited rate recomputed at 2-4x the context (the batch limit shifts too; the worst
    is a 70B model at its 4k context limit, 26 % optimistic)."""
    profile = get_profile(name)
    reference = profile.capacity(2.0)
    assert reference.decode_context_tokens is not None and reference.decode_context_tokens > 0
    for context in (2048, 4096):
        measured = profile.capacity(2.0, context_tokens=context).decode_tokens_per_s
        predicted = reference.decode_tokens_per_s / reference.decode_cost_factor(context)
        assert predicted == pytest.approx(measured, rel=0.3), (context, predicted, measured)
        assert predicted < reference.decode_tokens_per_s  # a longer context never decodes faster


def test_decode_cost_factor_is_one_at_the_reference_and_without_k() -> None:
    from scaler.capacity import DECODE_REFERENCE_CONTEXT

    cap = ReplicaCapacity(10_000.0, 2_000.0, 256, 100_000, decode_context_tokens=500.0)
    assert cap.decode_cost_factor(DECODE_REFERENCE_CONTEXT) == pytest.approx(1.0)
    assert cap.decode_cost_factor(3 * 500.0 + 2 * DECODE_REFERENCE_CONTEXT) == pytest.approx(
        (1 + 3 + 2 * DECODE_REFERENCE_CONTEXT / 500) / (1 + DECODE_REFERENCE_CONTEXT / 500))
    assert cap.decode_cost_factor(None) == 1.0
    assert ReplicaCapacity(10_000.0, 2_000.0, 256, 100_000).decode_cost_factor(8000.0) == 1.0
    with pytest.raises(ValueError, match=r"decode_context_tokens=0"):
        ReplicaCapacity(10_000.0, 2_000.0, 256, 100_000, decode_context_tokens=0)
