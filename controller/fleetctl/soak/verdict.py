"""What a soak produces: per-request samples, metric windows, checks and the verdict.

Everything here is a frozen dataclass that round-trips through JSON
(:func:`to_dict` / :func:`from_dict`), because a passing verdict is stored as the
next soak's baseline and the rollout records verdicts in its ledger.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, Union, get_args, get_origin, get_type_hints

from fleetctl.container import Container
from fleetctl.soak.answerset import Answer

#: Version of the verdict's JSON shape; a newer one is refused when loading a baseline.
SCHEMA_VERSION = 1


class Outcome(enum.StrEnum):
    """How one measurement, one check or a whole soak came out.

    ``error`` means the soak could not judge (the endpoint is down, a scrape
    failed): not the server's fault as far as we know. ``inconclusive`` means
    data was missing or too thin to decide; it is never a pass.
    ``skipped`` is a check that is disabled or does not apply (no container
    access, no speculative decoding): it does not count toward the verdict.
    """

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"
    SKIPPED = "skipped"


class ContainerAccess(Protocol):
    """Optional access to the container behind an endpoint (e.g. over SSH).

    Lets the soak tell a boot failure from a slow load, name a crash's cause
    from the log and notice restarts. Both methods may raise FleetError.
    """

    def logs(self, tail: int = 50) -> str:
        """The container's last ``tail`` log lines (stdout and stderr)."""
        ...

    def state(self) -> Container:
        """The container's current state (``exists=False`` when it is gone)."""
        ...


@dataclass(frozen=True)
class SoakTarget:
    """One server to soak: a display name (the host), its base URL, optional container access."""

    name: str
    base_url: str
    container: ContainerAccess | None = field(default=None, compare=False)
    #: The image tag being judged (recorded in the verdict and used to key baselines).
    tag: str = ""
    #: Sent as ``Authorization: Bearer`` (vLLM's --api-key / $VLLM_API_KEY); never shown or stored.
    api_key: str | None = field(default=None, repr=False, compare=False)
    #: The image digest being judged (``sha256:...``), shown beside the tag; never a baseline key.
    digest: str = ""


@dataclass(frozen=True)
class Sample:
    """One streamed request as the client saw it (times in seconds)."""

    phase: str
    cls: str
    concurrency: int
    #: Start time relative to the soak's start.
    start: float
    ok: bool
    status: int = 0
    ttft: float | None = None
    e2e: float | None = None
    #: Time per output token after the first, from the usage chunk's completion_tokens.
    tpot: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    events: int = 0
    finish_reason: str | None = None
    #: connect | http | stream_error | timeout | stall (no token for the liveness bound) |
    #: disconnect | protocol | finish (empty when ok).
    error_kind: str = ""
    error: str = ""
    #: The generated text, kept only for smoke prompts and canaries (load text is large).
    text: str | None = None
    #: Why the streamed text is garbage (a run of '!', a repeated token, no text at all), empty
    #: when clean.
    garbage: str = ""
    #: The text around the garbage finding (its last characters), for the verdict and report.
    excerpt: str = ""
    #: Inter-token latency of this stream: median and p99 of the gaps between reads carrying
    #: content.
    itl_p50: float | None = None
    itl_p99: float | None = None
    #: A phrase loop at the end of the answer (soak/loops.py), described; empty when none.
    loop: str = ""
    #: Where the loop starts (characters into the answer) and the answer's length in characters.
    loop_start: int | None = None
    text_chars: int = 0
    #: The text's length after each content delta (the long decode only: its windows are cut by
    #: tokens).
    delta_ends: tuple[int, ...] = ()


@dataclass(frozen=True)
class Window:
    """What /metrics says happened between two scrapes; never lifetime totals."""

    label: str
    phase: str
    start: float
    end: float
    #: d(generation tokens) / seconds.
    generation_tok_s: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    #: d(accepted) / d(draft tokens).
    acceptance_rate: float | None = None
    #: 1 + d(accepted) / d(drafts).
    mean_acceptance_length: float | None = None
    #: d(accepted at position i) / d(drafts), position 0 first.
    per_position: tuple[float, ...] = ()
    success_by_reason: Mapping[str, float] = field(default_factory=dict)
    preemptions: float | None = None
    #: Highest KV-cache usage (0-1) seen in the window's scrapes.
    kv_cache_usage_max: float | None = None
    #: True when a counter went backwards: the server restarted inside the window.
    counter_reset: bool = False
    #: Prompt tokens looked up in / served from the prefix cache (vLLM's prefix_cache_* counters).
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    #: Requests the server finished in the window beyond the soak's own (another client's traffic).
    foreign_requests: float | None = None
    #: Impossible readings, each naming its series ("vllm:...: accepted 290 > draft tokens 250"):
    #: the figures derived from those series are left out (None) and the checks reading them are
    #: inconclusive.
    inconsistent: tuple[str, ...] = ()


