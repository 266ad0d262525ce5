"""Liveness by generated tokens: a server whose /health answers while no token comes out is wedged.

A serving unit whose worker died, or whose collectives hang (vLLM #41725: every 20-26 minutes under
load until NCCL is swapped), keeps answering ``/health`` 200 on its head: readiness alone passes it.
What tells is a token. :func:`check_liveness` sends one short streamed request and reports, as the
unit gate must (docs/units.md), the fact: "/health 200 but no token in 30 s", never a bare timeout.
The cause is read from the members' logs when the caller gives them
(``fleetctl.fabric.collective_errors``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleetctl import fabric
from fleetctl.soak.client import ChatRequest, Client, SampleTag
from fleetctl.soak.verdict import SoakTarget

#: Seconds a server may take to produce its first token before it counts as wedged.
DEFAULT_WINDOW = 30.0
PROMPT = "Reply with the single word: ready"


@dataclass(frozen=True)
class Liveness:
    """``pass``: a token came; ``fail``: /health 200 and no token; ``error``: not serving at all."""

    outcome: str
    #: HTTP status of /health before the request (None: nothing answered).
    health: int | None
    #: Seconds to the first token (None when none came).
    first_token_s: float | None
    #: The fact, for the verdict: what was measured against what was expected.
    detail: str
    #: NCCL/Gloo lines from the members' logs, quoted as the cause (member: line).
    cause: tuple[str, ...] = ()


async def token_liveness(target: SoakTarget, model: str, window: float = DEFAULT_WINDOW,
                         member_logs: Callable[[], Mapping[str, str]] | None = None) -> Liveness:
    """One short streamed request against ``target``: did a token come within ``window`` seconds?

    ``member_logs`` (member -> its container's log tail) is read only when no token came, to quote
    the members' NCCL/Gloo error lines as the cause.
    """
    async with Client(target.base_url, connections=2, api_key=target.api_key) as client:
        health = await client.get("/health")
        status = health.status if health.state in ("ok", "http") else None
        if status != 200:
            return Liveness(
                "error",
                status,
                None,
                f"/health answered {status}"
                if status
                else f"/health: {health.detail or health.state}",
            )
        sample = await client.chat(
            ChatRequest(model, PROMPT, max_tokens=16, thinking=False),
            SampleTag("liveness", "liveness", 1, 0.0),
            timeout=window,
        )
    if sample.ttft is not None:
        return Liveness(
            "pass", 200, round(sample.ttft, 3), f"first token after {sample.ttft:.1f} s"
        )
    logs = member_logs() if member_logs is not None else {}
    cause = tuple(
        f"{member}: {line}"
        for member, log in logs.items()
        for line in fabric.collective_errors(log)[-2:]
    )
    if sample.error_kind == "timeout":
        detail = (f"/health answers 200 but no token came in {window:.0f} s (expected one within "
                  f"{window:.0f} s)")
        return Liveness("fail", 200, None, detail, cause)
    return Liveness(
        "fail", 200, None, f"/health answers 200 but the request failed: {sample.error}", cause
    )


def check_liveness(target: SoakTarget, model: str, window: float = DEFAULT_WINDOW,
                   member_logs: Callable[[], Mapping[str, str]] | None = None) -> Liveness:
    """:func:`token_liveness` from synchronous code."""
    return asyncio.run(token_liveness(target, model, window, member_logs))
