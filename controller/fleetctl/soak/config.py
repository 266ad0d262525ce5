"""The soak gate's configuration: read from a recipe's ``soak:`` mapping, defaults from the
published figures.

Defaults come from the published DGX Spark figures (docs/domain.md#health); the ``lab`` profile
scales them for the simulated fleet (an emulator
on two shared cores, soaks of seconds). A recipe overrides any key::

    soak:
      profile: spark            # or lab
      load_time: 4m             # what a load is expected to take: the rollout plan's time estimate
      sustained: {duration: 10m, concurrency: 16, window: 60s}
      checks:
        throughput: {tolerance: 0.15}
        latency: {observe_only: true}
        acceptance: {floor: {prose: 0.03}}

Every check takes ``enabled``, ``observe_only``, ``failure_limit``,
``inconclusive_limit`` and ``consecutive_error_limit`` (as in Argo Rollouts'
analysis), plus its own bounds. Unknown keys are errors, so a typo never
silently weakens a gate.

The profiles' defaults, the prompt classes and the checks' parameters are data, in
``profiles.py``; their public names stay reachable here (``config.CHECKS``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetctl.durations import DurationError, parse_duration
from fleetctl.errors import FleetError
from fleetctl.recipes.capabilities import check_capabilities, check_sampling
from fleetctl.soak.profiles import (
    CHECK_PARAMS,
    CHECKS,
    CLASSES,
    COMMON_PARAMS,
    DEFAULTS,
    PROFILES,
    WORKLOAD_VERSION,
)

# The profiles' public names, reachable as config.NAME as when they were here.
__all__ = [
    "CHECKS",
    "CLASSES",
    "PROFILES",
    "WORKLOAD_VERSION",
    "CheckSpec",
    "SoakConfig",
    "SoakConfigError",
    "from_recipe",
    "load_config",
]


_TOP_KEYS = (
    "profile",
    "model",
    "speculative",
    "load_time",
    "readiness_timeout",
    "readiness_poll",
    "request_timeout",
    "max_tokens",
    "temperature",
    "thinking",
    "concurrency",
    "requests_per_level",
    "min_requests_per_level",
    "trials",
    "stagger",
    "request_rates",
    "level_timeout",
    "classes",
    "class_requests",
    "long_context_tokens",
    "smoke_max_tokens",
    "sustained",
    "checks",
    "slo",
    "deadline",
    "capabilities",
    "sampling",
)
_SUSTAINED_KEYS = (
    "duration",
    "concurrency",
    "window",
    "max_requests",
    "shared_prefix_tokens",
    "turns",
)


class SoakConfigError(FleetError):
    """A recipe's ``soak:`` mapping (or a soak option) is invalid."""


@dataclass(frozen=True)
class CheckSpec:
    """One check's switches, limits and bounds."""

    name: str
    enabled: bool = True
    #: Measured and reported, never counted toward the verdict.
    observe_only: bool = False
    #: Failed measurements tolerated before the check fails.
    failure_limit: int = 0
    #: Inconclusive measurements tolerated before the check is inconclusive.
    inconclusive_limit: int = 0
    #: Consecutive measurement errors tolerated before the check errors.
    consecutive_error_limit: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)

    def level_bound(self, key: str, concurrency: int) -> float | None:
        """A per-concurrency bound: the entry for the smallest level >= ``concurrency``.

        Levels above the largest key use the largest key's bound.
        """
        table: Mapping[int, float] | None = self.params.get(key)
        if not table:
            return None
        keys = sorted(table)
        for k in keys:
            if k >= concurrency:
                return float(table[k])
        return float(table[keys[-1]])


