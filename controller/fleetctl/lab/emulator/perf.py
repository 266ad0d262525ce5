"""The emulator's performance model: decode rate, TTFT and draft acceptance per prompt class.

Pure functions of (prompt class, concurrency, context length, time), so they are
unit-tested from data. Every default comes from the published figures of the
serving image's README and model cards (summarised in docs/domain.md#health), for
Qwen3.6-35B-A3B-heretic-NVFP4 + DFlash n=11
on one DGX Spark with the v0.23.0 image:

- single-stream decode tok/s, TTFT p50 and DFlash position-0 acceptance per class:
  the "Single-stream (c=1), by category" table of the aeon-vllm-ultimate README
  (35B-A3B rows: Coding 91.7 tok/s / 88 ms / 32.5 %, Math 123.6 / 113 / 47.7,
  Reasoning 120.6 / 120 / 46.3, Prose 75.2 / 137 / 23.7, Natural language
  91.8 / 104 / 32.3, Extraction/JSON 79.8 / 103 / 28.1); the Gemma-4-26B-A4B and
  Qwen3.6-27B rows of the same README give FAMILY_PROFILES (chosen by config.json's
  model_type);
- aggregate tok/s at c=64: the model card's "v0.23.0 build" section (structured
  code/math/reasoning/extraction 610-781 tok/s, creative prose/NL 430-475 tok/s);
  the c=8 row (360/416/388/252/296/399) is what the saturation curve gives within 25 %;
- long-prompt prefill ~4,500 tok/s: the model card's long-context tiers
  (16K prompt -> TTFT 3.3-4.1 s, 32K -> 7.1-9.5 s) and decode falling to
  ~75-80 % of short-context at 32K (73-94 vs 92-124 tok/s);
- TTFT growth with load: the model card's TTFT-only sweep (74 ms at c=1,
  249 ms at c=16, ~1 s at c=64);
- sampled decoding: the model card says acceptance "collapses with sampling -
  at T=0.7 you typically see ~10-20 % acceptance vs. 60-78 % at T=0";
- the conditional acceptance of later draft positions (0.75) makes the mean
  acceptance length land in the published 2.7-4.4 range at k=11-15 when
  position-0 acceptance is 60-78 %;
- long-context collapse (the pre-SWA-fix drafter): "~0-7 %" past ~2K tokens.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum


class PromptClass(StrEnum):
    """The prompt classes of the published benchmarks."""

    CODING = "coding"
    MATH = "math"
    REASONING = "reasoning"
    PROSE = "prose"
    NATURAL = "natural"
    EXTRACTION = "extraction"


@dataclass(frozen=True)
class ClassProfile:
    """Published single-stream and c=64 figures of one prompt class."""

    decode_tok_s: float
    ttft_s: float
    accept_pos0: float
    aggregate_c64_tok_s: float


#: Per class: (c=1 decode tok/s, c=1 TTFT, position-0 acceptance at T=0, aggregate at c=64).
PROFILES: dict[PromptClass, ClassProfile] = {
    PromptClass.CODING: ClassProfile(91.7, 0.088, 0.325, 680.0),
    PromptClass.MATH: ClassProfile(123.6, 0.113, 0.477, 740.0),
    PromptClass.REASONING: ClassProfile(120.6, 0.120, 0.463, 760.0),
    PromptClass.PROSE: ClassProfile(75.2, 0.137, 0.237, 430.0),
    PromptClass.NATURAL: ClassProfile(91.8, 0.104, 0.323, 475.0),
    PromptClass.EXTRACTION: ClassProfile(79.8, 0.103, 0.281, 650.0),
}


def _scaled_family(
    table: dict[PromptClass, tuple[float, float, float]],
) -> dict[PromptClass, ClassProfile]:
    """Profiles of another model from its published c=1 figures; its c=64 aggregate is not
    published, so it keeps the 35B-A3B's c=64/c=1 ratio per class."""
    return {
        cls: ClassProfile(
            r1, ttft, acc, r1 * PROFILES[cls].aggregate_c64_tok_s / PROFILES[cls].decode_tok_s
        )
        for cls, (r1, ttft, acc) in table.items()
    }


