"""The SSE stream parser: any chunking, TTFT at the first content, usage, error events."""

from __future__ import annotations

import json

from fleetctl.soak.client import ChatRequest, StreamParser, chat_body


def _ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


STREAM = b"".join([
    _ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}),
    b": ping\n\n",
    _ev({"choices": [{"index": 0, "delta": {"content": "17 \u00d7 23"}, "finish_reason": None}]}),
    _ev({"choices": [{"index": 0, "delta": {"content": " = 391"}, "finish_reason": "stop"}]}),
    _ev({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}}),
    b"data: [DONE]\n\n",
])


def test_any_split_of_the_stream_parses_the_same() -> None:
    for size in (1, 3, 7, 64, len(STREAM)):
        p = StreamParser(keep_text=True)
        for i in range(0, len(STREAM), size):
            p.feed(STREAM[i:i + size], float(i))
        assert p.done and p.events == 4 and not p.error
        assert p.text == "17 \u00d7 23 = 391"
        assert p.finish_reason == "stop"
        assert p.usage == {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}
        # TTFT at the first event with non-empty content, not at the empty role delta.
        # Stamped when the chunk completing that event arrives.
        end = STREAM.index(b"\n", STREAM.index(b"17"))
        assert p.first_content_at is not None and end - size < p.first_content_at <= end


def test_an_error_event_inside_a_200_stream_is_caught() -> None:
    p = StreamParser()
    p.feed(_ev({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}), 0.0)
    p.feed(_ev({"error": {"message": "EngineCore encountered an issue", "type": "InternalServerError",
                          "code": 500}}), 1.0)
    p.feed(b"data: [DONE]\n\n", 2.0)
    assert p.error == "EngineCore encountered an issue (code 500)"


def test_crlf_and_no_space_after_data() -> None:
    p = StreamParser()
    p.feed(b'data:{"choices":[{"delta":{"content":"x"}}]}\r\n\r\ndata: [DONE]\r\n\r\n', 0.5)
    assert p.done and p.events == 1 and p.first_content_at == 0.5 and not p.error


def test_undecodable_event_is_an_error() -> None:
    p = StreamParser()
    p.feed(b"data: {not json\n\n", 0.0)
    assert "undecodable" in p.error


def test_reasoning_tokens_count_for_ttft() -> None:
    p = StreamParser()
    p.feed(_ev({"choices": [{"delta": {"reasoning_content": "hmm"}}]}), 0.25)
    assert p.first_content_at == 0.25


def test_chat_body_asks_for_usage_and_can_turn_thinking_off() -> None:
    body = json.loads(chat_body(ChatRequest("m", "hi", 2048, 0.0, thinking=False, ignore_eos=True)))
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["ignore_eos"] is True
    assert "chat_template_kwargs" not in json.loads(chat_body(ChatRequest("m", "hi", 16)))
