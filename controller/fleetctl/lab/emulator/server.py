"""The emulator's OpenAI-compatible HTTP server (asyncio streams, HTTP/1.1 keep-alive, chunked SSE).

asyncio rather than ThreadingHTTPServer: 64+ concurrent streams are 64 coroutines
sleeping on timers instead of 64 threads contending for the GIL on one core, and
keep-alive plus chunked transfer is a few lines either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import email.utils
import hmac
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from . import perf
from .engine_core import (
    ENGINE_DEAD_MESSAGE,
    Engine,
    EngineDeadError,
    Request,
    RequestFailedError,
    Step,
    prefix_keys,
)
from .knobs import Knobs
from .metrics import Metrics
from .text import count_tokens

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

#: Tokens a chat template adds per message and for the assistant turn (Qwen's <|im_start|> framing).
TEMPLATE_TOKENS_PER_MESSAGE = 5
TEMPLATE_TOKENS_GENERATION = 3


class BadRequestError(Exception):
    """A request vLLM answers with 400 (or ``status``), ``type`` as in vLLM's ErrorResponse."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        kind: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        """Carry the message, HTTP status, error type and offending parameter."""
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param


def error_body(message: str, kind: str, status: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse JSON."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass(frozen=True)
class ModelInfo:
    """What /v1/models and the chat endpoints say about the served model."""

    root: str
    served_names: tuple[str, ...]
    max_model_len: int
    thinking: bool
    reasoning_parser: str | None


@dataclass
class ParsedChat:
    """A chat or completion request after validation."""

    model: str
    request: Request
    stream: bool
    include_usage: bool


class Server:
    """One emulated vLLM API server: the engine plus its HTTP front end."""

    def __init__(
        self, info: ModelInfo, engine: Engine, knobs: Knobs, log: Callable[[str], None]
    ) -> None:
        """Serve ``engine`` under ``info``'s names; ``log`` writes one log line."""
        self.info = info
        self.engine = engine
        self.metrics: Metrics = engine.metrics
        self.knobs = knobs
        self.log = log
        self.created = int(time.time())
        self._connections: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: ``vllm-<version>-<8 hex>`` as vLLM 0.32 stamps complete responses and usage chunks.
        self.fingerprint = (
            f"vllm-{knobs.version}-{uuid.uuid5(uuid.NAMESPACE_URL, info.root).hex[:8]}"
        )
        #: False with --disable-uvicorn-access-log.
        self.access_log = True
        #: --api-key / $VLLM_API_KEY: /v1/* then needs ``Authorization: Bearer <key>`` (vLLM's
        #: AuthenticationMiddleware); /health, /metrics and /version stay open.
        self.api_key: str | None = None

    # --- HTTP plumbing ----------------------------------------------------------
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
                if not self.authorized(path, headers.get("authorization", "")):
                    await self.send_json(writer, 401, {"error": "Unauthorized"}, keep_alive)
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
                f'INFO:     {peer} - "{method} {target} HTTP/1.1" {status} {REASONS.get(status, "")}'
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
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        keep_alive: bool = True,
    ) -> None:
        """Send one complete response."""
        writer.write(
            self._head(status, content_type, [("content-length", str(len(body)))], keep_alive)
            + body
        )
        await writer.drain()

    async def send_json(
        self, writer: asyncio.StreamWriter, status: int, obj: Any, keep_alive: bool = True
    ) -> None:
        """Send a JSON response."""
        await self.send(
            writer, status, json.dumps(obj, separators=(",", ":")).encode(), keep_alive=keep_alive
        )

    # --- routing ------------------------------------------------------------------
    async def dispatch(
        self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter, keep_alive: bool
    ) -> bool:
        """Answer one request; returns whether the connection stays open."""
        routes: dict[str, tuple[str, Callable[[], Any]]] = {
            "/health": ("GET", lambda: self.health(writer, keep_alive)),
            "/ping": ("GET", lambda: self.health(writer, keep_alive)),
            "/version": (
                "GET",
                lambda: self.send_json(writer, 200, {"version": self.knobs.version}, keep_alive),
            ),
            "/v1/models": (
                "GET",
                lambda: self.send_json(writer, 200, self.models_body(), keep_alive),
            ),
            "/metrics": (
                "GET",
                lambda: self.send(
                    writer,
                    200,
                    self.metrics.render().encode(),
                    "text/plain; version=0.0.4; charset=utf-8",
                    keep_alive,
                ),
            ),
            "/v1/chat/completions": (
                "POST",
                lambda: self.completion(body, writer, keep_alive, chat=True),
            ),
            "/v1/completions": (
                "POST",
                lambda: self.completion(body, writer, keep_alive, chat=False),
            ),
            "/tokenize": ("POST", lambda: self.tokenize(body, writer, keep_alive)),
        }
        route = routes.get(path.rstrip("/") or "/")
        if route is None:
            await self.send_json(writer, 404, {"detail": "Not Found"}, keep_alive)
            return keep_alive
        allowed, action = route
        if method != allowed and not (method == "HEAD" and allowed == "GET"):
            await self.send_json(writer, 405, {"detail": "Method Not Allowed"}, keep_alive)
            return keep_alive
        result = await action()
        return keep_alive if result is None else bool(result)

    async def tokenize(self, raw: bytes, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        """POST /tokenize as vLLM answers it: ``{"count", "max_model_len", "tokens", "token_strs"}``.

        ``prompt`` is counted as it is; ``messages`` with the chat template's overhead, as a
        chat completion would count them (``add_generation_prompt`` defaults to true).
        """
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            await self.send_json(writer, 400, error_body("invalid JSON body", "Bad Request", 400, None),
                                 keep_alive)
            return
        if isinstance(body, dict) and isinstance(body.get("messages"), list):
            texts = [str(m.get("content") or "") if isinstance(m, dict) else "" for m in body["messages"]]
            count = sum(count_tokens(x) + TEMPLATE_TOKENS_PER_MESSAGE for x in texts)
            if body.get("add_generation_prompt", True):
                count += TEMPLATE_TOKENS_GENERATION
        elif isinstance(body, dict) and isinstance(body.get("prompt"), str):
            count = count_tokens(body["prompt"])
        else:
            await self.send_json(writer, 400, error_body("give prompt or messages", "Bad Request", 400,
                                                         "prompt"), keep_alive)
            return
        # Token ids are not modelled: a stable stand-in of the right length.
        await self.send_json(writer, 200, {"count": count, "max_model_len": self.info.max_model_len,
                                           "tokens": list(range(count)), "token_strs": None}, keep_alive)

    async def health(self, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        """200 with an empty body while the engine lives; 503 once it died."""
        if self.engine.dead:
            await self.send(writer, 503, b"", keep_alive=keep_alive)
        else:
            await self.send(writer, 200, b"", keep_alive=keep_alive)

    def models_body(self) -> dict[str, Any]:
        """The /v1/models listing: one entry per served name."""
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "vllm",
                    "root": self.info.root,
                    "parent": None,
                    "max_model_len": self.info.max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_URL, name).hex}",
                            "object": "model_permission",
                            "created": self.created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
                for name in self.info.served_names
            ],
        }

    # --- completions ----------------------------------------------------------------
    def parse(self, raw: bytes, *, chat: bool) -> ParsedChat:
        """Validate a request body as vLLM does (the parts the emulator models)."""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            raise BadRequestError(
                f"JSON decode error: {exc}", kind="Bad Request", param="body"
            ) from None
        if not isinstance(body, dict):
            raise BadRequestError("Input should be a valid dictionary")
        model = body.get("model") or self.info.served_names[0]
        if model not in self.info.served_names:
            raise BadRequestError(
                f"The model `{model}` does not exist. "
                f"Valid aliases: {', '.join(self.info.served_names)}.",
                404,
                "NotFoundError",
                "model",
            )
        has_image = False
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequestError("Field required", kind="Bad Request", param="body.messages")
            texts: list[str] = []
            for msg in messages:
                content = msg.get("content") if isinstance(msg, dict) else None
                if isinstance(content, list):
                    parts = []
                    for part in content:
                        if isinstance(part, dict) and part.get("type") == "text":
                            parts.append(str(part.get("text", "")))
                        elif isinstance(part, dict) and part.get("type") in (
                            "image_url",
                            "image",
                            "input_image",
                        ):
                            has_image = True
                    texts.append(" ".join(parts))
                else:
                    texts.append("" if content is None else str(content))
            counts = [count_tokens(t) + TEMPLATE_TOKENS_PER_MESSAGE for t in texts]
            prompt_tokens = sum(counts) + TEMPLATE_TOKENS_GENERATION
            user_texts = [
                t
                for m, t in zip(messages, texts, strict=True)
                if isinstance(m, dict) and m.get("role") == "user"
            ]
            prompt = user_texts[-1] if user_texts else texts[-1]
            keys, key_tokens = prefix_keys(texts, counts)
            kwargs = body.get("chat_template_kwargs") or {}
            thinking = self.info.thinking and bool(kwargs.get("enable_thinking", True))
        else:
            raw_prompt = body.get("prompt")
            if isinstance(raw_prompt, list):
                raw_prompt = " ".join(map(str, raw_prompt))
            if not isinstance(raw_prompt, str):
                raise BadRequestError("Field required", kind="Bad Request", param="body.prompt")
            prompt = raw_prompt
            prompt_tokens = max(1, count_tokens(prompt))
            keys, key_tokens = (), ()
            thinking = False
        max_tokens = self._budget(
            prompt_tokens, body.get("max_completion_tokens") or body.get("max_tokens")
        )
        try:
            temperature = float(
                body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0
            )
        except (TypeError, ValueError):
            raise BadRequestError("temperature must be a number", param="temperature") from None
        hint = body.get("emu_prompt_class")
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        request = Request(
            request_id=request_id,
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            temperature=temperature,
            thinking=thinking,
            prompt_class=perf.classify(prompt, hint if isinstance(hint, str) else None),
            prefix_keys=keys,
            prefix_tokens=key_tokens,
            has_image=has_image,
            ignore_eos=bool(body.get("ignore_eos", False)),
        )
        options = body.get("stream_options") or {}
        return ParsedChat(
            model=str(model),
            request=request,
            stream=bool(body.get("stream", False)),
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        )

    def _budget(self, prompt_tokens: int, raw: object) -> int:
        """The output budget, refused or cut as vLLM 0.32 does (messages checked against one)."""
        limit = self.info.max_model_len
        if prompt_tokens >= limit:
            raise BadRequestError(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                f"at least {prompt_tokens} input tokens, which exceeds this limit even without any output "
                f"tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt_tokens})",
                param="input_tokens",
            )
        if raw is None:
            return limit - prompt_tokens
        try:
            max_tokens = int(str(raw))
        except ValueError:
            raise BadRequestError("max_tokens must be an integer", param="max_tokens") from None
        if max_tokens < 1:
            raise BadRequestError(
                f"max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, value={max_tokens})",
                param="max_tokens",
            )
        if max_tokens > limit:
            raise BadRequestError(
                f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. Please request "
                f"fewer output tokens. (parameter=max_tokens, value={max_tokens})",
                param="max_tokens",
            )
        # What does not fit after the prompt is cut, not refused: the request ends with "length".
        return min(max_tokens, limit - prompt_tokens)

    def _split(self, step: Step) -> tuple[str, str]:
        """(reasoning, content) text of one step, as the reasoning parser would split it."""
        reasoning = "".join(p.text for p in step.pieces if p.channel == "reasoning")
        content = "".join(p.text for p in step.pieces if p.channel == "content")
        return reasoning, content

    async def completion(
        self, raw: bytes, writer: asyncio.StreamWriter, keep_alive: bool, *, chat: bool
    ) -> bool:
        """POST /v1/chat/completions and /v1/completions."""
        try:
            parsed = self.parse(raw, chat=chat)
        except BadRequestError as exc:
            await self.send_json(
                writer,
                exc.status,
                error_body(str(exc), exc.kind, exc.status, exc.param),
                keep_alive,
            )
            return keep_alive
        if self.engine.dead:
            await self.send_json(
                writer, 500, error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", 500), keep_alive
            )
            return keep_alive
        steps = self.engine.run(parsed.request)
        if parsed.stream:
            return await self._stream(parsed, steps, writer, keep_alive, chat=chat)
        return await self._whole(parsed, steps, writer, keep_alive, chat=chat)

    def _delta(self, reasoning: str, content: str, state: dict[str, bool]) -> dict[str, Any]:
        """The delta of one streamed step; without a reasoning parser thinking stays in <think> tags."""
        delta: dict[str, Any] = {}
        if self.info.reasoning_parser:
            if reasoning:
                delta["reasoning"] = reasoning
            if content or not reasoning:
                delta["content"] = content
            return delta
        text = ""
        if reasoning:
            text += ("" if state.get("opened") else "<think>\n") + reasoning
            state["opened"] = True
        if content and state.get("opened") and not state.get("closed"):
            text += "\n</think>\n\n"
            state["closed"] = True
        delta["content"] = text + content
        return delta

    async def _whole(
        self,
        parsed: ParsedChat,
        steps: AsyncIterator[Step],
        writer: asyncio.StreamWriter,
        keep_alive: bool,
        *,
        chat: bool,
    ) -> bool:
        reasoning_parts: list[str] = []
        content_parts: list[str] = []
        finish = "stop"
        completion_tokens = 0
        try:
            async for step in steps:
                r, c = self._split(step)
                reasoning_parts.append(r)
                content_parts.append(c)
                completion_tokens += len(step.pieces)
                finish = step.finish_reason or finish
        except (EngineDeadError, RequestFailedError) as exc:
            await self.send_json(
                writer, 500, error_body(str(exc), "InternalServerError", 500), keep_alive
            )
            return keep_alive
        reasoning = "".join(reasoning_parts)
        content = "".join(content_parts)
        if not self.info.reasoning_parser and reasoning:
            content = "<think>\n" + reasoning + ("\n</think>\n\n" + content if content else "")
            reasoning = ""
        usage = {
            "prompt_tokens": parsed.request.prompt_tokens,
            "total_tokens": parsed.request.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        }
        created = int(time.time())
        if chat:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": content or None,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
            }
            # Always present (null without a reasoning parser), as in vLLM 0.32.
            message["reasoning"] = reasoning or None
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "token_ids": None,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": content,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
            }
            obj = "text_completion"
        body = {
            "id": parsed.request.request_id,
            "object": obj,
            "created": created,
            "model": parsed.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": usage,
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
        await self.send_json(writer, 200, body, keep_alive)
        return keep_alive

    async def _stream(
        self,
        parsed: ParsedChat,
        steps: AsyncIterator[Step],
        writer: asyncio.StreamWriter,
        keep_alive: bool,
        *,
        chat: bool,
    ) -> bool:
        """SSE over chunked transfer: role chunk with the first step, then one event per step."""
        writer.write(
            self._head(
                200,
                "text/event-stream; charset=utf-8",
                [("transfer-encoding", "chunked")],
                keep_alive,
            )
        )
        rid, model, created = parsed.request.request_id, parsed.model, int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        async def event(payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            return json.dumps(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": choices,
                    **extra,
                },
                separators=(",", ":"),
            )

        completion_tokens = 0
        failed = False
        first = True
        think_state: dict[str, bool] = {}
        try:
            try:
                async for step in steps:
                    r, c = self._split(step)
                    completion_tokens += len(step.pieces)
                    if chat:
                        if first:
                            await event(
                                chunk(
                                    [
                                        {
                                            "index": 0,
                                            "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None,
                                            "finish_reason": None,
                                        }
                                    ],
                                    prompt_token_ids=None,
                                    prompt_text=None,
                                )
                            )
                        delta = self._delta(r, c, think_state)
                        choice: dict[str, Any] = {
                            "index": 0,
                            "delta": delta,
                            "logprobs": None,
                            "finish_reason": step.finish_reason,
                            "token_ids": None,
                        }
                    else:
                        choice = {
                            "index": 0,
                            "text": c,
                            "logprobs": None,
                            "finish_reason": step.finish_reason,
                            "token_ids": None,
                        }
                    if step.finish_reason is not None:
                        choice["stop_reason"] = None
                    first = False
                    await event(chunk([choice]))
            except (EngineDeadError, RequestFailedError) as exc:
                # An error after the stream started: an error event inside the 200 stream, then
                # [DONE] without a usage chunk; vLLM writes this one event with json.dumps' spaces.
                self.log(
                    f"ERROR [serving.py:929] Error in {'chat ' if chat else ''}completion stream generator."
                )
                self.log(f"ERROR [serving.py:929] {type(exc).__name__}: {exc}")
                await event(json.dumps(error_body(str(exc), "InternalServerError", 500)))
                failed = True
            if parsed.include_usage and not failed:
                usage = {
                    "prompt_tokens": parsed.request.prompt_tokens,
                    "total_tokens": parsed.request.prompt_tokens + completion_tokens,
                    "completion_tokens": completion_tokens,
                }
                await event(chunk([], usage=usage, system_fingerprint=self.fingerprint))
            await event("[DONE]")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, RuntimeError):
            # The client hung up mid-stream: abort the request (counted as "abort" by the engine).
            await _aclose(steps)
            return False
        return keep_alive

    # --- lifecycle --------------------------------------------------------------
    async def close_all(self) -> None:
        """Drop every connection and cancel their handlers."""
        for writer in list(self._connections):
            with contextlib.suppress(Exception):
                writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.sleep(0)


