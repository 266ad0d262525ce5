"""The emulator's performance model against the published figures."""

from __future__ import annotations

import pytest

from fleetctl.lab.emulator import perf
from fleetctl.lab.emulator.perf import PROFILES, PromptClass

#: Published aggregate tok/s at c=8 (model card, v0.23.0 section).
C8_PUBLISHED = {
    PromptClass.CODING: 360,
    PromptClass.MATH: 416,
    PromptClass.REASONING: 388,
    PromptClass.PROSE: 252,
    PromptClass.NATURAL: 296,
    PromptClass.EXTRACTION: 399,
}


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("What is 17 × 23?", PromptClass.MATH),
        ("Write a Python function that merges two sorted lists.", PromptClass.CODING),
        ("Extract the name and date fields as JSON.", PromptClass.EXTRACTION),
        ("Explain why the sky is blue, step by step.", PromptClass.REASONING),
        ("Write a short story about a lighthouse keeper.", PromptClass.PROSE),
        ("Good morning, how are you?", PromptClass.NATURAL),
    ],
)
def test_classify_by_keywords(prompt: str, expected: PromptClass) -> None:
    assert perf.classify(prompt) is expected


def test_classify_hint_wins_and_bad_hint_is_ignored() -> None:
    assert perf.classify("What is 17 × 23?", "prose") is PromptClass.PROSE
    assert perf.classify("What is 17 × 23?", "nonsense") is PromptClass.MATH


@pytest.mark.parametrize("cls", list(PromptClass))
def test_aggregate_passes_through_published_c1_and_c64(cls: PromptClass) -> None:
    profile = PROFILES[cls]
    assert perf.aggregate_tok_s(profile, 1) == pytest.approx(profile.decode_tok_s)
    assert perf.aggregate_tok_s(profile, 64) == pytest.approx(profile.aggregate_c64_tok_s)


@pytest.mark.parametrize("cls", list(PromptClass))
def test_aggregate_saturates_and_per_stream_falls(cls: PromptClass) -> None:
    profile = PROFILES[cls]
    levels = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    agg = [perf.aggregate_tok_s(profile, n) for n in levels]
    per = [a / n for a, n in zip(agg, levels, strict=True)]
    assert agg == sorted(agg)
    assert per == sorted(per, reverse=True)
    ceiling = perf.saturation_ceiling(profile)
    assert agg[-1] < ceiling
    # Doubling 128 -> 256 streams adds little: the compute wall.
    assert agg[-1] / agg[-2] < 1.1


@pytest.mark.parametrize("cls", list(PromptClass))
def test_c8_within_a_quarter_of_published(cls: PromptClass) -> None:
    got = perf.aggregate_tok_s(PROFILES[cls], 8)
    assert abs(got - C8_PUBLISHED[cls]) / C8_PUBLISHED[cls] < 0.25


def test_mean_acceptance_length_matches_published_range() -> None:
    assert perf.mean_acceptance_length(0.5, 0) == 1.0
    assert perf.mean_acceptance_length(0.0, 11) == 1.0
    # Model card: 62-78 % position-0 -> 2.7-4.4 mean accepted tokens per step (k=15).
    for pos0 in (0.62, 0.78):
        assert 2.7 <= perf.mean_acceptance_length(pos0, 15) <= 4.4


def _plan(cls: PromptClass, accept: float | None = None, k: int = 11, **kw: float) -> perf.StepPlan:
    """A single-stream plan at short context; ``accept`` None = the class's published acceptance."""
    profile = PROFILES[cls]
    return perf.plan_steps(
        profile,
        concurrency=int(kw.pop("concurrency", 1)),
        context_tokens=int(kw.pop("context_tokens", 0)),
        accept_pos0=profile.accept_pos0 if accept is None else accept,
        num_spec_tokens=k,
        **kw,
    )


def test_plan_at_nominal_acceptance_gives_the_published_rate() -> None:
    rate = PROFILES[PromptClass.MATH].decode_tok_s
    assert _plan(PromptClass.MATH).tok_s == pytest.approx(rate)
    assert _plan(PromptClass.MATH, accept=0.0, k=0).tok_s == pytest.approx(rate)


