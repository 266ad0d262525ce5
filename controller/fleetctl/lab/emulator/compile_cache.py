"""A cold or a warm compile: the emulator's stand-in for torch.compile's, Triton's and FlashInfer's
caches.

A real vLLM compiles its graphs and kernels during the load and keeps them in ``$VLLM_CACHE_ROOT``
(``~/.cache/vllm``): a later start with the same model, settings and GPU reads them instead. The
emulator does the same with real files: when the cache directory exists (the recipe mounts one), a
start looks for ``torch_compile_cache/fleetctl-emulator/`` there; its ``compiled.json`` names the
key it was compiled for (``$FLEETCTL_COMPILE_CACHE_KEY``, fleetctl.warmcache) and the sha256 of the
``kernels.bin`` beside it. Same key and intact file: a warm start (``EMU_WARM_COMPILE_SECONDS``);
anything else (missing, another key, a damaged file): a cold one (``EMU_COMPILE_SECONDS``), after
which the files are (re)written for this key. The outcome is logged, as vLLM logs its own cache
hits.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

#: Where under the cache root the emulator keeps its compiled artefacts.
SUBDIR = "torch_compile_cache/fleetctl-emulator"
KEY_ENV = "FLEETCTL_COMPILE_CACHE_KEY"
#: Size of the stand-in compiled kernels (bytes): real files, so that copying and checking them is
#: real.
KERNELS_BYTES = 256 * 1024


@dataclass(frozen=True)
class Compile:
    """How this start compiles: ``warm`` with the seconds it takes, and why."""

    warm: bool
    seconds: float
    key: str
    reason: str
    directory: Path | None


def cache_root(env: dict[str, str] | None = None) -> Path:
    """``$VLLM_CACHE_ROOT``, else ``~/.cache/vllm`` (vLLM's default)."""
    e = os.environ if env is None else env
    return Path(e.get("VLLM_CACHE_ROOT") or Path(e.get("HOME") or "/root") / ".cache" / "vllm")


def _kernels(key: str) -> bytes:
    """Deterministic bytes for ``key`` (what a compile of the same inputs produces)."""
    seed = hashlib.sha256(key.encode()).digest()
    blocks = [
        hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(KERNELS_BYTES // 32)
    ]
    return b"".join(blocks)


def plan(root: Path, key: str, cold_seconds: float, warm_seconds: float) -> Compile:
    """Whether a start with ``key`` finds its compiled artefacts under ``root`` (no writes)."""
    if cold_seconds <= 0 or not root.is_dir():
        return Compile(
            False,
            0.0,
            key,
            "no compile cache mounted" if cold_seconds > 0 else "compile not modelled",
            None,
        )
    d = root / SUBDIR
    try:
        meta = json.loads((d / "compiled.json").read_text())
        blob = (d / "kernels.bin").read_bytes()
    except (OSError, ValueError):
        return Compile(False, cold_seconds, key, "no compiled artefacts in the cache", d)
    if not isinstance(meta, dict) or meta.get("key") != key:
        got = meta.get("key") if isinstance(meta, dict) else "?"
        return Compile(
            False, cold_seconds, key, f"the cache was compiled for key {got}, not {key}", d
        )
    if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        return Compile(
            False, cold_seconds, key, "the cached kernels do not match their checksum", d
        )
    return Compile(True, warm_seconds, key, "compiled artefacts found for this key", d)


def write(c: Compile) -> None:
    """After a cold compile: the artefacts for ``c.key``, written atomically (a file at a time)."""
    if c.warm or c.directory is None:
        return
    c.directory.mkdir(parents=True, exist_ok=True)
    blob = _kernels(c.key)
    for name, data in (
        ("kernels.bin", blob),
        (
            "compiled.json",
            json.dumps(
                {"key": c.key, "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
            ).encode(),
        ),
    ):
        tmp = c.directory / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, c.directory / name)
