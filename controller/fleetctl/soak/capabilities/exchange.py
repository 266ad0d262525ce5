"""What a capability probe saw: one request's reply, read from vLLM's OpenAI-compatible shapes.

A chat completion's ``message`` carries the answer in ``content``, the reasoning (with a reasoning
parser) in ``reasoning`` (vLLM >= 0.10; ``reasoning_content`` before it, and still accepted) and
the calls (with a tool parser) in ``tool_calls``; ``finish_reason`` says why it ended
(``tool_calls`` when it ended in calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One call of a reply: the function's name and its arguments as the server sent them (a
    JSON string)."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class Reply:
    """One non-streamed chat completion as a probe saw it (status 0: no HTTP answer)."""

    status: int
    #: Why there is no usable answer (refused, timed out, HTTP 400 and its message), empty when
    #: there is one.
    error: str = ""
    content: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    seconds: float = 0.0
    #: The message as the server sent it, for the next turn of a chained call.
    message: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the server answered 200 with a choice."""
        return self.status == 200 and not self.error


@dataclass(frozen=True)
class Exchange:
    """One probe request: what was asked, what was expected, what came back."""

    #: The probe's own name for it ("single", "red circle", "thinking on", a served name).
    label: str
    #: The request's prompt as the failure shows it (an image is described, never inlined).
    prompt: str
    expected: str
    reply: Reply


@dataclass(frozen=True)
class CapabilityRun:
    """Every exchange of one capability's probe, and why it did not run when it did not."""

    name: str
    exchanges: tuple[Exchange, ...] = ()
    #: Why it did not run (the server went down first, the soak was halted), empty when it ran.
    skipped: str = ""

    @property
    def requests(self) -> int:
        """Requests it sent."""
        return len(self.exchanges)

    @property
    def seconds(self) -> float:
        """Seconds its requests took, added up."""
        return sum(x.reply.seconds for x in self.exchanges)


def read_reply(status: int, body: Any, error: str, seconds: float) -> Reply:
    """A :class:`Reply` from ``Client.post_json``'s answer; a 200 without a choice is an error."""
    if error or not isinstance(body, Mapping):
        return Reply(status, error or "answered no JSON object", seconds=seconds)
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(message, Mapping):
        return Reply(status, "answered 200 without choices[0].message", seconds=seconds)
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    finish = choice.get("finish_reason") if isinstance(choice, Mapping) else None
    return Reply(
        status,
        content=_text(message.get("content")),
        reasoning=_text(reasoning),
        tool_calls=_calls(message.get("tool_calls")),
        finish_reason=finish if isinstance(finish, str) else None,
        seconds=seconds,
        message=dict(message),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _calls(raw: Any) -> tuple[ToolCall, ...]:
    """The calls of ``message.tool_calls`` (a call without a function name reads as one named
    ``""``, which the judge fails)."""
    if not isinstance(raw, list):
        return ()
    out: list[ToolCall] = []
    for call in raw:
        fn = call.get("function") if isinstance(call, Mapping) else None
        fn = fn if isinstance(fn, Mapping) else {}
        args = fn.get("arguments")
        out.append(ToolCall(
            name=str(fn.get("name") or ""),
            arguments=args if isinstance(args, str) else "",
            id=str(call.get("id") or "") if isinstance(call, Mapping) else "",
        ))
    return tuple(out)
