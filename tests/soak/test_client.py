"""The SSE stream parser: any chunking, TTFT at the first content, usage, error events."""

from __future__ import annotations

import json

import pytest

from fleetctl.soak.client import (
    MAX_LINE_BYTES,
    ChatRequest,
    LineTooLongError,
    StreamParser,
    TextCheck,
    chat_body,
    validate_answer,
)


def _ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


STREAM = b"".join(
    [
        _ev(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                ]
            }
        ),
        b": ping\n\n",
        _ev(
            {"choices": [{"index": 0, "delta": {"content": "17 \u00d7 23"}, "finish_reason": None}]}
        ),
        _ev({"choices": [{"index": 0, "delta": {"content": " = 391"}, "finish_reason": "stop"}]}),
        _ev(
            {
                "choices": [],
                "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
            }
        ),
        b"data: [DONE]\n\n",
    ]
)


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
    p.feed(
        _ev(
            {
                "error": {
                    "message": "EngineCore encountered an issue",
                    "type": "InternalServerError",
                    "code": 500,
                }
            }
        ),
        1.0,
    )
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


# --- garbage in streamed text, answer validation, bounded lines --------------------------------

def _check(deltas: list[str]) -> TextCheck:
    c = TextCheck()
    for d in deltas:
        c.feed(d)
    return c


def test_a_run_of_bangs_is_garbage_with_its_excerpt() -> None:
    c = _check(["The answer is", " 391", "."] + ["!"] * 20)
    assert "a run of 16 '!'" in c.reason
    assert c.excerpt.startswith("The answer is 391.") and c.excerpt.endswith("!" * 16)
    # Split differently (spec decode: several tokens per event; spaces between them): same finding.
    assert "'!'" in _check(["ok", "!!!!", " !!!!", "!!!!!!!!", "!!"]).reason


def test_healthy_text_is_not_garbage() -> None:
    text = ("the system reads each request and answers it in order while the scheduler keeps every "
            "stream moving")
    assert not _check([" " + w for w in text.split(" ")] * 40).reason
    # Markdown separators, code indentation, numbers and a stray replacement character are fine.
    assert not _check(
        ["\n", "-" * 60, "\n", " " * 48, "return", " 10000000000000000", "\ufffd"]
    ).reason
    assert not _check(["Wow", "!", "!", "!"]).reason


def test_repeated_token_and_replacement_characters_are_garbage() -> None:
    assert "the token ' the' repeated 32 times" in _check(["Start"] + [" the"] * 40).reason
    assert "U+FFFD" in _check(["ab\ufffd", "c\ufffd", "\ufffd"]).reason
    assert "a run of" in _check(["x" * 200]).reason


def test_the_parser_runs_the_text_check_on_every_delta() -> None:
    p = StreamParser()
    for _ in range(20):
        p.feed(
            _ev({"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": None}]}), 0.0
        )
    assert len(p.check.parts) == 16 and "'!'" in p.check.reason


def test_finish_reason_and_completion_tokens_are_validated() -> None:
    req = ChatRequest("m", "p", 32, ignore_eos=True)
    ok = {"completion_tokens": 32}
    assert validate_answer(req, "length", ok, True) == ("", "")
    assert validate_answer(req, None, ok, True)[0] == "protocol"
    assert validate_answer(req, "abort", ok, True)[0] == "finish"
    assert validate_answer(req, "length", {"completion_tokens": 31}, True)[0] == "protocol"
    assert validate_answer(req, "length", {"completion_tokens": 33}, True)[0] == "protocol"
    assert validate_answer(req, "length", {"completion_tokens": "32"}, True)[0] == "protocol"
    assert "despite ignore_eos" in validate_answer(req, "stop", {"completion_tokens": 5}, True)[1]
    # All-empty text is reported (the client makes it a garbage finding), never dropped unseen.
    kind, msg = validate_answer(req, "length", ok, False)
    assert kind == "empty" and "no text" in msg
    assert validate_answer(ChatRequest("m", "p", 32), "stop", {"completion_tokens": 7}, True) == (
        "",
        "",
    )


def test_an_endless_line_is_refused_once_it_passes_the_cap() -> None:
    p = StreamParser()
    chunk = b"x" * (1 << 16)
    with pytest.raises(LineTooLongError):
        for _ in range((MAX_LINE_BYTES >> 16) + 2):
            p.feed(chunk, 0.0)
    assert len(p.pending) <= MAX_LINE_BYTES + len(chunk)


def test_thinking_goes_to_the_chat_template_only_when_set() -> None:
    off = json.loads(chat_body(ChatRequest("m", "hi", 8, 0.0, thinking=False)))
    assert off["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in json.loads(chat_body(ChatRequest("m", "hi", 8, 0.0)))
