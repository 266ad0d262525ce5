"""One model directory as ``hf download`` leaves it in ``--local-dir``, good or broken in one of
the variants."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fleetctl.errors import FleetError
from fleetctl.lab.models.configs import config_for, tokenizer_files
from fleetctl.lab.models.kinds import (
    KINDS,
    MISNESTED_DATE,
    STALE_DRAFTER_DATE,
    V1_DATE,
    VARIANTS,
    ModelKind,
)
from fleetctl.lab.models.safetensors import Tensor, tensors_for, write_safetensors


# --- writing a model directory ------------------------------------------------------------
def canonical_variant(name: str) -> str:
    canonical = name.replace("_", "-")
    if canonical not in VARIANTS:
        raise FleetError(
            f"unknown model variant {name!r}", fix=f"use one of: {', '.join(VARIANTS)}"
        )
    return canonical


def _date_for(kind: ModelKind, variant: str) -> str:
    return {
        "stale-drafter": STALE_DRAFTER_DATE,
        "v1-keys": V1_DATE,
        "misnested-vision": MISNESTED_DATE,
    }.get(variant, kind.date)


def write_model(
    directory: Path | str,
    kind: str,
    variant: str = "good",
    *,
    shards: int = 3,
    size_bytes: int | None = None,
    date: str | None = None,
) -> Path:
    """Write a tiny model of ``kind`` in ``variant`` into ``directory`` (created; must be empty or
    absent).

    ``size_bytes`` pads the embedding table so that the model's data totals about that many
    bytes (throughput benchmarks); ``date`` overrides the revision date. Returns the directory.
    """
    canonical = canonical_variant(variant)
    spec = _kind(kind, canonical)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FleetError(f"{out} is not empty", fix="write tiny models into a new directory")
    revision_date = date or _date_for(spec, canonical)
    embed_rows = 8
    if size_bytes:
        # Row = 4 BF16 values = 8 bytes: pad the embedding to reach the requested total.
        base = sum(t.nbytes for t in tensors_for(spec, canonical))
        embed_rows = max(8, 8 + (size_bytes - base) // 8)
    tensors = tensors_for(spec, canonical, embed_rows=embed_rows)
    (out / "config.json").write_text(
        json.dumps(config_for(spec, canonical, revision_date), indent=2) + "\n"
    )
    for name, content in tokenizer_files(spec).items():
        (out / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
    files = _files(spec, tensors, shards)
    for fname, group in files.items():
        write_safetensors(out / fname, group)
    if spec.role != "drafter":
        index = {
            "metadata": {"total_size": sum(t.nbytes for t in tensors)},
            "weight_map": {t.name: fname for fname, group in files.items() for t in group},
        }
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    _break(out, canonical, list(files))
    return out


def _kind(kind: str, variant: str) -> ModelKind:
    """The model kind named ``kind``, refused where ``variant`` does not apply to it."""
    if kind not in KINDS:
        raise FleetError(f"unknown model kind {kind!r}", fix=f"use one of: {', '.join(KINDS)}")
    spec = KINDS[kind]
    if variant == "stale-drafter" and spec.role != "drafter":
        raise FleetError(f"variant stale-drafter needs a drafter kind, not {kind!r}")
    if variant in ("misnested-vision", "v1-keys") and spec.vision != "qwen":
        raise FleetError(f"variant {variant} needs a Qwen multimodal body kind, not {kind!r}")
    return spec


def _files(spec: ModelKind, tensors: list[Tensor], shards: int) -> dict[str, list[Tensor]]:
    """The tensors by file: a drafter's one ``model.safetensors``, a body's ``shards`` shards."""
    if spec.role == "drafter":
        return {"model.safetensors": tensors}
    n = max(1, shards)
    per = -(-len(tensors) // n)
    files = {f"model-{i + 1:05d}-of-{n:05d}.safetensors": tensors[i * per : (i + 1) * per]
             for i in range(n)}
    return {k: v for k, v in files.items() if v}


def _break(out: Path, variant: str, shard_names: list[str]) -> None:
    """Apply a broken variant to a freshly written model directory."""
    victim = out / shard_names[-1]
    if variant == "lfs-pointer":
        data = victim.read_bytes()
        victim.write_text(
            "version https://git-lfs.github.com/spec/v1\n"
            f"oid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n"
        )
    elif variant == "escaping-symlink":
        data = victim.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        blobs = out.parent / ".hf-cache" / out.name / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        (blobs / digest).write_bytes(data)
        victim.unlink()
        victim.symlink_to(os.path.relpath(blobs / digest, out))
    elif variant == "missing-shard":
        if len(shard_names) < 2 and not (out / "model.safetensors.index.json").exists():
            raise FleetError("variant missing-shard needs a sharded model with an index")
        victim.unlink()
    elif variant == "corrupt-header":
        with victim.open("r+b") as fh:
            fh.seek(8)
            fh.write(b"{\x00not json")
