"""The step-time model: closed-form decode runs, validation, and the fits that make the defaults."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaler.step_time import DecodeRun, LinearStepTime, StepSample, fit_linear_knee, fit_step_samples

MODEL = LinearStepTime(overhead_s=0.001, floor_s=0.007, intercept_s=0.005, per_token_s=2e-5, per_seq_s=1e-5,
                       per_context_token_s=5e-8, prefill_attention_s=1e-9)


def test_decode_run_matches_step_by_step() -> None:
    run = MODEL.decode_run(64, 64 * 1000.0)
    steps = [MODEL.step_time(64, 64, 64 * (1000.0 + i), 0.0) for i in range(50)]
    assert run.total(50) == pytest.approx(sum(steps), rel=1e-12)
    assert np.allclose(run.step_durations(50), steps)


@settings(max_examples=200, deadline=None)
@given(first=st.floats(1e-4, 1.0), growth=st.floats(0.0, 1e-2), elapsed=st.floats(0.0, 1e3))
def test_steps_within_is_the_largest_k(first: float, growth: float, elapsed: float) -> None:
    run = DecodeRun(first, growth)
    k = run.steps_within(elapsed)
    assert run.total(k) <= elapsed
    assert run.total(k + 1) > elapsed


def test_knee_regimes() -> None:
    assert MODEL.step_time(1, 1, 0, 0) == pytest.approx(0.001 + 0.007 + 1e-5)
    # compute-bound above the knee: linear in tokens
    big = MODEL.step_time(8192, 1, 0, 0) - MODEL.step_time(4096, 1, 0, 0)
    assert big == pytest.approx(4096 * 2e-5)


def test_prefill_time_is_sum_of_chunks() -> None:
    chunked = MODEL.prefill_time(10_000, 4096)
    by_hand = (MODEL.step_time(4096, 1, 0, 4096 * 2048) + MODEL.step_time(4096, 1, 0, 4096 * (4096 + 2048))
               + MODEL.step_time(1808, 1, 0, 1808 * (8192 + 904)))
    assert chunked == pytest.approx(by_hand)


@pytest.mark.parametrize("field", ["floor_s", "per_token_s", "prefill_attention_s"])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_coefficient_names_field(field: str, bad: float) -> None:
    with pytest.raises(ValueError, match=field):
        LinearStepTime(**{**MODEL.to_dict(), field: bad})


def test_a_prefill_chunk_costs_its_own_term_once_per_chunk() -> None:
    chunky = LinearStepTime(**{**MODEL.to_dict(), "per_prefill_seq_s": 0.003})
    assert chunky.step_time(256, 4, 1000, 5e4, 2) - MODEL.step_time(256, 4, 1000, 5e4) == pytest.approx(0.006)
    assert chunky.step_time(64, 64, 64e3, 0.0) == MODEL.step_time(64, 64, 64e3, 0.0)  # decode: none
    assert chunky.prefill_time(10_000, 4096) - MODEL.prefill_time(10_000, 4096) == pytest.approx(3 * 0.003)


def test_a_profile_written_before_the_prefill_term_reads_as_zero_and_others_still_fail() -> None:
    old = MODEL.to_dict()
    del old["per_prefill_seq_s"]
    assert LinearStepTime.from_dict(old) == MODEL and MODEL.per_prefill_seq_s == 0.0
    with pytest.raises(ValueError, match=r"per_prefill_seq_s=-1.0"):
        LinearStepTime.from_dict({**old, "per_prefill_seq_s": -1.0})


def test_from_dict_names_missing_and_unknown() -> None:
    data = MODEL.to_dict()
    del data["floor_s"]
    data["flor_s"] = 1.0
    with pytest.raises(ValueError, match=r"missing keys \['floor_s'\].*unknown keys \['flor_s'\]"):
        LinearStepTime.from_dict(data)
    with pytest.raises(ValueError, match="per_seq_s='x'"):
        LinearStepTime.from_dict({**MODEL.to_dict(), "per_seq_s": "x"})
    assert LinearStepTime.from_dict(MODEL.to_dict()) == MODEL


def test_fit_linear_knee_recovers_parameters() -> None:
    tokens = np.array([1, 2, 8, 16, 32, 64, 512, 1024, 2048, 4096, 8192])
    seconds = np.maximum(0.01, 0.002 + 6e-5 * tokens)
    floor, intercept, slope = fit_linear_knee(tokens, seconds)
    assert (floor, intercept, slope) == pytest.approx((0.01, 0.002, 6e-5), rel=1e-6)
    with pytest.raises(ValueError, match="needs points"):
        fit_linear_knee(np.array([1, 2]), np.array([0.1, 0.1]))


def test_fit_step_samples_recovers_a_model() -> None:
    rng = np.random.default_rng(3)
    samples = []
    for _ in range(80):
        n, s = int(rng.integers(1, 8192)), int(rng.integers(1, 64))
        c, a = float(rng.integers(0, 200_000)), float(rng.integers(0, 10**7))
        samples.append(StepSample(n, s, c, a, MODEL.step_time(n, s, c, a)))
    fitted = fit_step_samples(samples, LinearStepTime(0.002, 0.01, 0.001, 1e-5, 2e-5, 1e-7, 2e-9))
    errors = [abs(fitted.step_time(x.tokens, x.seqs, x.decode_context, x.prefill_attention) / x.seconds - 1)
              for x in samples]
    assert max(errors) < 0.02
