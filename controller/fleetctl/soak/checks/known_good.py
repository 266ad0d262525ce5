"""The reference set judged against the last known-good version's answers (pure logic).

A server is not compared with itself here: a build that loops on every long answer loops on its
own c=1 reference too. Each greedy answer of the fixed set (``soak/answerset.py``) is compared with
the known-good version's answer to the same prompt: the build fails for

- a loop the known-good did not have (none, or another phrase),
- a run to ``max_tokens`` where the known-good stopped by itself,
- an answer far longer or shorter than the known-good's (``max_length_ratio``, past
  ``min_length_delta`` tokens),
- a known-answer canary whose answer changed,

each finding naming the prompt, both answers and both versions. Token agreement (the common
prefix's share, and how many answers match exactly) is reported per answer and for the set; it
fails only under a bound the recipe sets (``min_prefix_share``, ``min_exact_share``), because
kernels change numerics across versions and a greedy answer may then take another word.

Without a known-good (a first deploy) nothing is compared: the set is recorded, and an answer that
loops or runs to ``max_tokens`` is inconclusive, never a pass.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from fleetctl.soak.answerset import Answer, ReferenceSet
from fleetctl.soak.checks.check import Check, CheckContext
from fleetctl.soak.checks.judge import INC, F, P, decide, pct, skipped
from fleetctl.soak.config import CheckSpec
from fleetctl.soak.verdict import CheckResult, Measurement

_TOKEN = re.compile(r"\w+|[^\w\s]")

#: Defaults of the check's bounds (a recipe's soak settings override them).
MAX_LENGTH_RATIO = 2.5
MIN_LENGTH_DELTA = 48
#: Characters of each answer shown beside each other.
SHOWN = 160


@dataclass(frozen=True)
class Agreement:
    """How far two answers agree, token by token (words and punctuation)."""

    common_prefix: int
    #: Tokens of the longer answer; the prefix's share of it.
    longest: int
    exact: bool

    @property
    def prefix_share(self) -> float:
        """The common prefix over the longer answer (1.0 for two empty answers)."""
        return self.common_prefix / self.longest if self.longest else 1.0


def tokens(text: str) -> list[str]:
    """``text`` as words and punctuation marks, case kept (what agreement counts)."""
    return _TOKEN.findall(text)


def agreement(new: str, ref: str) -> Agreement:
    """Token agreement of ``new`` with ``ref``."""
    a, b = tokens(new), tokens(ref)
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return Agreement(n, max(len(a), len(b)), a == b)


def _words(phrase: str) -> list[str]:
    return [w.strip(".,;:!?\"'()[]*`").lower() for w in phrase.split()]


def same_loop(a: str, b: str) -> bool:
    """Two loop phrases that are the same phrase (one may start at another word of it)."""
    x, y = _words(a), _words(b)
    if not x or len(x) != len(y):
        return False
    return any(x[i:] + x[:i] == y for i in range(len(x)))


def excerpt(text: str, at: int, n: int = SHOWN) -> str:
    """About ``n`` characters of ``text`` from a little before character ``at`` (where two answers
    part), on one line, an ellipsis where it is cut."""
    one = " ".join(text.split())
    start = max(0, min(at, len(one)) - n // 4)
    part = one[start:start + n]
    return ("…" if start else "") + part + ("…" if start + n < len(one) else "")


def _parted(new: str, ref: str) -> int:
    """The character (in whitespace-normalised text) where ``new`` and ``ref`` first differ."""
    a, b = " ".join(new.split()), " ".join(ref.split())
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class Finding:
    """Why one answer fails against the known-good's: what differs, in one phrase."""

    what: str


