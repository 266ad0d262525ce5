"""The reference set judged against the known-good version's answers (soak/checks/known_good.py),
on real text pairs: a healthy model's natural end against a loop, a numerics-only difference that
must not fail, a lost stop, a changed canary, and a first deploy."""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl.soak.answerset import Answer, ReferenceSet, reference_prompts
from fleetctl.soak.checks.check import CheckContext
from fleetctl.soak.checks.evidence import Evidence
from fleetctl.soak.checks.known_good import (
    agreement,
    check_known_good,
    findings,
    same_loop,
)
from fleetctl.soak.config import CheckSpec
from fleetctl.soak.loops import find_loop
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.verdict import Outcome, Readiness

SPEC = CheckSpec("known_good")
LAB = load_config(profile="lab")


def answers_ctx(answers: Sequence[Answer], ref: ReferenceSet | None, label: str) -> CheckContext:
    """A soak whose load ran and gave ``answers``, judged against ``ref`` as version ``label``."""
    ev = Evidence(Readiness(Outcome.PASS, "ready", 1.0), load_ran=True, answers=tuple(answers))
    return CheckContext(ev, LAB, reference=ref, label=label)

# What a healthy model answered (a natural end, finish "stop").
HEALTHY = (
    "Leaves change colour in autumn because the trees stop making chlorophyll as the days grow "
    "shorter and colder, so the green pigment breaks down and the yellow and orange carotenoids "
    "that were there all along show through. Some trees also make red anthocyanins from the "
    "sugars trapped in their leaves, which is why maples can turn a deep crimson."
)
# The same prompt on a build that degenerates after ~50 words (finish "length").
LOOPED = " ".join(HEALTHY.split()[:52]) + " I can help with that." * 40
# The same prompt on a build whose kernels round differently: a word differs mid-way, the answer
# still ends by itself, as long.
NUMERICS = HEALTHY.replace("a deep crimson", "a bright crimson").replace(
    "show through", "become visible")


def answer(text: str, finish: str, *, aid: str = "natural_language:2", kind: str = "natural",
           max_tokens: int = 1024, expect: str = "") -> Answer:
    loop = find_loop(text)
    return Answer(aid, kind, "In two sentences, why do leaves change colour in autumn?", text,
                  finish, len(text.split()) if finish == "stop" else max_tokens, max_tokens,
                  loop.describe() if loop else "", loop.phrase if loop else "", expect)


def known(*answers: Answer) -> ReferenceSet:
    return ReferenceSet(answers, version="0.24.0", tag="2026-07-01-v0.24.0",
                        digest="sha256:" + "a" * 64, recipe="qwen", run_id="soak-old")


def test_a_loop_where_the_known_good_ended_fails_naming_the_prompt_both_answers_and_versions(
) -> None:
    ref = answer(HEALTHY, "stop")
    new = answer(LOOPED, "length")
    found = [f.what for f in findings(new, ref)]
    assert any(f.startswith("a loop the known-good did not have") for f in found)
    assert any(f.startswith("ran to max_tokens") for f in found)
    r = check_known_good(SPEC, answers_ctx([new], known(ref), "2026-08-01-degen (sha256:bbbb)"))
    assert r.outcome is Outcome.FAIL
    m = next(m for m in r.measurements if m.outcome is Outcome.FAIL)
    assert m.label == "natural_language:2" and "natural_language:2" in m.message
    assert "I can help with that." in m.message and "crimson" not in str(m.measured)
    assert "2026-08-01-degen" in m.message and "2026-07-01-v0.24.0" in m.message
    assert "trapped in their leaves" in m.message  # the known-good's own text where they part
    assert len(m.message) < 900  # both answers cut where they part, not whole


def test_a_numerics_only_difference_passes_with_its_agreement_reported() -> None:
    ref, new = answer(HEALTHY, "stop"), answer(NUMERICS, "stop")
    assert findings(new, ref) == []
    ag = agreement(new.text, ref.text)
    assert not ag.exact and 0.5 < ag.prefix_share < 1.0
    r = check_known_good(SPEC, answers_ctx([new], known(ref), "new"))
    assert r.outcome is Outcome.PASS, r.message
    assert "0.0% identical" in r.message and "mean common prefix" in r.message
    # A recipe that demands agreement fails the same pair under its bound.
    strict = CheckSpec("known_good", params={"min_prefix_share": 0.95})
    assert check_known_good(strict, answers_ctx([new], known(ref), "new")).outcome is Outcome.FAIL


def test_the_same_loop_as_the_known_good_is_no_finding() -> None:
    ref, new = answer(LOOPED, "length"), answer(LOOPED, "length")
    assert findings(new, ref) == []
    assert same_loop("I can help with that.", "help with that. I can")
    assert not same_loop("I can help with that.", "Let me know if you need more.")


def test_far_longer_and_a_changed_canary_fail() -> None:
    ref = answer(HEALTHY, "stop")
    long = answer(" ".join([HEALTHY, NUMERICS, HEALTHY]), "stop")
    assert any(f.what.startswith("far longer") for f in findings(long, ref))
    canary_ref = answer("17 × 23 = 391.", "stop", aid="canary:arithmetic", kind="canary",
                        expect="391")
    changed = answer("17 × 23 = 381.", "stop", aid="canary:arithmetic", kind="canary",
                     expect="391")
    assert [f.what for f in findings(changed, canary_ref)] == [
        "the known-answer canary's answer changed, without '391'"]


def test_a_first_deploy_records_and_calls_a_loop_inconclusive() -> None:
    healthy = check_known_good(SPEC, answers_ctx([answer(HEALTHY, "stop")], None, "new"))
    assert healthy.outcome is Outcome.PASS and "first deploy" in healthy.message
    looped = check_known_good(SPEC, answers_ctx([answer(LOOPED, "length")], None, "new"))
    assert looped.outcome is Outcome.INCONCLUSIVE
    assert "no known-good version to compare with" in looped.message


def test_the_set_holds_the_canaries_each_class_and_the_long_decode_window() -> None:
    ids = [p.id for p in reference_prompts(2, 64)]
    assert ids[:3] == ["canary:arithmetic", "canary:fact", "canary:copy"]
    assert "coding:2" in ids and "extraction:1" in ids and ids[-1] == "long_decode:window1"
    assert len(ids) == len(set(ids))
