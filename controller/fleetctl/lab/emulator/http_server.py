"""The emulator's HTTP/1.1 front end: asyncio streams, keep-alive, routing, auth, chunked SSE.

asyncio rather than ThreadingHTTPServer: 64+ concurrent streams are 64 coroutines
sleeping on timers instead of 64 threads contending for the GIL on one core, and
keep-alive plus chunked transfer is a few lines either way.

This module knows HTTP only: a route's handler gets the request body and returns a
:class:`Response` or an :class:`EventStream`; what the routes answer (vLLM's
OpenAI-compatible API) is :mod:`.openai_api`. Named ``http_server``, not ``http``: in
the image the emulator's directory is ``sys.path[0]`` of its ``vllm`` script, where an
``http.py`` would shadow the standard library's ``http``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import email.utils
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
#: The request being answered on this connection (each connection is its own task).
_CURRENT: contextvars.ContextVar[tuple[str, str, str]] = contextvars.ContextVar("current_request")
#: Whether that request came through a proxy (an ``X-Forwarded-For`` header: users' traffic via the
#: front door).
_FORWARDED: contextvars.ContextVar[bool] = contextvars.ContextVar("forwarded", default=False)


def forwarded() -> bool:
    """True when the request being answered carries ``X-Forwarded-For`` (it came through a front
    door)."""
    return _FORWARDED.get()


@dataclass(frozen=True)
class Response:
    """One complete response."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"


def json_response(status: int, obj: Any) -> Response:
    """A compact JSON response, as uvicorn's JSONResponse writes one."""
    return Response(status, json.dumps(obj, separators=(",", ":")).encode())


@dataclass(frozen=True)
class EventStream:
    """A 200 ``text/event-stream`` over chunked transfer: each payload is one ``data:`` event.

    When the client hangs up, the iterator is closed (``aclose``), so the request
    behind it can be aborted.
    """

    events: AsyncIterator[str]


#: A route's handler: the request body in, the whole answer out.
Handler = Callable[[bytes], Awaitable[Response | EventStream]]
#: Path -> (the one method it answers, its handler); GET routes answer HEAD too.
Routes = Mapping[str, tuple[str, Handler]]


