"""The deep long-decode probe on loopback: corruption that starts deep in a sequence is found in its
window, a garbled needle fails, and a healthy model that ends with the needle and loops after it
passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from fleetctl.soak import prompts
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.verdict import Outcome

from .fakevllm import FakeVLLM, good_chat, prompt_of, serve, stream_tokens, words
from .test_hostile_loopback import quick, soak

TOKENS = 256
WINDOW = 64


def _cfg() -> SoakConfig:
    return quick(checks={"long_decode": {"tokens": TOKENS, "window_tokens": WINDOW},
                         "correctness": {"long_decode_tokens": 0}})


def _decoder(tokens_for: Any) -> Any:
    async def chat(f: FakeVLLM, r: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if prompt_of(body) != prompts.LONG_DECODE_PROMPT:
            return await good_chat(f, r, body)
        n = int(body.get("max_tokens", 16))
        return await stream_tokens(f, r, body, tokens_for(n, bool(body.get("ignore_eos")))[:n])
    return chat


def _corrupt_after_200(n: int, ignore_eos: bool) -> list[str]:
    return words("deep", 200) + ["%%%%%%%%%%%% "] * (n - 200)


def _garbled_needle(n: int, ignore_eos: bool) -> list[str]:
    return [
        *words("deep", 100),
        f"{prompts.NEEDLE_MARK} ",
        "cobalt ",
        "heron ",
        "44l7 ",
        *words("after", n),
    ]


def _healthy_ending(n: int, ignore_eos: bool) -> list[str]:
    end = (
        words("deep", 100) + [f"{prompts.NEEDLE_MARK} "] + [w + " " for w in prompts.NEEDLE.split()]
    )
    if not ignore_eos:
        return end  # the model stops by itself after the needle
    return (
        end + ["I ", "can ", "help ", "with ", "that. "] * n
    )  # and loops past its end under ignore_eos


def test_corruption_deep_in_the_sequence_fails_its_window(tmp_path: Path) -> None:
    with serve(FakeVLLM(chat=_decoder(_corrupt_after_200))) as fake:
        v = soak(fake, _cfg(), tmp_path)
    ld = v.check("long_decode")
    assert ld.outcome is Outcome.FAIL, ld.message
    failed = [m.label for m in ld.measurements if m.outcome is Outcome.FAIL]
    assert failed == ["tokens 192-256"], ld.message
    assert "garbage (a run of" in ld.message


def test_a_garbled_needle_fails(tmp_path: Path) -> None:
    with serve(FakeVLLM(chat=_decoder(_garbled_needle))) as fake:
        v = soak(fake, _cfg(), tmp_path)
    ld = v.check("long_decode")
    assert (
        ld.outcome is Outcome.FAIL
        and "needle at the model's end" in ld.message
        and "garbled" in ld.message
    )


def test_a_model_that_ends_with_the_needle_and_loops_after_it_passes(tmp_path: Path) -> None:
    with serve(FakeVLLM(chat=_decoder(_healthy_ending))) as fake:
        v = soak(fake, _cfg(), tmp_path)
    ld, c = v.check("long_decode"), v.check("correctness")
    assert ld.outcome is Outcome.PASS, ld.message
    assert (
        f"{TOKENS} tokens in 4 windows" in ld.message
        and "needle at the model's end intact" in ld.message
    )
    assert c.outcome is Outcome.PASS, c.message
    assert any("past where its reference stopped by itself" in m.message for m in c.measurements)


def test_the_probe_replaces_the_correctness_long_decode_and_is_capped_by_max_model_len(
    tmp_path: Path,
) -> None:
    asked: list[int] = []

    async def chat(f: FakeVLLM, r: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if prompt_of(body) == prompts.LONG_DECODE_PROMPT:
            asked.append(int(body["max_tokens"]) if body.get("ignore_eos") else -1)
        return await good_chat(f, r, body)

    with serve(FakeVLLM(chat=chat, max_model_len=1024)) as fake:
        soak(fake, quick(checks={"long_decode": {"tokens": 16384}}), tmp_path)
    # The probe once (ignore_eos); the reference set asks the same prompt free to stop (-1 here).
    assert asked == [1024 - 512, -1]


def test_long_prompt_probes_find_the_fact_hidden_mid_prompt(tmp_path: Path) -> None:
    with serve(FakeVLLM()) as fake:
        v = soak(fake, quick(checks={"long_prompts": {"tokens": [2000, 6000, 64000]},
                                     "correctness": {"long_decode_tokens": 0}}), tmp_path)
    lp = v.check("long_prompts")
    assert lp.outcome is Outcome.PASS, lp.message
    assert "the hidden fact found at 2000 tokens, 6000 tokens" in lp.message
    assert [m.message for m in lp.measurements if m.label == "64000 tokens"] == \
        ["64000 tokens: not run (max_model_len 8192)"]


async def _forgets_the_middle(
    f: FakeVLLM, r: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    if prompts.NEEDLE_QUESTION in prompt_of(body):
        return await stream_tokens(f, r, body, ["I ", "do ", "not ", "know. "])
    return await good_chat(f, r, body)


def test_a_server_that_loses_the_middle_of_a_long_prompt_fails(tmp_path: Path) -> None:
    with serve(FakeVLLM(chat=_forgets_the_middle)) as fake:
        v = soak(
            fake,
            quick(
                checks={
                    "long_prompts": {"tokens": [6000]},
                    "correctness": {"long_decode_tokens": 0},
                }
            ),
            tmp_path,
        )
    lp = v.check("long_prompts")
    assert lp.outcome is Outcome.FAIL and v.outcome is Outcome.FAIL
    assert (
        "long prompt of 6000 tokens" in lp.message
        and "lacks the code stated in the prompt's middle" in lp.message
    )


def test_the_emulator_answers_the_long_prompt_probe_as_a_model_would() -> None:
    from fleetctl.lab.emulator import text as emulator_text

    assert (
        emulator_text.NEEDLE_QUESTION == prompts.NEEDLE_QUESTION
    )  # the emulator keeps its own copy
    answer = "".join(emulator_text.answer_tokens(prompts.needle_prompt(20000), temperature=0.0))
    assert prompts.VAULT_CODE in answer
