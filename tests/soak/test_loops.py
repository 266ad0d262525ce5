"""Phrase loops: the detector on its own, and the soak judging a looping server against the same
prompt's c=1 reference on loopback (no finding when the reference loops too, or past its natural
end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from fleetctl.lab.emulator import text as emulator_text
from fleetctl.soak.loops import compression_ratio, find_loop
from fleetctl.soak.verdict import Outcome

from .fakevllm import FakeVLLM, answer_for, prompt_of, serve, stream_tokens, words
from .test_hostile_loopback import quick, soak

LOOP = "I can help with that."


def test_a_repeated_sentence_is_a_loop_with_its_phrase_and_start() -> None:
    head = "Here is a short plan for the migration of the billing service to the new cluster. "
    text = head + " ".join([LOOP] * 12)
    loop = find_loop(text)
    assert loop is not None and loop.period == 5 and loop.phrase == LOOP
    assert loop.repeats >= 11 and loop.start <= len(head) + 1
    assert loop.ngram_repetition > 0.6 and loop.compression < 0.3
    assert "'I can help with that.' repeated" in loop.describe()


def test_varied_prose_and_short_repeats_are_not_loops() -> None:
    prose = " ".join(w.strip() for w in words("a prompt", 400))
    assert find_loop(prose) is None and compression_ratio(prose) > compression_ratio(LOOP * 40)
    # A list with a repeated word here and there, and a phrase said twice, are not loops.
    assert find_loop("yes yes no maybe " + prose) is None
    assert find_loop(prose + " " + LOOP + " " + LOOP) is None


def test_the_emulators_healthy_answers_never_loop_and_its_degenerate_build_does() -> None:
    # A healthy answer re-uses the filler's words without repeating one phrase to its end; the
    # degenerate build (EMU_DEGENERATE_AFTER_TOKENS) turns a long answer into one phrase.
    for prompt in ("Tell me about rivers.", "Explain TCP.", "Write a poem about snow."):
        pieces = emulator_text.generate(prompt, thinking=False, temperature=0.0, garbage=False)
        text = "".join(p.text for p in pieces)
        assert len(text.split()) >= 150 and find_loop(text) is None
        bad = emulator_text.degenerate(
            emulator_text.generate(prompt, thinking=False, temperature=0.0, garbage=False), 100)
        looped = "".join(next(bad).text for _ in range(400))
        loop = find_loop(looped)
        assert loop is not None and loop.phrase == emulator_text.DEGENERATE_PHRASE.strip()
        assert looped.startswith(text[:200])  # the first 100 tokens as the healthy build's
    short = emulator_text.degenerate(
        emulator_text.generate("What is 17 × 23?", thinking=False, temperature=0.0,
                               garbage=False), 100)
    assert "".join(p.text for p in short) == "17 × 23 = 391."  # a short answer ends as it did


def _tokens(phrase: str, n: int) -> list[str]:
    ws = phrase.split()
    return [ws[i % len(ws)] + " " for i in range(n)]


async def _loops_under_load_only(
    f: FakeVLLM, r: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    prompt, n = prompt_of(body), int(body.get("max_tokens", 16))
    if (right := answer_for(prompt)) is not None:
        return await stream_tokens(f, r, body, [w + " " for w in right.split()])
    if body.get("ignore_eos"):
        return await stream_tokens(f, r, body, _tokens(LOOP, n))
    return await stream_tokens(f, r, body, words(prompt, n))


async def _always_loops(f: FakeVLLM, r: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    prompt, n = prompt_of(body), int(body.get("max_tokens", 16))
    if (right := answer_for(prompt)) is not None:
        return await stream_tokens(f, r, body, [w + " " for w in right.split()])
    return await stream_tokens(f, r, body, _tokens(LOOP, n))


async def _loops_past_its_end(
    f: FakeVLLM, r: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    prompt, n = prompt_of(body), int(body.get("max_tokens", 16))
    if (right := answer_for(prompt)) is not None:
        return await stream_tokens(f, r, body, [w + " " for w in right.split()])
    natural = words(prompt, 10)
    if body.get("ignore_eos"):
        return await stream_tokens(f, r, body, (natural + _tokens(LOOP, n))[:n])
    return await stream_tokens(f, r, body, natural)


def _cfg() -> Any:
    return quick(max_tokens=48, checks={"correctness": {"long_decode_tokens": 0}})


def test_a_server_that_loops_where_its_reference_does_not_fails_with_both_samples(
    tmp_path: Path,
) -> None:
    with serve(FakeVLLM(chat=_loops_under_load_only)) as fake:
        v = soak(fake, _cfg(), tmp_path)
    c = v.check("correctness")
    assert c.outcome is Outcome.FAIL, c.message
    assert "degenerates into a loop where its c=1 greedy reference does not" in c.message
    assert "'I can help with that.' repeated" in c.message and "sample …" in c.message
    assert "reference (length, " in c.message  # the reference's own text is shown beside it


def test_a_loop_its_reference_shares_is_inconclusive_on_a_first_deploy(tmp_path: Path) -> None:
    # The same server's c=1 answer loops too: without a known-good version to compare with, the
    # build's loop is not told apart from the model's, and never passes silently.
    with serve(FakeVLLM(chat=_always_loops)) as fake:
        v = soak(fake, _cfg(), tmp_path)
    c = v.check("correctness")
    assert c.outcome is Outcome.INCONCLUSIVE, c.message
    assert "no known-good version to compare with (a first deploy)" in c.message


def test_no_finding_for_a_loop_past_the_models_natural_end(tmp_path: Path) -> None:
    with serve(FakeVLLM(chat=_loops_past_its_end)) as fake:
        v = soak(fake, _cfg(), tmp_path)
    c = v.check("correctness")
    assert c.outcome is Outcome.PASS, c.message
    assert any("past where its reference stopped by itself" in m.message for m in c.measurements)
