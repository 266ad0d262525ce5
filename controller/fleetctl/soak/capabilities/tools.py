"""The tool-call probe: the compose seed's three scenarios (``test_tools.py --scenario single |
parallel | chained``) against the recipe's tool parser.

Each call must arrive as vLLM's parser delivers it: in ``message.tool_calls``, with
``finish_reason: tool_calls``, each call's ``arguments`` a JSON string that validates against the
tool's own JSON Schema (``jsonschema``, every rule of the schema's draft, not a hand-written
subset) and names the city asked about. Tool-call markup left in ``content`` (``<tool_call>``,
``<function=``: vLLM #22975, #47194, the parser failing under speculative decoding and the prefix
cache) fails, naming the parser. The chained scenario sends the tool's result back and the answer
must use it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from fleetctl.soak.capabilities.exchange import Exchange, Reply, ToolCall
from fleetctl.soak.checks.judge import snippet
from fleetctl.soak.verdict import Measurement, Outcome

#: The one tool: a weather lookup, its arguments strict (no extra keys, a unit from a list).
WEATHER_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": dict(WEATHER_SCHEMA),
    },
}]

#: Markup a tool parser turns into tool_calls (Hermes/Qwen3 ``<tool_call>``, qwen3_coder's
#: ``<function=``): in content it means the parser did not.
MARKUP = ("<tool_call>", "</tool_call>", "<function=", "<tool_calls>")

#: What the chained scenario's tool answers, and the figure the final answer must carry.
CHAINED_RESULT = {"city": "Lisbon", "temperature_c": 21, "condition": "sunny"}
CHAINED_FIGURE = "21"

#: Tokens a call (or the chained answer) may take.
MAX_TOKENS = 256


@dataclass(frozen=True)
class Scenario:
    """One scenario: its prompt and the cities its calls must name, in any order."""

    name: str
    prompt: str
    cities: tuple[str, ...]


SCENARIOS = (
    Scenario("single", "What is the weather in Paris right now? Use the get_weather tool.",
             ("Paris",)),
    Scenario("parallel", "What is the weather in Paris and in Tokyo? Call get_weather once for "
             "each city, both calls at once.", ("Paris", "Tokyo")),
    Scenario("chained", "What is the weather in Lisbon? Look it up with get_weather, then tell "
             "me how warm it is, in degrees.", ("Lisbon",)),
)


def body(model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat completion offering the tool (``tool_choice: auto``, greedy, thinking off)."""
    return {"model": model, "messages": messages, "tools": TOOLS, "tool_choice": "auto",
            "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "chat_template_kwargs": {"enable_thinking": False}}


def follow_up(s: Scenario, first: Reply) -> list[dict[str, Any]]:
    """The chained scenario's second turn: the call as the server sent it, and the tool's result
    for each of its calls."""
    calls = [{"id": c.id or f"call_{i}", "type": "function",
              "function": {"name": c.name, "arguments": c.arguments}}
             for i, c in enumerate(first.tool_calls)]
    return [
        {"role": "user", "content": s.prompt},
        {"role": "assistant", "content": first.content, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(CHAINED_RESULT)}
          for c in calls),
    ]


def expected_calls(s: Scenario) -> str:
    """``get_weather(city=Paris) + get_weather(city=Tokyo)``."""
    return " + ".join(f"get_weather(city={c})" for c in s.cities)


def judge(exchanges: Sequence[Exchange], parser: str) -> list[Measurement]:
    """One measurement per scenario (the chained one from both its turns)."""
    by_label = {x.label: x for x in exchanges}
    out: list[Measurement] = []
    for s in SCENARIOS:
        first = by_label.get(s.name)
        if first is None:
            continue
        failed = _calls(s, first, parser)
        if failed is None and s.name == "chained":
            answer = by_label.get("chained answer")
            failed = (_answer(answer, parser) if answer is not None else
                      f"tool_calls (chained): the tool's result was never sent back ({s.prompt!r})")
        if failed is not None:
            out.append(Measurement(s.name, Outcome.FAIL, failed, None, expected_calls(s)))
        else:
            out.append(Measurement(s.name, Outcome.PASS, f"tool_calls ({s.name}): "
                                   f"{expected_calls(s)} as tool_calls", None, expected_calls(s)))
    return out


def _calls(s: Scenario, x: Exchange, parser: str) -> str | None:
    """Why the scenario's calls are wrong, or None when they are right."""
    r = x.reply
    head = f"tool_calls ({s.name}): {s.prompt!r}: expected {expected_calls(s)} as tool_calls"
    if not r.ok:
        return f"{head}, got no answer: {r.error}"
    content = r.content or ""
    if leaked := next((m for m in MARKUP if m in content), None):
        return (f"{head}, got {leaked} markup in content (finish_reason {r.finish_reason}, "
                f"{len(r.tool_calls)} tool_calls): the {parser} tool parser did not parse it: "
                f"{snippet(content)}")
    if r.finish_reason != "tool_calls":
        return (f"{head}, got finish_reason {r.finish_reason!r} with {len(r.tool_calls)} "
                f"tool_calls and content {snippet(content)}")
    if len(r.tool_calls) != len(s.cities):
        return f"{head}, got {len(r.tool_calls)} call(s): {_shown(r.tool_calls)}"
    cities: list[str] = []
    for c in r.tool_calls:
        why = _arguments(c)
        if why:
            return f"{head}, got {_shown((c,))}: {why}"
        cities.append(str(json.loads(c.arguments)["city"]))
    if sorted(c.lower() for c in cities) != sorted(c.lower() for c in s.cities):
        return f"{head}, got calls for {', '.join(cities)}"
    return None


def _arguments(c: ToolCall) -> str:
    """Why a call's name or arguments are wrong ('' when right): JSON, and valid by the schema."""
    if c.name != "get_weather":
        return f"calls {c.name or '(no name)'!r}, not get_weather"
    try:
        args = json.loads(c.arguments)
    except json.JSONDecodeError as e:
        return f"arguments are not JSON ({e.msg})"
    try:
        jsonschema.validate(args, WEATHER_SCHEMA)
    except jsonschema.ValidationError as e:
        return f"arguments do not match get_weather's schema: {e.message}"
    return ""


def _answer(x: Exchange, parser: str) -> str | None:
    """Why the chained scenario's final answer is wrong, or None."""
    r = x.reply
    head = (f"tool_calls (chained): after the tool's result {json.dumps(CHAINED_RESULT)}, "
            f"expected an answer with {CHAINED_FIGURE}")
    if not r.ok:
        return f"{head}, got no answer: {r.error}"
    content = r.content or ""
    if leaked := next((m for m in MARKUP if m in content), None):
        return f"{head}, got {leaked} markup in content: the {parser} tool parser did not parse it"
    if r.tool_calls:
        return f"{head}, got another call: {_shown(r.tool_calls)}"
    if CHAINED_FIGURE not in content:
        return f"{head}, got {snippet(content)}"
    return None


def _shown(calls: Sequence[ToolCall]) -> str:
    return ", ".join(f"{c.name}({snippet(c.arguments, 40)})" for c in calls) or "(none)"
