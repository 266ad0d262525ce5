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

Every stream's text is checked for garbage as it arrives (:class:`TextCheck`: runs of
one character, one token repeated, U+FFFD replacement characters), at a cost of a few
string operations per event, and every answer's ``finish_reason`` and
``completion_tokens`` are validated against what was asked. What the server sends is
bounded: an SSE line longer than :data:`MAX_LINE_BYTES` ends the request at once (a
64 MB line would otherwise cost seconds of the one CPU every host's soak shares), error
and probe bodies are read up to a cap, and every request has an overall deadline.

The stream's parser and its bounds are in ``stream.py``, the garbage check of its text in
``text_check.py``; their public names stay reachable here (``client.TextCheck``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from fleetctl.soak.client.stream import (
    MAX_LINE_BYTES,
    STREAM_BYTES_PER_TOKEN,
    STREAM_FIXED_BYTES,
    LineTooLongError,
    StreamParser,
    StreamTooLongError,
    error_text,
    stream_cap,
)
from fleetctl.soak.client.text_check import EXCERPT_CHARS, TextCheck
from fleetctl.soak.loops import MIN_WORDS, find_loop
from fleetctl.soak.verdict import Sample

# The parts' public names, reachable as client.NAME as when they were all in one module.
__all__ = [
    "EXCERPT_CHARS",
    "MAX_BODY_BYTES",
    "MAX_LINE_BYTES",
    "STREAM_BYTES_PER_TOKEN",
    "STREAM_FIXED_BYTES",
    "ChatRequest",
    "Client",
    "LineTooLongError",
    "Probe",
    "StreamParser",
    "StreamTooLongError",
    "TextCheck",
    "TokenizeAnswerError",
    "chat_body",
    "error_text",
    "stream_cap",
    "validate_answer",
]


#: The most read of an error or probe body (/metrics of a big server is ~100-300 KB).
MAX_BODY_BYTES = 8 << 20


class TokenizeAnswerError(ValueError):
    """A ``/tokenize`` that answered 200 with something other than a token count: the server has
    the endpoint and its answer is wrong, which is not the same as having none."""


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
    #: Earlier messages of a conversation (role, content), sent before ``prompt``: a shared
    #: system context and earlier turns, so that requests share a prefix the server can cache.
    history: tuple[tuple[str, str], ...] = ()
    #: vLLM's per-request sampling seed (the reference set's fixed one); None: not sent.
    seed: int | None = None


@dataclass(frozen=True)
class SampleTag:
    """Where one request's :class:`~fleetctl.soak.verdict.Sample` is filed: its phase, its class,
    the concurrency it ran at, and the soak's clock zero its start is measured from."""

    phase: str
    cls: str
    concurrency: int
    t0: float


def chat_body(req: ChatRequest) -> bytes:
    """The JSON body of a streamed chat completion with a usage chunk."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": [
            *({"role": r, "content": c} for r, c in req.history),
            {"role": "user", "content": req.prompt},
        ],
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": req.thinking}
    if req.ignore_eos:
        body["ignore_eos"] = True
    if req.seed is not None:
        body["seed"] = req.seed
    return json.dumps(body).encode()


def validate_answer(req: ChatRequest, finish_reason: str | None, usage: dict[str, Any],
                    has_text: bool) -> tuple[str, str]:
    """``(kind, message)`` when a complete 200 answer is wrong in shape, else ``("", "")``.

    A server that stops early, counts tokens it did not send or streams nothing but
    role deltas still answers 200 with ``[DONE]``; latency figures from it would lie.
    """
    out = usage.get("completion_tokens")
    if finish_reason is None:
        return "protocol", "no finish_reason in the stream"
    if finish_reason not in ("stop", "length"):
        return "finish", f"finish_reason {finish_reason!r} (expected stop or length)"
    if isinstance(out, bool) or not isinstance(out, int) or not 0 <= out <= req.max_tokens:
        return (
            "protocol",
            f"completion_tokens {out!r} is not between 0 and max_tokens {req.max_tokens}",
        )
    if finish_reason == "length" and out != req.max_tokens:
        return "protocol", f"finish_reason length after {out} of max_tokens {req.max_tokens} tokens"
    if req.ignore_eos and finish_reason != "length":
        return (
            "finish",
            f"stopped ({finish_reason}) after {out} of {req.max_tokens} tokens despite ignore_eos",
        )
    if not has_text:
        return (
            "empty",
            f"the answer had no text ({out} completion tokens, finish_reason {finish_reason})",
        )
    return "", ""


class Client:
    """An aiohttp session against one server's base URL. Use as ``async with Client(url) as c``."""

    def __init__(self, base_url: str, *, connections: int = 128, request_timeout: float = 180.0,
                 connect_timeout: float = 5.0, api_key: str | None = None,
                 scrub: Callable[[str], str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        #: Applied to every string that came from the server before it leaves the client (error
        #: bodies, error events, probe bodies, kept text): a server echoing the key must not be
        #: quoted.
        self.scrub: Callable[[str], str] = scrub or _same
        # vLLM with --api-key/$VLLM_API_KEY answers 401 on /v1/* without it (/health, /metrics stay
        # open).
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.connections = connections
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        # No pooling limit below our own concurrency, no cookie jar, no per-host cap:
        # the client must never be the one queueing requests.
        connector = aiohttp.TCPConnector(
            limit=self.connections, limit_per_host=0, ttl_dns_cache=300
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            headers=self._headers,
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
                raw = await _read_capped(resp, MAX_BODY_BYTES)
                if raw is None:
                    return Probe(
                        "http",
                        resp.status,
                        detail=f"{path} answered more than {MAX_BODY_BYTES} bytes",
                        seconds=time.monotonic() - t0,
                    )
                state = "ok" if 200 <= resp.status < 300 else "http"
                return Probe(state, resp.status, self.scrub(raw.decode(errors="replace")),
                             seconds=time.monotonic() - t0)
        except aiohttp.ClientConnectorError as e:
            refused = isinstance(e.os_error, ConnectionRefusedError)
            return Probe(
                "refused" if refused else "unreachable",
                detail=_conn_text(e),
                seconds=time.monotonic() - t0,
            )
        except TimeoutError:
            return Probe(
                "timeout", detail=f"no answer within {timeout:.0f}s", seconds=time.monotonic() - t0
            )
        except aiohttp.ClientError as e:
            return Probe(
                "unreachable",
                detail=self.scrub(f"{type(e).__name__}: {e}"),
                seconds=time.monotonic() - t0,
            )

    async def get_json(self, path: str, timeout: float = 10.0) -> tuple[Probe, Any]:
        """GET ``path`` and decode JSON (None when not ok or not JSON)."""
        p = await self.get(path, timeout)
        if not p.ok:
            return p, None
        try:
            return p, json.loads(p.body)
        except ValueError:
            return Probe(
                "http", p.status, p.body, detail="answer is not JSON", seconds=p.seconds
            ), None

    async def post_json(self, path: str, body: dict[str, Any],
                        timeout: float) -> tuple[int, Any, str]:
        """POST ``body`` as JSON and decode the answer: ``(status, JSON or None, why not)``.

        A refused connection, a timeout, an answer over :data:`MAX_BODY_BYTES` or one that is not
        JSON is a status 0 (or the HTTP status) and its reason, never an exception; the reason and
        nothing else of the body is kept, scrubbed.
        """
        try:
            async with self.session.post(self.base_url + path, data=json.dumps(body),
                                         headers={"Content-Type": "application/json"},
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                raw = await _read_capped(resp, MAX_BODY_BYTES)
                status = resp.status
        except aiohttp.ClientConnectorError as e:
            return 0, None, _conn_text(e)
        except TimeoutError:
            return 0, None, f"no answer within {timeout:.0f}s"
        except aiohttp.ClientError as e:
            return 0, None, self.scrub(f"{type(e).__name__}: {e}")
        if raw is None:
            return status, None, f"answered more than {MAX_BODY_BYTES >> 20} MiB"
        if status != 200:
            return status, None, self.scrub(f"HTTP {status}: {_http_error(raw)}")
        try:
            return status, json.loads(raw), ""
        except ValueError:
            return status, None, "answered a body that is not JSON"

    async def tokenize(self, model: str, text: str, timeout: float = 10.0) -> int | None:
        """Tokens of ``text`` for ``model`` by the server's ``POST /tokenize`` (vLLM).

        None where the server has no usable /tokenize (no 200 answer in ``timeout``); a 200 whose
        body is not ``{"count": <integer of 0 or more>}`` raises :class:`TokenizeAnswerError`
        saying what came instead (``-5``, ``"many"``, no count, not JSON), never its text.
        """
        try:
            async with self.session.post(self.base_url + "/tokenize",
                                         data=json.dumps({"model": model, "prompt": text,
                                                          "add_special_tokens": False}),
                                         headers={"Content-Type": "application/json"},
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                raw = await _read_capped(resp, MAX_BODY_BYTES)
                if resp.status != 200:
                    return None
        except (aiohttp.ClientError, TimeoutError):
            return None
        return _token_count(raw)

    async def chat(self, req: ChatRequest, tag: SampleTag, *, keep_text: bool = False,
                   timeout: float | None = None, stall: float | None = None,
                   delta_ends: bool = False) -> Sample:
        """One streamed chat completion, measured and filed under ``tag``; failures are returned
        as data.

        ``stall``: seconds without a token (before the first one too) after which the request is
        ended as ``stall`` (a wedged engine when /health still answers), not waited on to
        ``timeout``.
        """
        start = time.monotonic()
        parser = StreamParser(keep_text, delta_ends)
        status = 0
        kind = ""
        error = ""
        limit = self.request_timeout if timeout is None else timeout
        cap = stream_cap(req.max_tokens)
        stalled: list[float] = []
        watchdog: Callable[[], None] | None = None
        try:
            async with asyncio.timeout(limit) as deadline:
                if stall is not None and stall < limit:
                    watchdog = _watch(deadline, parser, start, stall, stalled)
                async with self.session.post(
                    self.base_url + "/v1/chat/completions", data=chat_body(req),
                    headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
                ) as resp:
                    status = resp.status
                    if status != 200:
                        kind, error = (
                            "http",
                            f"HTTP {status}: {_http_error(await resp.content.read(4096))}",
                        )
                    else:
                        feed = parser.feed
                        clock = time.monotonic
                        got = 0
                        async for chunk in resp.content.iter_any():
                            got += len(chunk)
                            if got > cap:
                                raise StreamTooLongError(
                                    f"the stream passed {cap} bytes for {req.max_tokens} tokens "
                                    "asked "
                                    f"(bound {STREAM_BYTES_PER_TOKEN} bytes a token) without [DONE]"
                                )
                            feed(chunk, clock())
                        if parser.pending:
                            parser.feed(b"\n", clock())
        except _TRANSPORT_ERRORS as e:
            kind, error = _failure(e, parser, stalled, limit)
        finally:
            if watchdog is not None:
                watchdog()
        end = time.monotonic()
        usage = parser.usage or {}
        out_tokens = usage.get("completion_tokens")
        gaps = sorted(b - a for a, b in zip(parser.stamps, parser.stamps[1:], strict=False))
        ttft = parser.first_content_at - start if parser.first_content_at is not None else None
        tpot = None
        if parser.first_content_at is not None and isinstance(out_tokens, int) and out_tokens > 1:
            tpot = (end - parser.first_content_at) / (out_tokens - 1)
        kind, error, garbage = _judged(req, parser, kind, error)
        loop_text, loop_start, chars, excerpt = _looped(parser.check, out_tokens, garbage)
        scrub = self.scrub
        return Sample(
            phase=tag.phase,
            cls=tag.cls,
            concurrency=tag.concurrency,
            start=start - tag.t0,
            ok=not kind,
            status=status,
            ttft=ttft,
            e2e=end - start,
            tpot=tpot,
            prompt_tokens=usage.get("prompt_tokens"),
            output_tokens=out_tokens,
            events=parser.events,
            finish_reason=parser.finish_reason,
            error_kind=kind,
            error=scrub(error)[:500],
            text=scrub(parser.text) if keep_text else None,
            itl_p50=gaps[len(gaps) // 2] if gaps else None,
            itl_p99=gaps[int(len(gaps) * 0.99)] if gaps else None,
            garbage=scrub(garbage),
            excerpt=scrub(excerpt),
            loop=scrub(loop_text),
            loop_start=loop_start,
            text_chars=chars,
            delta_ends=tuple(parser.ends) if parser.ends else (),
        )


#: What can end a request before its answer is complete (each mapped by :func:`_failure`).
_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, StreamTooLongError, LineTooLongError)


def _failure(e: BaseException, parser: StreamParser, stalled: list[float],
             limit: float) -> tuple[str, str]:
    """``(kind, message)`` of a request that ended in ``e`` (one of :data:`_TRANSPORT_ERRORS`)."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return "connect", _conn_text(e)
    if isinstance(e, TimeoutError):
        if not stalled:
            return "timeout", f"no complete answer within {limit:.0f}s"
        reads = (f"after {len(parser.stamps)} token read(s)" if parser.stamps
                 else "before the first token")
        return "stall", f"no token for {stalled[0]:.0f}s {reads}"
    if isinstance(e, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError
                  | aiohttp.ClientOSError):
        return "disconnect", f"connection broke mid-stream: {type(e).__name__}: {e}"
    if isinstance(e, aiohttp.ClientError):
        return "protocol", f"{type(e).__name__}: {e}"
    return "protocol", str(e)  # StreamTooLongError, LineTooLongError


def _judged(req: ChatRequest, parser: StreamParser, kind: str, error: str) -> tuple[str, str, str]:
    """``(kind, message, garbage)`` of a request whose transport gave ``kind`` ("" when it ended
    well): the stream's own error event, a missing [DONE] or usage, a wrong-shaped answer."""
    garbage = parser.check.reason
    if kind:
        return kind, error, garbage
    usage = parser.usage or {}
    if parser.error:
        return "stream_error", f"error event in HTTP 200 stream: {parser.error}", garbage
    if not parser.done:
        return "disconnect", "stream ended before data: [DONE]", garbage
    if not usage:
        # Asked for include_usage: a stream without it cannot be measured (TPOT, tokens).
        return ("protocol", "stream had no usage chunk (stream_options.include_usage ignored)",
                garbage)
    has_text = parser.first_content_at is not None
    kind, error = validate_answer(req, parser.finish_reason, usage, has_text)
    if kind == "empty":
        # Not a transport failure (its timings stand): degenerate output, judged with
        # garbage by the correctness check, so it is counted and shown, never dropped.
        return "", "", error
    return kind, error, garbage


def _looped(check: TextCheck, out_tokens: Any, garbage: str) -> tuple[str, int | None, int, str]:
    """``(loop, where it starts, characters, excerpt)`` of an answer without garbage that ends
    in a phrase loop (the excerpt then shows its end)."""
    if not check.parts or garbage:
        return "", None, 0, check.excerpt
    whole = "".join(check.parts)
    if (
        isinstance(out_tokens, int)
        and out_tokens >= MIN_WORDS
        and (found := find_loop(whole)) is not None
    ):
        return found.describe(), found.start, len(whole), whole[-EXCERPT_CHARS:]
    return "", None, len(whole), check.excerpt


def _watch(deadline: asyncio.Timeout, parser: StreamParser, start: float, stall: float,
           stalled: list[float]) -> Callable[[], None]:
    """A timer that ends the request (through its ``deadline``) once no token came for ``stall``
    seconds.

    One timer per request, re-armed at the last token's time + ``stall``: the per-event cost
    stays one attribute store in the parser (no timer per event).
    """
    loop = asyncio.get_running_loop()
    handle: list[asyncio.TimerHandle] = []

    def check() -> None:
        last = parser.last_at if parser.last_at is not None else start
        now = time.monotonic()
        if now - last >= stall:
            stalled.append(now - last)
            deadline.reschedule(loop.time())
            return
        handle[0] = loop.call_later(last + stall - now + 0.01, check)

    handle.append(loop.call_later(stall, check))
    return lambda: handle[0].cancel()


def _same(s: str) -> str:
    return s


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """The body, or None as soon as it passes ``cap`` bytes (the rest is never read)."""
    if resp.content_length is not None and resp.content_length > cap:
        return None
    buf = bytearray()
    async for chunk in resp.content.iter_chunked(1 << 16):
        buf += chunk
        if len(buf) > cap:
            return None
    return bytes(buf)


def _http_error(body: bytes) -> str:
    text = body[:2000].decode(errors="replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()[:300] or "(empty body)"
    if isinstance(obj, dict):
        if "error" in obj:
            return error_text(obj["error"])
        if "message" in obj:
            return str(obj["message"])
        if "detail" in obj:
            return str(obj["detail"])
    return text[:300]


def _conn_text(e: aiohttp.ClientConnectorError) -> str:
    if isinstance(e.os_error, ConnectionRefusedError):
        return f"connection refused by {e.host}:{e.port}"
    return f"cannot connect to {e.host}:{e.port}: {e.os_error or e}"


def _token_count(raw: bytes | None) -> int:
    """The count of a 200 answer of /tokenize, or why it is none (TokenizeAnswerError)."""
    if raw is None:
        raise TokenizeAnswerError(f"answered more than {MAX_BODY_BYTES >> 20} MiB")
    try:
        body = json.loads(raw)
    except ValueError:
        raise TokenizeAnswerError("answered a body that is not JSON") from None
    count = body.get("count") if isinstance(body, dict) else None
    if isinstance(count, bool) or not isinstance(count, int):
        what = "no count" if count is None else f"a count that is a {type(count).__name__}"
        raise TokenizeAnswerError(f"answered {what}, not a number of tokens")
    if count < 0:
        raise TokenizeAnswerError(f"answered a count of {count}, not a number of tokens")
    return count
