"""A recipe's ``soak:`` mapping read into a :class:`~fleetctl.soak.config.SoakConfig`, over
the published figures' defaults.

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

The profiles' defaults and the prompt classes are data, in ``profiles.py``; each check declares
its own parameters, their kinds and their defaults per profile (soak/checks/check.py), and the
checks of a config are those registered when it is loaded.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetctl.durations import DurationError, parse_duration
from fleetctl.recipes.capabilities import check_capabilities, check_sampling
from fleetctl.soak.capabilities.derive import derive
from fleetctl.soak.checks.registry import REGISTRY
from fleetctl.soak.config import CheckSpec, SoakConfig, SoakConfigError
from fleetctl.soak.profiles import CLASSES, COMMON_PARAMS, DEFAULTS, PROFILES

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
        checks=_load_checks(raw.get("checks", {}), prof, f"{where}.checks"),
        recipe=recipe,
        thinking=thinking is True,
        slo=slo,
        trials=max(1, num("trials", "count")),
        stagger=num("stagger"),
        request_rates=rates,
        deadline=num("deadline", "duration", default=0.0) if "deadline" in raw else 0.0,
        capabilities=check_capabilities(raw.get("capabilities"), _raise_on(where)),
        sampling=check_sampling(raw.get("sampling"), served_model_names, _raise_on(where)),
        plan=derive(_Named(tuple(served_model_names), raw)).capabilities,
    )


def from_recipe(recipe: Any, *, profile: str | None = None) -> SoakConfig:
    """The gate of a ``fleetctl.recipes.Recipe`` (its ``soak`` mapping, names and flags)."""
    args = [str(a) for a in getattr(recipe, "vllm_args", ())]
    spec = any(a == "--speculative-config" or a.startswith("--speculative-config=") for a in args)
    config = load_config(
        getattr(recipe, "soak", None) or {},
        profile=profile,
        served_model_names=tuple(getattr(recipe, "served_model_names", ())),
        speculative=spec,
        recipe=str(getattr(recipe, "name", "")),
    )
    # What the recipe serves (its flags, names, modalities) decides what the gate tests.
    served = _Named(config.served_model_names, getattr(recipe, "soak", None) or {}, tuple(args),
                    tuple(getattr(recipe, "modalities", ())))
    return dataclasses.replace(config, plan=derive(served).capabilities)


@dataclass(frozen=True)
class _Named:
    """What a soak without a recipe serves, as derivation reads it: its names and soak settings
    (no flags: an ``--endpoint`` without ``--recipe`` is probed for its names only)."""

    served_model_names: tuple[str, ...]
    soak: Mapping[str, Any]
    vllm_args: tuple[str, ...] = ()
    modalities: tuple[str, ...] = ()


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


def _load_checks(raw: Any, profile: str, where: str) -> dict[str, CheckSpec]:
    """Every registered check's spec: its profile defaults, overridden by the recipe's ``raw``."""
    if not isinstance(raw, Mapping):
        raise SoakConfigError(f"{where} must be a mapping of check name -> settings",
                              fix="e.g. checks: {latency: {observe_only: true}}")
    registered = REGISTRY.checks()
    _unknown(raw, [c.name for c in registered], where)
    out: dict[str, CheckSpec] = {}
    for check in registered:
        name = check.name
        given = raw.get(name)
        if given is False:
            given = {"enabled": False}
        elif given is None:
            given = {}
        if not isinstance(given, Mapping):
            raise SoakConfigError(f"{where}.{name} must be a mapping",
                                  fix=f"e.g. {name}: {{observe_only: true}}")
        here = f"{where}.{name}"
        _unknown(given, (*COMMON_PARAMS, *check.params), here)
        base = copy.deepcopy(dict(check.defaults_for(profile)))
        params = {k: v for k, v in base.items() if k not in COMMON_PARAMS}
        for key, kind in check.params.items():
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
