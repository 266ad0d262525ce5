"""The served-names probe: every name of the recipe answers one request.

Being listed in /v1/models is not enough (the identity check reads that): a name a router or a
proxy maps to nothing, or to a model that no longer loads, answers 404 or 500 only when asked.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl.soak.capabilities.exchange import Exchange
from fleetctl.soak.checks.judge import garbage, snippet
from fleetctl.soak.verdict import Measurement, Outcome

PROMPT = "What is the capital of France?"
EXPECT = "an answer (HTTP 200, text, no garbage)"
MAX_TOKENS = 32


def judge(exchanges: Sequence[Exchange]) -> list[Measurement]:
    """One measurement per served name."""
    out: list[Measurement] = []
    for x in exchanges:
        r = x.reply
        text = r.content or ""
        head = f"served_names ({x.label}): {x.prompt!r}: expected {x.expected}"
        if not r.ok:
            out.append(Measurement(x.label, Outcome.FAIL, f"{head}, got {r.error}",
                                   r.error[:120], x.expected))
        elif not text.strip():
            out.append(Measurement(x.label, Outcome.FAIL, f"{head}, got no text (finish_reason "
                                   f"{r.finish_reason})", "", x.expected))
        elif why := garbage(text):
            out.append(Measurement(x.label, Outcome.FAIL, f"{head}, got garbage ({why}): "
                                   f"{snippet(text)}", snippet(text), x.expected))
        else:
            out.append(Measurement(x.label, Outcome.PASS, f"{x.label} answered {snippet(text)}",
                                   snippet(text), x.expected))
    return out
