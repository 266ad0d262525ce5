"""The soak's load phases: identity, canaries, prompt classes, the concurrency sweep and its trials,
open-loop rates, the long decode, long-context prompts sized in tokens, and the sustained phase;
what they gather is kept in ``SoakState``.

The phases live here and ``run.py`` orders them; beside them ``soak_state`` (SoakState, canaries,
stalls, crashes), ``levels`` (the request runner), ``summary`` (a level's figures) and ``sizing``
(prompts sized in tokens). Import each name from its module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import replace

from fleetctl.soak import metrics, prompts
from fleetctl.soak.checks.evidence import Identity, LongPrompt, LoopResult
from fleetctl.soak.client import ChatRequest, Client, SampleTag
from fleetctl.soak.phases.levels import (
    LevelPlan,
    run_requests,
)
from fleetctl.soak.phases.sizing import (
    context_text,
    shared_prefix_tokens,
    sized,
)
from fleetctl.soak.phases.soak_state import (
    SoakState,
    canary,
    canary_every,
    diagnose_crash,
    stall_seen,
)
from fleetctl.soak.verdict import (
    Sample,
    SoakTarget,
)


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
    """One /metrics scrape (None: it failed, or no check this soak judges reads /metrics)."""
    if not st.runs("metrics"):
        return None
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
    tokens = cfg.long_decode_tokens() if st.runs("long_decode") else 0
    if ident.max_model_len:
        tokens = min(tokens, ident.max_model_len - 512)  # room for the prompt and the template
    if tokens <= 0:
        return
    probe = cfg.check("long_decode").enabled
    st.emit(
        "long_decode",
        f"one decode of {tokens} tokens" + (" (windows checked, needle asked)" if probe else ""),
    )
    prompt = prompts.LONG_DECODE_PROMPT if probe else prompts.prompt_for("prose", 0)
    req = ChatRequest(
        st.model, prompt, tokens, cfg.temperature, thinking=cfg.thinking, ignore_eos=True
    )
    # A deadline scaled to the length (>= 10 tok/s), never below the per-request one.
    st.phase = "the long decode"
    # Its text is kept (bounded by the stream's byte cap) for the probe's windows.
    s = await client.chat(
        req,
        SampleTag("long_decode", "prose", 1, st.t0),
        timeout=max(cfg.request_timeout, tokens / 10),
        stall=cfg.token_timeout(),
        keep_text=probe,
        delta_ends=probe,
    )
    st.samples.append(s)
    st.art.sample(replace(s, delta_ends=()))
    st.long_decode = s
    st.looped(s, req, "long_decode")
    await stall_seen(client, st, s, "the long decode")
    if s.error_kind == "connect":
        st.crash = st.crash or await diagnose_crash(client, st, 1, "the long decode")


async def sustained(client: Client, st: SoakState, ident: Identity) -> None:
    cfg = st.config
    if cfg.sustained_duration <= 0:
        return
    scrapes: list[metrics.Scrape] = []
    first = await scrape(client, st, "sustained-start")
    if first is not None:
        scrapes.append(first)
    done = asyncio.Event()
    if first is not None:
        st.cache_block_tokens = metrics.cache_block_tokens(first)
    context = await _shared_context(client, st, ident)
    task = asyncio.create_task(_scrape_windows(client, st, scrapes, done))
    probes = asyncio.create_task(trickle(client, st, done))
    try:
        await run_requests(
            client,
            st,
            LevelPlan("sustained", "sustained", cfg.sustained_concurrency,
                      cfg.sustained_max_requests, cfg.sustained_duration, prompts.SHORT_CLASSES,
                      canaries=True, context=context),
        )
    finally:
        done.set()
        await task
        await probes
    # Renumber so labels are consecutive whatever ran in between.
    rest = [w for w in st.windows if w.phase != "sustained"]
    sus = [
        replace(w, label=f"sustained #{i + 1}")
        for i, w in enumerate(w for w in st.windows if w.phase == "sustained")
    ]
    st.windows[:] = rest + sus


async def _scrape_windows(client: Client, st: SoakState, scrapes: list[metrics.Scrape],
                          done: asyncio.Event) -> None:
    """Scrape /metrics every window of the sustained phase until ``done``: one Window per pair."""
    n = 0
    while not done.is_set():
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=st.config.window)
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


async def _shared_context(client: Client, st: SoakState, ident: Identity) -> str:
    """The context the sustained phase's conversations share ("" for none), sized in tokens past
    the server's prefix-cache block."""
    cfg = st.config
    tokens = shared_prefix_tokens(
        cfg.shared_prefix_tokens,
        st.cache_block_tokens,
        ident.max_model_len,
        cfg.max_tokens,
        cfg.turns,
    )
    if not tokens:
        return ""
    chars, got, how = await sized(client, st, tokens, context_text)
    if how != "estimate":
        # Sized by /tokenize, or by the estimate because its answers were not believed: either
        # way the acceptance check says how (the latter as inconclusive, with no count).
        st.prompt_sizes["shared_prefix"] = (tokens, got if how == "tokenize" else None, how)
    raised = (
        f", raised from {cfg.shared_prefix_tokens} past the server's {st.cache_block_tokens}-token "
        "cache block"
        if tokens != cfg.shared_prefix_tokens
        else ""
    )
    st.emit("sustained", f"conversations share a {tokens}-token context (sized by {how}{raised})")
    return context_text(chars)


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
        s = await client.chat(req, SampleTag("probe", f"probe-{n}", 1, st.t0), stall=bound)
        st.samples.append(s)
        st.art.sample(s)
        await stall_seen(client, st, s, "sustained (liveness probe)")