@dataclass(frozen=True)
class SoakConfig:
    """Everything a soak needs to know besides the target; build it with :func:`load_config`."""

    profile: str
    #: The recipe's served model names: identity checks them, requests use the first.
    served_model_names: tuple[str, ...]
    #: The model name requests use (default: the first served name, else what /v1/models lists).
    model: str | None
    #: True/False when known from the recipe; None = decide from /metrics.
    speculative: bool | None
    readiness_timeout: float
    readiness_poll: float
    request_timeout: float
    max_tokens: int
    temperature: float
    concurrency: tuple[int, ...]
    #: Requests per sweep level = max(requests_per_level * c, min_requests_per_level).
    requests_per_level: int
    min_requests_per_level: int
    level_timeout: float
    classes: tuple[str, ...]
    class_requests: int
    long_context_tokens: int
    smoke_max_tokens: int
    sustained_duration: float
    sustained_concurrency: int
    window: float
    sustained_max_requests: int
    checks: Mapping[str, CheckSpec]
    #: Tokens of the context every sustained conversation shares (0: no shared context).
    shared_prefix_tokens: int = 0
    #: Exchanges in a sustained conversation before a worker starts a new one.
    turns: int = 1
    #: Readiness, identity and smoke only (no load): a rollback's quick check.
    smoke_only: bool = False
    #: The chat template's thinking for load requests (classes, sweep, sustained).
    thinking: bool = False
    recipe: str = ""
    #: Seconds a server is expected to take from start to ready (a plan's estimate, not a bound).
    load_time: float = 240.0
    #: Service-level objectives (``ttft_ms``, ``tpot_ms``, ``e2el_ms``): each level reports the
    #: share of its requests meeting all of them, and that goodput in requests/s (reported, not
    #: gated).
    slo: Mapping[str, float] = field(default_factory=dict)
    #: Trials per sweep level (their median tok/s is the level's).
    trials: int = 1
    #: Seconds between workers' starts.
    stagger: float = 0.0
    #: Open-loop levels: requests per second with Poisson arrivals.
    request_rates: tuple[float, ...] = ()
    #: The soak's hard overall deadline in seconds (0: derived from the phases,
    #: :meth:`hard_deadline`).
    deadline: float = 0.0
    #: ``soak.capabilities``: a capability probe turned on or off by the recipe (absent: derived
    #: from the recipe's flags, fleetctl.soak.capabilities).
    capabilities: Mapping[str, bool] = field(default_factory=dict)
    #: ``soak.sampling``: served name -> the sampling parameters its requests carry.
    sampling: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """What makes two soaks' throughput comparable: profile, max_tokens, levels, workload.

        A baseline made with another fingerprint is not compared (a lab-profile soak
        or one at other levels says nothing about this one's tok/s).
        """
        key = {
            "profile": self.profile,
            "max_tokens": self.max_tokens,
            "levels": list(self.concurrency),
            "thinking": self.thinking,
            "requests": [self.requests_per_level, self.min_requests_per_level],
            "classes": list(self.classes),
            "workload": WORKLOAD_VERSION,
            "conversation": [self.shared_prefix_tokens, self.turns],
            "trials": self.trials,
            "rates": list(self.request_rates),
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]

    def check(self, name: str) -> CheckSpec:
        """The spec of check ``name``."""
        return self.checks[name]

    def long_decode_tokens(self) -> int:
        """Tokens of the soak's one long decode: the long_decode probe's, else correctness' (0:
        none)."""
        probe = self.checks.get("long_decode")
        if probe is not None and probe.enabled and int(probe.params.get("tokens", 0) or 0) > 0:
            return int(probe.params["tokens"])
        spec = self.checks.get("correctness")
        return (
            int(spec.params.get("long_decode_tokens", 0) or 0)
            if spec is not None and spec.enabled
            else 0
        )

    def long_prompt_tokens(self) -> tuple[int, ...]:
        """The long-prompt probes' sizes in tokens (empty: none)."""
        spec = self.checks.get("long_prompts")
        return tuple(spec.params.get("tokens", ())) if spec is not None and spec.enabled else ()

    def long_prompt_timeout(self, tokens: int) -> float:
        """One long-prompt probe's deadline: the request's own plus its prefill at >= 500
        tokens/s."""
        return self.request_timeout + tokens / 500

    def long_prompt_seconds(self) -> float:
        return sum(self.long_prompt_timeout(t) for t in self.long_prompt_tokens())

    def token_timeout(self) -> float | None:
        """Seconds without a token before a request is a stall (None: the liveness check is
        disabled)."""
        spec = self.checks.get("liveness")
        if spec is None or not spec.enabled:
            return None
        t = float(spec.params.get("token_timeout", 0.0))
        return t if t > 0 else None

    def hard_deadline(self) -> tuple[float, str]:
        """The most one soak may last, and how it was derived (``deadline`` when the recipe sets
        it).

        Every phase's own bound added up (readiness, smoke, canaries, each class and sweep trial
        bounded by ``level_timeout`` plus the request that may still be running, the long decode,
        the sustained phase), plus a minute for scrapes and container reads: a soak reaching it
        is stopped whatever phase it is in, so no server can hold the controller longer.
        """
        if self.deadline > 0:
            return self.deadline, "set by the recipe's soak.deadline"
        per_level = self.level_timeout + self.request_timeout
        long_decode = self.long_decode_tokens()
        parts = {
            "readiness": self.readiness_timeout,
            "smoke and canaries": 4 * self.request_timeout,
            "classes": len(self.classes) * per_level,
            "sweep": len(self.concurrency) * self.trials * per_level
            + len(self.request_rates) * per_level,
            "long decode": max(self.request_timeout, long_decode / 10) if long_decode else 0.0,
            "long prompts": self.long_prompt_seconds(),
            # Up to 3 looping prompts re-run as references (MAX_LOOP_REFERENCES in
            # soak/phases/soak_state.py): two load prompts and the long decode at most.
            "loop references": 2 * self.request_timeout
            + (max(self.request_timeout, long_decode / 10) if long_decode else 0.0),
            "sustained": self.sustained_duration + self.request_timeout
            if self.sustained_duration
            else 0.0,
            "scrapes and slack": 60.0,
        }
        if self.smoke_only:
            parts = {
                k: v
                for k, v in parts.items()
                if k in ("readiness", "smoke and canaries", "scrapes and slack")
            }
        total = sum(parts.values())
        return total, " + ".join(f"{k} {v:.0f}s" for k, v in parts.items() if v)

    def level_requests(self, concurrency: int) -> int:
        """How many requests one sweep level sends."""
        return max(self.requests_per_level * concurrency, self.min_requests_per_level)

    def with_duration(self, seconds: float) -> SoakConfig:
        """This config with the sustained phase lasting ``seconds`` (windows shrink to fit >= 3)."""
        if seconds < 0:
            raise SoakConfigError(
                f"soak duration {seconds}s is negative", fix="give a duration like 90s or 10m"
            )
        window = min(self.window, max(seconds / 3.0, 1.0)) if seconds > 0 else self.window
        return dataclasses.replace(self, sustained_duration=float(seconds), window=window)