def findings(new: Answer, ref: Answer, *, max_length_ratio: float = MAX_LENGTH_RATIO,
             min_length_delta: int = MIN_LENGTH_DELTA) -> list[Finding]:
    """What makes ``new`` a regression from ``ref`` (the same prompt's known-good answer); empty
    when it is not one. A different wording alone is none (token agreement reports it)."""
    if not new.ok:
        return [Finding(f"the request failed ({new.error})")]
    if not ref.ok:
        return []
    out: list[Finding] = []
    if new.loop_phrase and not (ref.loop_phrase and same_loop(new.loop_phrase, ref.loop_phrase)):
        had = f"a different loop ({ref.loop_phrase!r})" if ref.loop_phrase else "no loop"
        out.append(Finding(f"a loop the known-good did not have ({new.loop}; the known-good: "
                           f"{had})"))
    if ref.finish_reason == "stop" and new.finish_reason == "length":
        out.append(Finding(f"ran to max_tokens ({new.tokens} tokens) where the known-good stopped "
                           f"by itself at {ref.tokens}"))
    elif new.finish_reason == ref.finish_reason == "stop" and new.tokens and ref.tokens:
        longer, shorter = max(new.tokens, ref.tokens), min(new.tokens, ref.tokens)
        if longer - shorter >= min_length_delta and longer >= max_length_ratio * shorter:
            how = "longer" if new.tokens > ref.tokens else "shorter"
            out.append(Finding(f"far {how}: {new.tokens} tokens where the known-good took "
                               f"{ref.tokens}"))
    if new.kind == "canary" and " ".join(new.text.split()).lower() != \
            " ".join(ref.text.split()).lower():
        missing = f", without {new.expect!r}" if new.expect and \
            new.expect.lower() not in new.text.lower() else ""
        out.append(Finding(f"the known-answer canary's answer changed{missing}"))
    return out


def _both(new: Answer, ref: Answer, new_label: str, ref_label: str) -> str:
    at = _parted(new.text, ref.text)
    return (f"{new_label}: {excerpt(new.text, at)!r} ({new.finish_reason or 'failed'}, "
            f"{new.tokens} tokens); known-good {ref_label}: {excerpt(ref.text, at)!r} "
            f"({ref.finish_reason}, {ref.tokens} tokens)")


def judge_answer(spec: CheckSpec, new: Answer, ref: Answer | None, new_label: str,
                 ref_label: str) -> list[Measurement]:
    """One answer against the known-good's: its findings (fail), then its agreement (reported;
    a fail only under the recipe's ``min_prefix_share``)."""
    if ref is None:
        return [Measurement(new.id, P, f"{new.id}: not in the known-good's set (recorded now)")]
    found = findings(
        new, ref,
        max_length_ratio=float(spec.params.get("max_length_ratio") or MAX_LENGTH_RATIO),
        min_length_delta=int(spec.params.get("min_length_delta") or MIN_LENGTH_DELTA),
    )
    both = _both(new, ref, new_label, ref_label)
    if found:
        return [Measurement(new.id, F, f"{new.id}: " + "; ".join(f.what for f in found) +
                            f" — {both}", excerpt(new.text, _parted(new.text, ref.text)),
                            excerpt(ref.text, _parted(new.text, ref.text)))]
    ag = agreement(new.text, ref.text)
    bound = _bound(spec, "min_prefix_share")
    text = ("identical" if ag.exact else
            f"common prefix {ag.common_prefix} of {ag.longest} tokens ({pct(ag.prefix_share)})")
    if bound is not None and ag.prefix_share < bound:
        return [Measurement(f"{new.id} agreement", F, f"{new.id}: agrees with the known-good "
                            f"for {pct(ag.prefix_share)} of its tokens, under the recipe's "
                            f"{pct(bound)} — {both}", ag.prefix_share, bound)]
    return [Measurement(f"{new.id} agreement", P, f"{new.id}: {text}", round(ag.prefix_share, 4),
                        bound)]


def _bound(spec: CheckSpec, key: str) -> float | None:
    value = spec.params.get(key)
    return float(value) if value is not None else None


def summary(answers: Sequence[Answer], ref: ReferenceSet) -> tuple[float, float, int]:
    """(mean common-prefix share, exact-match share, answers compared) of the set."""
    pairs = [(a, r) for a in answers if a.ok and (r := ref.answer(a.id)) is not None and r.ok]
    if not pairs:
        return 0.0, 0.0, 0
    ags = [agreement(a.text, r.text) for a, r in pairs]
    return (sum(g.prefix_share for g in ags) / len(ags), sum(g.exact for g in ags) / len(ags),
            len(ags))


