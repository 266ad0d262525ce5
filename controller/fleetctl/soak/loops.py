"""Multi-token loops in generated text: a phrase repeated to the end of an answer.

A server whose long answers turn into "I can help with that. I can help with that. ..." passed
the gate's single-character and single-delta checks. :func:`find_loop` looks for the longest
periodic tail of an answer, by words (a period of 1 to :data:`MAX_PERIOD` words repeated at
least :data:`MIN_REPEATS` times over at least :data:`MIN_WORDS` words), and reports it with the
text's 4-gram repetition ratio and its compression ratio, two figures a reader can compare.

A loop alone is not a failure: a healthy model asked for exactly ``max_tokens`` (``ignore_eos``)
keeps writing past its natural end and often loops there. The soak judges a looping answer
against the same prompt's reference (``phases.loop_references``): no finding when the reference
loops too, or when the loop starts where the reference stopped by itself.

Cost: one ``str.split`` and, per period, a comparison from the end until the first mismatch,
once per answer (not per event).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

#: The longest phrase, in words, looked for (a repeated sentence or two).
MAX_PERIOD = 64
#: A loop covers at least this many words ...
MIN_WORDS = 24
#: ... and repeats its phrase at least this many times.
MIN_REPEATS = 3


@dataclass(frozen=True)
class Loop:
    """A phrase of ``period`` words repeated ``repeats`` times up to the end of the text."""

    period: int
    repeats: float
    phrase: str
    #: Characters of the text before the loop starts (where its first repetition begins).
    start: int
    #: Words the periodic tail covers, and the text's word count.
    words: int
    total_words: int
    #: Share of the text's word 4-grams that occur more than once; compressed size / raw size.
    ngram_repetition: float
    compression: float

    def describe(self) -> str:
        """One line: what repeats, how often, from where."""
        phrase = self.phrase if len(self.phrase) <= 80 else self.phrase[:79] + "…"
        return (
            f"the {self.period}-word phrase {phrase!r} repeated {self.repeats:.0f} times over the "
            "last "
            f"{self.words} of {self.total_words} words (from character {self.start}; 4-gram "
            "repetition "
            f"{self.ngram_repetition:.0%}, compresses to {self.compression:.0%})"
        )


def find_loop(text: str, *, max_period: int = MAX_PERIOD, min_words: int = MIN_WORDS,
              min_repeats: int = MIN_REPEATS) -> Loop | None:
    """The longest periodic tail of ``text`` that counts as a loop, or None."""
    raw = text.split()
    n = len(raw)
    if n < min_words:
        return None
    # Compared without case and edge punctuation: a loop's first word may be capitalised and its
    # last one carry the full stop that ends the answer.
    words = [w.strip(_EDGE).lower() for w in raw]
    best_p, best_cover = 0, 0
    for p in range(1, min(max_period, n // min_repeats) + 1):
        i = n - 1
        while i >= p and words[i] == words[i - p]:
            i -= 1
        cover = (n - 1 - i) + p  # the matching positions plus the phrase they repeat
        if cover >= max(min_words, min_repeats * p) and cover > best_cover:
            best_p, best_cover = p, cover
    if not best_p:
        return None
    first = n - best_cover
    start = _char_offset(text, first)
    phrase = " ".join(raw[first:first + best_p])
    return Loop(best_p, best_cover / best_p, phrase, start, best_cover, n, ngram_repetition(words),
                compression_ratio(text))


_EDGE = ".,;:!?\"'()[]*`"


def ngram_repetition(words: list[str], n: int = 4) -> float:
    """Share of the word ``n``-grams that are repeats of an earlier one (0: none, ~1: one
    phrase)."""
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def compression_ratio(text: str) -> float:
    """zlib-compressed size over raw size: prose ~0.4-0.5, a loop a few percent."""
    raw = text.encode()
    return len(zlib.compress(raw, 6)) / len(raw) if raw else 1.0


def _char_offset(text: str, word_index: int) -> int:
    """Where word number ``word_index`` of ``text.split()`` starts."""
    pos = 0
    for _ in range(word_index):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        while pos < len(text) and not text[pos].isspace():
            pos += 1
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
