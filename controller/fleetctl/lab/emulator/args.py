"""The ``vllm serve`` command line, as much of it as the emulator needs; every other flag is
accepted.

Forms accepted: ``vllm serve MODEL [flags]``, ``vllm serve --model MODEL [flags]`` and the
api_server form ``python -m vllm.entrypoints.openai.api_server --model MODEL [flags]``
(no ``serve``). Flags take ``--name value`` or ``--name=value``; underscores and dashes
are the same, as in vLLM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class UsageError(ValueError):
    """The command line cannot be understood (argparse's exit code 2 in vLLM)."""


#: vLLM flags that never take a value (``store_true`` in vLLM's argparse).
BOOLEAN_FLAGS = frozenset(
    {
        "trust-remote-code",
        "enable-chunked-prefill",
        "no-enable-chunked-prefill",
        "enable-prefix-caching",
        "no-enable-prefix-caching",
        "enable-auto-tool-choice",
        "enforce-eager",
        "disable-log-requests",
        "enable-log-requests",
        "disable-log-stats",
        "disable-uvicorn-access-log",
        "disable-custom-all-reduce",
        "disable-frontend-multiprocessing",
        "enable-expert-parallel",
        "async-scheduling",
        "no-async-scheduling",
        "disable-fastapi-docs",
        "enable-request-id-headers",
        "enable-prompt-tokens-details",
        "enable-force-include-usage",
        "skip-tokenizer-init",
        "headless",
        "help",
    }
)
#: Flags whose value is one or more tokens (``nargs="+"``).
MULTI_VALUE_FLAGS = frozenset({"served-model-name"})


@dataclass(frozen=True)
class ServeArgs:
    """What the emulator uses of a ``vllm serve`` command line."""

    model: str
    served_model_names: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = 8000
    speculative_config: dict[str, Any] | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    reasoning_parser: str | None = None
    enable_prefix_caching: bool = True
    extra: dict[str, str | bool] = field(default_factory=dict)

    @property
    def spec_method(self) -> str | None:
        """The speculative method (``dflash``, ``ngram``, ``mtp`` ...) or None."""
        if not self.speculative_config:
            return None
        method = self.speculative_config.get("method")
        return str(method).lower() if method else "draft_model"

    @property
    def num_spec_tokens(self) -> int:
        """``num_speculative_tokens`` of the speculative config, 0 without one."""
        if not self.speculative_config:
            return 0
        return int(self.speculative_config.get("num_speculative_tokens", 0) or 0)


def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"argument --{name}: invalid int value: {raw!r}") from None


def _float(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"argument --{name}: invalid float value: {raw!r}") from None


def parse(argv: list[str]) -> ServeArgs:
    """Parse a ``vllm`` command line (with or without the leading ``serve``)."""
    args = list(argv)
    if args and args[0] == "serve":
        args = args[1:]
    positional: list[str] = []
    flags: dict[str, str | bool | list[str]] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--"):
            positional.append(token)
            i += 1
            continue
        name, eq, inline = token[2:].partition("=")
        name = name.replace("_", "-")
        if eq:
            flags[name] = inline
            i += 1
        elif name in MULTI_VALUE_FLAGS:
            values: list[str] = []
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
            if not values:
                raise UsageError(f"argument --{name}: expected at least one argument")
            flags[name] = values
        elif name in BOOLEAN_FLAGS or i + 1 >= len(args) or args[i + 1].startswith("--"):
            flags[name] = True
            i += 1
        else:
            flags[name] = args[i + 1]
            i += 2

    def text(name: str) -> str | None:
        value = flags.get(name)
        if value is None or value is True:
            return None
        return " ".join(value) if isinstance(value, list) else str(value)

    model = text("model") or (positional[0] if positional else None)
    if not model:
        raise UsageError("the following arguments are required: model_tag")
    names_flag = flags.get("served-model-name")
    if isinstance(names_flag, list):
        names = tuple(names_flag)
    elif isinstance(names_flag, str):
        names = (names_flag,)
    else:
        names = (model,)

    spec: dict[str, Any] | None = None
    spec_raw = text("speculative-config")
    if spec_raw:
        try:
            loaded = json.loads(spec_raw)
        except json.JSONDecodeError as exc:
            raise UsageError(f"argument --speculative-config: invalid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise UsageError("argument --speculative-config: must be a JSON object")
        spec = loaded

    known = {
        "model",
        "served-model-name",
        "host",
        "port",
        "speculative-config",
        "max-num-seqs",
        "max-num-batched-tokens",
        "kv-cache-dtype",
        "quantization",
        "gpu-memory-utilization",
        "max-model-len",
        "reasoning-parser",
        "enable-prefix-caching",
        "no-enable-prefix-caching",
    }
    extra: dict[str, str | bool] = {
        k: (" ".join(v) if isinstance(v, list) else v) for k, v in flags.items() if k not in known
    }
    port_raw = text("port")
    seqs_raw = text("max-num-seqs")
    batched_raw = text("max-num-batched-tokens")
    mml_raw = text("max-model-len")
    gmu_raw = text("gpu-memory-utilization")
    return ServeArgs(
        model=model,
        served_model_names=names,
        host=text("host") or "0.0.0.0",
        port=_int("port", port_raw) if port_raw else 8000,
        speculative_config=spec,
        max_num_seqs=_int("max-num-seqs", seqs_raw) if seqs_raw else None,
        max_num_batched_tokens=_int("max-num-batched-tokens", batched_raw) if batched_raw else None,
        kv_cache_dtype=text("kv-cache-dtype") or "auto",
        quantization=text("quantization"),
        gpu_memory_utilization=_float("gpu-memory-utilization", gmu_raw) if gmu_raw else 0.9,
        max_model_len=_parse_len(mml_raw) if mml_raw else None,
        reasoning_parser=text("reasoning-parser"),
        enable_prefix_caching="no-enable-prefix-caching" not in flags,
        extra=extra,
    )


def _parse_len(raw: str) -> int:
    """vLLM accepts ``32768``, ``32k`` and ``1M`` for --max-model-len."""
    lowered = raw.strip().lower()
    for suffix, mult in (("k", 1000), ("m", 1_000_000)):
        if lowered.endswith(suffix):
            return int(float(lowered[:-1]) * mult)
    return _int("max-model-len", raw)