def load_config(
    raw: Mapping[str, Any] | None = None,
    *,
    profile: str | None = None,
    served_model_names: Sequence[str] = (),
    speculative: bool | None = None,
    recipe: str = "",
) -> SoakConfig:
    """Validate a ``soak:`` mapping over the profile's defaults; errors name the key and the fix.

    ``profile`` (if given) wins over the mapping's own ``profile``; ``speculative``
    from the recipe's flags wins over auto-detection unless the mapping sets it.
    """
    where = f"recipe {recipe}: soak" if recipe else "soak"
    raw = dict(raw or {})
    if not isinstance(raw, Mapping):
        raise SoakConfigError(f"{where} must be a mapping, not {type(raw).__name__}",
                              fix="write soak: as key: value pairs (see README.md, Soak gates)")
    _unknown(raw, _TOP_KEYS, where)
    prof = profile or raw.get("profile") or "spark"
    if prof not in DEFAULTS:
        raise SoakConfigError(f"{where}.profile {prof!r} is not a profile",
                              fix=f"use one of: {', '.join(PROFILES)}")
    d = copy.deepcopy(DEFAULTS[prof])

    def num(key: str, kind: str = "number", src: Mapping[str, Any] | None = None,
            default: Any = None, label: str | None = None) -> Any:
        src = raw if src is None else src
        value = src.get(key, default if default is not None else d.get(key))
        return _scalar(value, kind, f"{where}.{label or key}")

    sustained_raw = _sustained(raw.get("sustained", {}), f"{where}.sustained")
    sd = d["sustained"]
    concurrency = _concurrency(raw.get("concurrency", d["concurrency"]), f"{where}.concurrency")
    classes = _classes(raw.get("classes", d["classes"]), f"{where}.classes")
    spec_raw = _flag(raw.get("speculative", speculative), f"{where}.speculative",
                     "leave it out to follow the recipe's --speculative-config")
    thinking = _flag(raw.get("thinking", d.get("thinking", False)), f"{where}.thinking",
                     "thinking: false (the reference figures' setting) or true", optional=False)
    rates = _rates(raw.get("request_rates", d.get("request_rates", [])), f"{where}.request_rates")
    slo = _slo(raw.get("slo") or {}, f"{where}.slo")
    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        raise SoakConfigError(f"{where}.model must be a served model name",
                              fix="e.g. model: qwen36-fast")

    return SoakConfig(
        profile=prof,
        served_model_names=tuple(served_model_names),
        model=model,
        speculative=spec_raw,
        load_time=num("load_time", "duration"),
        readiness_timeout=num("readiness_timeout", "duration"),
        readiness_poll=num("readiness_poll", "duration"),
        request_timeout=num("request_timeout", "duration"),
        max_tokens=num("max_tokens", "count"),
        temperature=num("temperature"),
        concurrency=concurrency,
        requests_per_level=num("requests_per_level", "count"),
        min_requests_per_level=num("min_requests_per_level", "count"),
        level_timeout=num("level_timeout", "duration"),
        classes=classes,
        class_requests=num("class_requests", "count"),
        long_context_tokens=num("long_context_tokens", "count"),
        smoke_max_tokens=num("smoke_max_tokens", "count"),
        sustained_duration=num(
            "duration", "duration", sustained_raw, sd["duration"], "sustained.duration"
        ),
        sustained_concurrency=num(
            "concurrency", "count", sustained_raw, sd["concurrency"], "sustained.concurrency"
        ),
        window=num("window", "duration", sustained_raw, sd["window"], "sustained.window"),
        sustained_max_requests=num(
            "max_requests", "count", sustained_raw, sd["max_requests"], "sustained.max_requests"
        ),
        shared_prefix_tokens=num(
            "shared_prefix_tokens",
            "count",
            sustained_raw,
            sd["shared_prefix_tokens"],
            "sustained.shared_prefix_tokens",
        ),
        turns=max(1, num("turns", "count", sustained_raw, sd["turns"], "sustained.turns")),
        checks=_load_checks(raw.get("checks", {}), d["checks"], f"{where}.checks"),
        recipe=recipe,
        thinking=thinking is True,
        slo=slo,
        trials=max(1, num("trials", "count")),
        stagger=num("stagger"),
        request_rates=rates,
        deadline=num("deadline", "duration", default=0.0) if "deadline" in raw else 0.0,
        capabilities=check_capabilities(raw.get("capabilities"), _raise_on(where)),
        sampling=check_sampling(raw.get("sampling"), served_model_names, _raise_on(where)),
    )


