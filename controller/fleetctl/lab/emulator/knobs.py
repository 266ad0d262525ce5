"""The EMU_* behaviour knobs, read once from the environment (see the package docstring)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

DEFAULT_VERSION = "0.24.0"


@dataclass(frozen=True)
class Knobs:
    """Every behaviour knob of the emulator, with its default (a healthy v0.24.0 server)."""

    load_seconds: float = 1.0
    #: Seconds of compiling after the weights, on a start without a matching compile cache (cold),
    #: and with one (warm); modelled only when a compile cache directory is mounted
    #: (compile_cache.py).
    compile_seconds: float = 0.0
    warm_compile_seconds: float = 0.0
    crash_at_concurrency: int = 0
    crash_exit_seconds: float = 2.0
    accept_decay_per_min: float = 0.0
    garbage: bool = False
    garbage_after_tokens: int = 0
    garbage_after_seconds: float = 0.0
    garbage_at_concurrency: int = 0
    boot_fail: str = ""
    speed: float = 1.0
    throughput_scale: float = 1.0
    error_rate: float = 0.0
    #: The error rate of requests that came through a proxy (``X-Forwarded-For``: users' traffic
    #: via the front door) only: a version whose failures show under live traffic, never in a soak
    #: out of rotation.
    forwarded_error_rate: float = 0.0
    longctx_collapse: bool = False
    hang: str = ""
    version: str = DEFAULT_VERSION
    seed: int = 0
    kv_capacity_tokens: int = 300_000
    #: vLLM caches whole blocks only; on hybrid Qwen3.5/3.6 the attention block grows to the Mamba
    #: page (~2k tokens), so a shared prefix shorter than this never hits the cache.
    prefix_block_tokens: int = 2048
    #: Acceptance lost (fraction, cumulative) per request served from the prefix cache, for requests
    #: that hit it: the production bug (rejected drafts written into the drafter's cached KV).
    decay_per_cache_hit: float = 0.0
    #: A build that degenerates: past this many generated tokens an answer turns into one short
    #: phrase repeated to max_tokens, at any concurrency and temperature (shorter answers, the
    #: canaries among them, end as a healthy build's do); 0 = never.
    degenerate_after_tokens: int = 0
    #: Requests per second another client sends to the same server (they show only in /metrics).
    foreign_rps: float = 0.0
    #: Every request carrying an image is answered ``!!!!`` (a vision tower skip-loaded: text
    #: stays perfect).
    image_garbage: bool = False
    #: The tool parser fails: the model's ``<tool_call>`` markup stays in ``content`` with
    #: ``finish_reason: stop`` and no ``tool_calls`` (vLLM #22975, #47194).
    tool_call_leak: bool = False
    #: The reasoning parser fails: the thinking arrives in ``content`` inside ``<think>`` tags,
    #: ``reasoning`` stays empty (vLLM #39697, #51679).
    reasoning_leak: bool = False


#: Knob field -> environment variable.
ENV_NAMES: dict[str, str] = {f.name: "EMU_" + f.name.upper() for f in fields(Knobs)}

_TRUE = {"1", "true", "yes", "on"}


def _parse(kind: object, raw: str) -> object:
    if kind is bool or kind == "bool":
        return raw.strip().lower() in _TRUE
    if kind is int or kind == "int":
        return int(raw)
    if kind is float or kind == "float":
        return float(raw)
    return raw


def from_env(env: Mapping[str, str] | None = None) -> Knobs:
    """Knobs from ``env`` (default: the process environment); unset names keep their defaults.

    Raises ValueError naming the variable when a value does not parse.
    """
    source = os.environ if env is None else env
    values: dict[str, object] = {}
    for f in fields(Knobs):
        raw = source.get(ENV_NAMES[f.name])
        if raw is None or raw == "":
            continue
        try:
            values[f.name] = _parse(f.type, raw)
        except ValueError as exc:
            raise ValueError(f"{ENV_NAMES[f.name]}={raw!r} is not a valid {f.type}") from exc
    knobs = Knobs(**values)  # type: ignore[arg-type]
    if knobs.speed <= 0 or knobs.throughput_scale <= 0:
        raise ValueError("EMU_SPEED and EMU_THROUGHPUT_SCALE must be > 0")
    if not 0.0 <= knobs.error_rate <= 1.0 or not 0.0 <= knobs.forwarded_error_rate <= 1.0:
        raise ValueError("EMU_ERROR_RATE and EMU_FORWARDED_ERROR_RATE must be between 0 and 1")
    return knobs
