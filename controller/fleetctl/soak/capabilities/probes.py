"""The capability probes' requests: each capability the plan tests, its requests one at a time
(a few per capability, after the smoke prompts and before the load), over the soak's client."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from fleetctl.soak.capabilities import images, names, reasoning, tools
from fleetctl.soak.capabilities.derive import Capability
from fleetctl.soak.capabilities.exchange import CapabilityRun, Exchange, Reply, read_reply
from fleetctl.soak.client import ChatRequest, Client, SampleTag

#: ``probe(client, capability, model, timeout)`` -> its exchanges.
ProbeFn = Callable[[Client, Capability, str, float], Awaitable[tuple[Exchange, ...]]]

CHAT = "/v1/chat/completions"


async def send(client: Client, body: dict[str, Any], timeout: float) -> Reply:
    """One non-streamed chat completion, read as a :class:`Reply` (failures are data)."""
    t0 = time.monotonic()
    status, answer, error = await client.post_json(CHAT, body, timeout)
    return read_reply(status, answer, error, time.monotonic() - t0)


async def probe_served_names(client: Client, cap: Capability, _model: str,
                             timeout: float) -> tuple[Exchange, ...]:
    """One streamed request to each served name, as the soak's load asks the first one."""
    out: list[Exchange] = []
    for name in cap.params.get("names", ()):
        req = ChatRequest(name, names.PROMPT, names.MAX_TOKENS, 0.0, thinking=False)
        s = await client.chat(req, SampleTag("capabilities", "served_names", 1, time.monotonic()),
                              keep_text=True, timeout=timeout)
        reply = Reply(s.status or 0, s.error, content=s.text, finish_reason=s.finish_reason,
                      seconds=s.e2e or 0.0)
        out.append(Exchange(name, names.PROMPT, names.EXPECT, reply))
    return tuple(out)


async def probe_tool_calls(client: Client, _cap: Capability, model: str,
                           timeout: float) -> tuple[Exchange, ...]:
    """The three scenarios; the chained one's second turn only after a call came back."""
    out: list[Exchange] = []
    for s in tools.SCENARIOS:
        first = await send(client, tools.body(model, [{"role": "user", "content": s.prompt}]),
                           timeout)
        out.append(Exchange(s.name, s.prompt, tools.expected_calls(s), first))
        if s.name == "chained" and first.ok and first.tool_calls:
            answer = await send(client, tools.body(model, tools.follow_up(s, first)), timeout)
            out.append(Exchange("chained answer", s.prompt, tools.CHAINED_FIGURE, answer))
    return tuple(out)


async def probe_reasoning(client: Client, _cap: Capability, model: str,
                          timeout: float) -> tuple[Exchange, ...]:
    """The question with thinking on, then off."""
    return tuple([
        Exchange(f"thinking {'on' if on else 'off'}", reasoning.PROMPT, reasoning.EXPECT,
                 await send(client, reasoning.body(model, on), timeout))
        for on in (True, False)
    ])


async def probe_images(client: Client, _cap: Capability, model: str,
                       timeout: float) -> tuple[Exchange, ...]:
    """Each drawing, asked its colour and shape."""
    return tuple([
        Exchange(d.label, images.describe(d), d.label,
                 await send(client, images.body(model, d), timeout))
        for d in images.DRAWINGS
    ])


#: The capabilities probed here, by name (sampling, the speculation tiers and the prefix cache
#: are probed by probes of their own).
PROBES: dict[str, ProbeFn] = {
    "served_names": probe_served_names,
    "tool_calls": probe_tool_calls,
    "reasoning": probe_reasoning,
    "images": probe_images,
}


async def probe_capabilities(client: Client, plan: tuple[Capability, ...], model: str,
                             timeout: float,
                             emit: Callable[[str, str], None]) -> tuple[CapabilityRun, ...]:
    """Every tested capability of ``plan`` that has a probe here, one after another."""
    out: list[CapabilityRun] = []
    for cap in plan:
        fn = PROBES.get(cap.name)
        if fn is None or not cap.tested:
            continue
        emit("capabilities", f"{cap.name}: {cap.source}")
        out.append(CapabilityRun(cap.name, await fn(client, cap, model, timeout)))
    return tuple(out)
