"""Prompts sized in tokens (long contexts, shared prefixes): measured with the server's /tokenize
where it answers believably, else estimated in characters per token."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleetctl.soak import prompts
from fleetctl.soak.client import Client, TokenizeAnswerError
from fleetctl.soak.phases.soak_state import SoakState
from fleetctl.soak.verdict import (
    Sample,
)


def shared_prefix_tokens(
    configured: int, block: int | None, max_model_len: int | None, max_tokens: int, turns: int
) -> int:
    """How long the conversations' shared context is: as configured, raised past the cache block.

    Prefix caching reuses whole blocks only, and a hybrid model's block is the Mamba page (~2k
    tokens on Qwen3.5/3.6): a context shorter than one block never hits the cache, and the decay
    that needs cache hits is never exercised. So a configured length at or under the server's
    block grows to 1.25 blocks, as far as the model's context leaves room for every turn. 0 (no
    shared context) stays 0.
    """
    if configured <= 0 or not block or configured > block:
        return configured
    want = block + block // 4
    if max_model_len:
        room = max_model_len - (turns + 1) * (max_tokens + 256)
        want = min(want, max(room, configured))
    return max(want, configured)


def context_text(chars: int) -> str:
    return "You answer questions for the operations team. Their service log:\n" + \
        prompts.long_context_document(chars)


def long_text(chars: int) -> str:
    return prompts.prompt_for("long_context", 0, chars)


async def sized(
    client: Client, st: SoakState, tokens: int, build: Callable[[int], str]
) -> tuple[int, int, str]:
    """``build(chars)`` grown or shrunk to ``tokens`` tokens as the server's ``/tokenize`` counts
    them.

    A character estimate is off by 2x between prose and a digit-heavy log; near
    max_model_len that is an HTTP 400 that fails a healthy server. Without
    /tokenize, the ratio measured on the classes phase's prompts is used.
    """
    estimate = max(int(tokens * st.chars_per_token), 64)
    chars = estimate
    got = tokens
    seen: list[tuple[int, int]] = []
    for _ in range(6):
        try:
            n = await client.tokenize(st.model, build(chars))
        except TokenizeAnswerError as e:
            # A malformed answer is the server's /tokenize answering wrong, as a lying count is:
            # the same finding (never "no /tokenize", which passes).
            return _not_believed(st, estimate, tokens, str(e))
        if n is None:
            return estimate, tokens, "estimate"
        if why := implausible_count(chars, n, seen):
            return _not_believed(st, estimate, tokens, why)
        seen.append((chars, n))
        got = n
        if abs(got - tokens) <= max(8, tokens // 50):
            break
        chars = min(max(int(chars * tokens / max(got, 1)), 64), tokens * MAX_CHARS_PER_TOKEN)
    return chars, got, "tokenize"


def _not_believed(st: SoakState, estimate: int, tokens: int, why: str) -> tuple[int, int, str]:
    """Sizing by the character estimate because /tokenize answered ``why``: its answers are not
    used (one that lies would make the prompt grow by target/reported each round: a server
    answering ``{"count": 10}`` grew one to gigabytes), and every check built on the prompt says
    so (inconclusive)."""
    st.emit("sizing", f"/tokenize not believed: {why}; sizing by the character estimate")
    return estimate, tokens, f"estimate (/tokenize not believed: {why})"


#: Characters per token a tokenizer may plausibly count in the soak's English/digit prompts (a byte
#: tokenizer counts ~1, GPT-style BPE ~4, nothing real counts 16): a count outside is a lying
#: /tokenize, and no prompt is ever grown past ``MAX_CHARS_PER_TOKEN`` characters a token.
MIN_CHARS_PER_TOKEN = 0.5


MAX_CHARS_PER_TOKEN = 16


def implausible_count(chars: int, count: int, seen: Sequence[tuple[int, int]]) -> str:
    """Why ``count`` tokens for ``chars`` characters cannot be a tokenizer's answer ('' when it
    can)."""
    if count <= 0:
        return f"{count} tokens for {chars} characters"
    ratio = chars / count
    if not MIN_CHARS_PER_TOKEN <= ratio <= MAX_CHARS_PER_TOKEN:
        return f"{count} tokens for {chars} characters ({ratio:.1f} characters a token)"
    for c, n in seen:
        if (chars > c and count < n) or (chars < c and count > n):
            return (
                f"{count} tokens for {chars} characters but {n} for {c}: longer text, fewer tokens"
            )
    return ""


def estimate_chars_per_token(
    samples: Sequence[Sample], prompt_of: Callable[[Sample], str]
) -> float:
    # Two prompts of different lengths cancel the chat template's fixed token overhead.
    pts = sorted(
        {(len(prompt_of(s)), s.prompt_tokens) for s in samples if s.ok and s.prompt_tokens}
    )
    if len(pts) >= 2:
        (c1, t1), (c2, t2) = pts[0], pts[-1]
        if t2 > t1 and c2 > c1:
            return min(max((c2 - c1) / (t2 - t1), 1.0), 8.0)
    return 4.0
