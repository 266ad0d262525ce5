"""The soak's load phases: identity, canaries, prompt classes, the concurrency sweep and its trials,
open-loop rates, the long decode, long-context prompts sized in tokens, and the sustained phase;
what they gather is kept in ``SoakState``.

Why one file of ~500 lines: the phases share SoakState and the request runner; each is a
small function here, and ``run.py`` orders them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetctl.container import Container
from fleetctl.errors import FleetError
from fleetctl.progress import Event, Progress
from fleetctl.soak import checks, metrics, prompts
from fleetctl.soak.artifacts import Artifacts
from fleetctl.soak.checks import CanaryResult, Identity, LongPrompt, LoopResult, SmokeResult, Wedge
from fleetctl.soak.client import ChatRequest, Client
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.readiness import (
    CRASH_LOG_TAIL,
    boot_failure_cause,
    container_logs,
    container_state,
)
from fleetctl.soak.verdict import (
    LevelSummary,
    Readiness,
    Sample,
    SoakTarget,
    Window,
)

#: Distinct looping requests re-run as references (each one more request at c=1).
MAX_LOOP_REFERENCES = 3

#: How long a crashed server's container is given to exit before its state is recorded.
CRASH_EXIT_WAIT = 15.0


def _pctl(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def meets(s: Sample, slo: Mapping[str, float]) -> bool:
    """True when a successful request met every SLO (``ttft_ms``, ``tpot_ms``, ``e2el_ms``) it can be judged on."""
    got = {"ttft_ms": s.ttft, "tpot_ms": s.tpot, "e2el_ms": s.e2e}
    return s.ok and all((x := got[k]) is None or x * 1000 <= v for k, v in slo.items())


def summarize(phase: str, label: str, concurrency: int, samples: Sequence[Sample], seconds: float,
              stopped: str = "", slo: Mapping[str, float] | None = None,
              warm: Sequence[Sample] = ()) -> LevelSummary:
    """Client-side figures of one level from its samples (goodput against ``slo`` when given).

    ``warm`` samples (warm-up requests) count in requests, errors and throughput, not in the
    latency percentiles: a first request pays for compiled graphs and cold caches.
    """
    ok = [s for s in samples if s.ok]
    good = sum(1 for s in samples if meets(s, slo)) if slo else None
    errs = [s for s in samples if not s.ok]
    warm_ids = {id(s) for s in warm}
    timed = [s for s in ok if id(s) not in warm_ids] or ok
    ttft = [s.ttft for s in timed if s.ttft is not None]
    tpot = [s.tpot for s in timed if s.tpot is not None]
    e2e = [s.e2e for s in timed if s.e2e is not None]
    itl50 = [s.itl_p50 for s in timed if s.itl_p50 is not None]
    itl99 = [s.itl_p99 for s in timed if s.itl_p99 is not None]
    out_tokens = sum(s.output_tokens or 0 for s in ok)
    return LevelSummary(
        phase=phase, label=label, concurrency=concurrency, requests=len(samples), errors=len(errs),
        seconds=round(seconds, 3), tok_s=out_tokens / seconds if ok and seconds > 0 else None,
        ttft_p50=_pctl(ttft, 0.5), ttft_p95=_pctl(ttft, 0.95), ttft_p99=_pctl(ttft, 0.99),
        tpot_p50=_pctl(tpot, 0.5), tpot_p95=_pctl(tpot, 0.95), e2e_p50=_pctl(e2e, 0.5),
        e2e_p95=_pctl(e2e, 0.95), e2e_p99=_pctl(e2e, 0.99), itl_p50=_pctl(itl50, 0.5), itl_p99=_pctl(itl99, 0.99),
        warmup=len(warm_ids & {id(s) for s in samples}),
        slo_met=good / len(samples) if good is not None and samples else None,
        goodput_rps=good / seconds if good is not None and seconds > 0 else None,
        output_tokens=out_tokens, first_error=errs[0].error if errs else "", stopped=stopped,
    )



#: The soak's phases in the order it runs them: each progress event of one of them says which it is
#: (``step`` of ``steps``), so that a display can show "phase k of n" and the time so far.
SOAK_PHASES = ("readiness", "identity", "smoke", "canary", "classes", "sweep", "rate", "long_decode", "sustained")


def planned_phases(cfg: SoakConfig) -> tuple[str, ...]:
    """The phases a soak with ``cfg`` will run (a crash or a failed smoke ends it sooner)."""
    if cfg.smoke_only:
        return SOAK_PHASES[:3]
    spec = cfg.check("correctness")
    present = {
        "canary": bool(canary_every(cfg)),
        "classes": bool(cfg.classes),
        "sweep": bool(cfg.concurrency),
        "rate": bool(cfg.request_rates),
        "long_decode": spec.enabled and int(spec.params.get("long_decode_tokens", 0)) > 0,
        "sustained": cfg.sustained_duration > 0,
    }
    return tuple(p for p in SOAK_PHASES if present.get(p, True))


@dataclass
class SoakState:
    """What one soak has gathered so far (mutable while it runs)."""

    target: SoakTarget
    config: SoakConfig
    progress: Progress
    art: Artifacts
    t0: float
    model: str = ""
    samples: list[Sample] = field(default_factory=list)
    levels: list[LevelSummary] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    scrape_errors: list[str] = field(default_factory=list)
    spec_seen: bool | None = None
    crash: str = ""
    last_acceptance: float | None = None
    chars_per_token: float = 4.0
    canaries: list[CanaryResult] = field(default_factory=list)
    #: Canary name -> its text at c=1 (the reference every level's answer is compared with).
    canary_refs: dict[str, str] = field(default_factory=dict)
    long_decode: Sample | None = None
    #: Prompts sized in tokens: name -> (target, measured by the server's usage, how it was sized).
    prompt_sizes: dict[str, tuple[int, int | None, str]] = field(default_factory=dict)
    #: The server's prefix-cache block (vllm:cache_config_info at the sustained phase's start).
    cache_block_tokens: int | None = None
    #: Warm-up samples (each worker's first request of a level).
    warm: list[Sample] = field(default_factory=list)
    #: The phases this soak runs (:func:`planned_phases`), for "phase k of n" in its events.
    phases: tuple[str, ...] = ()
    #: The baseline's tok/s per level label (the last passing verdict of the tag served before), shown
    #: next to the running figure while a level runs; the verdict's throughput check judges it.
    baseline_tok_s: Mapping[str, float] = field(default_factory=dict)
    #: Why the soak stopped before its end (every request of a phase failed, an engine wedged, the
    #: hard deadline); empty while it runs its course.
    halt: str = ""
    deadline_hit: bool = False
    #: The phase running now (named when the hard deadline stops the soak).
    phase: str = ""
    ready: Readiness | None = None
    ident: Identity | None = None
    smoke: list[SmokeResult] = field(default_factory=list)
    load_ran: bool = False
    container_before: Container | None = None
    container_after: Container | None = None
    container_error: str = ""
    #: Requests that got no token for the liveness bound while /health answered.
    wedges: list[Wedge] = field(default_factory=list)
    #: Looping answers: (request, where, first sample, how many) per distinct request, at most
    #: MAX_LOOP_REFERENCES of them; later looping answers of other requests are only counted.
    loop_candidates: dict[ChatRequest, list[Any]] = field(default_factory=dict)
    loops_unjudged: int = 0
    loops: list[LoopResult] = field(default_factory=list)
    long_prompts: list[LongPrompt] = field(default_factory=list)

    def looped(self, s: Sample, req: ChatRequest, where: str) -> None:
        """Note an answer that ended in a phrase loop (judged after the load against a reference)."""
        if not s.loop:
            return
        if req in self.loop_candidates:
            self.loop_candidates[req][2] += 1
        elif len(self.loop_candidates) < MAX_LOOP_REFERENCES:
            self.loop_candidates[req] = [s, where, 1]
        else:
            self.loops_unjudged += 1

    def emit(self, phase: str, message: str, **data: Any) -> None:
        if phase in self.phases:
            data = {"step": self.phases.index(phase) + 1, "steps": len(self.phases),
                    "elapsed": round(self.now()), **data}
        self.progress(Event(phase, message, host=self.target.name, data=data))

    def now(self) -> float:
        return time.monotonic() - self.t0

    def stop(self, why: str) -> None:
        """Stop the soak after the running phase (the first reason is kept)."""
        if not self.halt:
            self.halt = why
            self.emit("stopped", f"stopping early: {why}")


async def stall_seen(client: Client, st: SoakState, s: Sample, where: str) -> None:
    """After a request that got no token for the liveness bound: a wedged engine when /health answers.

    The engine is wedged, not dead: the API process still answers /health while its requests get
    nothing (vLLM #41725, MiaAI-Lab #87). Nothing more can be learnt by loading it: the soak stops.
    """
    if s.error_kind != "stall" or st.crash:
        return
    probe = await client.get("/health", timeout=5.0)
    seconds = st.config.token_timeout() or 0.0
    if probe.ok:
        w = Wedge(st.target.name, where, round(s.e2e or seconds, 1), round(s.start, 1), s.error)
        st.wedges.append(w)
        st.stop(f"engine wedged on {w.host} during {where}: {s.error} while /health answered 200")
    else:
        st.crash = st.crash or await diagnose_crash(client, st, s.concurrency, where)




async def identity(client: Client, target: SoakTarget) -> Identity:
    p, models = await client.get_json("/v1/models")
    if models is None:
        return Identity(False, detail=p.detail or f"HTTP {p.status}")
    data = models.get("data", []) if isinstance(models, dict) else []
    names = tuple(str(m.get("id")) for m in data if isinstance(m, dict))
    mml: list[int] = [m["max_model_len"] for m in data
                      if isinstance(m, dict) and isinstance(m.get("max_model_len"), int)]
    _pv, version = await client.get_json("/version")
    ver = str(version.get("version", "")) if isinstance(version, dict) else ""
    return Identity(True, names, ver, min(mml) if mml else None)


async def scrape(client: Client, st: SoakState, label: str) -> metrics.Scrape | None:
    p = await client.get("/metrics", timeout=15.0)
    t = st.now()
    if not p.ok:
        st.scrape_errors.append(f"{label}: /metrics {p.state} {p.detail or p.status}")
        return None
    st.art.scrape(label, t, p.body)
    try:
        s = metrics.parse(p.body, t)
    except metrics.MetricsError as e:
        st.scrape_errors.append(f"{label}: {e}")
        return None
    seen = s.has_spec_decode
    st.spec_seen = seen if st.spec_seen is None else (st.spec_seen or seen)
    return s


async def windowed(client: Client, st: SoakState, label: str, phase: str,
                    body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` between two scrapes and record the window."""
    before = await scrape(client, st, f"{label}-before")
    await body()
    after = await scrape(client, st, f"{label}-after")
    if before is not None and after is not None:
        w = metrics.window(before, after, label, phase)
        st.windows.append(w)
        if w.acceptance_rate is not None:
            st.last_acceptance = w.acceptance_rate


async def canary(client: Client, st: SoakState, cp: prompts.SmokePrompt, phase: str, level: str,
                  concurrency: int) -> Sample:
    """One greedy canary (thinking off), judged later against its answer and its c=1 answer."""
    spec = st.config.check("correctness")
    req = ChatRequest(st.model, cp.prompt, int(spec.params.get("canary_max_tokens", 64)), 0.0, thinking=False)
    s = await client.chat(req, phase=phase, cls=f"canary-{cp.name}", concurrency=concurrency, t0=st.t0,
                          keep_text=True, stall=st.config.token_timeout())
    st.samples.append(s)
    st.art.sample(s)
    st.canaries.append(CanaryResult(cp.name, cp.expect, level, s, st.canary_refs.get(cp.name)))
    await stall_seen(client, st, s, f"canary {cp.name} at {level}")
    return s


def canary_every(cfg: SoakConfig) -> int:
    spec = cfg.check("correctness")
    return int(spec.params.get("canary_every", 0)) if spec.enabled else 0


async def canary_references(client: Client, st: SoakState) -> None:
    """Each canary once at c=1: the answers every load level's canaries must repeat."""
    if not canary_every(st.config):
        return
    st.emit("canary", "greedy canaries at c=1 (references)")
    st.phase = "canary references"
    failed: list[Sample] = []
    for cp in prompts.CANARIES:
        s = await canary(client, st, cp, "canary", "reference", 1)
        if s.ok and not s.garbage and cp.expect.lower() in (s.text or "").lower():
            st.canary_refs[cp.name] = s.text or ""
        if not s.ok:
            failed.append(s)
        if st.halt or st.crash:
            return
        if len(failed) >= 2 and not st.canary_refs:
            # The server answered smoke and now answers nothing: loading it proves nothing more.
            st.stop(f"every canary reference failed ({failed[0].error})")
            return


async def long_decode(client: Client, st: SoakState, ident: Identity) -> None:
    """One long generation per soak: corruption that starts thousands of tokens into a sequence."""
    cfg = st.config
    tokens = cfg.long_decode_tokens()
    if ident.max_model_len:
        tokens = min(tokens, ident.max_model_len - 512)  # room for the prompt and the template
    if tokens <= 0:
        return
    probe = cfg.check("long_decode").enabled
    st.emit("long_decode", f"one decode of {tokens} tokens" + (" (windows checked, needle asked)" if probe else ""))
    prompt = prompts.LONG_DECODE_PROMPT if probe else prompts.prompt_for("prose", 0)
    req = ChatRequest(st.model, prompt, tokens, cfg.temperature, thinking=cfg.thinking, ignore_eos=True)
    # A deadline scaled to the length (>= 10 tok/s), never below the per-request one.
    st.phase = "the long decode"
    # Its text is kept (bounded by the stream's byte cap) for the probe's windows.
    s = await client.chat(req, phase="long_decode", cls="prose", concurrency=1, t0=st.t0,
                          timeout=max(cfg.request_timeout, tokens / 10), stall=cfg.token_timeout(), keep_text=probe,
                          delta_ends=probe)
    st.samples.append(s)
    st.art.sample(replace(s, delta_ends=()))
    st.long_decode = s
    st.looped(s, req, "long_decode")
    await stall_seen(client, st, s, "the long decode")
    if s.error_kind == "connect":
        st.crash = st.crash or await diagnose_crash(client, st, 1, "the long decode")


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


async def diagnose_crash(client: Client, st: SoakState, concurrency: int, label: str) -> str:
    """Name a crash: what /health and the container say, with the log's cause."""
    probe = await client.get("/health", timeout=5.0)
    if probe.ok:
        return ""
    health = f"HTTP {probe.status}" if probe.state == "http" else (probe.detail or probe.state)
    where = label if label.startswith("c=") or not concurrency else f"{label} (c={concurrency})"
    what = f"server crashed during {where}: /health {health}"
    if st.target.container is not None:
        # vLLM answers 503 for a few seconds after its engine dies, then exits: wait for the
        # exit so the verdict says what the container did, not what it was about to do.
        deadline = time.monotonic() + CRASH_EXIT_WAIT
        try:
            cs = await container_state(st.target)
            while cs.running and time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                cs = await container_state(st.target)
            if not cs.running:
                what += f", container {cs.status or 'gone'}" + (f" with exit code {cs.exit_code}"
                                                               if cs.exit_code is not None else "")
        except FleetError as e:
            what += f" (container state unreadable: {e.cause})"
        cause = boot_failure_cause(await container_logs(st.target, CRASH_LOG_TAIL))
        if cause:
            what += f"; log: {cause}"
    return what


def shared_prefix_tokens(configured: int, block: int | None, max_model_len: int | None, max_tokens: int,
                         turns: int) -> int:
    """How long the conversations' shared context is: as configured, raised past the cache block.

    Prefix caching reuses whole blocks only, and a hybrid model's block is the Mamba page (~2k
    tokens on Qwen3.5/3.6): a context shorter than one block never hits the cache, and the decay
    that needs cache hits is never exercised. So a configured length at or under the server's
    block grows to 1.25 blocks, as far as the model's context leaves room for every turn. 0 (no
    shared context) stays 0.
    """
    if configured <= 0 or not block or configured > block:
        return configured
    want = block + block // 4
    if max_model_len:
        room = max_model_len - (turns + 1) * (max_tokens + 256)
        want = min(want, max(room, configured))
    return max(want, configured)


async def sustained(client: Client, st: SoakState, ident: Identity) -> None:
    cfg = st.config
    if cfg.sustained_duration <= 0:
        return
    scrapes: list[metrics.Scrape] = []
    first = await scrape(client, st, "sustained-start")
    if first is not None:
        scrapes.append(first)
    done = asyncio.Event()

    async def scraper() -> None:
        n = 0
        while not done.is_set():
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), timeout=cfg.window)
            if done.is_set():
                return
            n += 1
            s = await scrape(client, st, f"sustained-{n}")
            if s is None:
                continue
            if scrapes:
                w = metrics.window(scrapes[-1], s, f"sustained #{len(st.windows) + 1}", "sustained")
                st.windows.append(w)
                if w.acceptance_rate is not None:
                    st.last_acceptance = w.acceptance_rate
            scrapes.append(s)

    context = ""
    if first is not None:
        st.cache_block_tokens = metrics.cache_block_tokens(first)
    tokens = shared_prefix_tokens(cfg.shared_prefix_tokens, st.cache_block_tokens, ident.max_model_len,
                                  cfg.max_tokens, cfg.turns)
    if tokens:
        chars, got, how = await sized(client, st, tokens, context_text)
        context = context_text(chars)
        if how == "tokenize":
            st.prompt_sizes["shared_prefix"] = (tokens, got, how)
        raised = (f", raised from {cfg.shared_prefix_tokens} past the server's {st.cache_block_tokens}-token "
                  "cache block" if tokens != cfg.shared_prefix_tokens else "")
        st.emit("sustained", f"conversations share a {tokens}-token context (sized by {how}{raised})")
    task = asyncio.create_task(scraper())
    probes = asyncio.create_task(trickle(client, st, done))
    try:
        await run_requests(client, st, phase="sustained", label="sustained",
                            concurrency=cfg.sustained_concurrency, requests=cfg.sustained_max_requests,
                            seconds=cfg.sustained_duration, classes=prompts.SHORT_CLASSES, canaries=True,
                            context=context)
    finally:
        done.set()
        await task
        await probes
    # Renumber so labels are consecutive whatever ran in between.
    rest = [w for w in st.windows if w.phase != "sustained"]
    sus = [replace(w, label=f"sustained #{i + 1}") for i, w in enumerate(w for w in st.windows if w.phase == "sustained")]
    st.windows[:] = rest + sus