def from_recipe(recipe: Any, *, profile: str | None = None) -> SoakConfig:
    """The gate of a ``fleetctl.recipes.Recipe`` (its ``soak`` mapping, names and flags)."""
    args = [str(a) for a in getattr(recipe, "vllm_args", ())]
    spec = any(a == "--speculative-config" or a.startswith("--speculative-config=") for a in args)
    return load_config(
        getattr(recipe, "soak", None) or {},
        profile=profile,
        served_model_names=tuple(getattr(recipe, "served_model_names", ())),
        speculative=spec,
        recipe=str(getattr(recipe, "name", "")),
    )


def _raise_on(where: str) -> Callable[[str, str, str], None]:
    """A recipe check's ``bad(field, problem, fix)`` that raises its first problem."""

    def bad(fld: str, problem: str, fix: str) -> None:
        raise SoakConfigError(f"{where}.{fld.removeprefix('soak.')} {problem}", fix=fix)

    return bad


def _sustained(raw: Any, where: str) -> Mapping[str, Any]:
    """The ``sustained:`` mapping, its keys checked."""
    if not isinstance(raw, Mapping):
        raise SoakConfigError(f"{where} must be a mapping",
                              fix="e.g. sustained: {duration: 10m, concurrency: 16, window: 60s}")
    _unknown(raw, _SUSTAINED_KEYS, where)
    return raw


