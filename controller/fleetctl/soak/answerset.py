"""The reference set: greedy answers to a fixed set of prompts with natural ends.

A soak asks each prompt of :func:`reference_prompts` once (temperature 0, :data:`SEED`, thinking
off, free to stop) and keeps each answer as an :class:`Answer`. A passing full soak's answers
become its recipe's known-good :class:`ReferenceSet` (``soak/references.py`` keeps them in the
ledger); the next version's answers are compared with them (``soak/checks/known_good.py``).

Pure data and the prompt list: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetctl.soak import prompts

#: The sampling seed every reference request sends (vLLM honours a per-request seed).
SEED = 1234

#: Prompts per class written to end well under the set's max_tokens: a healthy model stops by
#: itself on each, so a run to max_tokens or a loop is the build's doing.
NATURAL_END: dict[str, tuple[str, ...]] = {
    "coding": (
        "Write a Python function is_even(n) that returns True for even integers. Code only, no "
        "explanation.",
        "In two sentences, explain what a Python list comprehension is.",
    ),
    "math": (
        "What is 15% of 80? Show the calculation in one line, then give the result.",
        "In three short steps, solve 3x + 7 = 22.",
    ),
    "reasoning": (
        "All cats are mammals and Tom is a cat. Is Tom a mammal? Answer in two sentences.",
        "A bat and a ball cost 1.10 in total; the bat costs 1.00 more than the ball. What does "
        "the ball cost? Explain in three sentences.",
    ),
    "prose": (
        "Write a four-line poem about the first snow of winter.",
        "Describe a quiet harbour at dawn in three sentences.",
    ),
    "natural_language": (
        "Give three tips for staying focused while studying, one line each.",
        "In two sentences, why do leaves change colour in autumn?",
    ),
    "extraction": (
        'Return only JSON {"name", "role"} for: "Dr. Ana Ruiz is the lead engineer."',
        'Return only a JSON list of the colours named in: "a red car, a blue door, green '
        'shutters".',
    ),
}


@dataclass(frozen=True)
class RefPrompt:
    """One prompt of the reference set: its id (stable across versions), kind and text."""

    id: str
    #: ``canary`` (a known answer: ``expect``), ``natural`` (ends by itself) or ``long_decode``
    #: (the long decode's first window: ends at max_tokens, for the known-good too).
    kind: str
    prompt: str
    expect: str = ""
    #: Tokens asked for (0: the set's max_tokens).
    max_tokens: int = 0


def reference_prompts(per_class: int, long_window: int) -> tuple[RefPrompt, ...]:
    """The set, in the order it is asked: the canaries, ``per_class`` natural-end prompts of each
    class, then the long decode's prompt cut at ``long_window`` tokens (none when 0)."""
    out = [RefPrompt(f"canary:{c.name}", "canary", c.prompt, c.expect) for c in prompts.CANARIES]
    for cls, texts in NATURAL_END.items():
        out += [RefPrompt(f"{cls}:{i + 1}", "natural", t) for i, t in enumerate(texts[:per_class])]
    if long_window > 0:
        out.append(RefPrompt("long_decode:window1", "long_decode", prompts.LONG_DECODE_PROMPT,
                             max_tokens=long_window))
    return tuple(out)


@dataclass(frozen=True)
class Answer:
    """One greedy answer of the reference set."""

    id: str
    kind: str
    prompt: str
    text: str
    #: ``stop`` (ended by itself), ``length`` (ran to max_tokens), or empty when the request failed.
    finish_reason: str
    #: completion_tokens as the server counted them.
    tokens: int
    max_tokens: int
    #: The loop at its end (soak/loops.py ``Loop.describe``), empty when none.
    loop: str = ""
    #: The loop's repeated phrase (compared across versions), empty when none.
    loop_phrase: str = ""
    expect: str = ""
    #: Why the request failed (empty when it answered).
    error: str = ""

    @property
    def ok(self) -> bool:
        """The server answered (whatever it said)."""
        return not self.error


@dataclass(frozen=True)
class ReferenceSet:
    """The answers one version gave, and what produced them: the known-good a later version is
    compared with."""

    answers: tuple[Answer, ...]
    #: What /version said, the image tag and digest, the recipe and the soak config's fingerprint.
    version: str = ""
    tag: str = ""
    digest: str = ""
    recipe: str = ""
    fingerprint: str = ""
    #: The soak run that recorded it, the host it ran on, and when (ISO 8601).
    run_id: str = ""
    host: str = ""
    recorded: str = ""
    #: Where the set comes from: ``ledger`` (a passing full soak) or ``side-by-side`` (a host
    #: still on the old version, asked during this rollout).
    source: str = "ledger"

    def answer(self, answer_id: str) -> Answer | None:
        """The answer to prompt ``answer_id``, if the set has it."""
        return next((a for a in self.answers if a.id == answer_id), None)

    def label(self) -> str:
        """The version for messages: tag (short digest), or what /version said."""
        short = self.digest.split(":")[-1][:12] if self.digest else ""
        name = self.tag or self.version or "?"
        return f"{name} ({short})" if short else name