#: Per model family (the three published fleet models), single-stream figures of the README's
#: v0.23.0 fleet tables: Gemma-4-26B-A4B and Qwen3.6-27B (the 35B-A3B is PROFILES).
FAMILY_PROFILES: dict[str, dict[PromptClass, ClassProfile]] = {
    "qwen36-35b-a3b": PROFILES,
    "gemma4-26b-a4b": _scaled_family(
        {
            PromptClass.CODING: (155.8, 0.083, 0.589),
            PromptClass.MATH: (127.8, 0.145, 0.487),
            PromptClass.REASONING: (118.9, 0.105, 0.439),
            PromptClass.PROSE: (49.8, 0.105, 0.111),
            PromptClass.NATURAL: (67.3, 0.097, 0.200),
            PromptClass.EXTRACTION: (202.4, 0.085, 0.775),
        }
    ),
    "qwen36-27b": _scaled_family(
        {
            PromptClass.CODING: (41.8, 0.140, 0.345),
            PromptClass.MATH: (47.3, 0.244, 0.417),
            PromptClass.REASONING: (56.1, 0.234, 0.500),
            PromptClass.PROSE: (34.1, 0.146, 0.273),
            PromptClass.NATURAL: (38.3, 0.137, 0.313),
            PromptClass.EXTRACTION: (44.2, 0.246, 0.372),
        }
    ),
}


def family_of(model_type: str) -> str:
    """The profile family of a config.json ``model_type`` (Gemma-4, the dense Qwen3.6-27B, else
    35B-A3B)."""
    lowered = model_type.lower()
    if lowered.startswith("gemma"):
        return "gemma4-26b-a4b"
    if lowered in ("qwen3_5", "qwen3_5_text"):
        return "qwen36-27b"
    return "qwen36-35b-a3b"


#: Probability that draft position i+1 is accepted given position i was.
CONDITIONAL_ACCEPT = 0.75
#: Long-prompt prefill rate (tok/s) once kernel-launch overhead is amortised.
PREFILL_TOK_S = 4500.0
#: Decode slows with context: rate / (1 + context / CONTEXT_SLOWDOWN_TOKENS).
CONTEXT_SLOWDOWN_TOKENS = 100_000.0
#: Extra TTFT per other running request, as a fraction of the class's base TTFT.
TTFT_LOAD_FACTOR = 0.15
#: Acceptance multiplier under sampling: max(SAMPLED_FLOOR, 1 - SAMPLED_SLOPE * T).
SAMPLED_SLOPE = 1.1
SAMPLED_FLOOR = 0.1
#: Context (tokens) past which a drafter without the SWA fix stops being accepted.
LONGCTX_COLLAPSE_TOKENS = 2048
#: Position-0 acceptance of a collapsed drafter.
COLLAPSED_ACCEPT = 0.03

_KEYWORDS: tuple[tuple[PromptClass, re.Pattern[str]], ...] = (
    (
        PromptClass.EXTRACTION,
        re.compile(r"\b(json|extract|yaml|csv|schema|fields?|parse|table)\b", re.I),
    ),
    (
        PromptClass.CODING,
        re.compile(
            r"\b(code|function|python|rust|javascript|typescript|sql|bash|class|"
            r"implement|bug|compile|algorithm|def|refactor|program)\b",
            re.I,
        ),
    ),
    (
        PromptClass.MATH,
        re.compile(
            r"(\d+\s*[×x*/+\-^]\s*\d+|\b(math|equation|integral|derivative|prime|"
            r"solve|sum|product|calculate|compute)\b)",
            re.I,
        ),
    ),
    (
        PromptClass.REASONING,
        re.compile(r"\b(why|reason|explain|logic|puzzle|deduce|prove|step by step)\b", re.I),
    ),
    (
        PromptClass.PROSE,
        re.compile(r"\b(story|poem|essay|write|creative|describe|narrative|fiction)\b", re.I),
    ),
)


def classify(text: str, hint: str | None = None) -> PromptClass:
    """The class of a prompt: an explicit hint (a class name) wins, else keywords, else natural."""
    if hint:
        try:
            return PromptClass(hint.lower())
        except ValueError:
            pass
    # Only the head of a long prompt: classification must stay cheap at 32K tokens.
    head = text[:4000]
    for cls, pattern in _KEYWORDS:
        if pattern.search(head):
            return cls
    return PromptClass.NATURAL