#: Tokens a liveness probe asks for: enough to see tokens flow, too few to weigh on the load.
PROBE_MAX_TOKENS = 16


async def trickle(client: Client, st: SoakState, done: asyncio.Event) -> None:
    """A short greedy streamed request every half liveness bound while the sustained phase runs.

    The load's own requests can be long (max_tokens at c=16 lasts tens of seconds on a Spark) and
    a wedge then shows only when one of them stalls; the probe's stall is seen within the bound.
    """
    bound = st.config.token_timeout()
    if bound is None:
        return
    every = max(bound / 2, 0.5)
    cp = prompts.CANARIES[1]
    n = 0
    while not done.is_set() and not st.halt:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=every)
        if done.is_set() or st.halt:
            return
        n += 1
        req = ChatRequest(st.model, cp.prompt, PROBE_MAX_TOKENS, 0.0, thinking=False)
        s = await client.chat(req, phase="probe", cls=f"probe-{n}", concurrency=1, t0=st.t0, stall=bound)
        st.samples.append(s)
        st.art.sample(s)
        await stall_seen(client, st, s, "sustained (liveness probe)")


#: Tokens a long-prompt probe's answer may take (the code, said briefly) and the template's room.
LONG_PROMPT_ANSWER = 48


async def long_prompts(client: Client, st: SoakState, ident: Identity) -> None:
    """One request per configured size: a fact hidden mid-prompt, asked for at the end (greedy)."""
    cfg = st.config
    for tokens in cfg.long_prompt_tokens():
        if st.halt or st.crash:
            return
        if ident.max_model_len and tokens + LONG_PROMPT_ANSWER + 64 > ident.max_model_len:
            st.long_prompts.append(LongPrompt(tokens, skipped=f"max_model_len {ident.max_model_len}"))
            continue
        st.phase = f"the long prompt of {tokens} tokens"
        chars, _got, how = await sized(client, st, tokens, prompts.needle_prompt)
        st.emit("long_prompts", f"a {tokens}-token prompt (sized by {how.split(' ')[0]}) with a fact in its middle")
        req = ChatRequest(st.model, prompts.needle_prompt(chars), LONG_PROMPT_ANSWER, 0.0, thinking=False)
        bound = cfg.token_timeout()
        s = await client.chat(req, phase="long_prompt", cls="long_context", concurrency=1, t0=st.t0,
                              keep_text=True, timeout=cfg.long_prompt_timeout(tokens),
                              stall=bound + tokens / 500 if bound is not None else None)
        st.samples.append(replace(s, text=None))
        st.art.sample(s)
        st.long_prompts.append(LongPrompt(tokens, how, s))
        await stall_seen(client, st, s, f"the long prompt of {tokens} tokens")
        if s.error_kind == "connect":
            st.crash = st.crash or await diagnose_crash(client, st, 1, f"the long prompt of {tokens} tokens")


