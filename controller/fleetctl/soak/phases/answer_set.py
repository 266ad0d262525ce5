"""The reference set's phase: each fixed prompt once, greedy with a fixed seed, free to stop.

Its answers (``soak/answerset.py``) are judged against the last known-good version's by the
``known_good`` check, and a passing full soak's answers become the recipe's next known-good.
Asked after the load, ``concurrency`` at a time (1 by default: greedy answers that do not depend
on the batch), each bounded by the soak's request timeout scaled to its length.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from fleetctl.progress import NULL, Progress
from fleetctl.soak.answerset import SEED, Answer, RefPrompt, reference_prompts
from fleetctl.soak.artifacts import Artifacts
from fleetctl.soak.client import ChatRequest, Client, SampleTag
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.loops import find_loop
from fleetctl.soak.phases.soak_state import SoakState, stall_seen
from fleetctl.soak.verdict import Sample, SoakTarget


def answer_of(p: RefPrompt, s: Sample, max_tokens: int) -> Answer:
    """One reference prompt's sample as an :class:`Answer` (its loop found on the whole text)."""
    text = s.text or ""
    loop = find_loop(text) if s.ok else None
    return Answer(
        id=p.id, kind=p.kind, prompt=p.prompt, text=text,
        finish_reason=(s.finish_reason or "") if s.ok else "",
        tokens=int(s.output_tokens or 0), max_tokens=max_tokens,
        loop=loop.describe() if loop else "", loop_phrase=loop.phrase if loop else "",
        expect=p.expect, error="" if s.ok else (s.error or s.error_kind or "failed"),
    )


def planned(st: SoakState) -> tuple[RefPrompt, ...]:
    """The prompts this soak's config asks (none when the check is off)."""
    spec = st.config.check("known_good")
    if not st.runs("answer_set"):
        return ()
    ld = st.config.check("long_decode")
    window = int(ld.params.get("window_tokens", 0) or 0) if ld.enabled else 0
    return reference_prompts(int(spec.params.get("prompts_per_class", 1) or 0), window)


async def answer_set(client: Client, st: SoakState) -> None:
    """Ask the reference set; the answers go to ``st.answers`` in the set's order."""
    todo = planned(st)
    if not todo or st.halt or st.crash:
        return
    spec = st.config.check("known_good")
    max_tokens = int(spec.params.get("max_tokens", 1024) or 1024)
    st.phase = "the reference answers"
    st.emit("answers", f"{len(todo)} greedy reference answers (seed {SEED}) for the known-good "
            "comparison")
    gate = asyncio.Semaphore(max(1, int(spec.params.get("concurrency", 1) or 1)))

    async def one(p: RefPrompt) -> Answer:
        n = p.max_tokens or max_tokens
        req = ChatRequest(st.model, p.prompt, n, 0.0, thinking=False, seed=SEED)
        async with gate:
            s = await client.chat(
                req,
                SampleTag("answers", p.id, 1, st.t0),
                keep_text=True,
                timeout=max(st.config.request_timeout, n / 10),
                stall=st.config.token_timeout(),
            )
        st.samples.append(replace(s, text=None))
        st.art.sample(s)
        await stall_seen(client, st, s, f"the reference answer {p.id}")
        return answer_of(p, s, n)

    st.answers.extend(await asyncio.gather(*(one(p) for p in todo)))


def collect(target: SoakTarget, config: SoakConfig,
            progress: Progress = NULL) -> tuple[Answer, ...]:
    """The reference set asked of ``target`` alone (no load, no judging): what a host still on the
    old version answers, side by side with a canary's soak. Bounded by the config's request
    timeouts; a server that does not answer gives failed answers, never an exception."""
    model = config.model or (config.served_model_names[0] if config.served_model_names else "")

    async def go() -> tuple[Answer, ...]:
        st = SoakState(target, config, progress, Artifacts(None), time.monotonic(), model=model)
        async with Client(target.base_url, connections=8, request_timeout=config.request_timeout,
                          api_key=target.api_key) as client:
            await answer_set(client, st)
        return tuple(st.answers)

    return asyncio.run(go())
