"""Tiny but well-formed model directories (and deliberately broken ones) for the lab.

``write_model(dir, kind, variant)`` writes what ``hf download`` leaves in ``--local-dir``:
``config.json``, sharded ``*.safetensors`` with valid headers (8-byte little-endian
header length + JSON header + tensor data whose ``data_offsets`` tile the data
exactly), ``model.safetensors.index.json`` (bodies; drafters are one
``model.safetensors`` like z-lab's), ``generation_config.json`` and tokenizer files.
Tensor names follow each model kind (Qwen3.6 35B-A3B: ``model.language_model.layers.N.*``
and the 333 ``model.visual.*`` vision tensors). A model is a few hundred KB; ``size_bytes``
pads the embedding so a model weighs what a throughput benchmark needs.

Convention shared with the stage (``roles/weights``): every ``config.json`` carries
``"revision_date": "YYYY-MM-DD"`` (the date of the hub
revision the files stand for) and every mirror ``manifest.json`` repeats it with
``repo`` and ``revision``. A drafter dated before 2026-04-19 is the stale one that
crashes past ~16K tokens; the emulator reads the date from the drafter's config.json.

Variants (``-`` and ``_`` are the same), each exactly a failure of docs/domain.md#weights:

- ``good``: what a complete, current download looks like.
- ``lfs-pointer``: one shard is a git-lfs pointer text file (a clone without ``git lfs pull``).
- ``escaping-symlink``: one shard is a symlink into a sibling HF-cache ``blobs`` directory
  (``<dir>/../.hf-cache/<name>/blobs/<sha256>``): readable on the host, dangling once
  only the model directory is bind-mounted into the container.
- ``missing-shard``: the index lists a shard whose file is absent (an interrupted download).
- ``corrupt-header``: one shard's JSON header is damaged (same length, not JSON).
- ``misnested-vision``: vision tensors under ``model.language_model.visual.*`` (the
  2026-04-19..2026-06-18 revisions of the 35B body).
- ``v1-keys``: text tensors as ``model.layers.N.*``, architecture ``...ForCausalLM``
  (the unstable v1 of the 35B body, dated before 2026-04-19).
- ``stale-drafter``: a drafter dated 2026-04-12 (before the 2026-04-19 fix).

The package's parts: ``kinds`` (model kinds, variants, their dates), ``safetensors`` (tensors and
their files), ``configs`` (config.json, tokenizer files), ``directory`` (``write_model``) and
``mirror`` (the lab's weights mirror). Their public names stay reachable here.
"""

from __future__ import annotations

from fleetctl.lab.models.configs import config_for, tokenizer_files
from fleetctl.lab.models.directory import canonical_variant, write_model
from fleetctl.lab.models.kinds import (
    DRAFTER_FIX_DATE,
    KINDS,
    MISNESTED_DATE,
    REPO_KINDS,
    STALE_DRAFTER_DATE,
    V1_DATE,
    VARIANTS,
    ModelKind,
    kind_for_repo,
)
from fleetctl.lab.models.mirror import (
    MirrorEntry,
    MirrorSpec,
    manifest_for,
    populate_mirror,
    repo_recipes,
)
from fleetctl.lab.models.safetensors import Tensor, tensors_for, write_safetensors

__all__ = [
    "DRAFTER_FIX_DATE",
    "KINDS",
    "MISNESTED_DATE",
    "REPO_KINDS",
    "STALE_DRAFTER_DATE",
    "V1_DATE",
    "VARIANTS",
    "MirrorEntry",
    "MirrorSpec",
    "ModelKind",
    "Tensor",
    "canonical_variant",
    "config_for",
    "kind_for_repo",
    "manifest_for",
    "populate_mirror",
    "repo_recipes",
    "tensors_for",
    "tokenizer_files",
    "write_model",
    "write_safetensors",
]
