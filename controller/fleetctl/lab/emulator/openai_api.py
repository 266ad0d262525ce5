"""What the emulated vLLM answers: its OpenAI-compatible API and its own endpoints.

The response shapes of /v1/chat/completions and /v1/completions (one JSON body, or SSE chunks
with an optional usage chunk and ``[DONE]``), /v1/models, /tokenize, /health, /version and
/metrics. A request's validation as vLLM 0.32 does it, and the errors' JSON shape, are
:mod:`.chat_request`; the HTTP framing the answers travel in (connections, routing, auth,
chunked SSE) is :mod:`.http_server`. Named ``openai_api``, not ``openai``: in the image the
emulator's directory is ``sys.path[0]``, where an ``openai.py`` would shadow the OpenAI SDK.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from .chat_request import (
    TEMPLATE_TOKENS_GENERATION,
    TEMPLATE_TOKENS_PER_MESSAGE,
    BadRequestError,
    ModelInfo,
    ParsedChat,
    error_body,
    message_texts,
    parse_request,
)
from .engine_core import (
    ENGINE_DEAD_MESSAGE,
    Engine,
    EngineDeadError,
    RequestFailedError,
    Step,
)
from .http_server import EventStream, Response, Routes, aclose_quietly, json_response
from .knobs import Knobs
from .metrics import Metrics
from .text import count_tokens
from .tool_calls import delivered, deltas


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
        return Response(
            200, self.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8"
        )

    async def tokenize(self, raw: bytes) -> Response:
        """POST /tokenize as vLLM answers it: ``{"count", "max_model_len", "tokens",
        "token_strs"}``.

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
            return json_response(
                400, error_body("give prompt or messages", "Bad Request", 400, "prompt")
            )
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

    def _split(self, step: Step) -> tuple[str, str]:
        """(reasoning, content) text of one step, as the reasoning parser would split it."""
        reasoning = "".join(p.text for p in step.pieces if p.channel == "reasoning")
        content = "".join(p.text for p in step.pieces if p.channel == "content")
        return reasoning, content

    async def completion(self, raw: bytes, *, chat: bool) -> Response | EventStream:
        """A chat or text completion: an error, one JSON body, or an SSE stream of chunks."""
        try:
            parsed = parse_request(self.info, raw, chat=chat)
        except BadRequestError as exc:
            return json_response(exc.status, error_body(str(exc), exc.kind, exc.status, exc.param))
        if self.engine.dead:
            return json_response(500, error_body(ENGINE_DEAD_MESSAGE, "InternalServerError", 500))
        steps = self.engine.run(parsed.request)
        if parsed.stream:
            return EventStream(self._events(parsed, steps, chat=chat))
        return await self._whole(parsed, steps, chat=chat)

    @property
    def parses_reasoning(self) -> bool:
        """Whether the thinking is split from the answer: a reasoning parser that works
        (EMU_REASONING_LEAK: it does not)."""
        return bool(self.info.reasoning_parser) and not self.knobs.reasoning_leak

    def parses_calls(self, parsed: ParsedChat) -> bool:
        """Whether the tool parser turns this request's markup into tool_calls
        (EMU_TOOL_CALL_LEAK: it leaves it in content)."""
        return bool(parsed.request.tool_calls) and not self.knobs.tool_call_leak

    def _delta(self, reasoning: str, content: str, state: dict[str, bool]) -> dict[str, Any]:
        """The delta of one streamed step; without a reasoning parser thinking stays in <think>
        tags."""
        delta: dict[str, Any] = {}
        if self.parses_reasoning:
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
        if not self.parses_reasoning and reasoning:
            content = "<think>\n" + reasoning + ("\n</think>\n\n" + content if content else "")
            reasoning = ""
        calls: list[dict[str, Any]] = []
        if self.parses_calls(parsed):
            # The tool parser took the model's markup out of the text and made it the calls.
            calls = [delivered(c) for c in parsed.request.tool_calls]
            content = ""
            finish = "tool_calls" if finish == "stop" else finish
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
                "tool_calls": calls,
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
        """The SSE payloads: role chunk with the first step, then one chunk per step, usage,
        ``[DONE]``."""
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
                    finish = step.finish_reason
                    if self.parses_calls(parsed):
                        # The streaming tool parser holds the markup back and sends the calls.
                        c = ""
                        if finish is not None:
                            for call in deltas(parsed.request.tool_calls):
                                yield chunk([{"index": 0, "delta": {"tool_calls": call},
                                              "logprobs": None, "finish_reason": None}])
                            finish = "tool_calls" if finish == "stop" else finish
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
                            "finish_reason": finish,
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
                    f"ERROR [serving.py:929] Error in {'chat ' if chat else ''}completion stream "
                    "generator."
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
            # Closed early (the client hung up): abort the request, counted as "abort" by the
            # engine.
            await aclose_quietly(steps)
