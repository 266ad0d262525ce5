"""Load levels: closed-loop requests on N workers (classes, the sweep and its trials, the
sustained phase) and open-loop arrivals at a rate."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from fleetctl.soak import prompts
from fleetctl.soak.checks.judge import pct
from fleetctl.soak.client import ChatRequest, Client, SampleTag
from fleetctl.soak.phases.soak_state import (
    SoakState,
    canary,
    canary_every,
    diagnose_crash,
    stall_seen,
)
from fleetctl.soak.phases.summary import LevelKey, summarize
from fleetctl.soak.verdict import (
    Sample,
)


@dataclass(frozen=True)
class LevelPlan:
    """One closed-loop level: ``requests`` streamed requests of ``classes`` on ``concurrency``
    workers for at most ``seconds``; a long-context prompt of ``long_chars``, greedy canaries
    among them, a context every conversation shares, when asked."""

    phase: str
    label: str
    concurrency: int
    requests: int
    seconds: float
    classes: Sequence[str]
    long_chars: int = 0
    canaries: bool = False
    context: str = ""


async def run_requests(client: Client, st: SoakState, plan: LevelPlan) -> None:
    """The level ``plan`` on its workers, stopping at its time bound or a crash."""
    st.phase = f"{plan.phase} {plan.label}"
    t_start = time.monotonic()
    level = _Level(client, st, plan, every=canary_every(st.config) if plan.canaries else 0,
                   t_start=t_start, counter=iter(range(plan.requests)))
    await asyncio.gather(*(level.worker(w) for w in range(plan.concurrency)))
    await level.finish()


@dataclass
class _Level:
    """One level as its workers run it: its samples so far and why it stopped (shared by all)."""

    client: Client
    st: SoakState
    plan: LevelPlan
    #: A canary every this many requests (0: none).
    every: int
    t_start: float
    counter: Iterator[int]
    samples: list[Sample] = field(default_factory=list)
    stopped: str = ""
    gave_up: str = ""
    canaries: int = 0
    last_emit: float = 0.0

    @property
    def deadline(self) -> float:
        return self.t_start + self.plan.seconds

    @property
    def where(self) -> str:
        """The level as a finding names it."""
        plan = self.plan
        return plan.label if plan.phase in ("sweep", "sustained") else f"{plan.phase} {plan.label}"

    @property
    def give_up(self) -> int:
        """Once this many of the level's first answers all failed, no new request is sent."""
        return min(self.plan.requests, max(2, self.plan.concurrency))

    def note(self) -> None:
        """The level's progress, every 2 s: enough for a live table, and a CI log gets ~30 lines a
        minute per host."""
        now = time.monotonic()
        if now - self.last_emit < 2.0 and len(self.samples) < self.plan.requests:
            return
        self.last_emit = now
        st, label, concurrency = self.st, self.plan.label, self.plan.concurrency
        done = [s for s in self.samples if s.ok]
        el = max(now - self.t_start, 1e-6)
        tok_s = sum(s.output_tokens or 0 for s in done) / el
        errors = len(self.samples) - len(done)
        # The level once: a sweep level's label is its concurrency already.
        what = label if label == f"c={concurrency}" else f"{label} c={concurrency}"
        st.emit(self.plan.phase, f"{what} {len(self.samples)}/{self.plan.requests} req "
                f"{tok_s:.0f} tok/s errors {errors}", concurrency=concurrency, tok_s=round(tok_s),
                errors=errors, acceptance=pct(st.last_acceptance), level=label,
                requests=len(self.samples), planned_requests=self.plan.requests,
                level_elapsed=round(el),
                level_seconds=round(self.plan.seconds), baseline=st.baseline_tok_s.get(label),
                acceptance_rate=st.last_acceptance)

    async def worker(self, wid: int) -> None:
        """One worker: requests until the level's count, its time bound, a crash or a give-up."""
        cfg = self.st.config
        # With a shared context, each worker holds a conversation: the context, then its earlier
        # turns. Every request shares the context with every other worker's (a cross-request
        # prefix) and its own earlier turns (a growing one), as multi-turn production traffic does.
        history: list[tuple[str, str]] = []
        if cfg.stagger and wid:
            # Apart, not in lockstep; the ramp stays short against the level (a Spark request at
            # c=64 lasts seconds, the whole ramp 3 s) so the level still reaches its concurrency.
            await asyncio.sleep(min(wid * cfg.stagger, self.plan.seconds / 4))
        first = True
        for i in self.counter:
            if not await self._may_send(i):
                return
            s, req = await self._send(i, wid, history)
            self._record(s, req, first)
            first = False
            await self._after(s)

    async def _may_send(self, i: int) -> bool:
        """Whether request ``i`` goes out; a canary goes first when one is due."""
        st = self.st
        if self.stopped or self.gave_up or st.halt:
            return False
        if time.monotonic() >= self.deadline:
            self.stopped = self.stopped or f"time bound {self.plan.seconds:.0f}s reached"
            return False
        if self.every and i % self.every == 0:
            # A slice of every level is canaries, on top of its load requests (they are
            # shorter and greedy: kept out of the level's latency and throughput figures).
            cp = prompts.CANARIES[(i // self.every + self.plan.concurrency) % len(prompts.CANARIES)]
            self.canaries += 1
            c = await canary(self.client, st, cp, self.plan.phase, self.plan.label,
                             self.plan.concurrency)
            if c.error_kind == "connect" and not self.stopped:
                await self._refused()
                return False
        return True

    async def _send(self, i: int, wid: int,
                    history: list[tuple[str, str]]) -> tuple[Sample, ChatRequest]:
        """Request ``i`` of worker ``wid``, a turn of its conversation when there is a context."""
        st, cfg, context = self.st, self.st.config, self.plan.context
        cls = self.plan.classes[(i + wid) % len(self.plan.classes)]
        if context and len(history) >= 2 * cfg.turns:
            history.clear()
        convo = (("system", context), *history) if context else ()
        req = ChatRequest(st.model, prompts.prompt_for(cls, i, self.plan.long_chars),
                          cfg.max_tokens, cfg.temperature, thinking=cfg.thinking,
                          ignore_eos=True, history=convo)
        left = max(self.deadline - time.monotonic(), 1.0)
        s = await self.client.chat(
            req,
            SampleTag(self.plan.phase, cls, self.plan.concurrency, st.t0),
            timeout=min(cfg.request_timeout, left + cfg.request_timeout),
            keep_text=bool(context),
            stall=cfg.token_timeout(),
        )
        if context:
            history += [("user", req.prompt), ("assistant", s.text or "")]
            s = replace(s, text=None)
        return s, req

    def _record(self, s: Sample, req: ChatRequest, first: bool) -> None:
        """One answer into the level, the soak and its artifacts (a worker's first: its warm-up)."""
        self.samples.append(s)
        self.st.samples.append(s)
        self.st.looped(s, req, self.where)
        if first:
            self.st.warm.append(s)
        self.st.art.sample(s)
        self.note()

    async def _after(self, s: Sample) -> None:
        """What an answer says of the server: it refused connections, stalled, or all failed."""
        if s.error_kind == "connect" and not self.stopped:
            await self._refused()
        await stall_seen(self.client, self.st, s, self.where)
        if (not self.stopped and not self.gave_up and len(self.samples) >= self.give_up
                and not any(x.ok for x in self.samples)):
            self.gave_up = f"the first {len(self.samples)} requests all failed"

    async def _refused(self) -> None:
        self.stopped = "server refused connections"
        st = self.st
        st.crash = st.crash or await diagnose_crash(self.client, st, self.plan.concurrency,
                                                    self.plan.label)

    async def finish(self) -> None:
        """The level's summary into the soak; a level whose every request failed stops it."""
        st, level = self.st, self.samples
        elapsed = time.monotonic() - self.t_start
        if not self.stopped and any(not s.ok for s in level):
            # Errors without a refusal: look once whether the server is still there.
            probe = await self.client.get("/health", timeout=5.0)
            if not probe.ok:
                self.stopped = f"/health {probe.state} after errors"
                crash = await diagnose_crash(self.client, st, self.plan.concurrency,
                                             self.plan.label)
                st.crash = st.crash or crash
        stopped = self.stopped or self.gave_up
        st.levels.append(
            replace(
                summarize(
                    LevelKey(self.plan.phase, self.plan.label, self.plan.concurrency),
                    level,
                    elapsed,
                    stopped,
                    st.config.slo,
                    st.warm,
                ),
                canaries=self.canaries,
            )
        )
        if level and not any(x.ok for x in level) and not st.crash:
            st.stop(f"every request of {self.plan.label} failed ({level[0].error})")


def merge_trials(st: SoakState, label: str, concurrency: int) -> None:
    """The trials of one sweep level as one level: every sample in its percentiles, the median
    tok/s."""
    runs = [lv for lv in st.levels if lv.phase == "sweep" and lv.label == label]
    if len(runs) < 2:
        return
    rest = [lv for lv in st.levels if not (lv.phase == "sweep" and lv.label == label)]
    samples = [s for s in st.samples if s.phase == "sweep" and s.concurrency == concurrency
               and not s.cls.startswith("canary-")]
    merged = summarize(
        LevelKey("sweep", label, concurrency),
        samples,
        sum(lv.seconds for lv in runs),
        "; ".join(lv.stopped for lv in runs if lv.stopped),
        st.config.slo,
        st.warm,
    )
    rates = tuple(lv.tok_s for lv in runs if lv.tok_s is not None)
    st.levels[:] = [*rest, replace(merged, tok_s=statistics.median(rates) if rates else None,
                                   trials=tuple(round(r, 1) for r in rates),
                                   canaries=sum(lv.canaries for lv in runs))]


async def open_loop(
    client: Client, st: SoakState, rate: float, *, requests: int, seconds: float
) -> None:
    """Open-loop load: requests arrive at ``rate``/s with Poisson (exponential) gaps, whatever the
    server's speed (a closed loop slows its own arrivals when the server slows). In-flight
    requests are bounded (:data:`OPEN_LOOP_MAX_IN_FLIGHT`): past it arrivals wait, and say so."""
    cfg = st.config
    label = f"r={rate:g}/s"
    rng = random.Random(f"{st.target.name}/{rate}")
    sem = asyncio.Semaphore(OPEN_LOOP_MAX_IN_FLIGHT)
    level: list[Sample] = []
    t_start = time.monotonic()
    deadline = t_start + seconds

    async def one(i: int) -> None:
        async with sem:
            if st.halt:
                return
            cls = prompts.SHORT_CLASSES[i % len(prompts.SHORT_CLASSES)]
            req = ChatRequest(st.model, prompts.prompt_for(cls, i), cfg.max_tokens, cfg.temperature,
                              thinking=cfg.thinking, ignore_eos=True)
            left = max(deadline - time.monotonic(), 1.0)
            s = await client.chat(
                req,
                SampleTag("rate", cls, 0, st.t0),
                timeout=min(cfg.request_timeout, left + cfg.request_timeout),
                stall=cfg.token_timeout(),
            )
            level.append(s)
            st.samples.append(s)
            st.looped(s, req, label)
            st.art.sample(s)
            await stall_seen(client, st, s, label)

    tasks = []
    stopped = ""
    st.phase = f"rate {label}"
    for i in range(requests):
        await asyncio.sleep(rng.expovariate(rate))
        if st.halt:
            stopped = st.halt
            break
        if time.monotonic() >= deadline:
            stopped = f"time bound {seconds:.0f}s reached"
            break
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    st.emit(
        "rate",
        f"{label}: {len(level)} requests, {sum(1 for s in level if not s.ok)} errors",
        level=label,
    )
    st.levels.append(
        summarize(LevelKey("rate", label, 0), level, time.monotonic() - t_start, stopped, cfg.slo)
    )


#: Open-loop requests in flight at once (arrivals beyond wait): bounds sockets and memory.
OPEN_LOOP_MAX_IN_FLIGHT = 256
