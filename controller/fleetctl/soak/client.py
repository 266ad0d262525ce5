"""The soak's HTTP client: streamed chat completions, probes and scrapes, over aiohttp.

aiohttp rather than httpx because it keeps up: per CPU second a bare aiohttp
streaming loop absorbs ~2.6-3x the SSE events of a bare httpx loop (~210k vs
~80k here), and this client with its full per-event parsing stays at ~0.9x the
bare aiohttp loop (``bench/soak_client.py`` measures all three in one run). One controller core
must soak dozens of Sparks streaming at their 800 tok/s peak without becoming
the bottleneck, or it would measure itself instead of the server.

Per request it records TTFT at the first event with non-empty content (with
speculative decoding one event carries several tokens, and the first events
may be empty role deltas), time per output token from the usage chunk's
``completion_tokens`` (not the event count), and every way a request can fail,
including an ``{"error": ...}`` event inside an HTTP 200 stream.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from fleetctl.soak.verdict import Sample

_decode = json.JSONDecoder().decode


@dataclass(frozen=True)
class Probe:
    """One GET: ``state`` is ok | refused | http | timeout | unreachable."""

    state: str
    status: int = 0
    body: str = ""
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True on a 2xx answer."""
        return self.state == "ok"


@dataclass(frozen=True)
class ChatRequest:
    """What one streamed chat completion asks for."""

    model: str
    prompt: str
    max_tokens: int
    temperature: float = 0.0
    #: Disable the chat template's thinking (smoke prompts: so the answer is in ``content``).
    thinking: bool | None = None
    #: Generate exactly max_tokens (vLLM's ignore_eos), so levels are comparable run to run.
    ignore_eos: bool = False