async def _aclose(steps: AsyncIterator[Step]) -> None:
    aclose = getattr(steps, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


async def serve(
    server: Server,
    host: str,
    port: int,
    *,
    stop: asyncio.Event,
    died: asyncio.Event,
) -> int:
    """Listen and serve until SIGTERM (exit 0) or until the engine dies (exit 1 a moment later)."""
    bind_host: str | None = None if host in ("", "0.0.0.0", "::") else host
    try:
        listener = await asyncio.start_server(
            server.handle, bind_host, port, reuse_address=True, limit=1 << 20
        )
    except OSError as exc:
        server.log(f"ERROR [api_server.py:1890] {exc}")
        return 1
    server.log(f"INFO:     Started server process [{os.getpid()}]")
    server.log("INFO:     Waiting for application startup.")
    server.log("INFO:     Application startup complete.")
    foreign = (asyncio.ensure_future(_foreign_traffic(server, server.knobs.foreign_rps, stop))
               if server.knobs.foreign_rps > 0 else None)
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(died.wait())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for w in waiters:
        w.cancel()
    if foreign is not None:
        foreign.cancel()
    code = 0
    if died.is_set() and not stop.is_set():
        # /health answers 503 for a moment, then the API server follows its engine down.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), server.knobs.crash_exit_seconds)
        server.log("ERROR [api_server.py:1610] Engine core died; shutting down the API server.")
        code = 1
    server.log("INFO:     Shutting down")
    server.log("INFO:     Waiting for application shutdown.")
    server.log("INFO:     Application shutdown complete.")
    listener.close()
    await server.close_all()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(listener.wait_closed(), 2.0)
    server.log(f"INFO:     Finished server process [{os.getpid()}]")
    return code


async def _foreign_traffic(server: Server, rps: float, stop: asyncio.Event) -> None:
    """EMU_FOREIGN_RPS: another client's short requests through the same engine (metrics only)."""
    running: set[asyncio.Task[None]] = set()
    prompt = "Summarise the status of the nightly batch job in one sentence."

    async def one(i: int) -> None:
        req = Request(request_id=f"foreign-{i}", prompt=prompt, prompt_tokens=24, max_tokens=16,
                      temperature=0.7, thinking=False, prompt_class=perf.classify(prompt, None))
        with contextlib.suppress(Exception):
            async for _ in server.engine.run(req):
                pass

    i = 0
    while not stop.is_set():
        await asyncio.sleep(1.0 / rps)
        task = asyncio.ensure_future(one(i))
        running.add(task)
        task.add_done_callback(running.discard)
        i += 1


def install_signals(stop: asyncio.Event) -> None:
    """SIGTERM/SIGINT set ``stop`` (docker stop, Ctrl-C)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
