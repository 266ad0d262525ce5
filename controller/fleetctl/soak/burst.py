"""A short burst of load: a few seconds of concurrent greedy requests and the canaries, judged on
their own (no baseline, no ramp, no sweep). ``fleetctl watch --remediate``'s re-gate after smoke
(``watch.gate``): the restarted engine must take concurrent requests, stream tokens on every one,
fail none, and answer each canary right.

Bounded: ``concurrency`` workers start requests until ``seconds`` have passed; each request has the
soak's byte cap, its request timeout and the liveness bound (no token for ``token_timeout`` ends
it as a stall), and the whole burst is cut at ``seconds`` plus one such bound. Samples go to the
artifacts as they come; in memory: this burst's samples (a few seconds' worth).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from fleetctl.progress import NULL, Event, Progress
from fleetctl.soak import prompts, secrets
from fleetctl.soak.artifacts import Artifacts
from fleetctl.soak.checks.registry import REGISTRY
from fleetctl.soak.checks.watching import Burst
from fleetctl.soak.client import ChatRequest, Client, SampleTag
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.phases.summary import LevelKey, summarize
from fleetctl.soak.verdict import CheckResult, Outcome, Sample, SoakTarget, Verdict, to_dict

#: Requests in flight at once, and the tokens each greedy request asks for.
CONCURRENCY = 4
MAX_TOKENS = 32
#: The burst's prompts: prose (every answer streams ``MAX_TOKENS`` or stops at its end).
PROMPTS = prompts.PROMPTS["natural_language"]


def short_load(target: SoakTarget, config: SoakConfig, seconds: float,
               concurrency: int = CONCURRENCY, artifacts_dir: Path | None = None,
               progress: Progress = NULL) -> Verdict:
    """``seconds`` of ``concurrency`` concurrent greedy requests, the canaries among them; a
    verdict whose checks are the registered checks' burst sides: ``load`` (no request failed),
    ``liveness`` (no stall), ``tokens`` (every finished request streamed tokens) and ``canary``
    (each answered right)."""
    scrub = secrets.Scrubber(secrets.known_secrets(target.api_key, target.base_url))
    art = Artifacts(artifacts_dir)
    started, t0 = datetime.now(UTC), time.monotonic()
    progress(Event("load", f"{seconds:g}s of {concurrency} concurrent greedy requests and "
                   f"{len(prompts.CANARIES)} canaries", host=target.name))
    try:
        samples, cut, health_ok = asyncio.run(
            _burst(target, config, _Plan(seconds, concurrency, t0), scrub, art))
    finally:
        art.close()
    took = time.monotonic() - t0
    checks = _judge(Burst(target.name, config, tuple(samples), cut, health_ok))
    bad = [c for c in checks if c.outcome is not Outcome.PASS]
    outcome = Outcome.FAIL if bad else Outcome.PASS
    level = summarize(LevelKey("load", f"c{concurrency}", concurrency), samples, took)
    v = Verdict(
        run_id=f"load/{target.name}", target=target.name, base_url=target.base_url,
        outcome=outcome,
        summary=(f"fail: {bad[0].name}: {bad[0].message}" if bad else
                 f"pass: {level.requests} requests in {took:.1f}s at concurrency {concurrency}, "
                 f"{level.output_tokens} tokens"),
        started=started.isoformat(timespec="seconds"),
        finished=datetime.now(UTC).isoformat(timespec="seconds"), seconds=round(took, 2),
        tag=target.tag, digest=target.digest, profile=f"load/{config.profile}",
        artifacts_dir=str(artifacts_dir) if artifacts_dir else None, checks=checks,
        levels=(level,))
    v = scrub.tree(v)
    art.write_json("verdict.json", to_dict(v))
    progress(Event("load", v.summary, host=target.name, data={"outcome": outcome.value}))
    return v


@dataclass(frozen=True)
class _Plan:
    """How long the burst sends, how many requests at once, and its clock's zero."""

    seconds: float
    concurrency: int
    t0: float


async def _burst(t: SoakTarget, cfg: SoakConfig, plan: _Plan, scrub: secrets.Scrubber,
                 art: Artifacts) -> tuple[list[Sample], bool, bool]:
    """The burst's samples (canaries' text kept), whether its bound cut it, and whether /health
    answered 200 after a request stalled (the liveness rule tells a wedge from a server down)."""
    seconds, concurrency, t0 = plan.seconds, plan.concurrency, plan.t0
    stall = cfg.token_timeout()
    end = time.monotonic() + seconds
    samples: list[Sample] = []
    canary_tokens = int(cfg.check("correctness").params.get("canary_max_tokens", 64))
    async with Client(t.base_url, connections=concurrency + 1, request_timeout=cfg.request_timeout,
                      api_key=t.api_key, scrub=scrub) as c:
        model = cfg.model or (cfg.served_model_names[0] if cfg.served_model_names else "")
        if not model:
            _p, models = await c.get_json("/v1/models")
            data = models.get("data", []) if isinstance(models, dict) else []
            model = next((str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")), "")

        async def ask(prompt: str, cls: str, tokens: int, keep: bool) -> None:
            s = await c.chat(
                ChatRequest(model, prompt, tokens, 0.0, thinking=False),
                SampleTag("load", cls, concurrency, t0),
                keep_text=keep,
                stall=stall,
            )
            samples.append(s)
            art.sample(s)

        async def worker(w: int) -> None:
            # The first worker asks the canaries first, then greedy prose like the others.
            if w == 0:
                for cp in prompts.CANARIES:
                    await ask(cp.prompt, f"canary-{cp.name}", canary_tokens, True)
            i = w
            while time.monotonic() < end:
                await ask(PROMPTS[i % len(PROMPTS)], "greedy", MAX_TOKENS, False)
                i += concurrency

        bound = seconds + (stall or cfg.request_timeout) + 10.0
        cut = False
        try:
            async with asyncio.timeout(bound):
                await asyncio.gather(*(worker(w) for w in range(concurrency)))
        except TimeoutError:
            cut = True
        health = (await c.get("/health", timeout=5.0)
                  if any(s.error_kind == "stall" for s in samples) else None)
    return samples, cut, health is not None and health.ok


def _judge(b: Burst) -> tuple[CheckResult, ...]:
    """The registered checks' burst sides, in report order (messages cut at 300 characters)."""
    out = [r for c in REGISTRY.checks() if c.burst is not None for r in c.burst(b)]
    return tuple(replace(r, message=r.message[:300]) for r in out)
