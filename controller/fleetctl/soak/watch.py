"""``fleetctl watch``: a cheap continuous probe of promoted hosts, for hours, judged like a soak.

Every ``interval`` each host gets one greedy canary (compared with that canary's first answer in
this watch, its reference), one short streamed request (its time to first token, and a stall while
/health answers is a wedged engine), and a /metrics scrape whose delta since the last one gives the
interval's finished and failed requests, preemptions, acceptance and TTFT/TPOT percentiles
(``soak/traffic.py``). The result is one soak :class:`~fleetctl.soak.verdict.Verdict` per host with
pass/fail/inconclusive checks under the usual limits (``judge.decide``), written as the soak writes
its own (samples.jsonl, scrapes/, verdict.json). The checks are the registered soak checks that
judge a watch's intervals too (their ``watch`` side: soak/checks/watching.py), in report order.

Bounded: at most ``parallel`` hosts are probed at once (one client each, opened for the probe and
closed after it), every request has the soak's byte cap and liveness bound, samples and scrapes go
to disk as they come, and what stays in memory per host is fixed (the non-passing measurements up to
:data:`KEEP`, counts beyond, the last :data:`KEEP` windows, a reservoir of latencies). A breach
(a check failing) calls ``on_breach`` once per host and check, as it happens: the CLI pages the
webhook.

With a ``remedy`` (``fleetctl watch --remediate``), a breach it heals (the host restarted, or rolled
back to its known-good, re-gated and re-admitted) no longer fails the host: its failures up to the
remediation are kept apart, marked healed, and the host is judged on what came after (a
``remediation`` check lists each remediation; one left unhealed, a parked host, fails it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from fleetctl.progress import NULL, Event, Progress
from fleetctl.runids import new_run_id
from fleetctl.soak import metrics, prompts, secrets
from fleetctl.soak.artifacts import Artifacts
from fleetctl.soak.checks.judge import decide
from fleetctl.soak.checks.registry import REGISTRY
from fleetctl.soak.checks.watching import (
    Interval,
    WatchJudge,
    WatchSettings,
    WatchState,
    WatchTotals,
)
from fleetctl.soak.client import ChatRequest, Client, SampleTag
from fleetctl.soak.config import CheckSpec, SoakConfig
from fleetctl.soak.phases.summary import LevelKey, summarize
from fleetctl.soak.stopping import stop_on_signals
from fleetctl.soak.traffic import traffic
from fleetctl.soak.verdict import (
    CheckResult,
    Measurement,
    Outcome,
    Remedied,
    Sample,
    SoakTarget,
    Verdict,
    Window,
    to_dict,
)

P, F, INC, ERR = Outcome.PASS, Outcome.FAIL, Outcome.INCONCLUSIVE, Outcome.ERROR

#: Non-passing measurements, windows and latencies kept per host and check (the rest are counted).
KEEP = 200
#: The short streamed request: a prose prompt, a few tokens.
STREAM_PROMPT = prompts.PROMPTS["natural_language"][0]


@dataclass(frozen=True)
class WatchTarget:
    """One host (or endpoint) to watch: its target, its soak config (model, liveness bound,
    bounds)."""

    target: SoakTarget
    config: SoakConfig
    artifacts_dir: Path | None = None
    run_id: str = ""


#: ``on_breach(host, check, message)``: called once per host and check, the first time it fails.
OnBreach = Callable[[str, str, str], None]
#: ``remedy(host, check, message)``: called (in a thread) with the first new breach of an interval;
#: what was done, and True when the host's checks start afresh (its server was restarted or
#: replaced, or it should be tried again at the next breach): ``fleetctl watch --remediate``
#: (fleetctl.remediate).
Remedy = Callable[[str, str, str], tuple[Remedied, bool]]


@dataclass
class _Check:
    """One check's measurements for one host, bounded: passes counted, the rest kept up to KEEP."""

    name: str
    passes: int = 0
    last_pass: Measurement | None = None
    kept: list[Measurement] = field(default_factory=list)
    dropped: int = 0
    fails: int = 0
    #: Non-passing measurements before the host's last healing remediation (kept up to KEEP), and
    #: how many there were: shown, not judged.
    healed: list[Measurement] = field(default_factory=list)
    healed_n: int = 0

    def add(self, m: Measurement) -> None:
        if m.outcome is P:
            self.passes += 1
            self.last_pass = m
            return
        self.fails += m.outcome is F
        if len(self.kept) < KEEP:
            self.kept.append(m)
        else:
            self.dropped += 1

    def heal(self) -> None:
        """A remediation healed the host: what did not pass so far is set apart, judged no more."""
        self.healed.extend(self.kept[: KEEP - len(self.healed)])
        self.healed_n += len(self.kept) + self.dropped
        self.kept, self.dropped = [], 0

    def result(self, spec: CheckSpec, ok: str, no_data: str) -> CheckResult:
        ms_ = list(self.kept)
        if self.passes and self.last_pass is not None:
            ms_.append(
                replace(
                    self.last_pass,
                    label=f"{self.passes} passing interval(s)",
                    message=f"{self.passes} interval(s) within bounds; last: "
                            f"{self.last_pass.message}",
                )
            )
        r = decide(spec, ms_, ok_message=ok, no_data=no_data)
        if self.dropped:
            r = replace(r, message=r.message + f" ({self.dropped} more not kept)")
        if self.healed_n:
            r = replace(
                r if ms_ else CheckResult(self.name, P, "not probed since"),
                message=f"{r.message if ms_ else 'not probed since'}; healed: {self.healed_n} "
                "non-passing interval(s) before a remediation",
                measurements=r.measurements
                + tuple(replace(m, label=f"{m.label} (healed)") for m in self.healed),
            )
        return r


