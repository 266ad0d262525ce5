"""One chat completion's SSE stream, parsed event by event: its text (checked as it comes), its
timings, its usage, error events inside an HTTP 200 stream; and the bounds on what a server
may send."""

from __future__ import annotations

import codecs
import json
from typing import Any

from fleetctl.soak.client.text_check import TextCheck

# The JSON scanner itself (C), called directly: JSONDecoder.decode wraps it in two Python
# frames and two whitespace regex matches per event, a fifth of the client's parse time.
_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[attr-defined]


#: The longest SSE line accepted. vLLM's chunks are ~300 bytes (a spec-decode step of a
#: few tokens); 1 MiB is generous and still parses in about a millisecond.
MAX_LINE_BYTES = 1 << 20


#: A stream may carry at most this many bytes per token asked for, plus :data:`STREAM_FIXED_BYTES`:
#: vLLM's chunk for one token is ~250-400 bytes (id, model, delta, finish_reason, token_ids), a
#: speculative step carries several tokens in one. A server streaming valid events forever (never
#: ``[DONE]``) is cut there instead of growing the controller until MemoryError.
STREAM_BYTES_PER_TOKEN = 1024


STREAM_FIXED_BYTES = 64 << 10


class StreamParser:
    """Incremental SSE parser for one chat completion stream.

    Feed it the raw bytes as they arrive with the arrival time; it keeps the
    timing of the first non-empty content, the finish reason, the usage chunk
    and any error event. Every ``data:`` event is JSON-decoded.
    """

    __slots__ = ("_check", "_utf8", "check", "done", "ends", "error", "events", "finish_reason",
                 "first_content_at", "keep_text", "last_at", "parts", "pending", "stamps", "usage")

    def __init__(self, keep_text: bool = False, delta_ends: bool = False) -> None:
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
        #: When each read carrying content arrived: the inter-token latencies are their gaps.
        self.stamps: list[float] = []
        self.check = TextCheck()
        self._check = self.check.feed_all
        #: When the last token (a read carrying content) arrived: the liveness watchdog reads it.
        self.last_at: float | None = None
        #: With ``delta_ends`` (and ``keep_text``): the kept text's length after each content delta,
        #: so that a long answer can be cut into windows of tokens, not of characters.
        self.ends: list[int] | None = [] if delta_ends else None

    def feed(self, chunk: bytes, now: float) -> None:
        """Consume ``chunk`` (any split of the stream), received at ``now``.

        Raises :class:`LineTooLongError` when a line grows past :data:`MAX_LINE_BYTES`.
        """
        text = self._utf8.decode(chunk)
        data = self.pending + text if self.pending else text
        lines = data.split("\n")
        self.pending = lines.pop()
        if len(self.pending) > MAX_LINE_BYTES:
            raise LineTooLongError(f"an SSE line grew past {MAX_LINE_BYTES} bytes without ending")
        texts: list[str] = []
        events = 0
        for line in lines:
            # Every other line is a blank separator: the cheapest test first.
            if not line:
                continue
            # vLLM writes "data: {...}"; other servers may omit the space or end lines with \r.
            if line.startswith("data: "):
                payload = line[6:]
            elif line.startswith("data:"):
                payload = line[5:]
            else:
                continue  # comments (": ping"), event: lines
            if payload.endswith("\r") or payload.startswith(" "):
                payload = payload.strip()
            if payload == "[DONE]":
                self.done = True
                continue
            events += 1
            self._event(payload, now, texts)
        self.events += events
        if texts:
            self.stamps.append(now)
            self.last_at = now
            self._check(texts)

    def _event(self, payload: str, now: float, texts: list[str]) -> None:
        """One ``data:`` event: decoded, its error, choice and usage taken."""
        try:
            obj, end = _scan(payload, 0)
        except (StopIteration, ValueError):
            obj, end = None, -1
        if end != len(payload) and (end < 0 or payload[end:].strip()):
            self.error = self.error or f"undecodable stream event: {payload[:120]!r}"
            return
        if type(obj) is not dict:
            return
        err = obj.get("error")
        if err is not None:
            self.error = self.error or error_text(err)
            return
        choices = obj.get("choices")
        if choices:
            self._choice(choices[0], now, texts)
        usage = obj.get("usage")
        if usage:
            self.usage = usage

    def _choice(self, choice: dict[str, Any], now: float, texts: list[str]) -> None:
        """An event's choice: its content (the first one's arrival is the TTFT), finish reason."""
        delta = choice.get("delta")
        if delta:
            content = (
                delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            )
            if content:
                if self.first_content_at is None:
                    self.first_content_at = now
                texts.append(content)
                if self.keep_text and delta.get("content"):
                    self.parts.append(delta["content"])
                    if self.ends is not None:
                        self.ends.append(
                            (self.ends[-1] if self.ends else 0) + len(delta["content"])
                        )
        reason = choice.get("finish_reason")
        if reason:
            self.finish_reason = reason

    @property
    def text(self) -> str:
        """The generated content (only when ``keep_text``)."""
        return "".join(self.parts)


class LineTooLongError(Exception):
    """The server sent an SSE line longer than :data:`MAX_LINE_BYTES`."""


class StreamTooLongError(Exception):
    """The server sent more bytes than the tokens asked for can take
    (:data:`STREAM_BYTES_PER_TOKEN`)."""


def stream_cap(max_tokens: int) -> int:
    """The most bytes a stream asked for ``max_tokens`` tokens may carry."""
    return STREAM_FIXED_BYTES + STREAM_BYTES_PER_TOKEN * max(max_tokens, 1)


def error_text(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message") or err.get("type") or json.dumps(err)
        code = err.get("code")
        return f"{msg} (code {code})" if code else str(msg)
    return str(err)
