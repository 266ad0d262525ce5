"""Garbage in a stream's text, checked as it arrives: runs of one character, one token repeated,
U+FFFD replacement characters; a few string operations per event."""

from __future__ import annotations

from collections.abc import Sequence

#: Characters of text kept around a garbage finding for the verdict.
EXCERPT_CHARS = 160


#: Runs of one character that are garbage: ``!`` and U+FFFD are what broken
#: weights and broken detokenizers emit; other punctuation rarely repeats 32 times; letters,
#: digits and separator lines (``----``, ``====`` in markdown) get more room.
_RUN_LIMITS = {"!": 16, "\ufffd": 16}


_PUNCT_RUN = 32


_OTHER_RUN = 96


#: Blank runs (indentation, blank lines) are garbage only when absurdly long.
_SPACE_RUN = 512


#: The same token (one event's text) repeated this many times in a row is a degenerate loop.
_TOKEN_REPEATS = 32


#: Replacement characters in one answer before it is garbage (one can be a split byte).
_MAX_REPLACEMENTS = 3


class TextCheck:
    """Incremental garbage detector over a stream's text deltas (content and reasoning).

    ``feed_all(deltas)`` costs a comparison, a strip and a substring test per event; the
    first finding is kept (``reason``, ``excerpt``) and checking stops there.
    """

    __slots__ = ("excerpt", "last", "parts", "prev", "reason", "replacements", "run", "same")

    def __init__(self) -> None:
        self.prev = ""
        self.same = 0
        self.last = ""
        self.run = 0
        self.replacements = 0
        self.reason = ""
        self.excerpt = ""
        self.parts: list[str] = []

    def feed(self, s: str) -> None:
        """Check the next delta ``s`` (non-empty)."""
        self.feed_all((s,))

    def feed_all(self, deltas: Sequence[str]) -> None:
        """Check the next deltas in order (one call per received chunk: the state lives in
        locals for the loop, which halves the per-event cost of attribute access)."""
        if self.reason:
            return
        # The whole answer is kept (one answer is at most max_tokens deltas) so the excerpt can
        # show what came before the garbage.
        parts = self.parts
        base = len(parts)
        parts.extend(deltas)
        prev, same, last, run = self.prev, self.same, self.last, self.run
        for i, s in enumerate(deltas):
            if s != prev:
                prev = s
                same = 1
            else:
                same += 1
            c = s[-1]
            k = len(s) - len(s.rstrip(c))
            # Blanks between the characters of a run (" !" tokens) do not break it.
            if c == last and (k == len(s) or s[:len(s) - k].isspace()):
                run += k
            else:
                run = k
                last = c
            reason = ""
            if run >= 16 and run >= _run_limit(last):
                reason = f"a run of {run} {last!r}"
            elif same >= _TOKEN_REPEATS and not s.isspace():
                reason = f"the token {s!r} repeated {same} times in a row"
            elif "\ufffd" in s:
                self.replacements += s.count("\ufffd")
                if self.replacements >= _MAX_REPLACEMENTS:
                    reason = (
                        f"{self.replacements} U+FFFD replacement characters (undecodable output)"
                    )
            if reason:
                del parts[base + i + 1:]
                self.reason = reason
                self.excerpt = "".join(parts)[-EXCERPT_CHARS:]
                break
        self.prev, self.same, self.last, self.run = prev, same, last, run


def _run_limit(c: str) -> int:
    if c in _RUN_LIMITS:
        return _RUN_LIMITS[c]
    if c.isspace():
        return _SPACE_RUN
    if c.isalnum() or c in "-=_*#.`~":
        return _OTHER_RUN
    return _PUNCT_RUN
