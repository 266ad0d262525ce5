"""What one soak gathers while it runs (SoakState), the phases it plans, and what every phase's
requests go through: canaries, the stall watch, a crash's diagnosis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetctl.container import Container
from fleetctl.errors import FleetError
from fleetctl.progress import Event, Progress
from fleetctl.soak import prompts
from fleetctl.soak.answerset import Answer
from fleetctl.soak.artifacts import Artifacts
from fleetctl.soak.capabilities.exchange import CapabilityRun
from fleetctl.soak.checks.evidence import (
    CanaryResult,
    Identity,
    LongPrompt,
    LoopResult,
    SmokeResult,
    Wedge,
)
from fleetctl.soak.checks.registry import REGISTRY
from fleetctl.soak.client import ChatRequest, Client, SampleTag
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


#: The soak's phases in the order it runs them: each progress event of one of them says which it is
#: (``step`` of ``steps``), so that a display can show "phase k of n" and the time so far.
SOAK_PHASES = (
    "readiness",
    "identity",
    "smoke",
    "canary",
    "classes",
    "sweep",
    "rate",
    "long_decode",
    "sustained",
)


def probes_for(cfg: SoakConfig) -> frozenset[str]:
    """The probes a soak with ``cfg`` runs: those the registered, enabled checks it judges need
    (a smoke-only soak judges only the smoke checks)."""
    return REGISTRY.needed(cfg.checks, lambda c: c.smoke or not cfg.smoke_only)


def planned_phases(cfg: SoakConfig) -> tuple[str, ...]:
    """The phases a soak with ``cfg`` will run (a crash or a failed smoke ends it sooner)."""
    probes = probes_for(cfg)
    if cfg.smoke_only:
        return tuple(p for p in SOAK_PHASES[:3] if p != "smoke" or "smoke" in probes)
    spec = cfg.check("correctness")
    load = "load" in probes
    present = {
        "smoke": "smoke" in probes,
        "canary": bool(canary_every(cfg)),
        "classes": load and bool(cfg.classes),
        "sweep": load and bool(cfg.concurrency),
        "rate": load and bool(cfg.request_rates),
        "long_decode": spec.enabled and int(spec.params.get("long_decode_tokens", 0)) > 0,
        "sustained": load and cfg.sustained_duration > 0,
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
    #: The baseline's tok/s per level label (the last passing verdict of the tag served before),
    #: shown next to the running figure while a level runs; the verdict's throughput check judges
    #: it.
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
    #: The reference set's greedy answers (soak/answerset.py).
    answers: list[Answer] = field(default_factory=list)
    #: The capability probes' runs (soak/capabilities/probes.py).
    capabilities: tuple[CapabilityRun, ...] = ()

    def runs(self, probe: str) -> bool:
        """Whether this soak runs ``probe`` (a registered, enabled check needs it)."""
        return probe in probes_for(self.config)

    def looped(self, s: Sample, req: ChatRequest, where: str) -> None:
        """Note an answer that ended in a phrase loop (judged after the load against a
        reference)."""
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
    """After a request that got no token for the liveness bound: a wedged engine when /health
    answers.

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


async def canary(client: Client, st: SoakState, cp: prompts.SmokePrompt, phase: str, level: str,
                  concurrency: int) -> Sample:
    """One greedy canary (thinking off), judged later against its answer and its c=1 answer."""
    spec = st.config.check("correctness")
    req = ChatRequest(
        st.model, cp.prompt, int(spec.params.get("canary_max_tokens", 64)), 0.0, thinking=False
    )
    s = await client.chat(
        req,
        SampleTag(phase, f"canary-{cp.name}", concurrency, st.t0),
        keep_text=True,
        stall=st.config.token_timeout(),
    )
    st.samples.append(s)
    st.art.sample(s)
    st.canaries.append(CanaryResult(cp.name, cp.expect, level, s, st.canary_refs.get(cp.name)))
    await stall_seen(client, st, s, f"canary {cp.name} at {level}")
    return s


def canary_every(cfg: SoakConfig) -> int:
    """Every how many load requests one is a greedy canary (0: the canaries probe does not run)."""
    if "canaries" not in probes_for(cfg):
        return 0
    return int(cfg.check("correctness").params.get("canary_every", 0))


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
