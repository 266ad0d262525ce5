"""The emulated engine: admission, prefill, speculative decode steps, crashes, metrics.

One :class:`Engine` per server, driven by asyncio. A request is an async iterator of
:class:`Step` s (the tokens one engine step emits); the HTTP layer turns steps into
SSE events or one JSON body. Times come from :mod:`.perf` divided by ``EMU_SPEED``.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from . import perf
from .knobs import Knobs
from .metrics import Metrics
from .text import Piece, degenerate, generate

#: Default --max-num-seqs of vLLM's OpenAI server.
DEFAULT_MAX_NUM_SEQS = 256
#: A DFlash drafter fetched before this date crashes past ~16K tokens of context.
STALE_DRAFTER_BEFORE = "2026-04-19"
STALE_DRAFTER_CRASH_TOKENS = 16_000
#: Steps shorter than this (after EMU_SPEED) are merged into one event, to bound CPU.
MIN_EVENT_SECONDS = 0.004

#: What a corrupted engine emits for every token (EMU_GARBAGE_*).
GARBAGE_PIECE = Piece("content", "!")

ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class EngineDeadError(Exception):
    """The engine process died; every in-flight and later request fails."""


class RequestFailedError(Exception):
    """One request failed inside the engine (EMU_ERROR_RATE); the engine lives on."""


@dataclass(frozen=True)
class Step:
    """What one engine step emitted for a request."""

    pieces: tuple[Piece, ...]
    finish_reason: str | None = None


@dataclass
class Request:
    """One generation request as the engine sees it."""

    request_id: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    temperature: float
    thinking: bool
    prompt_class: perf.PromptClass
    prefix_keys: tuple[str, ...] = ()
    prefix_tokens: tuple[int, ...] = ()
    has_image: bool = False
    ignore_eos: bool = False
    #: It came through a proxy (``X-Forwarded-For``): users' traffic, not a soak's direct requests.
    forwarded: bool = False
    #: The answer's text when the request decides it (a tool call's markup, what an image shows).
    answer: str | None = None
    #: The calls in ``answer`` (tool_calls.PlannedCall), which the tool parser delivers.
    tool_calls: tuple[Any, ...] = ()
    arrival: float = field(default_factory=time.monotonic)


class Engine:
    """The emulated vLLM engine core (one per server process)."""

    def __init__(
        self,
        knobs: Knobs,
        metrics: Metrics,
        *,
        max_num_seqs: int | None,
        num_spec_tokens: int,
        vision_loaded: bool = True,
        drafter_date: str | None = None,
        on_death: Callable[[str], None] | None = None,
        log: Callable[[str], None] = print,
        profiles: dict[perf.PromptClass, perf.ClassProfile] | None = None,
    ) -> None:
        """``on_death`` is called once with the crash message when the engine dies."""
        self.knobs = knobs
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs or DEFAULT_MAX_NUM_SEQS
        self.num_spec_tokens = num_spec_tokens
        self.vision_loaded = vision_loaded
        self.drafter_date = drafter_date
        self.on_death = on_death
        self.profiles = profiles or perf.PROFILES
        self.log = log
        self.ready_at = time.monotonic()
        self.running = 0
        self.waiting = 0
        self.kv_tokens = 0
        self.dead = False
        self.death_message = ""
        self._slots: asyncio.Semaphore | None = None
        self._rng = random.Random(knobs.seed)
        self._prefix_cache: OrderedDict[str, None] = OrderedDict()
        #: Requests served from the prefix cache so far (EMU_DECAY_PER_CACHE_HIT counts them).
        self.cache_hit_requests = 0
        #: Tokens generated over the server's lifetime (EMU_GARBAGE_AFTER_TOKENS).
        self.generated_total = 0
        #: A collective that never completes (multi-node: a worker node was lost): requests are
        #: accepted and streams stay open, no token comes out, /health still answers 200.
        self.wedged = False

    @property
    def slots(self) -> asyncio.Semaphore:
        """The --max-num-seqs admission semaphore (created inside the running loop)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_num_seqs)
        return self._slots

    def mark_ready(self) -> None:
        """The engine finished loading: decay and uptime count from here."""
        self.ready_at = time.monotonic()

    def emulated_minutes(self) -> float:
        """Minutes of emulated time since ready (real time x EMU_SPEED)."""
        return (time.monotonic() - self.ready_at) * self.knobs.speed / 60.0

    def _corrupt(self) -> bool:
        """Whether this step's tokens come out as garbage (the EMU_GARBAGE_* knobs)."""
        k = self.knobs
        return bool(
            (k.garbage_after_tokens and self.generated_total >= k.garbage_after_tokens)
            or (
                k.garbage_after_seconds
                and self.emulated_minutes() * 60.0 >= k.garbage_after_seconds
            )
            or (k.garbage_at_concurrency and self.running >= k.garbage_at_concurrency)
        )

    def die(self, message: str) -> None:
        """Kill the engine: log like vLLM, fail every stream, then let the server exit."""
        if self.dead:
            return
        self.dead = True
        self.death_message = message
        self.log("ERROR [core.py:710] EngineCore encountered a fatal error.")
        for line in message.splitlines():
            self.log(f"ERROR [core.py:710] {line}")
        self.log("ERROR [async_llm.py:480] AsyncLLM output_handler failed.")
        self.log(
            "ERROR [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: "
            + ENGINE_DEAD_MESSAGE
        )
        if self.on_death is not None:
            self.on_death(message)

    def _gauges(self) -> None:
        self.metrics.set_gauge("vllm:num_requests_running", float(self.running))
        self.metrics.set_gauge("vllm:num_requests_waiting", float(self.waiting))
        self.metrics.set_gauge(
            "vllm:kv_cache_usage_perc", min(1.0, self.kv_tokens / self.knobs.kv_capacity_tokens)
        )

    def _prefix_hits(self, request: Request) -> int:
        """Tokens of the longest earlier-seen message prefix (vLLM's automatic prefix caching)."""
        hit = 0
        for key, tokens in zip(request.prefix_keys, request.prefix_tokens, strict=True):
            if key in self._prefix_cache:
                self._prefix_cache.move_to_end(key)
                hit = tokens
            else:
                self._prefix_cache[key] = None
        while len(self._prefix_cache) > 4096:
            self._prefix_cache.popitem(last=False)
        block = max(1, self.knobs.prefix_block_tokens)
        return min(hit // block * block, request.prompt_tokens)

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.knobs.speed)

    async def run(self, request: Request) -> AsyncIterator[Step]:
        """Run one request: wait for a slot, prefill, then decode step by step."""
        if self.dead:
            raise EngineDeadError(ENGINE_DEAD_MESSAGE)
        self.waiting += 1
        self._gauges()
        try:
            # vLLM's scheduler admits a request only when its prompt's KV blocks fit (a request
            # alone is always admitted, as vLLM does for one that fits max_model_len).
            while (
                self.kv_tokens + request.prompt_tokens > self.knobs.kv_capacity_tokens
                and self.running
            ):
                await asyncio.sleep(0.01)
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        started = time.monotonic()
        self.metrics.observe("vllm:request_queue_time_seconds", started - request.arrival)
        self.running += 1
        kv_held = request.prompt_tokens
        self.kv_tokens += kv_held
        self._gauges()
        finish: str | None = None
        generated = 0
        try:
            if self.knobs.crash_at_concurrency and self.running >= self.knobs.crash_at_concurrency:
                self.die(
                    "RuntimeError: block_table must have shape (num_reqs, max_num_blocks_per_req): "
                    f"got a padded batch of {self.running} requests "
                    "(DFlash drafter, FlashAttention varlen)"
                )
            if self.dead:
                raise EngineDeadError(ENGINE_DEAD_MESSAGE)
            hits = self._prefix_hits(request) if request.prefix_keys else 0
            cache_decay = 1.0
            if hits and self.knobs.decay_per_cache_hit:
                cache_decay = max(
                    0.0, 1.0 - self.knobs.decay_per_cache_hit * self.cache_hit_requests
                )
                self.cache_hit_requests += 1
            self.metrics.inc("vllm:prefix_cache_queries", request.prompt_tokens)
            self.metrics.inc("vllm:prefix_cache_hits", hits)
            self.metrics.inc("vllm:prompt_tokens_cached", hits)
            self.metrics.observe("vllm:request_params_max_tokens", request.max_tokens)
            self.metrics.observe("vllm:request_max_num_generation_tokens", request.max_tokens)
            self.metrics.observe("vllm:request_params_n", 1)
            self.metrics.inc("vllm:prompt_tokens", request.prompt_tokens)
            profile = self.profiles[request.prompt_class]
            ttft = perf.ttft_seconds(
                profile, prompt_tokens=request.prompt_tokens - hits, running=self.running
            )
            hang = bool(self.knobs.hang) and self.knobs.hang != "boot"
            # A wedged engine: the request is accepted and produces no token until it is unwedged.
            while (hang or self.wedged) and not self.dead:
                await asyncio.sleep(0.2)
            if self.dead:
                raise EngineDeadError(ENGINE_DEAD_MESSAGE)
            await self._sleep(ttft)
            first_token_at = time.monotonic()
            self.metrics.observe(
                "vllm:time_to_first_token_seconds", first_token_at - request.arrival
            )
            self.metrics.observe("vllm:request_prefill_time_seconds", first_token_at - started)
            fail_after = -1
            error_rate = self.knobs.error_rate
            if request.forwarded:
                error_rate = max(error_rate, self.knobs.forwarded_error_rate)
            if error_rate and self._rng.random() < error_rate:
                fail_after = self._rng.randrange(1, 8)
            garbage = self.knobs.garbage or (
                request.has_image and (not self.vision_loaded or self.knobs.image_garbage))
            pieces = generate(
                request.prompt if request.answer is None else request.answer,
                thinking=request.thinking,
                temperature=request.temperature,
                garbage=garbage,
                salt=request.request_id,
                ignore_eos=request.ignore_eos,
                verbatim=request.answer is not None,
            )
            if self.knobs.degenerate_after_tokens:
                pieces = degenerate(pieces, self.knobs.degenerate_after_tokens)
            last_emit = first_token_at
            pending: list[Piece] = []
            steps = 0
            exhausted = False
            preempted = False
            while True:
                while self.wedged and not self.dead:
                    await asyncio.sleep(0.2)
                if self.dead:
                    raise EngineDeadError(ENGINE_DEAD_MESSAGE)
                context = request.prompt_tokens + generated
                if (
                    self.drafter_date is not None
                    and self.drafter_date < STALE_DRAFTER_BEFORE
                    and context > STALE_DRAFTER_CRASH_TOKENS
                ):
                    self.die(
                        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                        "CUDA kernel errors might be asynchronously reported at some other API "
                        "call, "
                        "so the stacktrace below might be incorrect. (cudaErrorIllegalAddress)"
                    )
                    raise EngineDeadError(ENGINE_DEAD_MESSAGE)
                # The first step is the prefill's own token; later steps decode with drafts.
                n_tokens = 1
                if steps > 0 and self.num_spec_tokens > 0:
                    accept = perf.effective_acceptance(
                        profile,
                        temperature=request.temperature,
                        context_tokens=context,
                        decay_factor=perf.decay_factor(
                            self.knobs.accept_decay_per_min, self.emulated_minutes()
                        )
                        * cache_decay,
                        longctx_collapse=self.knobs.longctx_collapse,
                    )
                    accepted = 0
                    prob = accept
                    while accepted < self.num_spec_tokens and self._rng.random() < prob:
                        accepted += 1
                        prob = perf.CONDITIONAL_ACCEPT
                    self.metrics.draft(self.num_spec_tokens, accepted)
                    n_tokens = 1 + accepted
                    plan = perf.plan_steps(
                        profile,
                        concurrency=self.running,
                        context_tokens=context,
                        accept_pos0=accept,
                        num_spec_tokens=self.num_spec_tokens,
                        throughput_scale=self.knobs.throughput_scale,
                    )
                    await self._sleep(1.0 / plan.steps_per_s)
                elif steps > 0:
                    plan = perf.plan_steps(
                        profile,
                        concurrency=self.running,
                        context_tokens=context,
                        accept_pos0=0.0,
                        num_spec_tokens=0,
                        throughput_scale=self.knobs.throughput_scale,
                    )
                    await self._sleep(1.0 / plan.steps_per_s)
                steps += 1
                n_tokens = min(n_tokens, request.max_tokens - generated)
                before = generated
                corrupt = self._corrupt()
                for _ in range(n_tokens):
                    piece = next(pieces, None)
                    if piece is None:
                        exhausted = True
                        break
                    pending.append(GARBAGE_PIECE if corrupt else piece)
                    generated += 1
                self.generated_total += generated - before
                # Count what was emitted: the answer may end before the step's last draft slot.
                emitted = generated - before
                self.kv_tokens += emitted
                self.metrics.inc("vllm:generation_tokens", emitted)
                self.metrics.observe("vllm:iteration_tokens_total", emitted)
                if (
                    not preempted
                    and self.running > 1
                    and self.kv_tokens > self.knobs.kv_capacity_tokens
                ):
                    # Decoding outgrew the KV cache: vLLM preempts a request and recomputes its
                    # context later (once per request here).
                    preempted = True
                    self.metrics.inc("vllm:num_preemptions")
                    await self._sleep(
                        perf.ttft_seconds(profile, prompt_tokens=context, running=self.running)
                    )
                if exhausted:
                    finish = "stop"
                elif generated >= request.max_tokens:
                    finish = "length"
                if fail_after >= 0 and steps >= fail_after:
                    self.metrics.finished("error")
                    raise RequestFailedError(
                        "Internal server error while generating (EMU_ERROR_RATE or "
                        "EMU_FORWARDED_ERROR_RATE)"
                    )
                now = time.monotonic()
                if (
                    steps == 1
                    or finish is not None
                    or now - last_emit >= MIN_EVENT_SECONDS
                    or len(pending) > 64
                ):
                    if now > last_emit and generated > 1:
                        self.metrics.observe("vllm:inter_token_latency_seconds", now - last_emit)
                    last_emit = now
                    yield Step(tuple(pending), finish)
                    pending = []
                if finish is not None:
                    break
            done = time.monotonic()
            self.metrics.finished(finish)
            self.metrics.observe("vllm:e2e_request_latency_seconds", done - request.arrival)
            self.metrics.observe("vllm:request_decode_time_seconds", done - first_token_at)
            self.metrics.observe("vllm:request_inference_time_seconds", done - started)
            if generated > 1:
                self.metrics.observe(
                    "vllm:request_time_per_output_token_seconds",
                    (done - first_token_at) / (generated - 1),
                )
            self.metrics.observe("vllm:request_prompt_tokens", request.prompt_tokens)
            self.metrics.observe("vllm:request_generation_tokens", generated)
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away: vLLM aborts the request.
            self.metrics.finished("abort")
            raise
        finally:
            self.running -= 1
            self.kv_tokens -= kv_held + generated
            self.slots.release()
            self._gauges()


def prefix_keys(
    messages: list[str], token_counts: list[int]
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Cache keys of each cumulative message prefix (all but the last) and their token counts."""
    keys: list[str] = []
    tokens: list[int] = []
    digest = hashlib.sha256()
    total = 0
    for text, count in zip(messages[:-1], token_counts[:-1], strict=True):
        digest.update(text.encode())
        digest.update(b"\0")
        total += count
        keys.append(digest.hexdigest())
        tokens.append(total)
    return tuple(keys), tuple(tokens)
