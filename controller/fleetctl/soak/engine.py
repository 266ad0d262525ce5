"""The soak: wait for readiness, check identity and smoke, load the server, judge it.

``run_soak(target, config, baseline, progress) -> Verdict`` is what ``fleetctl
soak`` and the rollout's gate call. Phases, each bounded in requests and time:

1. readiness: ``/health`` 200 within ``readiness_timeout`` (separate from the
   soak's own duration: model loads take minutes). Refused means loading; the
   container exiting means a boot failure, whose cause is read from its log.
2. identity: ``/v1/models`` and ``/version``.
3. smoke: fixed prompts with known answers at temperature 0, thinking off and
   max_tokens >= 2048. A failed smoke ends the soak (load on a server that
   answers garbage proves nothing).
4. classes: each prompt class alone at c=1, between two /metrics scrapes, so
   acceptance is known per class (long context last).
5. sweep: concurrency levels (1, 4, 16, 32, 64), mixed short classes, a
   window per level. A refusal after ready is a crash: the soak stops there.
6. sustained: a fixed concurrency for ``sustained_duration``, scraping every
   ``window`` seconds (the decay check reads the windows' trend).

Raw samples, every /metrics scrape and the verdict are written to the
artifacts directory when one is given.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import os
import random
import re
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.progress import NULL, Event, Progress
from fleetctl.soak import checks, metrics, prompts
from fleetctl.soak.checks import CanaryResult, Evidence, Identity, SmokeResult
from fleetctl.soak.client import ChatRequest, Client
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.verdict import (
    ContainerState,
    LevelSummary,
    Outcome,
    Readiness,
    Sample,
    SoakTarget,
    Verdict,
    Window,
    to_dict,
)

#: Log lines shown while waiting, and searched for a boot failure's cause.
LOG_TAIL = 40
#: Log lines searched for a crash's cause: every in-flight stream logs two generic lines
#: after the root cause, so at c=64 it sits well over 100 lines up.
CRASH_LOG_TAIL = 400
#: How long a crashed server's container is given to exit before its state is recorded.
CRASH_EXIT_WAIT = 15.0
#: Distributions kept in the verdict for the report (the raw samples are in the artifacts).
MAX_DIST_SAMPLES = 2000


def new_run_id(name: str) -> str:
    """``soak-<name>-<UTC time>-<random>``: sortable, unique, safe as a directory name."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40]
    return f"soak-{safe}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}"


def boot_failure_cause(log: str) -> str:
    """The line of a container log that says why the server died ('' when none stands out).

    vLLM prints the root cause (``ValueError: max_num_scheduled_tokens is set to
    -512``, ``RuntimeError: block_table must have shape ...``) followed by generic
    lines (``EngineDeadError: ... See stack trace (above)``, ``Engine core died``):
    the last error line that is not one of the generic ones wins.
    """
    keys = ("Error", "ERROR", "Exception", "error:", "FATAL", "Fatal", "No valid", "Killed",
            "out of memory", "OOM")
    lines = [_strip_log_prefix(ln) for ln in log.splitlines() if ln.strip()]
    candidates = [ln for ln in lines if any(k in ln for k in keys)
                  and not ln.startswith(("Traceback", 'File "'))]
    for ln in reversed(candidates):
        if not any(g in ln for g in _GENERIC):
            return ln[:400]
    return candidates[-1][:400] if candidates else ""


#: Lines vLLM prints after the real cause; they name no cause themselves.
_GENERIC = ("EngineDeadError", "encountered a fatal error", "encountered an issue", "output_handler failed",
            "Error in chat completion stream generator", "Error in completion stream generator",
            "Engine core died", "shutting down", "Shutting down", "Engine core initialization failed",
            "See root cause above", "See stack trace",
            # uvicorn's access log of a request refused after the death ("POST ... 500").
            "Internal Server Error")
_LOG_PREFIX = re.compile(r"^(?:\([A-Za-z]+ pid=\d+\) )?(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) [\d-]+ [\d:]+ "
                         r"\[[^\]]+\] ")


