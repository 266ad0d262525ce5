"""The capability checks judged from vLLM's own response shapes, written by hand after its
OpenAI-compatible server (``ChatCompletionResponse``: ``message.tool_calls`` with
``chatcmpl-tool-`` ids and JSON-string arguments, ``finish_reason: tool_calls``; ``reasoning``,
and ``reasoning_content`` before 0.10) and after the regressions' reported shapes (vLLM #22975:
the qwen3_coder markup left in content with ``finish_reason: stop``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from fleetctl.soak import load_config
from fleetctl.soak.capabilities import checks, images, names, reasoning, tools
from fleetctl.soak.capabilities.derive import OFF_BY_RECIPE, Capability
from fleetctl.soak.capabilities.exchange import CapabilityRun, Exchange, read_reply
from fleetctl.soak.checks.check import CheckContext
from fleetctl.soak.checks.evidence import Evidence
from fleetctl.soak.verdict import Outcome, Readiness

PARSER = "qwen3_coder"
READY = Readiness(Outcome.PASS, "ready", 1.0)


def completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    """A non-streamed vLLM chat completion around ``message``."""
    return {
        "id": "chatcmpl-9f1c2a", "object": "chat.completion", "created": 1767411340,
        "model": "qwen36-fast",
        "choices": [{"index": 0, "message": {"role": "assistant", "refusal": None,
                                             "annotations": None, "audio": None,
                                             "function_call": None, **message},
                     "logprobs": None, "finish_reason": finish, "stop_reason": None}],
        "usage": {"prompt_tokens": 312, "total_tokens": 340, "completion_tokens": 28},
        "prompt_logprobs": None, "kv_transfer_params": None,
    }


def call(city: str, n: int = 0, args: str | None = None) -> dict[str, Any]:
    return {"id": f"chatcmpl-tool-5b1e{n}", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": json.dumps({"city": city}) if args is None else args}}


def ex(label: str, body: dict[str, Any], expected: str = "", prompt: str = "p",
       status: int = 200) -> Exchange:
    return Exchange(label, prompt, expected, read_reply(status, body, "", 0.4))


def tool_ex(scenario: str, body: dict[str, Any]) -> Exchange:
    s = next(s for s in tools.SCENARIOS if s.name == scenario)
    return ex(scenario, body, tools.expected_calls(s), s.prompt)


def test_well_formed_calls_pass_every_scenario() -> None:
    xs = [
        tool_ex("single", completion({"content": None, "tool_calls": [call("Paris")]},
                                     "tool_calls")),
        tool_ex("parallel", completion({"content": None, "tool_calls": [call("Tokyo", 1),
                                                                        call("Paris", 2)]},
                                       "tool_calls")),
        tool_ex("chained", completion({"content": None, "tool_calls": [call("Lisbon")]},
                                      "tool_calls")),
        ex("chained answer", completion({"content": "It is 21 °C and sunny in Lisbon.",
                                         "tool_calls": []}, "stop"), "21"),
    ]
    assert [m.outcome for m in tools.judge(xs, PARSER)] == [Outcome.PASS] * 3


def test_markup_left_in_content_fails_naming_the_parser() -> None:
    leaked = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
              "</function>\n</tool_call>")
    (m,) = tools.judge([tool_ex("single", completion({"content": leaked, "tool_calls": []},
                                                     "stop"))], PARSER)
    assert m.outcome is Outcome.FAIL
    assert "<tool_call> markup in content" in m.message and "qwen3_coder tool parser" in m.message
    assert "finish_reason stop" in m.message and "Paris" in m.message


def test_arguments_are_validated_against_the_schema() -> None:
    bad = {
        "not json": '{"city": "Paris"',
        "extra key": '{"city": "Paris", "country": "FR"}',
        "wrong unit": '{"city": "Paris", "unit": "kelvin"}',
        "no city": "{}",
    }
    for why, args in bad.items():
        body = completion({"content": None, "tool_calls": [call("Paris", args=args)]},
                          "tool_calls")
        (m,) = tools.judge([tool_ex("single", body)], PARSER)
        assert m.outcome is Outcome.FAIL, why
        assert ("not JSON" in m.message) or ("schema" in m.message), (why, m.message)


def test_a_call_for_the_wrong_city_or_count_fails() -> None:
    one = completion({"content": None, "tool_calls": [call("Paris")]}, "tool_calls")
    (m,) = tools.judge([tool_ex("parallel", one)], PARSER)
    assert m.outcome is Outcome.FAIL and "got 1 call(s)" in m.message
    wrong = completion({"content": None, "tool_calls": [call("Rome")]}, "tool_calls")
    (m,) = tools.judge([tool_ex("single", wrong)], PARSER)
    assert m.outcome is Outcome.FAIL and "calls for Rome" in m.message


def test_a_chained_answer_that_ignores_the_result_fails() -> None:
    xs = [tool_ex("chained", completion({"content": None, "tool_calls": [call("Lisbon")]},
                                        "tool_calls")),
          ex("chained answer", completion({"content": "I cannot look that up."}, "stop"), "21")]
    (m,) = tools.judge(xs, PARSER)
    assert m.outcome is Outcome.FAIL and "expected an answer with 21" in m.message


def reasoning_ex(on: bool, message: dict[str, Any], finish: str = "stop") -> Exchange:
    return ex(f"thinking {'on' if on else 'off'}", completion(message, finish),
              reasoning.EXPECT, reasoning.PROMPT)


def test_reasoning_apart_passes_in_both_field_names() -> None:
    xs = [reasoning_ex(True, {"content": "17 × 23 = 391.", "reasoning": "17 × 20 = 340 ..."}),
          reasoning_ex(True, {"content": "391", "reasoning_content": "17 × 3 = 51 ..."}),
          reasoning_ex(False, {"content": "17 × 23 = 391.", "reasoning": None})]
    assert [m.outcome for m in reasoning.judge(xs, "qwen3")] == [Outcome.PASS] * 3


def test_reasoning_leaked_into_content_fails() -> None:
    leaked = reasoning_ex(True, {"content": "<think>\n17 × 20 = 340\n</think>\n\n391",
                                 "reasoning": None})
    closing = reasoning_ex(True, {"content": "17 × 20 = 340\n</think>\n\n391",
                                  "reasoning": None})
    ms = reasoning.judge([leaked, closing], "qwen3")
    assert [m.outcome for m in ms] == [Outcome.FAIL, Outcome.FAIL]
    assert "<think> in content" in ms[0].message and "qwen3 reasoning parser" in ms[0].message
    assert "</think> in content" in ms[1].message


def test_reasoning_with_thinking_off_or_a_wrong_answer_fails() -> None:
    off = reasoning_ex(False, {"content": "391", "reasoning": "Let me think"})
    wrong = reasoning_ex(True, {"content": "17 × 23 = 401.", "reasoning": "..."})
    cut = reasoning_ex(True, {"content": None, "reasoning": "Let me think ..."}, "length")
    ms = reasoning.judge([off, wrong, cut], "qwen3")
    assert [m.outcome for m in ms] == [Outcome.FAIL, Outcome.FAIL, Outcome.INCONCLUSIVE]
    assert "reasoning with thinking off" in ms[0].message
    assert "'17 × 23 = 401.'" in ms[1].message


def image_ex(label: str, content: str) -> Exchange:
    d = next(d for d in images.DRAWINGS if d.label == label)
    return ex(label, completion({"content": content}, "stop"), d.label, images.describe(d))


def test_images_right_wrong_and_garbage() -> None:
    ms = images.judge([image_ex("red circle", "A red circle."),
                       image_ex("blue square", "Blue square"),
                       image_ex("green triangle", "A red triangle."),
                       image_ex("red circle", "!" * 24)])
    assert [m.outcome for m in ms] == [Outcome.PASS, Outcome.PASS, Outcome.FAIL, Outcome.FAIL]
    assert "expected 'green triangle', got 'A red triangle.'" in ms[2].message
    assert "garbage" in ms[3].message and "PNG 224x224" in ms[3].message


def test_the_drawings_are_pngs_of_their_size() -> None:
    raw = images.png(images.DRAWINGS[0])
    assert raw.startswith(b"\x89PNG") and images.data_url(images.DRAWINGS[0]).startswith(
        "data:image/png;base64,")


def test_a_served_name_that_answers_404_fails() -> None:
    err = {"error": {"message": "The model `qwen36-deep` does not exist.", "type":
                     "NotFoundError", "param": "model", "code": 404}}
    x = Exchange("qwen36-deep", names.PROMPT, names.EXPECT,
                 read_reply(404, None, f"HTTP 404: {err['error']['message']}", 0.01))
    ok = ex("qwen36-fast", completion({"content": "Paris."}, "stop"), names.EXPECT)
    ms = names.judge([ok, x])
    assert [m.outcome for m in ms] == [Outcome.PASS, Outcome.FAIL]
    assert "qwen36-deep" in ms[1].message and "404" in ms[1].message


def test_a_capability_off_by_recipe_is_reported_so() -> None:
    cfg = dataclasses.replace(load_config(profile="lab"), plan=(
        Capability("images", OFF_BY_RECIPE, "soak.capabilities.images: false; modalities: image"),
    ))
    ctx = CheckContext(Evidence(readiness=READY), cfg)
    r = checks.IMAGES.evaluate(cfg.check("images"), ctx)
    assert r.outcome is Outcome.SKIPPED and r.message.startswith("off by recipe")


def test_a_failed_probe_fails_its_check_with_the_probe_message() -> None:
    cap = Capability("tool_calls", "tested", "--tool-call-parser qwen3_coder", {"parser": PARSER})
    cfg = dataclasses.replace(load_config(profile="lab"), plan=(cap,))
    leaked = completion({"content": "<tool_call>\n<function=get_weather>", "tool_calls": []},
                        "stop")
    ev = Evidence(readiness=READY,
                  capabilities=(CapabilityRun("tool_calls", (tool_ex("single", leaked),)),))
    r = checks.TOOL_CALLS.evaluate(cfg.check("tool_calls"), CheckContext(ev, cfg))
    assert r.outcome is Outcome.FAIL and "qwen3_coder tool parser" in r.message