@dataclass(frozen=True)
class LevelSummary:
    """Client-side figures of one load level (a concurrency step, a class, the sustained phase)."""

    phase: str
    label: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    #: Aggregate output tokens per second over the level's wall time.
    tok_s: float | None = None
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    ttft_p99: float | None = None
    tpot_p50: float | None = None
    tpot_p95: float | None = None
    e2e_p50: float | None = None
    e2e_p95: float | None = None
    e2e_p99: float | None = None
    #: Inter-token latency: the median of the requests' medians, and the p99 of their p99s.
    itl_p50: float | None = None
    itl_p99: float | None = None
    #: tok/s of each trial when the level ran several (``tok_s`` is then their median).
    trials: tuple[float, ...] = ()
    #: Requests left out of the latency percentiles as warm-up (each worker's first).
    warmup: int = 0
    #: With SLOs in the soak config: the share of requests meeting every one, and those per second.
    slo_met: float | None = None
    goodput_rps: float | None = None
    output_tokens: int = 0
    #: First error message (what an operator reads first), empty when none.
    first_error: str = ""
    #: True when the level stopped early (crash, time bound).
    stopped: str = ""
    #: Greedy canaries run in this level on top of its ``requests`` (not in its figures).
    canaries: int = 0


@dataclass(frozen=True)
class Measurement:
    """One measured value against its bound (one level, one window, one prompt)."""

    label: str
    outcome: Outcome
    message: str
    measured: float | str | None = None
    bound: float | str | None = None


@dataclass(frozen=True)
class CheckResult:
    """One check: its outcome after limits, and the measurements it was decided from."""

    name: str
    outcome: Outcome
    message: str
    observe_only: bool = False
    measurements: tuple[Measurement, ...] = ()


@dataclass(frozen=True)
class Remedied:
    """What ``fleetctl watch --remediate`` did with one breach of a host (``Verdict.remediations``):
    the check and its message, the action (restart, rollback, park, none) and its result."""

    check: str
    cause: str
    action: str
    result: str
    #: The host serves again because of it, re-gated and re-admitted (restarted, or rolled back to
    #: its known-good): the host's failures before it are healed, no longer judged.
    healed: bool = False
    detail: str = ""
    #: Its ledger record (``fleetctl history``), empty when none was written (a dry run, a page).
    id: str = ""