def first_deploy(spec: CheckSpec, answers: Sequence[Answer]) -> CheckResult:
    """No known-good yet: the answers are recorded; a loop is inconclusive (the same server's c=1
    answer cannot clear it: it loops as well when the build does). A run to max_tokens is shown."""
    out: list[Measurement] = []
    for a in answers:
        if not a.ok:
            out.append(Measurement(a.id, F, f"{a.id}: the request failed ({a.error})"))
        elif a.loop:
            out.append(Measurement(
                a.id, INC, f"{a.id}: ends in a loop ({a.loop}) with no known-good version to "
                f"compare with (a first deploy): {excerpt(a.text, len(a.text))!r}",
                excerpt(a.text, len(a.text)), None))
        else:
            out.append(Measurement(a.id, P, f"{a.id}: {a.finish_reason}, {a.tokens} tokens",
                                   a.tokens, None))
    long = sum(a.finish_reason == "length" for a in answers if a.kind != "long_decode")
    return decide(spec, out, ok_message=f"no known-good version yet (a first deploy): "
                  f"{len(answers)} greedy answers recorded, none loops"
                  + (f" ({long} ran to max_tokens)" if long else ""),
                  no_data="no reference answer was asked")


def check_known_good(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """The reference set's answers against the known-good version's (see the module docstring):
    the ledger's set ``ref``, and ``side``, the same prompts asked of a host still on the old
    version during this rollout (either may be missing; neither: a first deploy)."""
    answers, ref, side = ctx.evidence.answers, ctx.reference, ctx.side
    new_label, ran = ctx.label or ctx.evidence.host, ctx.evidence.load_ran
    if not ran:
        return skipped(spec, "not run: no load phase")
    against = [r for r in (ref, side) if r is not None and any(a.ok for a in r.answers)]
    if not against:
        return first_deploy(spec, answers)
    out: list[Measurement] = []
    said: list[str] = []
    for r in against:
        ref_label = r.label() + (" on a host still serving it" if r.source == "side-by-side"
                                 else "")
        ms = [m for a in answers for m in judge_answer(spec, a, r.answer(a.id), new_label,
                                                      ref_label)]
        if r.source == "side-by-side":
            ms = [replace(m, label=f"side-by-side {m.label}") for m in ms]
        out += ms
        prefix, exact, n = summary(answers, r)
        bound = _bound(spec, "min_exact_share")
        if n:
            low = bound is not None and exact < bound
            out.append(Measurement(
                "agreement" if r.source != "side-by-side" else "side-by-side agreement",
                F if low else P,
                f"token agreement with {ref_label}: {pct(exact)} of {n} answers identical, mean "
                f"common prefix {pct(prefix)}" + (f" (under the recipe's {pct(bound)})"
                                                  if bound is not None and low else ""),
                round(exact, 4), bound))
        said.append(f"{ref_label}'s: {pct(exact)} identical, mean common prefix {pct(prefix)}")
    return decide(spec, out, ok_message=f"{len(answers)} greedy answers as the known-good "
                  + "; as ".join(said), no_data="no reference answer was asked")


# The fixed greedy prompts with natural ends (soak/answerset.py) against the last known-good
# version's answers: how many per class, their max_tokens and concurrency (1: batch-invariant
# greedy answers), the length bounds, and the token-agreement bounds (unset: reported only,
# kernels change numerics across versions). The lab: one prompt per class; the emulator's answers
# run 150-600 tokens and are the same at any concurrency, so the set is asked four at a time.
KNOWN_GOOD = Check(
    "known_good", check_known_good, needs=("answer_set",),
    params={"prompts_per_class": "count", "max_tokens": "count", "concurrency": "count",
            "max_length_ratio": "number", "min_length_delta": "count",
            "min_prefix_share": "fraction", "min_exact_share": "fraction"},
    defaults={"spark": {"prompts_per_class": 2, "max_tokens": 1024, "concurrency": 1},
              "lab": {"prompts_per_class": 1, "max_tokens": 768, "concurrency": 4}})