def _concurrency(value: Any, where: str) -> tuple[int, ...]:
    """The sweep's levels: positive integers, rising strictly."""
    if (not isinstance(value, Sequence) or isinstance(value, str) or not value
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in value)):
        raise SoakConfigError(f"{where} {value!r} is not a list of positive integers",
                              fix="e.g. concurrency: [1, 4, 16, 32, 64]")
    if list(value) != sorted(set(value)):
        raise SoakConfigError(f"{where} {list(value)} must rise strictly",
                              fix="list each level once, smallest first, e.g. [1, 4, 16, 32, 64]")
    return tuple(value)


def _classes(value: Any, where: str) -> tuple[str, ...]:
    """Prompt classes, each one of :data:`CLASSES`."""
    if (not isinstance(value, Sequence) or isinstance(value, str)
            or any(c not in CLASSES for c in value)):
        raise SoakConfigError(f"{where} {value!r} names an unknown prompt class",
                              fix=f"choose from: {', '.join(CLASSES)}")
    return tuple(value)


def _flag(value: Any, where: str, fix: str, optional: bool = True) -> bool | None:
    """True, false, or (``optional``) left out: None."""
    if not (isinstance(value, bool) or (optional and value is None)):
        raise SoakConfigError(f"{where} {value!r} is not true/false", fix=fix)
    return value


def _rates(value: Any, where: str) -> tuple[float, ...]:
    """Open-loop request rates: positive numbers."""
    if (not isinstance(value, Sequence) or isinstance(value, str)
            or any(isinstance(r, bool) or not isinstance(r, int | float) or r <= 0 for r in value)):
        raise SoakConfigError(f"{where} {value!r} is not a list of positive rates",
                              fix="requests per second, e.g. request_rates: [2, 8]")
    return tuple(float(r) for r in value)


def _slo(value: Any, where: str) -> dict[str, float]:
    """The goodput SLO: ``ttft_ms``, ``tpot_ms`` and/or ``e2el_ms`` in milliseconds."""
    if not isinstance(value, Mapping) or set(value) - {"ttft_ms", "tpot_ms", "e2el_ms"}:
        raise SoakConfigError(f"{where} must map ttft_ms, tpot_ms and/or e2el_ms to milliseconds",
                              fix="e.g. slo: {ttft_ms: 500, tpot_ms: 60, e2el_ms: 20000}")
    return {str(k): float(_scalar(v, "number", f"{where}.{k}")) for k, v in value.items()}


