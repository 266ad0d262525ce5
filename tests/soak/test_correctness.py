"""The correctness check: garbage under load and canaries, judged with the offending sample."""

from __future__ import annotations

from fleetctl.soak.checks.answers import check_correctness
from fleetctl.soak.checks.check import CheckContext
from fleetctl.soak.checks.evidence import CanaryResult, Evidence
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.verdict import Outcome, Readiness, Sample

LAB = load_config({}, profile="lab")
SPEC = LAB.check("correctness")
READY = Readiness(Outcome.PASS, "ready", 1.0)


def ctx(ev: Evidence) -> CheckContext:
    """The context the check is evaluated in (no known-good version: a first deploy)."""
    return CheckContext(ev, LAB)


def _s(
    text: str = "", *, ok: bool = True, garbage: str = "", phase: str = "sweep", c: int = 16
) -> Sample:
    return Sample(
        phase=phase,
        cls="coding",
        concurrency=c,
        start=12.34,
        ok=ok,
        text=text,
        garbage=garbage,
        excerpt=text[-160:] if garbage else "",
        error="" if ok else "HTTP 500: boom",
        error_kind="" if ok else "http",
        output_tokens=32,
    )


def test_garbage_under_load_fails_with_host_level_and_excerpt() -> None:
    bad = _s("fine text " + "!" * 20, garbage="a run of 16 '!'")
    ev = Evidence(
        readiness=READY, load_ran=True, host="spark-03", garbage_samples=(bad,), streams_checked=40
    )
    r = check_correctness(SPEC, ctx(ev))
    assert r.outcome is Outcome.FAIL
    assert (
        "spark-03 c=16: garbage in a coding answer started at +12.3s (a run of 16 '!')" in r.message
    )
    assert "!!!!" in r.message
    assert r.measurements[0].measured == bad.excerpt


def test_canaries_must_hold_the_answer_and_repeat_the_c1_answer() -> None:
    ref = "17 × 23 = 391."
    good = CanaryResult("arithmetic", "391", "c=16", _s(ref), ref)
    wrong = CanaryResult("arithmetic", "391", "c=32", _s("17 × 23 = 392."), ref)
    drift = CanaryResult(
        "fact", "Paris", "c=64", _s("Paris, of course."), "The capital of France is Paris."
    )
    failed = CanaryResult("copy", "amber", "sustained", _s(ok=False), None)
    ev = Evidence(readiness=READY, load_ran=True, host="h", canaries=(good,), streams_checked=8)
    assert check_correctness(SPEC, ctx(ev)).outcome is Outcome.PASS
    for c, says in (
        (wrong, "lacks '391'"),
        (drift, "differs from its c=1 answer"),
        (failed, "HTTP 500"),
    ):
        r = check_correctness(
            SPEC, ctx(Evidence(readiness=READY, load_ran=True, host="h", canaries=(good, c)))
        )
        assert (
            r.outcome is Outcome.FAIL
            and says in r.message
            and f"canary {c.name} at {c.level}" in r.message
        )


def test_no_load_is_skipped_and_nothing_checked_is_inconclusive() -> None:
    assert check_correctness(SPEC, ctx(Evidence(readiness=READY))).outcome is Outcome.SKIPPED
    assert (
        check_correctness(SPEC, ctx(Evidence(readiness=READY, load_ran=True))).outcome
        is Outcome.INCONCLUSIVE
    )