def test_lost_acceptance_slows_decode_by_the_lost_tokens() -> None:
    healthy = _plan(PromptClass.CODING)
    decayed = _plan(PromptClass.CODING, accept=0.0)
    assert decayed.tok_s == pytest.approx(healthy.tok_s / healthy.mean_tokens_per_step)
    slow = _plan(PromptClass.CODING, throughput_scale=0.7)
    assert slow.tok_s == pytest.approx(0.7 * healthy.tok_s)


def test_long_context_slows_decode_gently() -> None:
    short = _plan(PromptClass.CODING, accept=0.3, context_tokens=100)
    long = _plan(PromptClass.CODING, accept=0.3, context_tokens=32_000)
    # Model card: 73-94 tok/s at 32K vs 92-124 short: about three quarters.
    assert 0.65 < long.tok_s / short.tok_s < 0.85


def test_acceptance_under_sampling_context_and_decay() -> None:
    profile = PROFILES[PromptClass.MATH]
    greedy = perf.effective_acceptance(profile, temperature=0.0, context_tokens=100)
    assert greedy == pytest.approx(profile.accept_pos0)
    sampled = perf.effective_acceptance(profile, temperature=0.7, context_tokens=100)
    # "at T=0.7 ~10-20 % acceptance vs 60-78 % at T=0": about a fifth.
    assert 0.1 < sampled / greedy < 0.35
    held = perf.effective_acceptance(profile, temperature=0.0, context_tokens=30_000)
    assert held == greedy
    collapsed = perf.effective_acceptance(
        profile, temperature=0.0, context_tokens=4096, longctx_collapse=True
    )
    assert collapsed <= perf.COLLAPSED_ACCEPT
    short_with_knob = perf.effective_acceptance(
        profile, temperature=0.0, context_tokens=1000, longctx_collapse=True
    )
    assert short_with_knob == greedy
    half = perf.effective_acceptance(profile, temperature=0.0, context_tokens=100, decay_factor=0.5)
    assert half == pytest.approx(greedy / 2)


def test_decay_factor_is_linear_to_zero() -> None:
    assert perf.decay_factor(0.0, 100.0) == 1.0
    assert perf.decay_factor(0.5, 1.0) == pytest.approx(0.5)
    assert perf.decay_factor(0.5, 2.0) == 0.0
    assert perf.decay_factor(0.5, 10.0) == 0.0


def test_ttft_grows_with_prompt_and_load() -> None:
    profile = PROFILES[PromptClass.NATURAL]
    base = perf.ttft_seconds(profile, prompt_tokens=10, running=1)
    assert base == pytest.approx(profile.ttft_s + 10 / perf.PREFILL_TOK_S)
    # Model card long-context tiers: 16K -> 3.3-4.1 s, 32K -> 7.1-9.5 s.
    assert 3.3 <= perf.ttft_seconds(profile, prompt_tokens=16_000, running=1) <= 4.1
    assert 7.1 <= perf.ttft_seconds(profile, prompt_tokens=32_000, running=1) <= 9.5
    loaded = perf.ttft_seconds(profile, prompt_tokens=10, running=16)
    # TTFT-only sweep: 74 ms at c=1 -> 249 ms at c=16 (x3.4).
    assert 2.5 < loaded / base < 4.5


def test_model_families_from_config_model_type() -> None:
    assert perf.family_of("qwen3_5_moe") == "qwen36-35b-a3b"
    assert perf.family_of("qwen3_5") == "qwen36-27b"
    assert perf.family_of("gemma4") == "gemma4-26b-a4b"
    gemma = perf.FAMILY_PROFILES["gemma4-26b-a4b"]
    # README fleet table: Gemma-4-26B-A4B extraction 202.4 tok/s at 77.5 % acceptance, the 27B 41.8
    # coding.
    assert perf.aggregate_tok_s(gemma[PromptClass.EXTRACTION], 1) == pytest.approx(202.4)
    assert gemma[PromptClass.EXTRACTION].accept_pos0 == pytest.approx(0.775)
    assert perf.FAMILY_PROFILES["qwen36-27b"][PromptClass.CODING].decode_tok_s == pytest.approx(
        41.8
    )
    for profiles in perf.FAMILY_PROFILES.values():
        for cls, profile in profiles.items():
            ratio = profile.aggregate_c64_tok_s / profile.decode_tok_s
            assert ratio == pytest.approx(
                PROFILES[cls].aggregate_c64_tok_s / PROFILES[cls].decode_tok_s
            )
