"""Issue 32, finding 16: one rule for what a server's ``/tokenize`` answers (loopback server,
tests/soak/fakevllm.py).

Before: ``{"count": -5}`` or ``{"count": "many"}`` counted as "no /tokenize" (the prompt sized by
the character estimate, the check passed), while ``{"count": 10}`` made it inconclusive. Now: any
200 answer that is not a believable token count is the same finding, which says what came: the
checks built on the sized prompt are inconclusive, naming the answer. A server without /tokenize
(no 200 answer) is still sized by the estimate, and said so.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fleetctl.soak.client import Client, TokenizeAnswerError
from fleetctl.soak.verdict import Outcome

from .fakevllm import MODEL, FakeVLLM, serve
from .test_hostile_loopback import quick, soak, spec_metrics

MALFORMED = [
    ({"count": -5}, "answered a count of -5, not a number of tokens"),
    ({"count": "many"}, "answered a count that is a str, not a number of tokens"),
    ({"count": 1.5}, "answered a count that is a float"),
    ({"count": True}, "answered a count that is a bool"),
    ({"tokens": [1, 2]}, "answered no count"),
    ([3], "answered no count"),
    ({"count": 10}, "10 tokens for"),  # a count, but not one a tokenizer gives for that text
]


@pytest.mark.parametrize("answer, said", MALFORMED)
def test_a_malformed_or_impossible_tokenize_makes_the_sized_check_inconclusive_saying_so(
        answer: Any, said: str, tmp_path: Path) -> None:
    with serve(FakeVLLM(tokenize=lambda _text: answer, metrics=spec_metrics)) as fake:
        v = soak(fake, quick(classes=["coding", "long_context"], long_context_tokens=1500),
                 tmp_path)
    lc = v.check("long_context")
    assert lc.outcome is Outcome.INCONCLUSIVE, lc.message
    assert f"/tokenize not believed: {said}" in lc.message, lc.message


def test_a_malformed_tokenize_under_the_shared_prefix_is_said_too(tmp_path: Path) -> None:
    # Before, a not-believed /tokenize left no trace on the shared prefix at all.
    with serve(FakeVLLM(tokenize=lambda _t: {"count": "many"}, metrics=spec_metrics)) as fake:
        cfg = quick(sustained={"duration": 3, "concurrency": 2, "window": 1,
                               "shared_prefix_tokens": 600})
        v = soak(fake, cfg, tmp_path)
    m = next(m for c in v.checks for m in c.measurements if m.label == "shared_prefix prompt")
    assert m.outcome is Outcome.INCONCLUSIVE, m.message
    assert "/tokenize not believed: answered a count that is a str" in m.message, m.message


def test_the_client_tells_no_tokenize_from_a_wrong_one() -> None:
    async def ask(url: str) -> int | None:
        async with Client(url) as c:
            return await c.tokenize(MODEL, "one two three four")

    with serve(FakeVLLM()) as good:
        assert asyncio.run(ask(good.url)) == 4
    with (serve(FakeVLLM(tokenize=lambda _t: {"count": -5})) as bad,
          pytest.raises(TokenizeAnswerError, match="count of -5")):
        asyncio.run(ask(bad.url))
    with serve(FakeVLLM()) as fake:
        assert asyncio.run(ask(fake.url + "/no-such-prefix")) is None  # a 404: no /tokenize
