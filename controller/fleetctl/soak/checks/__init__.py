"""The gate's checks: evidence from one soak in, one CheckResult per check out.

Each check turns its evidence into measurements (one per level, window, class
or prompt), each pass / fail / inconclusive / error with the measured value and
its bound, then applies the check's limits as Argo Rollouts' analysis does:
more failures than ``failure_limit`` fails it, more consecutive errors than
``consecutive_error_limit`` errors it, more inconclusive measurements than
``inconclusive_limit`` makes it inconclusive. No measurements at all is
inconclusive: missing data never passes. ``observe_only`` checks are reported
but do not count toward the verdict.

The families live beside this module, each one concept: ``evidence`` (what a soak observed),
``judge`` (the outcome rules and the doubts all families share), ``health``, ``answers``,
``performance`` and ``speculative``. ``evaluate`` runs them in report order; every public name
stays reachable here (``checks.decide``, ``checks.Evidence``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleetctl.soak.answerset import ReferenceSet
from fleetctl.soak.checks.answers import (
    EXCERPT_REF,
    NATURAL_END_SHARE,
    check_correctness,
    check_long_decode,
    check_long_prompts,
    long_decode_windows,
    same_answer,
)
from fleetctl.soak.checks.evidence import (
    CanaryResult,
    Evidence,
    Identity,
    LongPrompt,
    LoopResult,
    SmokeResult,
    Wedge,
)
from fleetctl.soak.checks.health import (
    ANSWER_WINDOW,
    check_container,
    check_errors,
    check_identity,
    check_liveness,
    check_preemptions,
    check_readiness,
    check_server_errors,
    check_smoke,
)
from fleetctl.soak.checks.judge import (
    ERR,
    FOREIGN_MIN,
    FOREIGN_SHARE,
    INC,
    SIZE_TOLERANCE,
    SKIP,
    F,
    P,
    decide,
    foreign_traffic,
    garbage,
    inconsistent,
    ms,
    pct,
    size_measurements,
    skipped,
    snippet,
)
from fleetctl.soak.checks.known_good import check_known_good
from fleetctl.soak.checks.performance import check_latency, check_throughput
from fleetctl.soak.checks.speculative import (
    SPEC_SERIES,
    acceptance_trend,
    check_acceptance,
    check_acceptance_decay,
    check_long_context,
    position0,
)
from fleetctl.soak.config import CHECKS, CheckSpec, SoakConfig
from fleetctl.soak.verdict import CheckResult, Outcome, Verdict

# The families' public names, reachable as checks.NAME as when they were all in one module.
__all__ = [
    "ANSWER_WINDOW",
    "ERR",
    "EXCERPT_REF",
    "FOREIGN_MIN",
    "FOREIGN_SHARE",
    "INC",
    "NATURAL_END_SHARE",
    "SIZE_TOLERANCE",
    "SKIP",
    "SPEC_SERIES",
    "CanaryResult",
    "Evidence",
    "F",
    "Identity",
    "LongPrompt",
    "LoopResult",
    "P",
    "SmokeResult",
    "Wedge",
    "acceptance_trend",
    "check_acceptance",
    "check_acceptance_decay",
    "check_container",
    "check_correctness",
    "check_errors",
    "check_identity",
    "check_known_good",
    "check_latency",
    "check_liveness",
    "check_long_context",
    "check_long_decode",
    "check_long_prompts",
    "check_preemptions",
    "check_readiness",
    "check_server_errors",
    "check_smoke",
    "check_throughput",
    "decide",
    "evaluate",
    "foreign_traffic",
    "garbage",
    "inconsistent",
    "long_decode_windows",
    "ms",
    "overall",
    "pct",
    "position0",
    "same_answer",
    "size_measurements",
    "skipped",
    "snippet",
]


def evaluate(ev: Evidence, config: SoakConfig, baseline: Verdict | None,
             baseline_note: str = "", reference: ReferenceSet | None = None,
             label: str = "", side: ReferenceSet | None = None) -> tuple[CheckResult, ...]:
    """Every enabled check, in report order (disabled ones are reported as skipped).

    ``baseline_note``: why there is no baseline to compare with, when one was set aside.
    ``reference``: the known-good version's reference set (None: a first deploy); ``label``: the
    version under test, as messages name it; ``side``: the same prompts' answers from a host still
    on the old version (a rollout's side-by-side comparison).
    """
    known = reference or side
    fns: dict[str, Callable[[CheckSpec], CheckResult]] = {
        "readiness": lambda s: check_readiness(s, ev),
        "identity": lambda s: check_identity(s, ev, config),
        "smoke": lambda s: check_smoke(s, ev),
        "errors": lambda s: check_errors(s, ev, config),
        "liveness": lambda s: check_liveness(s, ev),
        "correctness": lambda s: check_correctness(s, ev, known.label() if known else ""),
        "long_decode": lambda s: check_long_decode(s, ev, config),
        "long_prompts": lambda s: check_long_prompts(s, ev, config),
        "server_errors": lambda s: check_server_errors(s, ev),
        "latency": lambda s: check_latency(s, ev),
        "throughput": lambda s: check_throughput(s, ev, baseline, baseline_note),
        "acceptance": lambda s: check_acceptance(s, ev, config, baseline),
        "acceptance_decay": lambda s: check_acceptance_decay(s, ev, config),
        "long_context": lambda s: check_long_context(s, ev, config),
        "preemptions": lambda s: check_preemptions(s, ev),
        "container": lambda s: check_container(s, ev),
        "known_good": lambda s: check_known_good(s, ev.answers, reference, label or ev.host,
                                                 ev.load_ran, side),
    }
    out: list[CheckResult] = []
    if fns.keys() != set(CHECKS):  # the declaration in soak/config.py and the evaluators must agree
        raise AssertionError(
            f"soak checks without an evaluator or a declaration: {set(CHECKS) ^ fns.keys()}"
        )
    for name in CHECKS:
        fn = fns[name]
        spec = config.check(name)
        if not spec.enabled:
            out.append(skipped(spec, "disabled in the recipe's soak settings"))
        elif config.smoke_only and name not in ("readiness", "identity", "smoke", "container"):
            out.append(skipped(spec, "smoke-only soak (no load)"))
        else:
            out.append(fn(spec))
    return tuple(out)


def overall(checks: Sequence[CheckResult]) -> Outcome:
    """The verdict: any fail -> fail; else any error -> error; else any inconclusive; else pass."""
    counted = [c.outcome for c in checks if not c.observe_only]
    for o in (F, ERR, INC):
        if o in counted:
            return o
    return P
