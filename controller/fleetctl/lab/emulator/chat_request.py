"""A chat or completion request as the emulated vLLM reads it: validated as vLLM 0.32 does (model
names, messages, the context and output budget, temperature), with its errors' JSON shape."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from . import perf
from .engine_core import Request, prefix_keys
from .http_server import forwarded
from .text import count_tokens
from .tool_calls import ToolChoiceError
from .tool_calls import plan as plan_calls
from .vision import ImageError, look

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
    """Each chat message's text as the model sees it (text parts joined), and whether one has an
    image.

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
                elif isinstance(part, dict) and part.get("type") in (
                    "image_url",
                    "image",
                    "input_image",
                ):
                    has_image = True
            texts.append(" ".join(parts))
        else:
            texts.append("" if content is None else str(content))
    return texts, has_image


def first_image_url(messages: list[Any]) -> str | None:
    """The URL of the first ``image_url`` part of a chat's messages (None: no image URL)."""
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") == "image_url":
                ref = part.get("image_url")
                url = ref.get("url") if isinstance(ref, dict) else ref
                if isinstance(url, str):
                    return url
    return None


def decided_answer(info: ModelInfo, body: dict[str, Any],
                   prompt: str) -> tuple[str | None, tuple[Any, ...]]:
    """(the answer's text when the request decides it, its tool calls): what an image shows, or
    the calls a request offering tools gets (400 when the server cannot call tools)."""
    url = first_image_url(body.get("messages") or [])
    if url is not None and url.startswith("data:"):
        try:
            return look(url).capitalize() + ".", ()
        except ImageError as exc:
            raise BadRequestError(f"Failed to load image: {exc}", param="messages") from None
    try:
        return plan_calls(body, info.tool_parser, info.auto_tool_choice, prompt)
    except ToolChoiceError as exc:
        raise BadRequestError(str(exc), param="tool_choice") from None


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
    #: ``--tool-call-parser`` and whether ``--enable-auto-tool-choice`` is given.
    tool_parser: str | None = None
    auto_tool_choice: bool = False


@dataclass
class ParsedChat:
    """A chat or completion request after validation."""

    model: str
    request: Request
    stream: bool
    include_usage: bool


def parse_request(info: ModelInfo, raw: bytes, *, chat: bool) -> ParsedChat:
    """Validate a request body as vLLM does (the parts the emulator models)."""
    try:
        body = json.loads(raw or b"{}")
    except json.JSONDecodeError as exc:
        raise BadRequestError(
            f"JSON decode error: {exc}", kind="Bad Request", param="body"
        ) from None
    if not isinstance(body, dict):
        raise BadRequestError("Input should be a valid dictionary")
    model = body.get("model") or info.served_names[0]
    if model not in info.served_names:
        raise BadRequestError(
            f"The model `{model}` does not exist. "
            f"Valid aliases: {', '.join(info.served_names)}.",
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
        # Qwen3's template thinks unless told not to; Gemma-4's only when asked, and only a
        # server with a reasoning parser is run as a thinking model.
        asked = kwargs.get("enable_thinking", info.thinking)
        thinking = bool(asked) and (info.thinking or info.reasoning_parser is not None)
        answer, calls = decided_answer(info, body, prompt)
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
        answer, calls = None, ()
    max_tokens = output_budget(
        info.max_model_len,
        prompt_tokens,
        body.get("max_completion_tokens") or body.get("max_tokens"),
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
        answer=answer,
        tool_calls=calls,
    )
    options = body.get("stream_options") or {}
    return ParsedChat(
        model=str(model),
        request=request,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
    )

def output_budget(limit: int, prompt_tokens: int, raw: object) -> int:
    """The output budget, refused or cut as vLLM 0.32 does (messages checked against one)."""
    if prompt_tokens >= limit:
        raise BadRequestError(
            f"This model's maximum context length is {limit} tokens. However, your prompt contains "
            f"at least {prompt_tokens} input tokens, which exceeds this limit even without any "
            "output "
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
            f"max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, "
            f"value={max_tokens})",
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