async def loop_references(client: Client, st: SoakState) -> None:
    """Each looping request once more at c=1, greedy, free to stop (no ignore_eos): its reference.

    A healthy model asked for exactly max_tokens often loops past its natural end; the server is
    at fault only where the same prompt's reference does not loop (checks._judge_loop).
    """
    if not st.loop_candidates:
        return
    st.phase = "loop references"
    st.emit("loops", f"{len(st.loop_candidates)} looping answer(s): running each prompt's c=1 reference")
    for req, (s, where, count) in st.loop_candidates.items():
        if st.halt or st.crash:
            break
        ref_req = replace(req, temperature=0.0, ignore_eos=False)
        timeout = max(st.config.request_timeout, req.max_tokens / 10)
        ref = await client.chat(ref_req, phase="reference", cls=s.cls, concurrency=1, t0=st.t0, keep_text=True,
                                timeout=timeout, stall=st.config.token_timeout())
        st.samples.append(replace(ref, text=None))
        st.art.sample(ref)
        st.loops.append(LoopResult(s, where, ref, count))
        await stall_seen(client, st, ref, f"the loop reference of {where}")


def context_text(chars: int) -> str:
    return "You answer questions for the operations team. Their service log:\n" + \
        prompts.long_context_document(chars)


def long_text(chars: int) -> str:
    return prompts.prompt_for("long_context", 0, chars)