class _Host:
    """What the watch keeps of one host between intervals."""

    def __init__(self, wt: WatchTarget, t0: float, judges: Sequence[WatchJudge]) -> None:
        self.wt = wt
        self.scrub = secrets.Scrubber(secrets.known_secrets(wt.target.api_key, wt.target.base_url))
        self.target = secrets.scrubbed_target(wt.target, self.scrub)
        self.art = Artifacts(wt.artifacts_dir)
        self.t0 = t0
        self.model = wt.config.model or (
            wt.config.served_model_names[0] if wt.config.served_model_names else ""
        )
        self.prev: metrics.Scrape | None = None
        #: The registered checks' watch sides, in report order, and what they keep of the host.
        self.judges = judges
        self.state = WatchState()
        self.checks = {j.name: _Check(j.name) for j in judges}
        self.windows: collections.deque[Window] = collections.deque(maxlen=KEEP)
        self.samples: collections.deque[Sample] = collections.deque(maxlen=2000)
        self.requests = self.errors = self.intervals = 0
        self.first_error = ""
        self.version = ""
        self.paged: set[str] = set()
        #: Each check's failures before the host's last fresh start (a remedy): not breaches again.
        self.fails_before: dict[str, int] = {}
        #: What the remedy did with the host's breaches (the last KEEP; ``remedies`` counts all).
        self.remedied: collections.deque[Remedied] = collections.deque(maxlen=KEEP)
        self.remedies = 0

    def fresh_start(self) -> None:
        """The server was restarted or replaced: new counters, new greedy answers, no breach."""
        self.prev = None
        self.state.fresh_start()
        self.version = ""
        self.paged.clear()
        self.fails_before = {n: c.fails for n, c in self.checks.items()}

    def now(self) -> float:
        return time.monotonic() - self.t0


