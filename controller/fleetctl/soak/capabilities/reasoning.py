"""The reasoning probe: one known-answer question with thinking on, and again with it off.

With the recipe's reasoning parser and thinking on, vLLM delivers the thinking in ``reasoning``
(``reasoning_content`` before 0.10) and the answer in ``content``: the answer must be there and
right, with no ``<think>``/``</think>`` left in it (a broken parser leaks the whole thinking into
content: vLLM #39697, #51679). With thinking off (``chat_template_kwargs.enable_thinking:
false``) there is no reasoning at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetctl.soak.capabilities.exchange import Exchange
from fleetctl.soak.checks.judge import garbage, snippet
from fleetctl.soak.verdict import Measurement, Outcome

PROMPT = "What is 17 × 23?"
EXPECT = "391"

#: Thinking on: room for a reasoning model's thinking and its answer (the emulator thinks ~1,600
#: tokens; a real Qwen3 a few hundred on this question). Thinking off: the answer only.
THINKING_TOKENS = 2048
ANSWER_TOKENS = 64

TAGS = ("<think>", "</think>")


def body(model: str, thinking: bool) -> dict[str, Any]:
    """The question, greedy, with the chat template's thinking on or off."""
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": THINKING_TOKENS if thinking else ANSWER_TOKENS, "temperature": 0.0,
            "chat_template_kwargs": {"enable_thinking": thinking}}


def judge(exchanges: Sequence[Exchange], parser: str) -> list[Measurement]:
    """One measurement per exchange (labels ``thinking on`` / ``thinking off``)."""
    return [_one(x, parser, x.label == "thinking on") for x in exchanges]


def _one(x: Exchange, parser: str, thinking: bool) -> Measurement:
    r = x.reply
    head = f"reasoning ({x.label}): {x.prompt!r}: expected {x.expected}"
    fail = Outcome.FAIL

    def m(outcome: Outcome, message: str) -> Measurement:
        return Measurement(x.label, outcome, message, snippet(r.content or ""), x.expected)

    if not r.ok:
        return m(fail, f"{head}, got no answer: {r.error}")
    content = r.content or ""
    if tag := next((t for t in TAGS if t in content), None):
        return m(fail, f"{head}, got {tag} in content: the {parser} reasoning parser left the "
                 f"thinking in the answer ({snippet(content)})")
    if thinking and not r.reasoning:
        if r.finish_reason == "length" and not content:
            return m(Outcome.INCONCLUSIVE, f"{head}: the answer did not arrive within "
                     f"{THINKING_TOKENS} tokens (finish_reason length, no reasoning either)")
        return m(fail, f"{head}, with the reasoning apart, got no reasoning field (the {parser} "
                 f"reasoning parser did not split it): content {snippet(content)}")
    if not thinking and r.reasoning:
        return m(fail, f"{head} and no reasoning, got reasoning with thinking off: "
                 f"{snippet(r.reasoning)}")
    if thinking and r.finish_reason == "length" and not content:
        return m(Outcome.INCONCLUSIVE, f"{head}: the thinking did not end within "
                 f"{THINKING_TOKENS} tokens (finish_reason length)")
    if why := garbage(content):
        return m(fail, f"{head}, got garbage ({why}): {snippet(content)}")
    if x.expected not in content:
        return m(fail, f"{head} in content, got {snippet(content)}")
    return m(Outcome.PASS, f"reasoning ({x.label}): {x.expected} in content"
             + (f", {len(r.reasoning or '')} characters of reasoning apart" if thinking else ""))
