"""Tool calls as the emulated model makes them and vLLM's tool parser delivers them.

The model writes its calls as qwen3_coder markup (``<tool_call><function=NAME><parameter=K>V
</parameter></function></tool_call>``, what Qwen3.6 emits); with ``--tool-call-parser`` and
``--enable-auto-tool-choice`` the server turns that into ``message.tool_calls`` (streamed as
``tool_calls`` deltas) with ``finish_reason: tool_calls``. A request offering ``tools`` is
answered with one call per city it asks about ("... in Paris and in Tokyo"), each call's first
required string argument set to the city; after a ``tool`` message the model answers from the
tool's result. ``EMU_TOOL_CALL_LEAK`` is the parser failing (vLLM #22975, #47194): the markup
stays in ``content``, ``finish_reason: stop``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

_CITY = re.compile(r"\bin ([A-Z][a-z]+)")


@dataclass(frozen=True)
class PlannedCall:
    """One call the model makes: its id, function name and JSON arguments."""

    id: str
    name: str
    arguments: str


class ToolChoiceError(ValueError):
    """A request vLLM refuses for its tools (400)."""


def plan(body: dict[str, Any], parser: str | None, auto: bool,
         user_text: str) -> tuple[str | None, tuple[PlannedCall, ...]]:
    """(the answer's text when the tools decide it, the calls in it) of one chat request."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None, ()
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return None, ()
    if choice == "auto" and not (parser and auto):
        raise ToolChoiceError('"auto" tool choice requires --enable-auto-tool-choice and '
                              "--tool-call-parser to be set")
    messages = body.get("messages") or []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if last.get("role") == "tool":
        return _from_result(str(last.get("content") or "")), ()
    fn, arg = _function(tools)
    cities = _CITY.findall(user_text)
    if fn is None or arg is None or not cities:
        return None, ()
    calls = tuple(PlannedCall(f"chatcmpl-tool-{uuid.uuid4().hex[:16]}", fn,
                              json.dumps({arg: city})) for city in dict.fromkeys(cities))
    return "".join(markup(c) for c in calls), calls


def markup(c: PlannedCall) -> str:
    """A call as qwen3_coder's model output writes it."""
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n"
                     for k, v in json.loads(c.arguments).items())
    return f"<tool_call>\n<function={c.name}>\n{params}</function>\n</tool_call>"


def delivered(c: PlannedCall) -> dict[str, Any]:
    """A call as ``message.tool_calls`` carries it."""
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def deltas(calls: tuple[PlannedCall, ...]) -> list[list[dict[str, Any]]]:
    """The ``tool_calls`` deltas vLLM streams: per call its id and name, then its arguments."""
    out: list[list[dict[str, Any]]] = []
    for i, c in enumerate(calls):
        out.append([{"index": i, "id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": ""}}])
        out.append([{"index": i, "function": {"arguments": c.arguments}}])
    return out


def _function(tools: list[Any]) -> tuple[str | None, str | None]:
    """The first tool's name and its first required string parameter."""
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not fn.get("name"):
            continue
        raw = fn.get("parameters")
        params: dict[str, Any] = raw if isinstance(raw, dict) else {}
        raw = params.get("properties")
        props: dict[str, Any] = raw if isinstance(raw, dict) else {}
        for name in params.get("required") or list(props):
            if isinstance(props.get(name), dict) and props[name].get("type") == "string":
                return str(fn["name"]), str(name)
    return None, None


def _from_result(content: str) -> str:
    """The model's answer after a tool's result: the result's facts, said."""
    try:
        result = json.loads(content)
    except ValueError:
        return f"The tool says: {content}"
    if isinstance(result, dict):
        return "The tool says: " + ", ".join(f"{k} {v}" for k, v in result.items()) + "."
    return f"The tool says: {result}."
