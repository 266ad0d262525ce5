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
artifacts directory when one is given."""

from __future__ import annotations

import asyncio
import bisect
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.progress import NULL, Event, Progress
from fleetctl.runids import new_run_id
from fleetctl.soak import prompts, secrets
from fleetctl.soak.answerset import ReferenceSet
from fleetctl.soak.artifacts import Artifacts
from fleetctl.soak.capabilities.probes import probe_capabilities
from fleetctl.soak.checks.check import CheckContext
from fleetctl.soak.checks.evidence import Evidence, Identity, SmokeResult
from fleetctl.soak.checks.health import check_identity, check_smoke
from fleetctl.soak.checks.judge import overall, pct
from fleetctl.soak.checks.registry import evaluate
from fleetctl.soak.client import ChatRequest, Client, SampleTag
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.phases import (
    canary_references,
    identity,
    long_decode,
    long_prompts,
    loop_references,
    sustained,
    windowed,
)
from fleetctl.soak.phases.answer_set import answer_set
from fleetctl.soak.phases.levels import LevelPlan, merge_trials, open_loop, run_requests
from fleetctl.soak.phases.sizing import estimate_chars_per_token, long_text, sized
from fleetctl.soak.phases.soak_state import SoakState, diagnose_crash, planned_phases, stall_seen
from fleetctl.soak.readiness import (
    await_ready,
    container_state,
)
from fleetctl.soak.verdict import (
    Outcome,
    Readiness,
    Sample,
    SoakTarget,
    Verdict,
    Window,
    to_dict,
)

#: Distributions kept in the verdict for the report (the raw samples are in the artifacts).
MAX_DIST_SAMPLES = 2000




async def _soak(client: Client, st: SoakState) -> Evidence:
    cfg, target = st.config, st.target
    st.emit("readiness", f"waiting for {target.base_url}/health")
    st.phase = "readiness"
    ready = await await_ready(
        client, target, cfg.readiness_timeout, cfg.readiness_poll, st.progress
    )
    st.ready = ready
    if not ready.ready:
        return Evidence(readiness=ready, has_container=target.container is not None)

    if target.container is not None and st.runs("container"):
        try:
            st.container_before = await container_state(target)
        except FleetError as e:
            st.container_error = e.cause

    st.emit("identity", "reading /v1/models and /version")
    st.phase = "identity"
    ident = await identity(client, target)
    st.ident = ident
    st.model = cfg.model or (cfg.served_model_names[0] if cfg.served_model_names else "") or \
        (ident.models[0] if ident.models else "")
    id_spec = cfg.check("identity")
    early = CheckContext(Evidence(readiness=ready, identity=ident), cfg)
    if id_spec.enabled and not id_spec.observe_only and check_identity(
            id_spec, early).outcome is Outcome.FAIL:
        # Known in the first second: a server that lacks the recipe's names fails now.
        return evidence(st, final=False)

    st.emit("smoke", "smoke prompts at temperature 0")
    st.phase = "smoke"
    for sp in prompts.SMOKE if st.runs("smoke") else ():
        req = ChatRequest(st.model, sp.prompt, cfg.smoke_max_tokens, 0.0, thinking=False)
        s = await client.chat(
            req,
            SampleTag("smoke", sp.name, 1, st.t0),
            keep_text=True,
            stall=cfg.token_timeout(),
        )
        st.samples.append(s)
        st.art.sample(s)
        st.smoke.append(SmokeResult(sp.name, sp.expect, s, cfg.smoke_max_tokens))
        await stall_seen(client, st, s, "smoke")
    smoke_check = check_smoke(
        cfg.check("smoke"), CheckContext(Evidence(readiness=ready, smoke=tuple(st.smoke)), cfg)
    )
    stop_after_smoke = smoke_check.outcome is Outcome.FAIL and not cfg.check("smoke").observe_only

    st.load_ran = not cfg.smoke_only and not stop_after_smoke and ident.reachable and not st.halt
    if st.load_ran:
        await _load(client, st, ident)
        if st.runs("load"):
            await loop_references(client, st)
        if st.runs("capabilities") and not st.crash and not st.halt:
            # After the load (a wedge or crash in it is the load's finding), one request at a time.
            st.phase = "capabilities"
            st.capabilities = await probe_capabilities(client, cfg.plan, st.model,
                                                       cfg.request_timeout, st.emit)
        await answer_set(client, st)
    return await _finish(client, st)


async def _finish(client: Client, st: SoakState) -> Evidence:
    """The container's state and /health after the load, then the evidence."""
    target = st.target
    st.phase = "the end of the soak"
    if target.container is not None and not st.container_error and st.runs("container"):
        try:
            st.container_after = await container_state(target)
        except FleetError as e:
            st.container_error = e.cause
    if not st.crash:
        probe = await client.get("/health", timeout=5.0)
        if probe.state in ("refused", "unreachable"):
            st.crash = await diagnose_crash(client, st, 0, "the end of the soak")
    return evidence(st)