def _strip_log_prefix(line: str) -> str:
    return _LOG_PREFIX.sub("", line.strip())


def _tail(log: str, n: int = LOG_TAIL) -> str:
    return "\n".join(log.splitlines()[-n:])


def _last_lines(log: str, n: int = 3) -> str:
    lines = [ln.rstrip() for ln in log.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[:300]


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


class _Artifacts:
    """Writes samples, scrapes and the verdict under one directory as the soak goes."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.n = 0
        if root is not None:
            # scrapes and samples quote the server's answers: private like the rest of the state
            paths.private_dir(root)
            paths.private_dir(root / "scrapes")
            fd = os.open(root / "samples.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            self._samples = os.fdopen(fd, "a")

    def sample(self, s: Sample) -> None:
        if self.root is not None:
            self._samples.write(json.dumps(to_dict(s)) + "\n")

    def scrape(self, label: str, t: float, text: str) -> None:
        if self.root is None:
            return
        self.n += 1
        safe = "".join(c if c.isalnum() or c in "-_=" else "_" for c in label)
        paths.write_private(self.root / "scrapes" / f"{self.n:04d}-{safe}-t{t:.1f}.prom", text)

    def write_json(self, name: str, data: Any) -> None:
        if self.root is None:
            return
        paths.write_private(self.root / name, json.dumps(data, indent=2) + "\n")

    def close(self) -> None:
        if self.root is not None:
            self._samples.close()


@dataclass
class _State:
    """What one soak has gathered so far (mutable while it runs)."""

    target: SoakTarget
    config: SoakConfig
    progress: Progress
    art: _Artifacts
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

    def emit(self, phase: str, message: str, **data: Any) -> None:
        self.progress(Event(phase, message, host=self.target.name, data=data))

    def now(self) -> float:
        return time.monotonic() - self.t0


async def _container_call(target: SoakTarget, fn: Callable[[SoakTarget], Any]) -> Any:
    # Container access is blocking (SSH): keep it off the event loop that is timing streams.
    return await asyncio.to_thread(fn, target)


async def _state(target: SoakTarget) -> ContainerState:
    assert target.container is not None
    st: ContainerState = await _container_call(target, lambda t: t.container.state())  # type: ignore[union-attr]
    return st


async def _logs(target: SoakTarget, tail: int = LOG_TAIL) -> str:
    if target.container is None:
        return ""
    try:
        text: str = await _container_call(target, lambda t: t.container.logs(tail))  # type: ignore[union-attr]
        return text
    except FleetError as e:
        return f"(container log unreadable: {e.cause})"


async def await_ready(client: Client, target: SoakTarget, timeout: float, poll: float,
                      progress: Progress = NULL) -> Readiness:
    """Poll /health until 200, the container dies, or ``timeout`` passes (see :func:`wait_ready`)."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    last_log_at = -1e9
    tail = ""
    last_state = ""
    restarts: int | None = None  # the container's restart count when first seen
    while True:
        probe = await client.get("/health", timeout=min(10.0, max(poll * 4, 2.0)))
        waited = time.monotonic() - t0
        if probe.ok:
            return Readiness(Outcome.PASS, f"/health 200 after {waited:.0f}s", waited)
        last_state = probe.detail or f"HTTP {probe.status}" if probe.state != "ok" else ""
        if target.container is not None:
            try:
                st = await _state(target)
            except FleetError as e:
                return Readiness(Outcome.ERROR, f"cannot inspect the container: {e.cause}", waited)
            if not st.exists:
                return Readiness(Outcome.ERROR, f"nothing to soak: no container serves {target.base_url} "
                                                f"({last_state})", waited)
            restarts = st.restart_count if restarts is None else restarts
            # Under a restart policy a crash at boot shows as a restart, the container up again.
            if not st.running or st.restart_count > restarts:
                log = await _logs(target, CRASH_LOG_TAIL)
                cause = boot_failure_cause(log)
                code = f" with code {st.exit_code}" if st.exit_code is not None else ""
                again = (f" (docker restarted it {st.restart_count - restarts} time(s))"
                         if st.restart_count > restarts else "")
                msg = f"boot failure: the container exited{code}{again} before /health answered"
                msg += f": {cause}" if cause else f"; last log lines: {_last_lines(log)}"
                return Readiness(Outcome.FAIL, msg, waited, cause=cause, log_tail=_tail(log))
            if time.monotonic() - last_log_at > 10:
                tail = _last_lines(await _logs(target, 5), 1)
                last_log_at = time.monotonic()
        # Whole 10 s steps in the message: line displays print a line per change, not per poll.
        progress(Event("readiness", f"waiting for {target.base_url}/health ({last_state}), "
                                    f"{int(waited // 10 * 10)}s of {timeout:.0f}s" + (f"; log: {tail}" if tail else ""),
                       host=target.name, data={"waited": round(waited), "state": probe.state}))
        if time.monotonic() + poll > deadline:
            break
        await asyncio.sleep(poll)
    waited = time.monotonic() - t0
    if target.container is not None:
        log = await _logs(target, CRASH_LOG_TAIL)
        cause = boot_failure_cause(log)
        msg = (f"not healthy after {waited:.0f}s (readiness deadline {timeout:.0f}s; /health: {last_state}); "
               f"the container runs but never became ready")
        msg += f": {cause}" if cause else f"; last log lines: {_last_lines(log)}"
        return Readiness(Outcome.FAIL, msg, waited, cause=cause, log_tail=_tail(log))
    return Readiness(Outcome.ERROR, f"endpoint down: {target.base_url}/health gave no 200 in {waited:.0f}s "
                                    f"({last_state})", waited)


def wait_ready(target: SoakTarget, timeout: float = 600.0, poll: float = 2.0,
               progress: Progress = NULL) -> Readiness:
    """Wait until ``target`` answers /health 200; the outcome says why it did not.

    ``pass``: ready. ``fail``: the container exited or never became healthy
    (the cause from its log in ``cause``). ``error``: nothing answers and there
    is no container to tell a slow boot from a dead endpoint.
    """

    async def go() -> Readiness:
        async with Client(target.base_url, connections=4, api_key=target.api_key) as c:
            return await await_ready(c, target, timeout, poll, progress)

    return asyncio.run(go())


async def _identity(client: Client, target: SoakTarget) -> Identity:
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


async def _scrape(client: Client, st: _State, label: str) -> metrics.Scrape | None:
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


async def _windowed(client: Client, st: _State, label: str, phase: str,
                    body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` between two scrapes and record the window."""
    before = await _scrape(client, st, f"{label}-before")
    await body()
    after = await _scrape(client, st, f"{label}-after")
    if before is not None and after is not None:
        w = metrics.window(before, after, label, phase)
        st.windows.append(w)
        if w.acceptance_rate is not None:
            st.last_acceptance = w.acceptance_rate


async def _canary(client: Client, st: _State, cp: prompts.SmokePrompt, phase: str, level: str,
                  concurrency: int) -> Sample:
    """One greedy canary (thinking off), judged later against its answer and its c=1 answer."""
    spec = st.config.check("correctness")
    req = ChatRequest(st.model, cp.prompt, int(spec.params.get("canary_max_tokens", 64)), 0.0, thinking=False)
    s = await client.chat(req, phase=phase, cls=f"canary-{cp.name}", concurrency=concurrency, t0=st.t0,
                          keep_text=True)
    st.samples.append(s)
    st.art.sample(s)
    st.canaries.append(CanaryResult(cp.name, cp.expect, level, s, st.canary_refs.get(cp.name)))
    return s


def _canary_every(cfg: SoakConfig) -> int:
    spec = cfg.check("correctness")
    return int(spec.params.get("canary_every", 0)) if spec.enabled else 0


async def _canary_references(client: Client, st: _State) -> None:
    """Each canary once at c=1: the answers every load level's canaries must repeat."""
    if not _canary_every(st.config):
        return
    st.emit("canary", "greedy canaries at c=1 (references)")
    for cp in prompts.CANARIES:
        s = await _canary(client, st, cp, "canary", "reference", 1)
        if s.ok and not s.garbage and cp.expect.lower() in (s.text or "").lower():
            st.canary_refs[cp.name] = s.text or ""


async def _long_decode(client: Client, st: _State, ident: Identity) -> None:
    """One long generation per soak: corruption that starts thousands of tokens into a sequence."""
    cfg = st.config
    spec = cfg.check("correctness")
    tokens = int(spec.params.get("long_decode_tokens", 0)) if spec.enabled else 0
    if ident.max_model_len:
        tokens = min(tokens, ident.max_model_len - 512)  # room for the prompt and the template
    if tokens <= 0:
        return
    st.emit("long_decode", f"one decode of {tokens} tokens")
    req = ChatRequest(st.model, prompts.prompt_for("prose", 0), tokens, cfg.temperature, ignore_eos=True)
    # A deadline scaled to the length (>= 10 tok/s), never below the per-request one.
    s = await client.chat(req, phase="long_decode", cls="prose", concurrency=1, t0=st.t0,
                          timeout=max(cfg.request_timeout, tokens / 10))
    st.samples.append(s)
    st.art.sample(s)
    st.long_decode = s
    if s.error_kind == "connect":
        st.crash = st.crash or await _diagnose_crash(client, st, 1, "the long decode")


async def _run_requests(client: Client, st: _State, *, phase: str, label: str, concurrency: int,
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
    every = _canary_every(cfg) if canaries else 0
    n_canaries = 0

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
        st.emit(phase, f"{label} c={concurrency} {len(level)}/{requests} req {tok_s:.0f} tok/s "
                       f"errors {errors}", concurrency=concurrency, tok_s=round(tok_s),
                errors=errors, acceptance=checks.pct(st.last_acceptance), level=label)

    async def worker(wid: int) -> None:
        nonlocal stopped, n_canaries
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
            if stopped:
                return
            if time.monotonic() >= deadline:
                stopped = stopped or f"time bound {seconds:.0f}s reached"
                return
            if every and i % every == 0:
                # A slice of every level is canaries, on top of its load requests (they are
                # shorter and greedy: kept out of the level's latency and throughput figures).
                cp = prompts.CANARIES[(i // every + concurrency) % len(prompts.CANARIES)]
                n_canaries += 1
                c = await _canary(client, st, cp, phase, label, concurrency)
                if c.error_kind == "connect" and not stopped:
                    stopped = "server refused connections"
                    st.crash = st.crash or await _diagnose_crash(client, st, concurrency, label)
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
                                  keep_text=bool(context))
            if context:
                history += [("user", req.prompt), ("assistant", s.text or "")]
                s = replace(s, text=None)
            level.append(s)
            st.samples.append(s)
            if first:
                st.warm.append(s)
                first = False
            st.art.sample(s)
            note()
            if s.error_kind == "connect" and not stopped:
                stopped = "server refused connections"
                st.crash = st.crash or await _diagnose_crash(client, st, concurrency, label)

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.monotonic() - t_start
    if not stopped and any(not s.ok for s in level):
        # Errors without a refusal: look once whether the server is still there.
        probe = await client.get("/health", timeout=5.0)
        if not probe.ok:
            stopped = f"/health {probe.state} after errors"
            st.crash = st.crash or await _diagnose_crash(client, st, concurrency, label)
    st.levels.append(replace(summarize(phase, label, concurrency, level, elapsed, stopped, cfg.slo, st.warm),
                             canaries=n_canaries))


def _merge_trials(st: _State, label: str, concurrency: int) -> None:
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


async def _open_loop(client: Client, st: _State, rate: float, *, requests: int, seconds: float) -> None:
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
            cls = prompts.SHORT_CLASSES[i % len(prompts.SHORT_CLASSES)]
            req = ChatRequest(st.model, prompts.prompt_for(cls, i), cfg.max_tokens, cfg.temperature,
                              thinking=cfg.thinking, ignore_eos=True)
            left = max(deadline - time.monotonic(), 1.0)
            s = await client.chat(req, phase="rate", cls=cls, concurrency=0, t0=st.t0,
                                  timeout=min(cfg.request_timeout, left + cfg.request_timeout))
            level.append(s)
            st.samples.append(s)
            st.art.sample(s)

    tasks = []
    stopped = ""
    for i in range(requests):
        await asyncio.sleep(rng.expovariate(rate))
        if time.monotonic() >= deadline:
            stopped = f"time bound {seconds:.0f}s reached"
            break
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    st.emit("rate", f"{label}: {len(level)} requests, {sum(1 for s in level if not s.ok)} errors", level=label)
    st.levels.append(summarize("rate", label, 0, level, time.monotonic() - t_start, stopped, cfg.slo))


#: Open-loop requests in flight at once (arrivals beyond wait): bounds sockets and memory.
OPEN_LOOP_MAX_IN_FLIGHT = 256


async def _diagnose_crash(client: Client, st: _State, concurrency: int, label: str) -> str:
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
            cs = await _state(st.target)
            while cs.running and time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                cs = await _state(st.target)
            if not cs.running:
                what += f", container {cs.status or 'gone'}" + (f" with exit code {cs.exit_code}"
                                                               if cs.exit_code is not None else "")
        except FleetError as e:
            what += f" (container state unreadable: {e.cause})"
        cause = boot_failure_cause(await _logs(st.target, CRASH_LOG_TAIL))
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


async def _sustained(client: Client, st: _State, ident: Identity) -> None:
    cfg = st.config
    if cfg.sustained_duration <= 0:
        return
    scrapes: list[metrics.Scrape] = []
    first = await _scrape(client, st, "sustained-start")
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
            s = await _scrape(client, st, f"sustained-{n}")
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
        chars, got, how = await _sized(client, st, tokens, _context_text)
        context = _context_text(chars)
        if how == "tokenize":
            st.prompt_sizes["shared_prefix"] = (tokens, got, how)
        raised = (f", raised from {cfg.shared_prefix_tokens} past the server's {st.cache_block_tokens}-token "
                  "cache block" if tokens != cfg.shared_prefix_tokens else "")
        st.emit("sustained", f"conversations share a {tokens}-token context (sized by {how}{raised})")
    task = asyncio.create_task(scraper())
    try:
        await _run_requests(client, st, phase="sustained", label="sustained",
                            concurrency=cfg.sustained_concurrency, requests=cfg.sustained_max_requests,
                            seconds=cfg.sustained_duration, classes=prompts.SHORT_CLASSES, canaries=True,
                            context=context)
    finally:
        done.set()
        await task
    # Renumber so labels are consecutive whatever ran in between.
    rest = [w for w in st.windows if w.phase != "sustained"]
    sus = [replace(w, label=f"sustained #{i + 1}") for i, w in enumerate(w for w in st.windows if w.phase == "sustained")]
    st.windows[:] = rest + sus


def _context_text(chars: int) -> str:
    return "You answer questions for the operations team. Their service log:\n" + \
        prompts.long_context_document(chars)


def _long_text(chars: int) -> str:
    return prompts.prompt_for("long_context", 0, chars)


async def _sized(client: Client, st: _State, tokens: int, build: Callable[[int], str]) -> tuple[int, int, str]:
    """``build(chars)`` grown or shrunk to ``tokens`` tokens as the server's ``/tokenize`` counts them.

    A character estimate is off by 2x between prose and a digit-heavy log; near
    max_model_len that is an HTTP 400 that fails a healthy server. Without
    /tokenize, the ratio measured on the classes phase's prompts is used.
    """
    chars = max(int(tokens * st.chars_per_token), 64)
    got = tokens
    for _ in range(6):
        n = await client.tokenize(st.model, build(chars))
        if n is None:
            return chars, tokens, "estimate"
        got = n
        if abs(got - tokens) <= max(8, tokens // 50):
            break
        chars = max(int(chars * tokens / max(got, 1)), 64)
    return chars, got, "tokenize"


def _estimate_chars_per_token(samples: Sequence[Sample], prompt_of: Callable[[Sample], str]) -> float:
    # Two prompts of different lengths cancel the chat template's fixed token overhead.
    pts = sorted({(len(prompt_of(s)), s.prompt_tokens) for s in samples if s.ok and s.prompt_tokens})
    if len(pts) >= 2:
        (c1, t1), (c2, t2) = pts[0], pts[-1]
        if t2 > t1 and c2 > c1:
            return min(max((c2 - c1) / (t2 - t1), 1.0), 8.0)
    return 4.0


async def _soak(client: Client, st: _State) -> Evidence:
    cfg, target = st.config, st.target
    st.emit("readiness", f"waiting for {target.base_url}/health")
    ready = await await_ready(client, target, cfg.readiness_timeout, cfg.readiness_poll, st.progress)
    if not ready.ready:
        return Evidence(readiness=ready, has_container=target.container is not None)

    before: ContainerState | None = None
    container_error = ""
    if target.container is not None:
        try:
            before = await _state(target)
        except FleetError as e:
            container_error = e.cause

    st.emit("identity", "reading /v1/models and /version")
    ident = await _identity(client, target)
    st.model = cfg.model or (cfg.served_model_names[0] if cfg.served_model_names else "") or \
        (ident.models[0] if ident.models else "")
    id_spec = cfg.check("identity")
    if id_spec.enabled and not id_spec.observe_only and checks.check_identity(
            id_spec, Evidence(readiness=ready, identity=ident), cfg).outcome is Outcome.FAIL:
        # Known in the first second: a server that lacks the recipe's names fails now.
        return Evidence(readiness=ready, identity=ident, container_before=before, container_error=container_error,
                        has_container=target.container is not None, host=target.name)

    st.emit("smoke", "smoke prompts at temperature 0")
    smoke: list[SmokeResult] = []
    for sp in prompts.SMOKE:
        req = ChatRequest(st.model, sp.prompt, cfg.smoke_max_tokens, 0.0, thinking=False)
        s = await client.chat(req, phase="smoke", cls=sp.name, concurrency=1, t0=st.t0, keep_text=True)
        st.samples.append(s)
        st.art.sample(s)
        smoke.append(SmokeResult(sp.name, sp.expect, s, cfg.smoke_max_tokens))
    smoke_check = checks.check_smoke(cfg.check("smoke"), Evidence(readiness=ready, smoke=tuple(smoke)))
    stop_after_smoke = smoke_check.outcome is Outcome.FAIL and not cfg.check("smoke").observe_only

    load = not cfg.smoke_only and not stop_after_smoke and ident.reachable
    if load:
        await _load(client, st, ident)

    after: ContainerState | None = None
    if target.container is not None and not container_error:
        try:
            after = await _state(target)
        except FleetError as e:
            container_error = e.cause
    if not st.crash:
        probe = await client.get("/health", timeout=5.0)
        if probe.state in ("refused", "unreachable"):
            st.crash = await _diagnose_crash(client, st, 0, "the end of the soak")
    return Evidence(
        readiness=ready, identity=ident, smoke=tuple(smoke), levels=tuple(st.levels),
        windows=tuple(_with_foreign(st.windows, st.samples)), load_ran=load, crash=st.crash, container_before=before,
        container_after=after, container_error=container_error, has_container=target.container is not None,
        spec_seen=st.spec_seen, scrape_errors=tuple(st.scrape_errors), host=target.name,
        canaries=tuple(st.canaries), long_decode=st.long_decode, prompt_sizes=dict(st.prompt_sizes),
        cache_block_tokens=st.cache_block_tokens,
        garbage_samples=tuple(s for s in st.samples if s.garbage and s.phase in _CHECKED_PHASES
                              and not s.cls.startswith("canary-")),
        streams_checked=sum(1 for s in st.samples if s.phase in _CHECKED_PHASES and s.events),
    )


def _with_foreign(windows: Sequence[Window], samples: Sequence[Sample]) -> list[Window]:
    """Each window with the requests the server finished in it beyond those this soak finished.

    The server's request_success counter covers every client; the soak knows its own
    streams (those that got an answer, which the server counts as finished or aborted).
    """
    ends = sorted(s.start + s.e2e for s in samples if s.status == 200 and s.e2e is not None)
    out = []
    for w in windows:
        server = sum(w.success_by_reason.values()) if w.success_by_reason else None
        if server is None:
            out.append(w)
            continue
        mine = bisect.bisect_right(ends, w.end) - bisect.bisect_right(ends, w.start)
        out.append(replace(w, foreign_requests=max(0.0, server - mine)))
    return out


#: Phases whose streamed text the correctness check judges (smoke has its own check).
_CHECKED_PHASES = ("canary", "classes", "sweep", "long_decode", "sustained")


async def _load(client: Client, st: _State, ident: Identity) -> None:
    cfg = st.config
    await _canary_references(client, st)
    # 4. one class at a time at c=1: per-class acceptance needs a window of its own.
    short = [c for c in cfg.classes if c != "long_context"]
    for cls in short:
        await _windowed(client, st, cls, "classes", lambda cls=cls: _run_requests(  # type: ignore[misc]
            client, st, phase="classes", label=cls, concurrency=1, requests=cfg.class_requests,
            seconds=cfg.level_timeout, classes=(cls,)))
        if st.crash:
            return
    if "long_context" in cfg.classes:
        st.chars_per_token = _estimate_chars_per_token(
            [s for s in st.samples if s.phase == "classes"],
            lambda s: prompts.prompt_for(s.cls, 0))
        tokens = cfg.long_context_tokens
        if ident.max_model_len:
            # Room for the answer and the chat template: the prompt must never overflow the model.
            tokens = min(tokens, ident.max_model_len - cfg.max_tokens - 64)
        chars, _, how = await _sized(client, st, tokens, _long_text)
        await _windowed(client, st, "long_context", "classes", lambda: _run_requests(
            client, st, phase="classes", label="long_context", concurrency=1, requests=cfg.class_requests,
            seconds=cfg.level_timeout, classes=("long_context",), long_chars=chars))
        measured = [s.prompt_tokens for s in st.samples if s.cls == "long_context" and s.prompt_tokens]
        st.prompt_sizes["long_context"] = (tokens, int(statistics.median(measured)) if measured else None, how)
        if st.crash:
            return
    # 5. the concurrency sweep.
    for c in cfg.concurrency:
        for _trial in range(cfg.trials):
            await _windowed(client, st, f"c={c}", "sweep", lambda c=c: _run_requests(  # type: ignore[misc]
                client, st, phase="sweep", label=f"c={c}", concurrency=c, requests=cfg.level_requests(c),
                seconds=cfg.level_timeout, classes=prompts.SHORT_CLASSES, canaries=True))
            if st.crash:
                break
        _merge_trials(st, f"c={c}", c)
        if st.crash:
            return
    for rate in cfg.request_rates:
        await _windowed(client, st, f"r={rate:g}/s", "rate", lambda rate=rate: _open_loop(  # type: ignore[misc]
            client, st, rate, requests=cfg.level_requests(max(1, round(rate))), seconds=cfg.level_timeout))
        if st.crash:
            return
    await _long_decode(client, st, ident)
    if st.crash:
        return
    # 6. the sustained phase.
    await _sustained(client, st, ident)


def run_soak(target: SoakTarget, config: SoakConfig, baseline: Verdict | None = None,
             progress: Progress = NULL, *, artifacts_dir: Path | None = None,
             run_id: str | None = None) -> Verdict:
    """Soak ``target`` and return the verdict (never raises for a bad server: that is the verdict).

    ``baseline``: the last passing verdict of the previously serving tag on the
    same host (throughput is compared with it). ``artifacts_dir``: where samples,
    scrapes and verdict.json go (created). With ``config.smoke_only`` only
    readiness, identity and smoke run: a rollback's quick check.
    """
    run_id = run_id or new_run_id(target.name)
    started = datetime.now(UTC)
    t0 = time.monotonic()
    art = _Artifacts(artifacts_dir)
    art.write_json("config.json", to_dict(config))
    st = _State(target, config, progress, art, t0)

    async def go() -> Evidence:
        conns = max((*config.concurrency, config.sustained_concurrency, 1)) + 8
        async with Client(target.base_url, connections=conns, request_timeout=config.request_timeout,
                          api_key=target.api_key) as c:
            return await _soak(c, st)

    try:
        ev = asyncio.run(go())
    finally:
        art.close()
    baseline_note = ""
    if baseline is not None and baseline.fingerprint != config.fingerprint():
        baseline_note = (f"baseline {baseline.run_id} not compared: made by another soak config "
                         f"(fingerprint {baseline.fingerprint or 'none'}, this soak {config.fingerprint()})")
        baseline = None
    results = checks.evaluate(ev, config, baseline, baseline_note=baseline_note)
    outcome = checks.overall(results)
    deciding = [c for c in results if c.outcome is outcome and not c.observe_only]
    summary = outcome.value if outcome is Outcome.PASS else f"{outcome.value}: " + "; ".join(
        f"{c.name}: {c.message}" for c in deciding[:2])
    if outcome is Outcome.PASS:
        sweep = [lv for lv in ev.levels if lv.phase == "sweep" and lv.tok_s]
        peak = max(sweep, key=lambda lv: lv.tok_s or 0.0) if sweep else None
        summary = "pass: " + ", ".join(x for x in (
            f"{sum(lv.requests for lv in ev.levels)} requests, 0 errors" if ev.load_ran else "smoke only",
            f"peak {peak.tok_s:.0f} tok/s at {peak.label}" if peak and peak.tok_s else "",
            f"acceptance {checks.pct(_acceptance(ev.windows))}" if _acceptance(ev.windows) is not None else "",
        ) if x)
    ok = [s for s in st.samples if s.ok and s.phase in ("sweep", "sustained", "classes")]
    verdict = Verdict(
        run_id=run_id, target=target.name, base_url=target.base_url, outcome=outcome, summary=summary,
        started=started.isoformat(timespec="seconds"),
        finished=datetime.now(UTC).isoformat(timespec="seconds"),
        seconds=round(time.monotonic() - t0, 2), tag=target.tag, profile=config.profile,
        artifacts_dir=str(artifacts_dir) if artifacts_dir else None,
        version=ev.identity.version if ev.identity else "",
        served_models=ev.identity.models if ev.identity else (),
        checks=results, levels=ev.levels, windows=ev.windows,
        baseline_run_id=baseline.run_id if baseline else "",
        fingerprint=config.fingerprint(),
        ttft_samples=tuple(round(s.ttft, 5) for s in ok if s.ttft is not None)[:MAX_DIST_SAMPLES],
        tpot_samples=tuple(round(s.tpot, 6) for s in ok if s.tpot is not None)[:MAX_DIST_SAMPLES],
    )
    art.write_json("verdict.json", to_dict(verdict))
    progress(Event("done", verdict.summary, host=target.name, data={"outcome": outcome.value}))
    return verdict


def _acceptance(windows: Sequence[Window]) -> float | None:
    acc = [w.accepted_tokens for w in windows if w.accepted_tokens is not None]
    dt = [w.draft_tokens for w in windows if w.draft_tokens]
    return sum(acc) / sum(dt) if acc and dt and sum(dt) else None


def smoke_check(target: SoakTarget, config: SoakConfig, progress: Progress = NULL, **kw: Any) -> Verdict:
    """Readiness, identity and smoke only, no load: the quick check after a rollback."""
    return run_soak(target, replace(config, smoke_only=True), None, progress, **kw)