@dataclass(frozen=True)
class Verdict:
    """The result of one soak: the outcome the rollout gates on, and everything behind it."""

    run_id: str
    target: str
    base_url: str
    outcome: Outcome
    summary: str
    started: str
    finished: str
    seconds: float
    tag: str = ""
    profile: str = ""
    #: The image digest judged (``sha256:...``), when known: reports show the tag and its short
    #: digest.
    digest: str = ""
    #: Directory holding samples.jsonl, scrapes/, verdict.json (None when not saved).
    artifacts_dir: str | None = None
    version: str = ""
    served_models: tuple[str, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    levels: tuple[LevelSummary, ...] = ()
    windows: tuple[Window, ...] = ()
    #: The baseline this soak was compared with (run id), empty when none.
    baseline_run_id: str = ""
    #: ``SoakConfig.fingerprint()`` of the config that made this verdict (empty: before
    #: fingerprints).
    fingerprint: str = ""
    #: Latency samples for the report's distributions (seconds), per phase.
    ttft_samples: tuple[float, ...] = ()
    tpot_samples: tuple[float, ...] = ()
    schema: int = SCHEMA_VERSION
    #: Set on a baseline combined from several passing runs: how many, and the spread (robust
    #: standard deviation, 1.4826 x MAD) of each sweep level's tok/s, by level label.
    baseline_runs: int = 1
    baseline_spread: Mapping[str, float] = field(default_factory=dict)
    #: The reference set's greedy answers (soak/answerset.py): a passing full soak's become its
    #: recipe's known-good (soak/references.py).
    answers: tuple[Answer, ...] = ()
    #: The known-good set the answers were compared with (its run id; empty: none, a first deploy).
    known_good_run_id: str = ""
    #: A watch with remediation: each breach handed to it, what was done and how it ended.
    remediations: tuple[Remedied, ...] = ()

    @property
    def passed(self) -> bool:
        """True when the gate passes."""
        return self.outcome is Outcome.PASS

    @property
    def healed(self) -> bool:
        """A watched host that passes because remediations healed its breaches."""
        return self.passed and any(r.healed for r in self.remediations)

    def check(self, name: str) -> CheckResult:
        """The check called ``name`` (KeyError when it did not run)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def level(self, phase: str, label: str) -> LevelSummary | None:
        """The client-side summary of one level, if it ran."""
        for lv in self.levels:
            if lv.phase == phase and lv.label == label:
                return lv
        return None


#: Values :func:`to_dict` returns as they are (by exact type: an enum deriving from str is not one).
_PLAIN = frozenset({str, int, float, bool, type(None)})
#: Per dataclass, the fields :func:`to_dict` writes (looked up once: a soak writes thousands of
#: samples, and ``dataclasses.fields`` per object was a good part of the controller's CPU per host).
_FIELDS: dict[type, tuple[str, ...]] = {}


def to_dict(obj: Any) -> Any:
    """A dataclass tree to plain JSON values."""
    tp = type(obj)
    if tp in _PLAIN:
        return obj
    names = _FIELDS.get(tp)
    if names is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _FIELDS[tp] = tuple(
            f.name for f in dataclasses.fields(obj) if f.compare or f.name != "container"
        )
    if names is not None:
        return {n: to_dict(getattr(obj, n)) for n in names}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        if all(type(v) in _PLAIN for v in obj):  # latency samples: thousands of floats
            return list(obj)
        return [to_dict(v) for v in obj]
    return obj


T = TypeVar("T")


def from_dict(cls: type[T], data: Any) -> T:
    """Rebuild a dataclass tree written by :func:`to_dict` (unknown keys are ignored)."""
    return typing.cast(T, _build(cls, data))


#: Per dataclass, its fields' names and resolved types (``get_type_hints`` evaluates every
#: annotation string each time it is called).
_HINTS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _build(tp: Any, data: Any) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return _build_union(tp, data)
    if origin is tuple:
        return _build_tuple(tp, data)
    if origin in (Mapping, dict) or origin is typing.get_origin(Mapping[str, Any]):
        _k, v_tp = get_args(tp)
        return {str(k): _build(v_tp, v) for k, v in data.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, data)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    return _build_scalar(tp, data)


def _build_union(tp: Any, data: Any) -> Any:
    """The first of the union's types (``None`` apart) that ``data`` fits."""
    if data is None:
        return None
    for a in (a for a in get_args(tp) if a is not type(None)):
        try:
            return _build(a, data)
        except (TypeError, ValueError, KeyError):
            continue
    raise ValueError(f"{data!r} does not fit {tp}")


def _build_tuple(tp: Any, data: Any) -> tuple[Any, ...]:
    (inner, *_rest) = get_args(tp)
    if inner is float and all(type(v) in (int, float) for v in data):  # latency samples
        return tuple(float(v) for v in data)
    return tuple(_build(inner, v) for v in data)


def _build_dataclass(tp: type, data: Any) -> Any:
    if not isinstance(data, Mapping):
        raise TypeError(f"{tp.__name__} needs a mapping")
    fields = _HINTS.get(tp)
    if fields is None:
        hints = get_type_hints(tp)
        fields = _HINTS[tp] = tuple((f.name, hints[f.name]) for f in dataclasses.fields(tp)
                                    if f.init and f.name != "container")
    return tp(**{name: _build(hint, data[name]) for name, hint in fields if name in data})


#: A scalar type, and what a JSON value must be to be read as one (bool is not a number here).
_SCALARS: dict[Any, tuple[tuple[type, ...], str]] = {
    float: ((int, float), "not a number"),
    int: ((int,), "not an int"),
    str: ((str,), "not a string"),
}


def _build_scalar(tp: Any, data: Any) -> Any:
    if tp in _SCALARS:
        kinds, why = _SCALARS[tp]
        if (isinstance(data, bool) and tp is not str) or not isinstance(data, kinds):
            raise TypeError(why)
        return float(typing.cast(float, data)) if tp is float else data
    if tp is bool:
        return bool(data)
    return data


@dataclass(frozen=True)
class Readiness:
    """How waiting for /health 200 ended (``wait_ready``; the soak's first check)."""

    outcome: Outcome
    message: str
    seconds: float
    #: The boot failure's cause from the container log (e.g. the negative token budget line).
    cause: str = ""
    #: The container's last log lines when it did not become ready.
    log_tail: str = ""

    @property
    def ready(self) -> bool:
        """True when /health answered 200 before the deadline."""
        return self.outcome is Outcome.PASS