def _unknown(raw: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    bad = [str(k) for k in raw if k not in known]
    if bad:
        raise SoakConfigError(f"{where} has unknown key(s) {', '.join(bad)}",
                              fix=f"valid keys are: {', '.join(known)}")


def _scalar(value: Any, kind: str, where: str) -> Any:
    if kind == "duration":
        try:
            return parse_duration(value, where)
        except DurationError as e:
            raise SoakConfigError(e.cause, fix=e.fix) from None
    if kind == "bool":
        if not isinstance(value, bool):
            raise SoakConfigError(f"{where} {value!r} is not true/false", fix="write true or false")
        return value
    return _number(value, kind, where)


def _number(value: Any, kind: str, where: str) -> Any:
    """A count (a whole number), a fraction (0 to 1) or any other number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SoakConfigError(f"{where} {value!r} is not a number", fix="write a plain number")
    if kind == "count":
        if not isinstance(value, int) or value < 0:
            raise SoakConfigError(f"{where} {value!r} is not a whole number >= 0", fix="e.g. 3")
        return value
    if kind == "fraction":
        if not 0 <= value <= 1:
            raise SoakConfigError(f"{where} {value!r} is not a fraction between 0 and 1",
                                  fix="write 0.15 for 15%")
        return float(value)
    if value < 0:
        raise SoakConfigError(f"{where} {value!r} is negative", fix="write a number >= 0")
    return float(value)


def _load_checks(
    raw: Any, defaults: Mapping[str, Mapping[str, Any]], where: str
) -> dict[str, CheckSpec]:
    if not isinstance(raw, Mapping):
        raise SoakConfigError(f"{where} must be a mapping of check name -> settings",
                              fix="e.g. checks: {latency: {observe_only: true}}")
    _unknown(raw, CHECKS, where)
    out: dict[str, CheckSpec] = {}
    for name in CHECKS:
        given = raw.get(name)
        if given is False:
            given = {"enabled": False}
        elif given is None:
            given = {}
        if not isinstance(given, Mapping):
            raise SoakConfigError(f"{where}.{name} must be a mapping",
                                  fix=f"e.g. {name}: {{observe_only: true}}")
        here = f"{where}.{name}"
        _unknown(given, (*COMMON_PARAMS, *CHECK_PARAMS[name]), here)
        base = defaults.get(name, {})
        params = {k: v for k, v in base.items() if k not in COMMON_PARAMS}
        for key, kind in CHECK_PARAMS[name].items():
            if key in given:
                value = _check_param(given[key], kind, f"{here}.{key}")
                if kind == "classes":  # a partial floor table overrides only the classes it names
                    value = {**params.get(key, {}), **value}
                params[key] = value

        def common(key: str, kind: str, default: Any, here: str = here, given: Any = given,
                   base: Mapping[str, Any] = base) -> Any:
            return _scalar(given.get(key, base.get(key, default)), kind, f"{here}.{key}")

        out[name] = CheckSpec(
            name=name,
            enabled=common("enabled", "bool", True),
            observe_only=common("observe_only", "bool", False),
            failure_limit=common("failure_limit", "count", 0),
            inconclusive_limit=common("inconclusive_limit", "count", 0),
            consecutive_error_limit=common("consecutive_error_limit", "count", 0),
            params=params,
        )
    return out


def _check_param(value: Any, kind: str, where: str) -> Any:
    if kind == "levels":
        return _level_bounds(value, where)
    if kind == "classes":
        return _class_floors(value, where)
    if kind == "counts":
        if (not isinstance(value, Sequence) or isinstance(value, str)
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value)):
            raise SoakConfigError(f"{where} {value!r} is not a list of whole numbers >= 1",
                                  fix="e.g. [32768, 65536, 131072] (or [] for none)")
        return [int(v) for v in value]
    return _scalar(value, kind, where)


def _level_bounds(value: Any, where: str) -> dict[int, float]:
    """A bound per concurrency level (``{1: 500, 16: 2000}``)."""
    if not isinstance(value, Mapping) or not value:
        raise SoakConfigError(f"{where} must map concurrency levels to bounds",
                              fix="e.g. {1: 500, 16: 2000, 64: 15000}")
    table: dict[int, float] = {}
    for k, v in value.items():
        try:
            level = int(k)
        except (TypeError, ValueError):
            raise SoakConfigError(f"{where} key {k!r} is not a concurrency level",
                                  fix="use whole numbers like 1, 16, 64 as keys") from None
        if level < 1:
            raise SoakConfigError(f"{where} key {k!r} is not a concurrency level >= 1",
                                  fix="use 1, 4, 16 ...")
        table[level] = _scalar(v, "number", f"{where}.{k}")
    return table


def _class_floors(value: Any, where: str) -> dict[str, float]:
    """A floor per prompt class (``{coding: 0.15}``)."""
    if not isinstance(value, Mapping):
        raise SoakConfigError(
            f"{where} must map prompt classes to floors", fix="e.g. {coding: 0.15}"
        )
    floors: dict[str, float] = {}
    for k, v in value.items():
        if k not in CLASSES:
            raise SoakConfigError(f"{where} names unknown prompt class {k!r}",
                                  fix=f"choose from: {', '.join(CLASSES)}")
        floors[str(k)] = _scalar(v, "fraction", f"{where}.{k}")
    return floors
