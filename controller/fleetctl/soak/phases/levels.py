"""Load levels: closed-loop requests on N workers (classes, the sweep and its trials, the
sustained phase) and open-loop arrivals at a rate."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

from fleetctl.soak import checks, prompts
from fleetctl.soak.client import ChatRequest, Client
from fleetctl.soak.phases.soak_state import (
    SoakState,
    canary,
    canary_every,
    diagnose_crash,
    stall_seen,
)
from fleetctl.soak.phases.summary import summarize
from fleetctl.soak.verdict import (
    Sample,
)


async def run_requests(client: Client, st: SoakState, *, phase: str, label: str, concurrency: int,
                        requests: int, seconds: float, classes: Sequence[str],
                        long_chars: int = 0, canaries: bool = False, context: str = "") -> None:
    """``requests`` streamed requests on ``concurrency`` workers, stopping at ``seconds`` or a crash."""
    cfg = st.config
    t_start = time.monotonic()
    deadline = t_start + seconds
    level: list[Sample] = []
    counter = iter(range(requests))
    stopped = ""
    last_emit = 0.0
    every = canary_every(cfg) if canaries else 0
    n_canaries = 0
    st.phase = f"{phase} {label}"
    # Early stop: once this many of the level's first answers all failed, no new request is sent.
    give_up = min(requests, max(2, concurrency))
    gave_up = ""

    def note() -> None:
        nonlocal last_emit
        now = time.monotonic()
        # Every 2 s: enough for a live table, and a CI log gets ~30 lines a minute per host.
        if now - last_emit < 2.0 and len(level) < requests:
            return
        last_emit = now
        done = [s for s in level if s.ok]
        el = max(now - t_start, 1e-6)
        tok_s = sum(s.output_tokens or 0 for s in done) / el
        errors = len(level) - len(done)
        # The level once: a sweep level's label is its concurrency already.
        what = label if label == f"c={concurrency}" else f"{label} c={concurrency}"
        st.emit(phase, f"{what} {len(level)}/{requests} req {tok_s:.0f} tok/s "
                       f"errors {errors}", concurrency=concurrency, tok_s=round(tok_s),
                errors=errors, acceptance=checks.pct(st.last_acceptance), level=label,
                requests=len(level), planned_requests=requests, level_elapsed=round(el),
                level_seconds=round(seconds), baseline=st.baseline_tok_s.get(label),
                acceptance_rate=st.last_acceptance)

    async def worker(wid: int) -> None:
        nonlocal stopped, n_canaries, gave_up
        # With a shared context, each worker holds a conversation: the context, then its earlier
        # turns. Every request shares the context with every other worker's (a cross-request
        # prefix) and its own earlier turns (a growing one), as multi-turn production traffic does.
        history: list[tuple[str, str]] = []
        first = True
        if cfg.stagger and wid:
            # Apart, not in lockstep; the ramp stays short against the level (a Spark request at
            # c=64 lasts seconds, the whole ramp 3 s) so the level still reaches its concurrency.
            await asyncio.sleep(min(wid * cfg.stagger, seconds / 4))
        for i in counter:
            if stopped or gave_up or st.halt:
                return
            if time.monotonic() >= deadline:
                stopped = stopped or f"time bound {seconds:.0f}s reached"
                return
            if every and i % every == 0:
                # A slice of every level is canaries, on top of its load requests (they are
                # shorter and greedy: kept out of the level's latency and throughput figures).
                cp = prompts.CANARIES[(i // every + concurrency) % len(prompts.CANARIES)]
                n_canaries += 1
                c = await canary(client, st, cp, phase, label, concurrency)
                if c.error_kind == "connect" and not stopped:
                    stopped = "server refused connections"
                    st.crash = st.crash or await diagnose_crash(client, st, concurrency, label)
                    return
            cls = classes[(i + wid) % len(classes)]
            if context and len(history) >= 2 * cfg.turns:
                history.clear()
            convo = (("system", context), *history) if context else ()
            req = ChatRequest(st.model, prompts.prompt_for(cls, i, long_chars), cfg.max_tokens,
                              cfg.temperature, thinking=cfg.thinking, ignore_eos=True, history=convo)
            left = max(deadline - time.monotonic(), 1.0)
            s = await client.chat(req, phase=phase, cls=cls, concurrency=concurrency, t0=st.t0,
                                  timeout=min(cfg.request_timeout, left + cfg.request_timeout),
                                  keep_text=bool(context), stall=cfg.token_timeout())
            if context:
                history += [("user", req.prompt), ("assistant", s.text or "")]
                s = replace(s, text=None)
            level.append(s)
            st.samples.append(s)
            st.looped(s, req, label if phase in ("sweep", "sustained") else f"{phase} {label}")
            if first:
                st.warm.append(s)
                first = False
            st.art.sample(s)
            note()
            if s.error_kind == "connect" and not stopped:
                stopped = "server refused connections"
                st.crash = st.crash or await diagnose_crash(client, st, concurrency, label)
            await stall_seen(client, st, s, label if phase in ("sweep", "sustained") else f"{phase} {label}")
            if not stopped and not gave_up and len(level) >= give_up and not any(x.ok for x in level):
                gave_up = f"the first {len(level)} requests all failed"

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.monotonic() - t_start
    if not stopped and any(not s.ok for s in level):
        # Errors without a refusal: look once whether the server is still there.
        probe = await client.get("/health", timeout=5.0)
        if not probe.ok:
            stopped = f"/health {probe.state} after errors"
            st.crash = st.crash or await diagnose_crash(client, st, concurrency, label)
    stopped = stopped or gave_up
    st.levels.append(replace(summarize(phase, label, concurrency, level, elapsed, stopped, cfg.slo, st.warm),
                             canaries=n_canaries))
    if level and not any(x.ok for x in level) and not st.crash:
        st.stop(f"every request of {label} failed ({level[0].error})")


def merge_trials(st: SoakState, label: str, concurrency: int) -> None:
    """The trials of one sweep level as one level: every sample in its percentiles, the median tok/s."""
    runs = [lv for lv in st.levels if lv.phase == "sweep" and lv.label == label]
    if len(runs) < 2:
        return
    rest = [lv for lv in st.levels if not (lv.phase == "sweep" and lv.label == label)]
    samples = [s for s in st.samples if s.phase == "sweep" and s.concurrency == concurrency
               and not s.cls.startswith("canary-")]
    merged = summarize("sweep", label, concurrency, samples, sum(lv.seconds for lv in runs),
                       "; ".join(lv.stopped for lv in runs if lv.stopped), st.config.slo, st.warm)
    rates = tuple(lv.tok_s for lv in runs if lv.tok_s is not None)
    st.levels[:] = [*rest, replace(merged, tok_s=statistics.median(rates) if rates else None,
                                   trials=tuple(round(r, 1) for r in rates),
                                   canaries=sum(lv.canaries for lv in runs))]


async def open_loop(client: Client, st: SoakState, rate: float, *, requests: int, seconds: float) -> None:
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
            s = await client.chat(req, phase="rate", cls=cls, concurrency=0, t0=st.t0,
                                  timeout=min(cfg.request_timeout, left + cfg.request_timeout),
                                  stall=cfg.token_timeout())
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
    st.emit("rate", f"{label}: {len(level)} requests, {sum(1 for s in level if not s.ok)} errors", level=label)
    st.levels.append(summarize("rate", label, 0, level, time.monotonic() - t_start, stopped, cfg.slo))


#: Open-loop requests in flight at once (arrivals beyond wait): bounds sockets and memory.
OPEN_LOOP_MAX_IN_FLIGHT = 256