async def _probe(h: _Host, s: WatchSettings, i: int, progress: Progress) -> None:
    """One interval of one host: canary, streamed request, scrape."""
    cfg = h.wt.config
    stall = cfg.token_timeout()
    async with Client(h.target.base_url, connections=2, request_timeout=cfg.request_timeout,
                      api_key=h.target.api_key, scrub=h.scrub) as c:
        if not h.model:
            _p, models = await c.get_json("/v1/models")
            data = models.get("data", []) if isinstance(models, dict) else []
            h.model = next(
                (str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")), ""
            )
        if not h.version:
            _pv, version = await c.get_json("/version")
            h.version = str(version.get("version", "")) if isinstance(version, dict) else ""
        cp = prompts.CANARIES[i % len(prompts.CANARIES)]
        canary_tokens = int(cfg.check("correctness").params.get("canary_max_tokens", 64))
        # Side by side: a wedged engine holds each for the liveness bound, so one bound, not two,
        # passes before the interval's breach.
        canary, stream = await asyncio.gather(c.chat(
            ChatRequest(h.model, cp.prompt, canary_tokens, 0.0, thinking=False),
            SampleTag("watch", f"canary-{cp.name}", 1, h.t0),
            keep_text=True,
            stall=stall,
        ), c.chat(
            ChatRequest(
                    h.model, STREAM_PROMPT, s.stream_max_tokens, cfg.temperature, thinking=False
                ),
            SampleTag("watch", "stream", 1, h.t0),
            stall=stall,
        ))
        health = (
            await c.get("/health", timeout=5.0)
            if "stall" in (canary.error_kind, stream.error_kind)
            else None
        )
        p = await c.get("/metrics", timeout=15.0)
    h.intervals += 1
    label = f"i{i}"
    for smp in (canary, stream):
        h.art.sample(smp)
        h.samples.append(smp)
        h.requests += 1
        if not smp.ok:
            h.errors += 1
            h.first_error = h.first_error or smp.error
    iv = Interval(label, h.target.name, cfg, s, h.state, canary, cp, stream,
                  health_ok=health is not None and health.ok)
    if p.ok:
        h.art.scrape(label, h.now(), p.body)
        try:
            cur = metrics.parse(p.body, h.now())
        except metrics.MetricsError as e:
            iv = replace(iv, scrape_error=str(e))
        else:
            h.state.spec_seen = h.state.spec_seen or cur.has_spec_decode
            if h.prev is not None:
                w = metrics.window(h.prev, cur, label, "watch")
                h.windows.append(w)
                iv = replace(iv, traffic=traffic(h.target.name, h.prev, cur), window=w)
            h.prev = cur
    else:
        iv = replace(iv, scrape_error=f"/metrics {p.state} {p.detail or p.status}")
    for judge in h.judges:
        for m in judge.interval(iv):
            h.checks[judge.name].add(m)
    progress(Event("watch", f"interval {i + 1}: canary {'ok' if canary.ok else canary.error_kind}, "
                   f"stream {'ok' if stream.ok else stream.error_kind}", host=h.target.name,
                   data={"interval": i + 1, "errors": h.errors, "requests": h.requests}))


def _breaches(h: _Host, s: WatchSettings, on_breach: OnBreach | None) -> list[tuple[str, str]]:
    """Page each check's first breach (since the host's last fresh start); the new ones."""
    new = []
    for c in h.checks.values():
        if c.fails - h.fails_before.get(c.name, 0) > s.failure_limit and c.name not in h.paged:
            h.paged.add(c.name)
            last = next((m for m in reversed(c.kept) if m.outcome is F), None)
            message = h.scrub(last.message if last else c.name)
            new.append((c.name, message))
            if on_breach is not None:
                on_breach(h.target.name, c.name, message)
    return new


def _verdict(h: _Host, s: WatchSettings, started: datetime, seconds: float) -> Verdict:
    n = h.intervals
    totals = WatchTotals(s, h.requests, n, h.state.spec_seen)
    results = tuple(_result(h.checks[j.name], j, CheckSpec(j.name, failure_limit=s.failure_limit),
                            totals) for j in h.judges)
    if h.remedied:
        results = (_remediation(h), *results)
    counted = [r.outcome for r in results if not r.observe_only]
    outcome = next((o for o in (F, ERR, INC) if o in counted), P)
    deciding = [r for r in results if r.outcome is outcome]
    if outcome is not P:
        summary = f"{outcome.value}: " + "; ".join(f"{r.name}: {r.message}" for r in deciding[:2])
    elif any(x.healed for x in h.remedied):
        summary = f"healed: {n} interval(s), {h.requests} probes, {results[0].message}"
    else:
        summary = f"pass: {n} interval(s), {h.requests} probes, 0 failed"
    level = summarize(LevelKey("watch", "probes", 1), list(h.samples), seconds)
    level = replace(level, requests=h.requests, errors=h.errors, first_error=h.first_error)
    ok = [x for x in h.samples if x.ok]
    v = Verdict(
        run_id=h.wt.run_id,
        target=h.target.name,
        base_url=h.target.base_url,
        outcome=outcome,
        summary=summary,
        started=started.isoformat(timespec="seconds"),
        finished=datetime.now(UTC).isoformat(timespec="seconds"),
        seconds=round(seconds, 2),
        tag=h.target.tag,
        digest=h.target.digest,
        profile=f"watch/{h.wt.config.profile}",
        artifacts_dir=str(h.wt.artifacts_dir) if h.wt.artifacts_dir else None,
        version=h.version,
        served_models=(h.model,) if h.model else (),
        checks=results,
        levels=(level,),
        windows=tuple(h.windows),
        ttft_samples=tuple(round(x.ttft, 5) for x in ok if x.ttft is not None),
        tpot_samples=tuple(round(x.tpot, 6) for x in ok if x.tpot is not None),
        remediations=tuple(h.remedied),
    )
    return h.scrub.tree(v)


def _result(c: _Check, j: WatchJudge, spec: CheckSpec, totals: WatchTotals) -> CheckResult:
    """One check's result over the watch: skipped when it judged nothing and says why, or when it
    reads only the server's series and the server reported none."""
    if j.unjudged is not None and not (c.kept or c.passes or c.healed_n):
        return CheckResult(j.name, Outcome.SKIPPED, j.unjudged(totals))
    r = c.result(spec, j.passing(totals), j.no_data)
    if j.server_series and r.outcome is INC and not r.measurements:
        return replace(r, outcome=Outcome.SKIPPED)
    return r


def _remediation(h: _Host) -> CheckResult:
    """The remediations of the host's breaches: failed while one after the last that healed it
    did not (a parked host, a remediation held back or refused, a breach only paged)."""
    rs = list(h.remedied)
    last = max((i for i, r in enumerate(rs) if r.healed), default=-1)
    ms_ = tuple(Measurement(r.id or f"breach {i + 1}", P if r.healed else F,
                            f"{r.check}: {r.action}: {r.result}: {r.detail}"[:300])
                for i, r in enumerate(rs))
    more = f" ({h.remedies - len(rs)} earlier not kept)" if h.remedies > len(rs) else ""
    left = rs[last + 1:]
    if left:
        r = left[-1]
        return CheckResult("remediation", F, f"not healed: {r.check}: {r.action}: {r.result}: "
                           f"{r.detail}"[:300] + more, measurements=ms_)
    return CheckResult("remediation", P, f"{sum(r.healed for r in rs)} breach(es) healed ("
                       + ", ".join(f"{r.check}: {r.action}" for r in rs if r.healed)[:200]
                       + ")" + more, measurements=ms_)


@dataclass(frozen=True)
class _Run:
    """What every host's loop shares: the settings, the bound on hosts probed at once, the end,
    the progress stream, the breach hooks and the stop asked by a signal."""

    settings: WatchSettings
    sem: asyncio.Semaphore
    end: float
    progress: Progress
    on_breach: OnBreach | None
    remedy: Remedy | None
    stop: asyncio.Event


async def _watch_host(h: _Host, run: _Run) -> None:
    """One host's intervals until the watch ends (or a stop is asked), its breaches remedied."""
    s, sem, end, progress, stop = run.settings, run.sem, run.end, run.progress, run.stop
    on_breach, remedy = run.on_breach, run.remedy
    i = 0
    while True:
        tick = time.monotonic()
        if tick >= end or stop.is_set():
            return
        async with sem:
            try:
                # An interval never outlives the watch: a server holding a probe is cut at the end.
                async with asyncio.timeout(max(1.0, end - time.monotonic())):
                    await _probe(h, s, i, progress)
            except TimeoutError:
                break
        new = _breaches(h, s, on_breach)
        # One remediation at a time for this host: its probes wait for it (the others go on).
        if remedy is not None and new:
            done, fresh = await asyncio.to_thread(remedy, h.target.name, *new[0])
            h.remedied.append(done)
            h.remedies += 1
            if done.healed:
                for c in h.checks.values():
                    c.heal()
            if fresh:
                h.fresh_start()
        i += 1
        with contextlib.suppress(TimeoutError):  # the next interval, or a stop asked before it
            await asyncio.wait_for(stop.wait(), max(0.0, min(tick + s.interval, end)
                                                    - time.monotonic()))


def run_watch(targets: Sequence[WatchTarget], settings: WatchSettings, progress: Progress = NULL,
              on_breach: OnBreach | None = None, remedy: Remedy | None = None) -> list[Verdict]:
    """Watch ``targets`` for ``settings.duration`` seconds; one verdict per target (its artifacts
    written). With ``remedy``, a host's breach is handed to it (see :data:`Remedy`)."""
    started = datetime.now(UTC)
    t0 = time.monotonic()
    progress = secrets.scrubbed_progress(progress, secrets.Scrubber(
        [x for w in targets for x in secrets.known_secrets(w.target.api_key, w.target.base_url)]))
    judges = [c.watch for c in REGISTRY.checks() if c.watch is not None]
    hosts = [
        _Host(replace(w, run_id=w.run_id or new_run_id("watch", w.target.name)), t0, judges)
        for w in targets
    ]
    progress(
        Event(
            "watch",
            f"{len(hosts)} host(s) every {settings.interval:g}s for {settings.duration:g}s, "
            f"{min(settings.parallel, len(hosts))} at a time",
        )
    )

    async def go() -> None:
        sem = asyncio.Semaphore(max(1, settings.parallel))
        end = time.monotonic() + settings.duration
        with stop_on_signals(progress, "ending the watch after the probes and remediations in "
                             "flight, with verdicts of the time watched") as stop:
            run = _Run(settings, sem, end, progress, on_breach, remedy, stop)
            await asyncio.gather(*(_watch_host(h, run) for h in hosts))

    try:
        asyncio.run(go())
    finally:
        for h in hosts:
            h.art.close()
    out = []
    for h in hosts:
        v = _verdict(h, settings, started, time.monotonic() - t0)
        h.art.write_json("verdict.json", to_dict(v))
        progress(Event("done", v.summary, host=v.target, data={"outcome": v.outcome.value}))
        out.append(v)
    return out