def chat_body(req: ChatRequest) -> bytes:
    """The JSON body of a streamed chat completion with a usage chunk."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": [{"role": "user", "content": req.prompt}],
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": req.thinking}
    if req.ignore_eos:
        body["ignore_eos"] = True
    return json.dumps(body).encode()


class StreamParser:
    """Incremental SSE parser for one chat completion stream.

    Feed it the raw bytes as they arrive with the arrival time; it keeps the
    timing of the first non-empty content, the finish reason, the usage chunk
    and any error event. Every ``data:`` event is JSON-decoded.
    """

    __slots__ = ("_utf8", "done", "error", "events", "finish_reason", "first_content_at", "keep_text",
                 "parts", "pending", "usage")

    def __init__(self, keep_text: bool = False) -> None:
        # Decoding each chunk once to str (incrementally: a chunk may end mid-character) and
        # parsing str events is ~2x faster than json.loads on bytes, which sniffs the encoding
        # of every event.
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.pending = ""
        self.events = 0
        self.first_content_at: float | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: str = ""
        self.done = False
        self.keep_text = keep_text
        self.parts: list[str] = []

    def feed(self, chunk: bytes, now: float) -> None:
        """Consume ``chunk`` (any split of the stream), received at ``now``."""
        text = self._utf8.decode(chunk)
        data = self.pending + text if self.pending else text
        lines = data.split("\n")
        self.pending = lines.pop()
        decode = _decode
        for line in lines:
            if not line.startswith("data:"):
                continue  # blank separators, comments (": ping"), event: lines
            # vLLM writes "data: {...}"; other servers may omit the space or end lines with \r.
            payload = line[6:] if line.startswith("data: ") else line[5:]
            if payload.endswith("\r") or payload.startswith(" "):
                payload = payload.strip()
            if payload == "[DONE]":
                self.done = True
                continue
            self.events += 1
            try:
                obj = decode(payload)
            except ValueError:
                self.error = self.error or f"undecodable stream event: {payload[:120]!r}"
                continue
            if type(obj) is not dict:
                continue
            err = obj.get("error")
            if err is not None:
                self.error = self.error or _error_text(err)
                continue
            choices = obj.get("choices")
            if choices:
                choice = choices[0]
                delta = choice.get("delta")
                if delta:
                    content = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                    if content:
                        if self.first_content_at is None:
                            self.first_content_at = now
                        if self.keep_text and delta.get("content"):
                            self.parts.append(delta["content"])
                reason = choice.get("finish_reason")
                if reason:
                    self.finish_reason = reason
            usage = obj.get("usage")
            if usage:
                self.usage = usage

    @property
    def text(self) -> str:
        """The generated content (only when ``keep_text``)."""
        return "".join(self.parts)


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message") or err.get("type") or json.dumps(err)
        code = err.get("code")
        return f"{msg} (code {code})" if code else str(msg)
    return str(err)


class Client:
    """An aiohttp session against one server's base URL. Use as ``async with Client(url) as c``."""

    def __init__(self, base_url: str, *, connections: int = 128, request_timeout: float = 180.0,
                 connect_timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.connections = connections
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        # No pooling limit below our own concurrency, no cookie jar, no per-host cap:
        # the client must never be the one queueing requests.
        connector = aiohttp.TCPConnector(limit=self.connections, limit_per_host=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session (inside ``async with``)."""
        if self._session is None:
            raise RuntimeError("Client used outside `async with`")
        return self._session

    async def get(self, path: str, timeout: float = 10.0) -> Probe:
        """GET ``path``; a refused connection is a state, not an exception."""
        t0 = time.monotonic()
        try:
            async with self.session.get(self.base_url + path,
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                body = await resp.text(errors="replace")
                state = "ok" if 200 <= resp.status < 300 else "http"
                return Probe(state, resp.status, body, seconds=time.monotonic() - t0)
        except aiohttp.ClientConnectorError as e:
            refused = isinstance(e.os_error, ConnectionRefusedError)
            return Probe("refused" if refused else "unreachable", detail=_conn_text(e),
                         seconds=time.monotonic() - t0)
        except TimeoutError:
            return Probe("timeout", detail=f"no answer within {timeout:.0f}s", seconds=time.monotonic() - t0)
        except aiohttp.ClientError as e:
            return Probe("unreachable", detail=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)

    async def get_json(self, path: str, timeout: float = 10.0) -> tuple[Probe, Any]:
        """GET ``path`` and decode JSON (None when not ok or not JSON)."""
        p = await self.get(path, timeout)
        if not p.ok:
            return p, None
        try:
            return p, json.loads(p.body)
        except ValueError:
            return Probe("http", p.status, p.body, detail="answer is not JSON", seconds=p.seconds), None

    async def chat(self, req: ChatRequest, *, phase: str, cls: str, concurrency: int,
                   t0: float, keep_text: bool = False, timeout: float | None = None) -> Sample:
        """One streamed chat completion, measured; failures are returned as data."""
        start = time.monotonic()
        parser = StreamParser(keep_text)
        status = 0
        kind = ""
        error = ""
        limit = self.request_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                async with self.session.post(
                    self.base_url + "/v1/chat/completions", data=chat_body(req),
                    headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
                ) as resp:
                    status = resp.status
                    if status != 200:
                        kind, error = "http", f"HTTP {status}: {_http_error(await resp.read())}"
                    else:
                        feed = parser.feed
                        clock = time.monotonic
                        async for chunk in resp.content.iter_any():
                            feed(chunk, clock())
                        if parser.pending:
                            parser.feed(b"\n", clock())
        except aiohttp.ClientConnectorError as e:
            kind, error = "connect", _conn_text(e)
        except TimeoutError:
            kind, error = "timeout", f"no complete answer within {limit:.0f}s"
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            kind, error = "disconnect", f"connection broke mid-stream: {type(e).__name__}: {e}"
        except aiohttp.ClientError as e:
            kind, error = "protocol", f"{type(e).__name__}: {e}"
        end = time.monotonic()
        if not kind:
            if parser.error:
                kind, error = "stream_error", f"error event in HTTP 200 stream: {parser.error}"
            elif not parser.done:
                kind, error = "disconnect", "stream ended before data: [DONE]"
        usage = parser.usage or {}
        out_tokens = usage.get("completion_tokens")
        ttft = parser.first_content_at - start if parser.first_content_at is not None else None
        tpot = None
        if parser.first_content_at is not None and isinstance(out_tokens, int) and out_tokens > 1:
            tpot = (end - parser.first_content_at) / (out_tokens - 1)
        if not kind and not usage:
            # Asked for include_usage: a stream without it cannot be measured (TPOT, tokens).
            kind, error = "protocol", "stream had no usage chunk (stream_options.include_usage ignored)"
        return Sample(
            phase=phase, cls=cls, concurrency=concurrency, start=start - t0, ok=not kind,
            status=status, ttft=ttft, e2e=end - start, tpot=tpot,
            prompt_tokens=usage.get("prompt_tokens"), output_tokens=out_tokens, events=parser.events,
            finish_reason=parser.finish_reason, error_kind=kind, error=error[:500],
            text=parser.text if keep_text else None,
        )


def _http_error(body: bytes) -> str:
    text = body[:2000].decode(errors="replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()[:300] or "(empty body)"
    if isinstance(obj, dict):
        if "error" in obj:
            return _error_text(obj["error"])
        if "message" in obj:
            return str(obj["message"])
        if "detail" in obj:
            return str(obj["detail"])
    return text[:300]


def _conn_text(e: aiohttp.ClientConnectorError) -> str:
    if isinstance(e.os_error, ConnectionRefusedError):
        return f"connection refused by {e.host}:{e.port}"
    return f"cannot connect to {e.host}:{e.port}: {e.os_error or e}"