#: Tokens a long-prompt probe's answer may take (the code, said briefly) and the template's room.
LONG_PROMPT_ANSWER = 48


async def long_prompts(client: Client, st: SoakState, ident: Identity) -> None:
    """One request per configured size: a fact hidden mid-prompt, asked for at the end (greedy)."""
    cfg = st.config
    for tokens in cfg.long_prompt_tokens() if st.runs("long_prompts") else ():
        if st.halt or st.crash:
            return
        if ident.max_model_len and tokens + LONG_PROMPT_ANSWER + 64 > ident.max_model_len:
            st.long_prompts.append(
                LongPrompt(tokens, skipped=f"max_model_len {ident.max_model_len}")
            )
            continue
        st.phase = f"the long prompt of {tokens} tokens"
        chars, _got, how = await sized(client, st, tokens, prompts.needle_prompt)
        st.emit(
            "long_prompts",
            f"a {tokens}-token prompt (sized by {how.split(' ')[0]}) with a fact in its middle",
        )
        req = ChatRequest(
            st.model, prompts.needle_prompt(chars), LONG_PROMPT_ANSWER, 0.0, thinking=False
        )
        bound = cfg.token_timeout()
        s = await client.chat(
            req,
            SampleTag("long_prompt", "long_context", 1, st.t0),
            keep_text=True,
            timeout=cfg.long_prompt_timeout(tokens),
            stall=bound + tokens / 500 if bound is not None else None,
        )
        st.samples.append(replace(s, text=None))
        st.art.sample(s)
        st.long_prompts.append(LongPrompt(tokens, how, s))
        await stall_seen(client, st, s, f"the long prompt of {tokens} tokens")
        if s.error_kind == "connect":
            st.crash = st.crash or await diagnose_crash(
                client, st, 1, f"the long prompt of {tokens} tokens"
            )


async def loop_references(client: Client, st: SoakState) -> None:
    """Each looping request once more at c=1, greedy, free to stop (no ignore_eos): its reference.

    A healthy model asked for exactly max_tokens often loops past its natural end; the server is
    at fault only where the same prompt's reference does not loop (answers._judge_loop).
    """
    if not st.loop_candidates:
        return
    st.phase = "loop references"
    st.emit(
        "loops", f"{len(st.loop_candidates)} looping answer(s): running each prompt's c=1 reference"
    )
    for req, (s, where, count) in st.loop_candidates.items():
        if st.halt or st.crash:
            break
        ref_req = replace(req, temperature=0.0, ignore_eos=False)
        timeout = max(st.config.request_timeout, req.max_tokens / 10)
        ref = await client.chat(
            ref_req,
            SampleTag("reference", s.cls, 1, st.t0),
            keep_text=True,
            timeout=timeout,
            stall=st.config.token_timeout(),
        )
        st.samples.append(replace(ref, text=None))
        st.art.sample(ref)
        st.loops.append(LoopResult(s, where, ref, count))
        await stall_seen(client, st, ref, f"the loop reference of {where}")


