"""How a check's measurements become its outcome, and the doubts every check family shares.

``decide`` applies a check's limits to its measurements and ``overall`` makes the checks'
verdict; the other helpers turn evidence that
no bound can judge (garbage text, another client's traffic, a series that reads impossibly, a
prompt that missed its size) into measurements of its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fleetctl.soak.checks.evidence import Evidence
from fleetctl.soak.config import CheckSpec
from fleetctl.soak.verdict import (
    CheckResult,
    Measurement,
    Outcome,
)

P, F, INC, ERR, SKIP = (
    Outcome.PASS,
    Outcome.FAIL,
    Outcome.INCONCLUSIVE,
    Outcome.ERROR,
    Outcome.SKIPPED,
)


def pct(x: float | None) -> str:
    """0.523 -> '52.3%' ('n/a' for None)."""
    return "n/a" if x is None else f"{100 * x:.1f}%"


def ms(x: float | None) -> str:
    """Seconds as a readable duration."""
    if x is None:
        return "n/a"
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def decide(spec: CheckSpec, ms_: Sequence[Measurement], ok_message: str = "",
           no_data: str = "no data to judge") -> CheckResult:
    """Apply ``spec``'s limits to the measurements (Argo Rollouts' analysis semantics)."""
    name = spec.name
    if not ms_:
        return CheckResult(name, INC, f"inconclusive: {no_data}", spec.observe_only)
    fails = [m for m in ms_ if m.outcome is F]
    incs = [m for m in ms_ if m.outcome is INC]
    errs = [m for m in ms_ if m.outcome is ERR]
    run = worst = 0
    for m in ms_:
        run = run + 1 if m.outcome is ERR else 0
        worst = max(worst, run)
    if len(fails) > spec.failure_limit:
        outcome, shown = F, fails
    elif worst > spec.consecutive_error_limit:
        outcome, shown = ERR, errs
    elif len(incs) > spec.inconclusive_limit:
        outcome, shown = INC, incs
    elif all(m.outcome is SKIP for m in ms_):
        outcome, shown = SKIP, list(ms_)
    else:
        outcome, shown = P, []
    if outcome is P:
        message = ok_message or f"{sum(m.outcome is P for m in ms_)} measurement(s) within bounds"
        tolerated = len(fails) + len(incs) + len(errs)
        if tolerated:
            message += f" ({tolerated} tolerated by the check's limits)"
    else:
        message = "; ".join(m.message for m in shown[:3])
        if len(shown) > 3:
            message += f"; and {len(shown) - 3} more"
    return CheckResult(name, outcome, message, spec.observe_only, tuple(ms_))


def skipped(spec: CheckSpec, why: str) -> CheckResult:
    """A check that does not apply to this soak."""
    return CheckResult(spec.name, SKIP, why, spec.observe_only)


_RUN = re.compile(r"(\S)\1{7,}")


def garbage(text: str) -> str:
    """Why ``text`` looks like garbage output (``!!!!``...), or '' when it does not.

    A long run of one repeated non-space character, or one character making up
    most of the reply, is what a model with mis-loaded weights emits.
    """
    stripped = "".join(text.split())
    if not stripped:
        return ""
    m = _RUN.search(stripped)
    if m and not m.group(1).isalnum() and len(m.group(0)) >= 8 and m.group(1) not in "-=_*#.`~":
        return f"a run of {len(m.group(0))} {m.group(1)!r}"
    if len(stripped) >= 16:
        top = max(set(stripped), key=stripped.count)
        share = stripped.count(top) / len(stripped)
        if share >= 0.8:
            return f"{share:.0%} of the reply is {top!r}"
    return ""


def snippet(text: str, n: int = 60) -> str:
    one = " ".join(text.split())
    return repr(one if len(one) <= n else one[: n - 1] + "…")


def foreign_traffic(ev: Evidence, phases: Sequence[str]) -> list[Measurement]:
    """Inconclusive measurements for windows of ``phases`` where another client's requests ran.

    /metrics counts every client's tokens and drafts: with foreign traffic in a window, the
    throughput and acceptance figures of that window are not this soak's.
    """
    out = []
    for w in ev.windows:
        if w.phase not in phases or w.foreign_requests is None:
            continue
        mine = sum(w.success_by_reason.values()) - w.foreign_requests
        if w.foreign_requests > max(FOREIGN_MIN, FOREIGN_SHARE * mine):
            out.append(
                Measurement(
                    f"{w.label} foreign",
                    INC,
                    f"{w.label}: the server finished {w.foreign_requests:.0f} requests besides "
                    "this "
                    f"soak's {mine:.0f}: another client is using it, its figures are not this "
                    "server's alone (soak a host out of rotation: with fleetctl_front_door set, "
                    "a rollout drains it at the front door first, docs/frontdoor.md)",
                    w.foreign_requests,
                    None,
                )
            )
    return out


def inconsistent(
    ev: Evidence, series: Sequence[str], phases: Sequence[str] = ()
) -> list[Measurement]:
    """Inconclusive measurements for windows whose ``series`` read impossibly (see
    metrics.inconsistencies).

    A ratio over 100 %, a counter going backwards, accepted > drafted: the server's figures are not
    numbers a bound can pass or fail, so the check says which series lied instead of judging them.
    """
    out = []
    for w in ev.windows:
        if phases and w.phase not in phases:
            continue
        for finding in w.inconsistent:
            if finding.startswith(tuple(series)):
                out.append(
                    Measurement(
                        f"{w.label} metrics",
                        INC,
                        f"metrics inconsistent in {w.label}: {finding}",
                        finding.split(" ", 1)[0],
                        None,
                    )
                )
    return out




#: Foreign requests in a window tolerated before its figures are doubted: boundary effects
#: (a request finishing as the window is scraped) account for one or two.
FOREIGN_MIN = 3


FOREIGN_SHARE = 0.1


#: How far a prompt's measured length may miss its target before the check built on it is doubtful.
SIZE_TOLERANCE = 0.25


def size_measurements(ev: Evidence, name: str) -> list[Measurement]:
    """The prompt ``name`` as measured by the server's usage against its target (inconclusive when
    far off)."""
    if name not in ev.prompt_sizes:
        return []
    target, got, how = ev.prompt_sizes[name]
    if got is None or target <= 0:
        return [
            Measurement(
                f"{name} prompt",
                INC,
                f"{name} prompt: no usage figure to check its {target} target tokens ({how})",
            )
        ]
    off = abs(got - target) / target
    # Sized by the server's own /tokenize and still far off: something is wrong with the server's
    # counting, inconclusive. Sized by a character estimate (a server without /tokenize): reported.
    # A /tokenize whose answers were not believed (estimate (...)): the server's counting is
    # suspect.
    doubtful = (off > SIZE_TOLERANCE and how == "tokenize") or how.startswith("estimate (")
    return [
        Measurement(
            f"{name} prompt",
            INC if doubtful else P,
            f"{name} prompt {got} tokens measured, target {target} (sized by {how})"
            + (
                ": the prompt is not what the check assumes"
                if doubtful
                else f": {off:.0%} off, the server has no /tokenize"
                if off > SIZE_TOLERANCE
                else ""
            ),
            got,
            target,
        )
    ]


def overall(checks: Sequence[CheckResult]) -> Outcome:
    """The verdict: any fail -> fail; else any error -> error; else any inconclusive; else pass."""
    counted = [c.outcome for c in checks if not c.observe_only]
    for o in (F, ERR, INC):
        if o in counted:
            return o
    return P
