"""What the emulated vLLM answers: its OpenAI-compatible API and its own endpoints.

Request validation as vLLM 0.32 does it (the parts the emulator models: model names,
messages, the context and output budget, temperature), and the response shapes of
/v1/chat/completions and /v1/completions (one JSON body, or SSE chunks with an optional
usage chunk and ``[DONE]``), /v1/models, /tokenize, /health, /version and /metrics.
The HTTP framing those answers travel in (connections, routing, auth, chunked SSE) is
:mod:`.http_server`. Named ``openai_api``, not ``openai``: in the image the emulator's
directory is ``sys.path[0]``, where an ``openai.py`` would shadow the OpenAI SDK.

Why one file of ~500 lines: the OpenAI semantics (chat, completions, models, tokenize) share
request validation and the response shapes; HTTP framing is apart in ``http_server.py``.
"""

from __future__ import annotations

import json
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
from .http_server import EventStream, Response, Routes, aclose_quietly, forwarded, json_response
from .knobs import Knobs
from .metrics import Metrics
from .text import count_tokens

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


def message_texts(messages: list[Any]) -> tuple[list[str], bool]:
    """Each chat message's text as the model sees it (text parts joined), and whether one has an image.

    The one reading of ``messages`` that both a chat completion and /tokenize count tokens from.
    """
    texts: list[str] = []
    has_image = False
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
                elif isinstance(part, dict) and part.get("type") in ("image_url", "image", "input_image"):
                    has_image = True
            texts.append(" ".join(parts))
        else:
            texts.append("" if content is None else str(content))
    return texts, has_image


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


class OpenAIApi:
    """The answers of one emulated vLLM API server, computed from its engine."""

    def __init__(
        self, info: ModelInfo, engine: Engine, knobs: Knobs, log: Callable[[str], None]
    ) -> None:
        """Answer for ``engine`` under ``info``'s names; ``log`` writes one log line."""
        self.info = info
        self.engine = engine
        self.metrics: Metrics = engine.metrics
        self.knobs = knobs
        self.log = log
        self.created = int(time.time())
        #: ``vllm-<version>-<8 hex>`` as vLLM 0.32 stamps complete responses and usage chunks.
        self.fingerprint = (
            f"vllm-{knobs.version}-{uuid.uuid5(uuid.NAMESPACE_URL, info.root).hex[:8]}"
        )

    def routes(self) -> Routes:
        """Every path the server answers, with its method and handler."""
        return {
            "/health": ("GET", self.health),
            "/ping": ("GET", self.health),
            "/version": ("GET", self.version),
            "/v1/models": ("GET", self.models),
            "/metrics": ("GET", self.metrics_text),
            "/v1/chat/completions": ("POST", self.chat_completions),
            "/v1/completions": ("POST", self.completions),
            "/tokenize": ("POST", self.tokenize),
        }

    async def health(self, _body: bytes) -> Response:
        """200 with an empty body while the engine lives; 503 once it died."""
        return Response(503 if self.engine.dead else 200)

    async def version(self, _body: bytes) -> Response:
        """GET /version: the version the emulator poses as."""
        return json_response(200, {"version": self.knobs.version})

    async def models(self, _body: bytes) -> Response:
        """GET /v1/models."""
        return json_response(200, self.models_body())

    async def metrics_text(self, _body: bytes) -> Response:
        """GET /metrics in Prometheus' text format, with vLLM's metric names."""
        return Response(200, self.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")

    async def tokenize(self, raw: bytes) -> Response:
        """POST /tokenize as vLLM answers it: ``{"count", "max_model_len", "tokens", "token_strs"}``.

        ``prompt`` is counted as it is; ``messages`` with the chat template's overhead, as a
        chat completion would count them (``add_generation_prompt`` defaults to true).
        """
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return json_response(400, error_body("invalid JSON body", "Bad Request", 400, None))
        if isinstance(body, dict) and isinstance(body.get("messages"), list):
            # Counted exactly as a chat completion counts the same messages (content parts joined;
            # the repr of a list of parts is not what the model sees).
            texts, _image = message_texts(body["messages"])
            count = sum(count_tokens(x) + TEMPLATE_TOKENS_PER_MESSAGE for x in texts)
            if body.get("add_generation_prompt", True):
                count += TEMPLATE_TOKENS_GENERATION
        elif isinstance(body, dict) and isinstance(body.get("prompt"), str):
            count = count_tokens(body["prompt"])
        else:
            return json_response(400, error_body("give prompt or messages", "Bad Request", 400, "prompt"))
        # Token ids are not modelled: a stable stand-in of the right length.
        return json_response(200, {"count": count, "max_model_len": self.info.max_model_len,
                                   "tokens": list(range(count)), "token_strs": None})

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

    async def chat_completions(self, raw: bytes) -> Response | EventStream:
        """POST /v1/chat/completions."""
        return await self.completion(raw, chat=True)

    async def completions(self, raw: bytes) -> Response | EventStream:
        """POST /v1/completions."""
        return await self.completion(raw, chat=False)

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
            texts, has_image = message_texts(messages)
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
            forwarded=forwarded(),
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

    async def completion(self, raw: bytes, *, chat: bool) -> Response | EventStream:
        """A chat or text completion: an error, one JSON body, or an SSE stream of chunks."""
        try:
            parsed = self.parse(raw, chat=chat)
        except BadRequestError as exc:
            return json_response(exc.status, error_body(str(exc), exc.kind, exc.status, exc.param))
        if self.engine.dead:
            return json_response(500, error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", 500))
        steps = self.engine.run(parsed.request)
        if parsed.stream:
            return EventStream(self._events(parsed, steps, chat=chat))
        return await self._whole(parsed, steps, chat=chat)

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
        *,
        chat: bool,
    ) -> Response:
        """The answer as one JSON body, once the engine finished the request."""
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
            return json_response(500, error_body(str(exc), "InternalServerError", 500))
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
        return json_response(200, body)


    async def _events(
        self, parsed: ParsedChat, steps: AsyncIterator[Step], *, chat: bool
    ) -> AsyncIterator[str]:
        """The SSE payloads: role chunk with the first step, then one chunk per step, usage, ``[DONE]``."""
        rid, model, created = parsed.request.request_id, parsed.model, int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

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
                            yield chunk(
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
                    yield chunk([choice])
            except (EngineDeadError, RequestFailedError) as exc:
                # An error after the stream started: an error event inside the 200 stream, then
                # [DONE] without a usage chunk; vLLM writes this one event with json.dumps' spaces.
                self.log(
                    f"ERROR [serving.py:929] Error in {'chat ' if chat else ''}completion stream generator."
                )
                self.log(f"ERROR [serving.py:929] {type(exc).__name__}: {exc}")
                yield json.dumps(error_body(str(exc), "InternalServerError", 500))
                failed = True
            if parsed.include_usage and not failed:
                usage = {
                    "prompt_tokens": parsed.request.prompt_tokens,
                    "total_tokens": parsed.request.prompt_tokens + completion_tokens,
                    "completion_tokens": completion_tokens,
                }
                yield chunk([], usage=usage, system_fingerprint=self.fingerprint)
            yield "[DONE]"
        finally:
            # Closed early (the client hung up): abort the request, counted as "abort" by the engine.
            await aclose_quietly(steps)
