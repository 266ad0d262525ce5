"""The soak client against a hostile local server (real HTTP): what the server sends is bounded."""

from __future__ import annotations

import asyncio
import contextlib

from fleetctl.soak.client import MAX_BODY_BYTES, ChatRequest, Client, SampleTag

HUGE = 64 << 20


async def _hostile(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """/v1/chat/completions: one 64 MB SSE line; /metrics: a body past the cap."""
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                       if ln.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        if head.startswith(b"GET /metrics"):
            size = MAX_BODY_BYTES + (1 << 20)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n" % size
            )
        else:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                b'data: {"x": "'
            )
        block = b"a" * (1 << 16)
        for _ in range(HUGE // len(block)):
            writer.write(block)
            await writer.drain()
    writer.close()


def test_an_endless_sse_line_and_an_oversized_metrics_body_are_refused() -> None:
    async def go() -> None:
        server = await asyncio.start_server(_hostile, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, Client(f"http://127.0.0.1:{port}", request_timeout=120) as c:
            # 4096 tokens asked: the stream cap (4 MiB) is above the line bound, which must end it
            # first.
            s = await c.chat(ChatRequest("m", "hi", 4096), SampleTag("sweep", "coding", 1, 0.0))
            assert not s.ok and s.error_kind == "protocol", s
            assert "SSE line grew past" in s.error
            p = await c.get("/metrics", timeout=120)
            assert not p.ok and "more than" in p.detail and not p.body

    asyncio.run(go())