async def sized(client: Client, st: SoakState, tokens: int, build: Callable[[int], str]) -> tuple[int, int, str]:
    """``build(chars)`` grown or shrunk to ``tokens`` tokens as the server's ``/tokenize`` counts them.

    A character estimate is off by 2x between prose and a digit-heavy log; near
    max_model_len that is an HTTP 400 that fails a healthy server. Without
    /tokenize, the ratio measured on the classes phase's prompts is used.
    """
    estimate = max(int(tokens * st.chars_per_token), 64)
    chars = estimate
    got = tokens
    seen: list[tuple[int, int]] = []
    for _ in range(6):
        n = await client.tokenize(st.model, build(chars))
        if n is None:
            return estimate, tokens, "estimate"
        if why := implausible_count(chars, n, seen):
            # A /tokenize that lies would make the prompt grow by target/reported each round (a
            # server answering {"count": 10} grew one to gigabytes): its answers are not used.
            st.emit("sizing", f"/tokenize not believed: {why}; sizing by the character estimate")
            return estimate, tokens, f"estimate (/tokenize not believed: {why})"
        seen.append((chars, n))
        got = n
        if abs(got - tokens) <= max(8, tokens // 50):
            break
        chars = min(max(int(chars * tokens / max(got, 1)), 64), tokens * MAX_CHARS_PER_TOKEN)
    return chars, got, "tokenize"


#: Characters per token a tokenizer may plausibly count in the soak's English/digit prompts (a byte
#: tokenizer counts ~1, GPT-style BPE ~4, nothing real counts 16): a count outside is a lying /tokenize,
#: and no prompt is ever grown past ``MAX_CHARS_PER_TOKEN`` characters a token.
MIN_CHARS_PER_TOKEN = 0.5
MAX_CHARS_PER_TOKEN = 16


def implausible_count(chars: int, count: int, seen: Sequence[tuple[int, int]]) -> str:
    """Why ``count`` tokens for ``chars`` characters cannot be a tokenizer's answer ('' when it can)."""
    if count <= 0:
        return f"{count} tokens for {chars} characters"
    ratio = chars / count
    if not MIN_CHARS_PER_TOKEN <= ratio <= MAX_CHARS_PER_TOKEN:
        return f"{count} tokens for {chars} characters ({ratio:.1f} characters a token)"
    for c, n in seen:
        if (chars > c and count < n) or (chars < c and count > n):
            return f"{count} tokens for {chars} characters but {n} for {c}: longer text, fewer tokens"
    return ""


def estimate_chars_per_token(samples: Sequence[Sample], prompt_of: Callable[[Sample], str]) -> float:
    # Two prompts of different lengths cancel the chat template's fixed token overhead.
    pts = sorted({(len(prompt_of(s)), s.prompt_tokens) for s in samples if s.ok and s.prompt_tokens})
    if len(pts) >= 2:
        (c1, t1), (c2, t2) = pts[0], pts[-1]
        if t2 > t1 and c2 > c1:
            return min(max((c2 - c1) / (t2 - t1), 1.0), 8.0)
    return 4.0
