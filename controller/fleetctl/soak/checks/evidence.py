"""What one soak observed, as the checks read it: the engine builds an Evidence, the checks
judge it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetctl.container import Container
from fleetctl.soak.answerset import Answer
from fleetctl.soak.capabilities.exchange import CapabilityRun
from fleetctl.soak.verdict import (
    LevelSummary,
    Readiness,
    Sample,
    Window,
)


@dataclass(frozen=True)
class Identity:
    """What the server says it is."""

    reachable: bool
    models: tuple[str, ...] = ()
    version: str = ""
    max_model_len: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class SmokeResult:
    """One smoke prompt: the request as measured and what the answer had to contain."""

    name: str
    expect: str
    sample: Sample
    max_tokens: int


@dataclass(frozen=True)
class CanaryResult:
    """One greedy canary: where it ran, what it had to say, and its prompt's answer at c=1."""

    name: str
    expect: str
    #: The level it ran in ("c=16", "sustained") or "reference" for the c=1 reference run.
    level: str
    sample: Sample
    #: The same prompt's text at c=1 (None for the reference itself, or when that failed).
    reference: str | None = None


@dataclass(frozen=True)
class LoopResult:
    """An answer that ended in a phrase loop, and the same prompt's reference answer.

    The reference is the same request at c=1, greedy, without ``ignore_eos`` (the model may stop
    by itself): a loop the reference shares, or one that starts where the reference stopped, is
    the model's, not the server's.
    """

    sample: Sample
    #: Where it ran ("c=16", "sustained", "long_decode").
    where: str
    reference: Sample | None
    #: Answers to this same prompt that looped (the sample is the first).
    count: int = 1


@dataclass(frozen=True)
class LongPrompt:
    """One long-prompt probe: its target size, how it was sized, and the answer (None when
    skipped)."""

    tokens: int
    how: str = ""
    sample: Sample | None = None
    skipped: str = ""


@dataclass(frozen=True)
class Wedge:
    """A request that got no token for the liveness bound while /health answered 200."""

    host: str
    #: The phase or level it ran in ("c=16", "sustained", "the long decode").
    where: str
    #: Seconds the request waited in all (its last token, or its start, was this long before the
    #: end).
    seconds: float
    #: When the request started, seconds into the soak.
    start: float
    detail: str = ""


@dataclass(frozen=True)
class Evidence:
    """Everything one soak observed; the engine builds it, the checks judge it."""

    readiness: Readiness
    identity: Identity | None = None
    smoke: tuple[SmokeResult, ...] = ()
    levels: tuple[LevelSummary, ...] = ()
    windows: tuple[Window, ...] = ()
    #: Phases that were meant to run and did not (crash, readiness failure, smoke-only).
    load_ran: bool = False
    #: Non-empty when the server crashed during the soak: what happened, with the log's cause.
    crash: str = ""
    container_before: Container | None = None
    container_after: Container | None = None
    #: Why container state could not be read (empty when it was, or when there is no access).
    container_error: str = ""
    has_container: bool = False
    #: Whether the server exports spec-decode counters (None: no scrape succeeded).
    spec_seen: bool | None = None
    scrape_errors: tuple[str, ...] = ()
    #: The host (target name), named in correctness findings.
    host: str = ""
    canaries: tuple[CanaryResult, ...] = ()
    #: Load and long-decode samples whose streamed text was flagged as garbage.
    garbage_samples: tuple[Sample, ...] = ()
    #: Load streams whose text was checked (flagged or not).
    streams_checked: int = 0
    #: The soak's one long decode (None when it did not run).
    long_decode: Sample | None = None
    #: Prompts sized in tokens: name -> (target tokens, tokens the server counted,
    #: "tokenize"|"estimate").
    prompt_sizes: Mapping[str, tuple[int, int | None, str]] = field(default_factory=dict)
    #: The server's prefix-cache block in tokens (vllm:cache_config_info), when it states one.
    cache_block_tokens: int | None = None
    #: Why the soak stopped before its end (empty when it ran its course).
    halted: str = ""
    #: True when the hard deadline stopped it.
    deadline_hit: bool = False
    wedges: tuple[Wedge, ...] = ()
    #: The liveness bound the streams were held to (None: not watched).
    token_timeout: float | None = None
    #: Streams watched for liveness.
    streams_timed: int = 0
    #: Looping answers judged against their reference; looping answers left unjudged (past the cap).
    loops: tuple[LoopResult, ...] = ()
    loops_unjudged: int = 0
    long_prompts: tuple[LongPrompt, ...] = ()
    #: The reference set's greedy answers (judged against the known-good's by known_good).
    answers: tuple[Answer, ...] = ()
    #: The capability probes' exchanges (tool calls, reasoning, images, served names).
    capabilities: tuple[CapabilityRun, ...] = ()
