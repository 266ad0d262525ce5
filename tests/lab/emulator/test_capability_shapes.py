"""The emulator reads what the capability probes send as vLLM does: tools offered (auto tool choice
refused without a parser), images looked at, thinking as each model family's template does it."""

from __future__ import annotations

import json

import pytest

from fleetctl.lab.emulator.chat_request import BadRequestError, ModelInfo, parse_request
from fleetctl.lab.emulator.tool_calls import deltas, markup
from fleetctl.soak.capabilities import images, tools

QWEN = ModelInfo("/m", ("qwen36-fast",), 32768, thinking=True, reasoning_parser="qwen3",
                 tool_parser="qwen3_coder", auto_tool_choice=True)
GEMMA = ModelInfo("/m", ("gemma26b",), 32768, thinking=False, reasoning_parser="gemma4")
BARE = ModelInfo("/m", ("gemma26b",), 32768, thinking=False, reasoning_parser=None)


def raw(body: dict[str, object]) -> bytes:
    return json.dumps(body).encode()


def test_tools_get_one_call_per_city_in_qwen3_coder_markup() -> None:
    s = tools.SCENARIOS[1]
    p = parse_request(QWEN, raw(tools.body("qwen36-fast", [{"role": "user",
                                                            "content": s.prompt}])), chat=True)
    calls = p.request.tool_calls
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Tokyo"]
    assert p.request.answer == "".join(markup(c) for c in calls)
    assert p.request.answer is not None and p.request.answer.startswith(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis")
    first, second = deltas(calls)[:2]
    assert first[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert second[0]["function"]["arguments"] == calls[0].arguments


def test_auto_tool_choice_without_a_parser_is_refused() -> None:
    body = tools.body("gemma26b", [{"role": "user", "content": tools.SCENARIOS[0].prompt}])
    with pytest.raises(BadRequestError) as e:
        parse_request(GEMMA, raw(body), chat=True)
    assert "--enable-auto-tool-choice" in str(e.value)


def test_an_image_is_looked_at() -> None:
    for d in images.DRAWINGS:
        p = parse_request(QWEN, raw(images.body("qwen36-fast", d)), chat=True)
        assert p.request.answer == f"A {d.label}.", d


@pytest.mark.parametrize("info, kwargs, thinks", [
    (QWEN, {}, True), (QWEN, {"enable_thinking": False}, False),
    (GEMMA, {}, False), (GEMMA, {"enable_thinking": True}, True),
    (BARE, {"enable_thinking": True}, False),
])
def test_thinking_as_each_template_does(info: ModelInfo, kwargs: dict[str, object],
                                        thinks: bool) -> None:
    body = {"model": info.served_names[0], "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": kwargs}
    assert parse_request(info, raw(body), chat=True).request.thinking is thinks
