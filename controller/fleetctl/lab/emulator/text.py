"""What the emulator says: known answers, deterministic filler, reasoning text and token counts.

Tokens are approximated as words and punctuation (about what a BPE tokenizer gives
for English), which keeps prompt token counts stable and cheap at 32K tokens.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

#: Prompts whose answer is known (normalised: lower case, single spaces).
KNOWN_ANSWERS: dict[str, str] = {
    "what is 17 × 23?": "17 × 23 = 391.",
    "what is 17 x 23?": "17 × 23 = 391.",
    "what is 17 * 23?": "17 × 23 = 391.",
    "hello!": "Hello! How can I help you today?",
    "hello": "Hello! How can I help you today?",
    "what is the capital of france?": "The capital of France is Paris.",
    "what is 2 + 2?": "2 + 2 = 4.",
}

#: The soak's long-prompt probe hides "The vault code is X." in a document and ends with this
#: question.
NEEDLE_QUESTION = "What is the vault code stated in the log above? Answer with the code only."
_NEEDLE_FACT = re.compile(r"The vault code is ([\w -]+?)\.")

#: A prompt "Repeat exactly: TEXT" is answered with TEXT.
COPY_PREFIX = "repeat exactly:"

_FILLER = (
    "the system reads each request and answers it in order while the scheduler keeps "
    "every stream moving so that no request waits longer than it must and the cache "
    "holds the shared prefix for the next turn of the conversation which makes the "
    "answer arrive sooner when the context repeats across many similar requests"
)
_FILLER_WORDS = _FILLER.split()

_THINK = (
    "Let me think about this carefully. The user asks a question and I should work "
    "through it step by step before answering, checking each intermediate result."
)
_REASONING = _THINK.split()


def count_tokens(text: str) -> int:
    """Approximate token count of ``text`` (words and punctuation marks)."""
    return len(_TOKEN_RE.findall(text))


def normalise(prompt: str) -> str:
    """A prompt as looked up in KNOWN_ANSWERS."""
    return " ".join(prompt.strip().lower().split())


def _seed(prompt: str, salt: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{salt}\0{prompt}".encode()).digest()[:8], "little")


def answer_tokens(prompt: str, *, temperature: float, salt: str = "") -> list[str]:
    """The answer to ``prompt`` as token strings (each with its leading space).

    At temperature 0 the same prompt always gets the same answer; above 0 the filler
    varies with ``salt`` (a per-request value), like sampling does.
    """
    known = KNOWN_ANSWERS.get(normalise(prompt))
    if known is not None:
        return split_tokens(known)
    stripped = prompt.strip()
    if stripped.endswith(NEEDLE_QUESTION) and (m := _NEEDLE_FACT.search(stripped)):
        # The soak's long-prompt probe: a fact hidden in a long document, asked for at its end.
        return split_tokens(f"The vault code is {m.group(1)}.")
    if stripped.lower().startswith(COPY_PREFIX):
        # The soak's copy canary: a greedy model repeats the text verbatim.
        return split_tokens(stripped[len(COPY_PREFIX):].strip())
    seed = _seed(prompt, salt if temperature > 0 else "")
    # Answer length between 150 and 600 tokens, deterministic per prompt.
    length = 150 + seed % 451
    words = prose_words(seed, length)
    words[0] = words[0].capitalize()
    tokens = [("" if i == 0 else " ") + w for i, w in enumerate(words)]
    tokens.append(".")
    return tokens


def prose_words(seed: int, length: int) -> list[str]:
    """``length`` filler words that read on without a period: runs of 4-11 consecutive filler words
    from places the seed picks, as prose re-uses its words without repeating one phrase (a healthy
    answer never ends in a loop; a degenerate build's does, :func:`degenerate`)."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < length:
        at = rng.randrange(len(_FILLER_WORDS))
        out += [_FILLER_WORDS[(at + i) % len(_FILLER_WORDS)] for i in range(rng.randint(4, 11))]
    return out[:length]


#: What a degenerate build repeats once its answer is long (EMU_DEGENERATE_AFTER_TOKENS).
DEGENERATE_PHRASE = " I can help with that."


def degenerate(pieces: Iterator[Piece], after: int) -> Iterator[Piece]:
    """``pieces`` up to ``after`` tokens; a longer answer then turns into one short phrase repeated
    for ever (to max_tokens), whatever the temperature and the batch: the phrase loops some builds
    fall into (eugr/spark-vllm-docker #363). Answers of ``after`` tokens or fewer end as they
    would."""
    for n, piece in enumerate(pieces):
        if n == after:
            break
        yield piece
    else:
        return
    loop = split_tokens(DEGENERATE_PHRASE)
    while True:
        for tok in loop:
            yield Piece("content", tok)


def reasoning_tokens(prompt: str) -> list[str]:
    """The thinking a reasoning model does before answering: 1,300-1,600 tokens.

    Long enough that a request with ``max_tokens`` below ~1500 ends inside the
    thinking (``content: null``, ``finish_reason: "length"``), as the model card warns.
    """
    length = 1300 + _seed(prompt, "think") % 301
    return [("" if i == 0 else " ") + _REASONING[i % len(_REASONING)] for i in range(length)]


def split_tokens(text: str) -> list[str]:
    """Split text into token strings that concatenate back to ``text``."""
    return re.findall(r"\s*(?:\w+|[^\w\s])", text) or [text]


@dataclass(frozen=True)
class Piece:
    """One generated token: which channel it belongs to and its text."""

    channel: str  # "reasoning" or "content"
    text: str


def generate(
    prompt: str,
    *,
    thinking: bool,
    temperature: float,
    garbage: bool,
    salt: str = "",
    ignore_eos: bool = False,
    verbatim: bool = False,
) -> Iterator[Piece]:
    """The full token stream of one completion (reasoning first when thinking is on).

    With ``ignore_eos`` (what ``vllm bench serve`` sends for fixed-length outputs) the answer
    never ends: filler follows it until max_tokens, as a real model keeps sampling past EOS.
    ``verbatim``: ``prompt`` is the answer itself (a tool call's markup, what an image shows).
    """
    if garbage:
        # The real failure mode: a model whose weights are wrong emits one token forever.
        while True:
            yield Piece("content", "!")
    if thinking:
        for tok in reasoning_tokens(prompt):
            yield Piece("reasoning", tok)
    answer = split_tokens(prompt) if verbatim else answer_tokens(
        prompt, temperature=temperature, salt=salt)
    for tok in answer:
        yield Piece("content", tok)
    n = 0
    while ignore_eos:
        yield Piece("content", " " + _FILLER_WORDS[n % len(_FILLER_WORDS)])
        n += 1