class HttpServer:
    """Serves ``routes`` over HTTP/1.1 with keep-alive, writing uvicorn's access log lines to
    ``log``."""

    def __init__(
        self,
        routes: Routes,
        log: Callable[[str], None],
        *,
        api_key: str | None = None,
        access_log: bool = True,
    ) -> None:
        """``api_key`` (--api-key / $VLLM_API_KEY) guards /v1/*; ``access_log`` is False with
        --disable-uvicorn-access-log."""
        self.routes = routes
        self.log = log
        #: /v1/* then needs ``Authorization: Bearer <key>`` (vLLM's AuthenticationMiddleware);
        #: /health, /metrics and /version stay open.
        self.api_key = api_key
        self.access_log = access_log
        self._connections: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def listen(self, host: str, port: int) -> asyncio.Server:
        """Start accepting connections on ``host:port`` (all interfaces for ``0.0.0.0``/``::``)."""
        bind_host: str | None = None if host in ("", "0.0.0.0", "::") else host
        return await asyncio.start_server(
            self.handle, bind_host, port, reuse_address=True, limit=1 << 20
        )

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection until it closes (HTTP/1.1 keep-alive)."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._connections.add(writer)
        try:
            while True:
                line = await reader.readline()
                if not line.strip():
                    break
                try:
                    method, target, version = line.decode("latin-1").split()
                except ValueError:
                    break
                headers: dict[str, str] = {}
                while True:
                    raw = await reader.readline()
                    if raw in (b"\r\n", b"\n", b""):
                        break
                    key, _, value = raw.decode("latin-1").partition(":")
                    headers[key.strip().lower()] = value.strip()
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                elif headers.get("transfer-encoding", "").lower() == "chunked":
                    body = await self._read_chunked(reader)
                keep_alive = (
                    version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                )
                path = target.split("?", 1)[0]
                _CURRENT.set((self._peer(writer), method, target))
                _FORWARDED.set("x-forwarded-for" in headers)
                if not self.authorized(path, headers.get("authorization", "")):
                    await self.send(
                        writer, json_response(401, {"error": "Unauthorized"}), keep_alive
                    )
                    if not keep_alive:
                        break
                    continue
                keep_alive = await self.dispatch(method, path, body, writer, keep_alive)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        except asyncio.CancelledError:
            # Shutdown cancels every connection; ending normally keeps Python 3.11's stream
            # callback from logging a CancelledError traceback into the log operators read.
            pass
        finally:
            self._connections.discard(writer)
            if task is not None:
                self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    def authorized(self, path: str, authorization: str) -> bool:
        """vLLM's rule: with a key, every path under /v1 needs ``Bearer <key>``; others are open."""
        if not self.api_key or not path.startswith("/v1"):
            return True
        return hmac.compare_digest(authorization.encode(), f"Bearer {self.api_key}".encode())

    async def dispatch(
        self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter, keep_alive: bool
    ) -> bool:
        """Answer one request; returns whether the connection stays open."""
        route = self.routes.get(path.rstrip("/") or "/")
        if route is None:
            await self.send(writer, json_response(404, {"detail": "Not Found"}), keep_alive)
            return keep_alive
        allowed, handler = route
        if method != allowed and not (method == "HEAD" and allowed == "GET"):
            await self.send(
                writer, json_response(405, {"detail": "Method Not Allowed"}), keep_alive
            )
            return keep_alive
        reply = await handler(body)
        if isinstance(reply, EventStream):
            return await self.stream(writer, reply, keep_alive)
        await self.send(writer, reply, keep_alive)
        return keep_alive

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readline()

    @staticmethod
    def _peer(writer: asyncio.StreamWriter) -> str:
        peer = writer.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "-"

    def _head(
        self, status: int, content_type: str, extra: list[tuple[str, str]], keep_alive: bool
    ) -> bytes:
        if self.access_log:
            peer, method, target = _CURRENT.get(("-", "-", "-"))
            # uvicorn's access log line, as a real vLLM writes one per response.
            self.log(
                f'INFO:     {peer} - "{method} {target} HTTP/1.1" {status} '
                f'{REASONS.get(status, "")}'
            )
        lines = [
            f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}",
            f"date: {email.utils.formatdate(usegmt=True)}",
            "server: uvicorn",
            f"content-type: {content_type}",
            *(f"{k}: {v}" for k, v in extra),
        ]
        if not keep_alive:
            lines.append("connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(
        self, writer: asyncio.StreamWriter, response: Response, keep_alive: bool
    ) -> None:
        """Send one complete response."""
        writer.write(
            self._head(
                response.status,
                response.content_type,
                [("content-length", str(len(response.body)))],
                keep_alive,
            )
            + response.body
        )
        await writer.drain()

    async def stream(
        self, writer: asyncio.StreamWriter, stream: EventStream, keep_alive: bool
    ) -> bool:
        """SSE over chunked transfer, one chunk per event; False when the client hung up."""
        writer.write(
            self._head(
                200,
                "text/event-stream; charset=utf-8",
                [("transfer-encoding", "chunked")],
                keep_alive,
            )
        )
        try:
            async for payload in stream.events:
                data = f"data: {payload}\n\n".encode()
                writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, RuntimeError):
            # The client hung up mid-stream: closing the events aborts the request behind them.
            await aclose_quietly(stream.events)
            return False
        return keep_alive

    async def close_all(self) -> None:
        """Drop every connection and cancel their handlers."""
        for writer in list(self._connections):
            with contextlib.suppress(Exception):
                writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.sleep(0)


async def aclose_quietly(iterator: AsyncIterator[Any]) -> None:
    """Close an async generator (running its ``finally``), ignoring what closing it raises."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
