"""What the emulator checks of a model directory at boot, with the errors a real vLLM gives.

Only ``config.json``, the shard index and each shard's safetensors header are read
(8-byte little-endian header length, then a JSON header), never the tensor data:
enough to fail like vLLM on missing weights, LFS pointer files, dangling symlinks,
missing shards and corrupt headers, and to warn like vLLM on mis-nested vision tensors.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Safetensors refuses headers larger than this (the Rust crate's MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000


class BootError(Exception):
    """A reason vLLM refuses to start; ``str()`` is the log line vLLM prints."""


def invalid_model_message(model: str) -> str:
    """vLLM's message for a path that is neither a local model dir nor a hub repo id."""
    return (
        f"ValueError: Invalid repository ID or local directory specified: '{model}'.\n"
        "Please verify the following requirements:\n"
        "1. Provide a valid Hugging Face repository ID.\n"
        "2. Specify a local directory that contains a recognized configuration file.\n"
        "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
        "   - For Mistral models: ensure the presence of a 'params.json'."
    )


def read_config(model_dir: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a model directory, or BootError as vLLM reports it."""
    config_path = model_dir / "config.json"
    if not model_dir.is_dir() or not config_path.is_file():
        raise BootError(invalid_model_message(str(model_dir)))
    try:
        loaded = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BootError(
            f"OSError: It looks like the config file at '{config_path}' is not a valid JSON file. "
            f"({exc})"
        ) from None
    if not isinstance(loaded, dict):
        raise BootError(f"OSError: config file at '{config_path}' is not a JSON object.")
    return loaded


def read_header(shard: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file, or BootError with the safetensors message."""
    try:
        with shard.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise BootError(
                    "safetensors_rust.SafetensorError: Error while deserializing header: "
                    "HeaderTooSmall"
                )
            (length,) = struct.unpack("<Q", head)
            size = shard.stat().st_size
            if length > MAX_HEADER_BYTES or length + 8 > size:
                raise BootError(
                    "safetensors_rust.SafetensorError: Error while deserializing header: "
                    "HeaderTooLarge"
                )
            raw = fh.read(length)
    except FileNotFoundError:
        raise BootError(
            f"FileNotFoundError: [Errno 2] No such file or directory: '{shard}'"
        ) from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BootError(
            "safetensors_rust.SafetensorError: Error while deserializing header: "
            "InvalidHeaderDeserialization"
        ) from None
    if not isinstance(header, dict):
        raise BootError(
            "safetensors_rust.SafetensorError: Error while deserializing header: "
            "InvalidHeaderDeserialization"
        )
    return header


@dataclass(frozen=True)
class LoadedWeights:
    """What loading a model directory found."""

    config: dict[str, Any]
    tensor_names: tuple[str, ...]
    shards: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def vision_loaded(self) -> bool:
        """True when vision tensors sit where vLLM's multimodal class looks (``model.visual.*``)."""
        return any(n.startswith("model.visual.") for n in self.tensor_names)

    @property
    def revision_date(self) -> str | None:
        """The revision date the lab's model writer records in config.json (None if absent)."""
        value = self.config.get("revision_date")
        return str(value) if value else None


def load_weights(model_dir: Path) -> LoadedWeights:
    """Read config, index and every shard header of ``model_dir``, failing like vLLM would."""
    config = read_config(model_dir)
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            weight_map = dict(index["weight_map"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BootError(f"ValueError: invalid shard index '{index_path}': {exc}") from None
        shards = sorted(set(map(str, weight_map.values())))
    else:
        shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
        weight_map = {}
    if not shards:
        raise BootError(f"RuntimeError: Cannot find any model weights with `{model_dir}`")
    names: list[str] = []
    for shard in shards:
        header = read_header(model_dir / shard)
        names.extend(k for k in header if k != "__metadata__")
    # A shard file that exists but that the index does not list is never loaded by vLLM:
    # its tensors are then missing, which vLLM reports as a parameter without weights.
    listed = set(weight_map)
    missing = [n for n in names if weight_map and n not in listed]
    if missing:
        raise BootError(
            "ValueError: Following weights were not initialized from checkpoint: "
            f"{{'{missing[0]}', ...}} "
            f"({len(missing)} tensors are in a shard that model.safetensors.index.json does not "
            "list)"
        )
    warnings: list[str] = []
    misnested = [n for n in names if n.startswith("model.language_model.visual.")]
    if misnested:
        # vLLM's Qwen3_5MoeForConditionalGeneration builds self.visual at model.visual: these
        # are skipped with one warning each and the vision tower runs uninitialised.
        warnings.extend(
            f"WARNING [utils.py:101] Parameter {n[len('model.language_model.') :]} not found in "
            "params_dict, skip loading"
            for n in misnested[:5]
        )
        warnings.append(
            f"WARNING {len(misnested)} vision tensors skipped (model.language_model.visual.*)"
        )
    return LoadedWeights(
        config=config, tensor_names=tuple(names), shards=tuple(shards), warnings=tuple(warnings)
    )