def evidence(st: SoakState, final: bool = True) -> Evidence:
    """Everything ``st`` gathered as Evidence (also after a hard deadline stopped the soak
    midway)."""
    assert st.ready is not None
    return (
        Evidence(
            readiness=st.ready,
            identity=st.ident,
            smoke=tuple(st.smoke),
            levels=tuple(st.levels),
            windows=tuple(_with_foreign(st.windows, st.samples)),
            load_ran=st.load_ran,
            crash=st.crash,
            container_before=st.container_before,
            container_after=st.container_after,
            container_error=st.container_error,
            has_container=st.target.container is not None,
            spec_seen=st.spec_seen,
            scrape_errors=tuple(st.scrape_errors),
            host=st.target.name,
            canaries=tuple(st.canaries),
            long_decode=st.long_decode,
            prompt_sizes=dict(st.prompt_sizes),
            cache_block_tokens=st.cache_block_tokens,
            garbage_samples=tuple(
                s
                for s in st.samples
                if s.garbage and s.phase in _CHECKED_PHASES and not s.cls.startswith("canary-")
            ),
            streams_checked=sum(1 for s in st.samples if s.phase in _CHECKED_PHASES and s.events),
            halted=st.halt,
            deadline_hit=st.deadline_hit,
            wedges=tuple(st.wedges),
            token_timeout=st.config.token_timeout(),
            streams_timed=sum(1 for s in st.samples if s.events or s.error_kind == "stall"),
            loops=tuple(st.loops),
            loops_unjudged=st.loops_unjudged,
            long_prompts=tuple(st.long_prompts),
            answers=tuple(st.answers),
            capabilities=st.capabilities,
        )
        if final
        else Evidence(
            readiness=st.ready,
            identity=st.ident,
            container_before=st.container_before,
            container_error=st.container_error,
            has_container=st.target.container is not None,
            host=st.target.name,
        )
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


async def _load(client: Client, st: SoakState, ident: Identity) -> None:
    """The load phases in order, until one crashes the server or halts the soak."""
    steps = (_references, _classes, _long_context, _sweep, _rates, long_decode, long_prompts,
             sustained)
    for step in steps:
        if step in _LOAD_STEPS and not st.runs("load"):
            continue
        await step(client, st, ident)
        if st.crash or st.halt:
            return


async def _references(client: Client, st: SoakState, ident: Identity) -> None:
    """The canaries' c=1 answers, which the canaries under load must repeat."""
    await canary_references(client, st)


async def _classes(client: Client, st: SoakState, ident: Identity) -> None:
    """4. one class at a time at c=1: per-class acceptance needs a window of its own."""
    cfg = st.config
    for cls in (c for c in cfg.classes if c != "long_context"):
        plan = LevelPlan("classes", cls, 1, cfg.class_requests, cfg.level_timeout, (cls,))
        await windowed(client, st, cls, "classes",
                       lambda plan=plan: run_requests(client, st, plan))  # type: ignore[misc]
        if st.crash or st.halt:
            return


async def _long_context(client: Client, st: SoakState, ident: Identity) -> None:
    """The long-context class at c=1, its prompt sized in tokens to fit the model."""
    cfg = st.config
    if "long_context" not in cfg.classes:
        return
    st.chars_per_token = estimate_chars_per_token(
        [s for s in st.samples if s.phase == "classes"],
        lambda s: prompts.prompt_for(s.cls, 0))
    tokens = cfg.long_context_tokens
    if ident.max_model_len:
        # Room for the answer and the chat template: the prompt must never overflow the model.
        tokens = min(tokens, ident.max_model_len - cfg.max_tokens - 64)
    chars, _, how = await sized(client, st, tokens, long_text)
    await windowed(
        client,
        st,
        "long_context",
        "classes",
        lambda: run_requests(
            client,
            st,
            LevelPlan("classes", "long_context", 1, cfg.class_requests, cfg.level_timeout,
                      ("long_context",), long_chars=chars),
        ),
    )
    measured = [s.prompt_tokens for s in st.samples if s.cls == "long_context" and s.prompt_tokens]
    st.prompt_sizes["long_context"] = (
        tokens,
        int(statistics.median(measured)) if measured else None,
        how,
    )


async def _sweep(client: Client, st: SoakState, ident: Identity) -> None:
    """5. the concurrency sweep, each level in its trials (merged into one)."""
    cfg = st.config
    for c in cfg.concurrency:
        for _trial in range(cfg.trials):
            await windowed(
                client,
                st,
                f"c={c}",
                "sweep",
                lambda c=c: run_requests(  # type: ignore[misc]
                    client,
                    st,
                    LevelPlan("sweep", f"c={c}", c, cfg.level_requests(c), cfg.level_timeout,
                              prompts.SHORT_CLASSES, canaries=True),
                ),
            )
            if st.crash or st.halt:
                break
        merge_trials(st, f"c={c}", c)
        if st.crash or st.halt:
            return


async def _rates(client: Client, st: SoakState, ident: Identity) -> None:
    """Open-loop arrivals at each of the configured request rates."""
    cfg = st.config
    for rate in cfg.request_rates:
        await windowed(
            client,
            st,
            f"r={rate:g}/s",
            "rate",
            lambda rate=rate: open_loop(  # type: ignore[misc]
                client,
                st,
                rate,
                requests=cfg.level_requests(max(1, round(rate))),
                seconds=cfg.level_timeout,
            ),
        )
        if st.crash or st.halt:
            return


#: The load steps: run when a registered, enabled check needs the ``load`` probe (the canaries,
#: the long decode and the long prompts are probes of their own).
_LOAD_STEPS = frozenset({_classes, _long_context, _sweep, _rates, sustained})


@dataclass(frozen=True)
class Against:
    """What a soak is compared with (each may be missing).

    ``baseline``: the last passing verdict of the previously serving tag on the same host
    (throughput is compared with it). ``reference``: the last known-good version's reference set
    (soak/references.py; None: a first deploy); ``side``: the same prompts being asked of a host
    still on the old version (rollout/side_by_side.py), awaited after the load.
    """

    baseline: Verdict | None = None
    reference: ReferenceSet | None = None
    side: Future[ReferenceSet | None] | None = None


def run_soak(target: SoakTarget, config: SoakConfig, against: Against | None = None,
             progress: Progress = NULL, *, artifacts_dir: Path | None = None,
             run_id: str | None = None) -> Verdict:
    """Soak ``target`` and return the verdict (never raises for a bad server: that is the verdict).

    ``against``: the baseline, the known-good reference set and the side-by-side answers it is
    compared with (:class:`Against`; None: none of them). ``artifacts_dir``: where samples,
    scrapes and verdict.json go (created). With ``config.smoke_only`` only
    readiness, identity and smoke run: a rollback's quick check.
    """
    secrets.validate_endpoint(target.base_url, f"{target.name}: the soak's URL", strict=False)
    against = against or Against()
    baseline, reference, side = against.baseline, against.reference, against.side
    scrub = secrets.Scrubber(secrets.known_secrets(target.api_key, target.base_url))
    target = secrets.scrubbed_target(target, scrub)
    progress = secrets.scrubbed_progress(progress, scrub)
    run_id = run_id or new_run_id("soak", target.name)
    started = datetime.now(UTC)
    t0 = time.monotonic()
    art = Artifacts(artifacts_dir)
    art.write_json("config.json", to_dict(config))
    st = SoakState(
        target,
        config,
        progress,
        art,
        t0,
        phases=planned_phases(config),
        baseline_tok_s={
            lv.label: lv.tok_s
            for lv in (baseline.levels if baseline else ())
            if lv.tok_s is not None
        },
    )

    limit, how = config.hard_deadline()
    st.emit("deadline", f"hard deadline {limit:.0f}s ({how})", deadline=round(limit))

    async def go() -> Evidence:
        conns = max((*config.concurrency, config.sustained_concurrency, 1)) + 8
        async with Client(
            target.base_url,
            connections=conns,
            request_timeout=config.request_timeout,
            api_key=target.api_key,
            scrub=scrub,
        ) as c:
            try:
                async with asyncio.timeout(limit):
                    return await _soak(c, st)
            except TimeoutError:
                # Whatever phase it was in: no server holds the controller past the deadline.
                st.deadline_hit = True
                st.halt = (
                    st.halt
                    or f"the soak reached its hard deadline of {limit:.0f}s during {st.phase}"
                )
                st.emit("deadline", st.halt)
                if st.ready is None:
                    st.ready = Readiness(Outcome.ERROR, st.halt, limit)
                return evidence(st)

    try:
        ev = asyncio.run(go())
    finally:
        art.close()
    baseline_note = ""
    if baseline is not None and baseline.fingerprint != config.fingerprint():
        baseline_note = (
            f"baseline {baseline.run_id} not compared: made by another soak config "
            f"(fingerprint {baseline.fingerprint or 'none'}, this soak {config.fingerprint()})"
        )
        baseline = None
    results = evaluate(CheckContext(ev, config, baseline, baseline_note, reference,
                                    _label(target), _side(side)))
    outcome = overall(results)
    deciding = [c for c in results if c.outcome is outcome and not c.observe_only]
    summary = outcome.value if outcome is Outcome.PASS else f"{outcome.value}: " + "; ".join(
        f"{c.name}: {c.message}" for c in deciding[:2])
    if outcome is Outcome.PASS:
        sweep = [lv for lv in ev.levels if lv.phase == "sweep" and lv.tok_s]
        peak = max(sweep, key=lambda lv: lv.tok_s or 0.0) if sweep else None
        summary = "pass: " + ", ".join(
            x
            for x in (
                f"{sum(lv.requests for lv in ev.levels)} requests, 0 errors"
                if ev.load_ran
                else "smoke only",
                f"peak {peak.tok_s:.0f} tok/s at {peak.label}" if peak and peak.tok_s else "",
                f"acceptance {pct(_acceptance(ev.windows))}"
                if _acceptance(ev.windows) is not None
                else "",
            )
            if x
        )
    ok = [s for s in st.samples if s.ok and s.phase in ("sweep", "sustained", "classes")]
    verdict = Verdict(
        run_id=run_id,
        target=target.name,
        base_url=target.base_url,
        outcome=outcome,
        summary=summary,
        started=started.isoformat(timespec="seconds"),
        finished=datetime.now(UTC).isoformat(timespec="seconds"),
        seconds=round(time.monotonic() - t0, 2),
        tag=target.tag,
        digest=target.digest,
        profile=config.profile,
        artifacts_dir=str(artifacts_dir) if artifacts_dir else None,
        version=ev.identity.version if ev.identity else "",
        served_models=ev.identity.models if ev.identity else (),
        checks=results,
        levels=ev.levels,
        windows=ev.windows,
        baseline_run_id=baseline.run_id if baseline else "",
        fingerprint=config.fingerprint(),
        ttft_samples=tuple(round(s.ttft, 5) for s in ok if s.ttft is not None)[:MAX_DIST_SAMPLES],
        tpot_samples=tuple(round(s.tpot, 6) for s in ok if s.tpot is not None)[:MAX_DIST_SAMPLES],
        answers=ev.answers,
        known_good_run_id=reference.run_id if reference else "",
    )
    verdict = scrub.tree(verdict)
    art.write_json("verdict.json", to_dict(verdict))
    progress(Event("done", verdict.summary, host=target.name, data={"outcome": outcome.value}))
    return verdict


def _side(side: Future[ReferenceSet | None] | None) -> ReferenceSet | None:
    """The old-version host's answers, once asked (None when there is none or asking failed)."""
    try:
        return side.result() if side is not None else None
    except Exception:  # a peer that could not be asked leaves the ledger's set alone
        return None


def _label(target: SoakTarget) -> str:
    """The version under test for messages: tag (short digest), or the host."""
    short = target.digest.split(":")[-1][:12] if target.digest else ""
    name = target.tag or target.name
    return f"{name} ({short})" if short else name


def _acceptance(windows: Sequence[Window]) -> float | None:
    # Windows whose spec-decode counters were impossible have no accepted figure: left out whole.
    ok = [w for w in windows if w.accepted_tokens is not None]
    acc = [w.accepted_tokens for w in ok if w.accepted_tokens is not None]
    dt = [w.draft_tokens for w in ok if w.draft_tokens]
    return sum(acc) / sum(dt) if acc and dt and sum(dt) else None


def smoke_check(
    target: SoakTarget, config: SoakConfig, progress: Progress = NULL, **kw: Any
) -> Verdict:
    """Readiness, identity and smoke only, no load: the quick check after a rollback."""
    return run_soak(target, replace(config, smoke_only=True), None, progress, **kw)
