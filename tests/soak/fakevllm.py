"""A small fake vLLM on loopback (real HTTP, aiohttp.web in a thread) whose behaviour a test bends.

It answers like vLLM where the test does not say otherwise: /health, /v1/models, /version,
/tokenize (4 characters a token), /metrics (counters of what it served) and streamed chat
completions (the smoke and canary prompts answered right, other prompts with seeded varied
words, ``ignore_eos`` honoured, a usage chunk, ``[DONE]``). A test replaces any part:
``FakeVLLM(chat=..., tokenize=..., metrics=...)``; the hooks receive the parsed request.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from fleetctl.soak import prompts

MODEL = "fake-model"
WORDS = (
    "amber",
    "river",
    "quiet",
    "falcon",
    "stone",
    "harbor",
    "lantern",
    "meadow",
    "copper",
    "signal",
    "orchard",
    "basin",
    "cedar",
    "violet",
    "summit",
    "ember",
    "glacier",
    "willow",
    "canyon",
    "prairie",
    "tundra",
    "coral",
    "thistle",
    "marble",
    "beacon",
    "compass",
    "saddle",
    "granite",
    "pepper",
    "walnut",
    "juniper",
    "saffron",
    "cobalt",
    "raven",
    "heron",
    "badger",
    "otter",
    "maple",
    "birch",
    "aspen",
    "spruce",
    "lichen",
    "moss",
    "fern",
    "clover",
    "pebble",
    "dune",
    "reef",
    "lagoon",
    "delta",
)

Chat = Callable[["FakeVLLM", web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


def prompt_of(body: dict[str, Any]) -> str:
    msgs = body.get("messages") or [{}]
    return str(msgs[-1].get("content", ""))


def answer_for(prompt: str) -> str | None:
    """The right answer of a smoke or canary prompt (None for a load prompt)."""
    if prompt.endswith(prompts.NEEDLE_QUESTION) and prompts.VAULT_CODE in prompt:
        return f"The vault code is {prompts.VAULT_CODE}."
    for sp in (*prompts.SMOKE, *prompts.CANARIES):
        if sp.prompt == prompt:
            return f"The answer is {sp.expect}." if sp.name != "copy" else sp.expect
    return None


def words(prompt: str, n: int, offset: int = 0) -> list[str]:
    """``n`` varied word tokens seeded by the prompt (no phrase repeats)."""
    rng = random.Random(prompt)
    out = [f"{rng.choice(WORDS)} " for _ in range(n + offset)]
    return out[offset:]


class FakeVLLM:
    """The fake server's state and behaviour; ``url`` once started by :func:`serve`."""

    def __init__(self, *, chat: Chat | None = None,
                 tokenize: Callable[[str], Any] | None = None,
                 metrics: Callable[[FakeVLLM], str] | None = None,
                 health: Callable[[FakeVLLM], int] | None = None,
                 max_model_len: int = 8192) -> None:
        self.chat_hook = chat or good_chat
        self.tokenize_hook = tokenize or (lambda text: {"count": max(1, len(text) // 4)})
        self.metrics_hook = metrics or default_metrics
        self.health_hook = health or (lambda _f: 200)
        self.max_model_len = max_model_len
        self.url = ""
        self.finished = 0
        self.generated = 0
        self.prompt_tokens = 0
        self.chats = 0
        self.seen_headers: list[dict[str, str]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _version(self, _r: web.Request) -> web.Response:
        return _json({"version": "0.0.0-fake"})

    async def _models(self, _r: web.Request) -> web.Response:
        return _json({"data": [{"id": MODEL, "max_model_len": self.max_model_len}]})

    async def _metrics(self, _r: web.Request) -> web.Response:
        return web.Response(text=self.metrics_hook(self))

    async def _health(self, _r: web.Request) -> web.Response:
        return web.Response(status=self.health_hook(self))

    async def _tokenize(self, r: web.Request) -> web.Response:
        body = await r.json()
        return _json(self.tokenize_hook(str(body.get("prompt", ""))))

    async def _chat(self, r: web.Request) -> web.StreamResponse:
        self.chats += 1
        self.seen_headers.append(dict(r.headers))
        return await self.chat_hook(self, r, await r.json())


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(obj), status=status, content_type="application/json")


def default_metrics(f: FakeVLLM) -> str:
    return (
        f'vllm:request_success_total{{model_name="{MODEL}",finished_reason="length"}} '
        f'{f.finished}\n'
        f'vllm:generation_tokens_total{{model_name="{MODEL}"}} {f.generated}\n'
        f'vllm:prompt_tokens_total{{model_name="{MODEL}"}} {f.prompt_tokens}\n'
        f'vllm:num_preemptions_total{{model_name="{MODEL}"}} 0\n'
    )


async def sse_start(r: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(r)
    return resp


def event(
    content: str | None = None, finish: str | None = None, usage: dict[str, int] | None = None
) -> bytes:
    obj: dict[str, Any] = {
        "choices": []
        if usage
        else [
            {"index": 0, "delta": {"content": content} if content else {}, "finish_reason": finish}
        ]
    }
    if usage:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def stream_tokens(f: FakeVLLM, r: web.Request, body: dict[str, Any], tokens: list[str],
                        delay: float = 0.0) -> web.StreamResponse:
    """Stream ``tokens`` as a complete, well-formed answer (finish, usage, [DONE])."""
    resp = await sse_start(r)
    for t in tokens:
        await resp.write(event(t))
        if delay:
            await asyncio.sleep(delay)
    n = len(tokens)
    finish = "length" if n >= int(body.get("max_tokens", 16)) else "stop"
    await resp.write(event(finish=finish))
    ptoks = max(1, len(json.dumps(body.get("messages", []))) // 4)
    await resp.write(
        event(usage={"prompt_tokens": ptoks, "completion_tokens": n, "total_tokens": ptoks + n})
    )
    await resp.write(b"data: [DONE]\n\n")
    f.finished += 1
    f.generated += n
    f.prompt_tokens += ptoks
    return resp


async def good_chat(f: FakeVLLM, r: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """A healthy server: right answers to smoke/canaries, varied words otherwise."""
    prompt = prompt_of(body)
    right = answer_for(prompt)
    if right is not None:
        return await stream_tokens(f, r, body, [w + " " for w in right.split()])
    return await stream_tokens(f, r, body, words(prompt, int(body.get("max_tokens", 16))))


@contextmanager
def serve(fake: FakeVLLM) -> Iterator[FakeVLLM]:
    """Run ``fake`` on a free loopback port in a thread for the ``with`` block."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    # Handlers that hang on purpose are cancelled at cleanup, not waited on for a minute.
    runner = web.AppRunner(fake.app(), handle_signals=False, access_log=None, shutdown_timeout=0.5)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        fake.url = f"http://127.0.0.1:{port}"
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait(10)
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