def mean_acceptance_length(
    accept_pos0: float, k: int, conditional: float = CONDITIONAL_ACCEPT
) -> float:
    """Expected tokens per engine step: 1 + sum over positions of P(position i accepted)."""
    if k <= 0 or accept_pos0 <= 0.0:
        return 1.0
    return 1.0 + sum(accept_pos0 * conditional**i for i in range(k))


def saturation_ceiling(profile: ClassProfile) -> float:
    """The asymptotic aggregate tok/s such that the curve passes through c=1 and c=64."""
    r1, a64 = profile.decode_tok_s, profile.aggregate_c64_tok_s
    # aggregate(n) = n*r1 / (1 + (n-1)*r1/ceiling); solve aggregate(64) = a64.
    denom = 64.0 * r1 / a64 - 1.0
    return 63.0 * r1 / denom if denom > 0 else math.inf


def aggregate_tok_s(profile: ClassProfile, concurrency: int) -> float:
    """Aggregate decode tok/s of ``concurrency`` streams of this class (saturating)."""
    n = max(1, concurrency)
    ceiling = saturation_ceiling(profile)
    return n * profile.decode_tok_s / (1.0 + (n - 1) * profile.decode_tok_s / ceiling)


@dataclass(frozen=True)
class StepPlan:
    """How one request decodes: engine steps per second and the acceptance of each draft."""

    steps_per_s: float
    accept_pos0: float
    num_spec_tokens: int

    @property
    def mean_tokens_per_step(self) -> float:
        """Expected tokens emitted per engine step."""
        return mean_acceptance_length(self.accept_pos0, self.num_spec_tokens)

    @property
    def tok_s(self) -> float:
        """Expected decode tok/s of this request."""
        return self.steps_per_s * self.mean_tokens_per_step


def effective_acceptance(
    profile: ClassProfile,
    *,
    temperature: float,
    context_tokens: int,
    decay_factor: float = 1.0,
    longctx_collapse: bool = False,
) -> float:
    """Position-0 acceptance for one request, after sampling, context and decay effects."""
    accept = profile.accept_pos0
    # Sampling at T=0.7 drops acceptance to about a fifth (60-78 % -> 10-20 %), never below a tenth.
    accept *= max(SAMPLED_FLOOR, 1.0 - SAMPLED_SLOPE * max(temperature, 0.0))
    if longctx_collapse and context_tokens > LONGCTX_COLLAPSE_TOKENS:
        accept = min(accept, COLLAPSED_ACCEPT)
    return max(0.0, min(1.0, accept * decay_factor))


def plan_steps(
    profile: ClassProfile,
    *,
    concurrency: int,
    context_tokens: int,
    accept_pos0: float,
    num_spec_tokens: int,
    throughput_scale: float = 1.0,
) -> StepPlan:
    """Engine step rate for one request among ``concurrency`` running ones.

    The published decode rates already include the class's own acceptance, so a
    target-model step rate is the published rate divided by the class's mean
    acceptance length; a request whose acceptance falls (decay, collapse, sampling)
    then decodes slower by exactly the lost tokens per step, as on the real engine.
    """
    per_stream = aggregate_tok_s(profile, concurrency) / max(1, concurrency)
    per_stream /= 1.0 + context_tokens / CONTEXT_SLOWDOWN_TOKENS
    nominal_mal = mean_acceptance_length(profile.accept_pos0, num_spec_tokens)
    steps = per_stream / nominal_mal * max(throughput_scale, 1e-6)
    return StepPlan(steps_per_s=steps, accept_pos0=accept_pos0, num_spec_tokens=num_spec_tokens)


def ttft_seconds(profile: ClassProfile, *, prompt_tokens: int, running: int) -> float:
    """Time to first token: fixed launch overhead + prefill, stretched by the other running
    requests."""
    base = profile.ttft_s + prompt_tokens / PREFILL_TOK_S
    return base * (1.0 + TTFT_LOAD_FACTOR * max(0, running - 1))


def decay_factor(per_minute: float, minutes: float) -> float:
    """Acceptance multiplier after ``minutes`` of a linear decay of ``per_minute`` (toward 0)."""
    if per_minute <= 0.0:
        return 1.0
    return max(0.0, 1.0 - per_minute * minutes)
