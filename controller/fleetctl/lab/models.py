"""Tiny but well-formed model directories (and deliberately broken ones) for the lab.

``write_model(dir, kind, variant)`` writes what ``hf download`` leaves in ``--local-dir``:
``config.json``, sharded ``*.safetensors`` with valid headers (8-byte little-endian
header length + JSON header + tensor data whose ``data_offsets`` tile the data
exactly), ``model.safetensors.index.json`` (bodies; drafters are one
``model.safetensors`` like z-lab's), ``generation_config.json`` and tokenizer files.
Tensor names follow each model kind (Qwen3.6 35B-A3B: ``model.language_model.layers.N.*``
and the 333 ``model.visual.*`` vision tensors). A model is a few hundred KB; ``size_bytes``
pads the embedding so a model weighs what a throughput benchmark needs.

Convention shared with the stage (``roles/weights``): every ``config.json`` carries ``"revision_date": "YYYY-MM-DD"`` (the date of the hub
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

Why one file of ~800 lines: each model kind's tensor layout and each broken variant are data
described side by side, so that a new failure is written next to the good layout it breaks.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.errors import FleetError

VARIANTS = (
    "good",
    "lfs-pointer",
    "escaping-symlink",
    "missing-shard",
    "corrupt-header",
    "misnested-vision",
    "v1-keys",
    "stale-drafter",
)
#: A drafter revision before this date is the one that crashes past ~16K tokens.
DRAFTER_FIX_DATE = "2026-04-19"
STALE_DRAFTER_DATE = "2026-04-12"
V1_DATE = "2026-04-10"
MISNESTED_DATE = "2026-05-20"

#: Safetensors dtype -> bytes per element.
_DTYPE_BYTES = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}


@dataclass(frozen=True)
class ModelKind:
    """One model the recipes serve: its config and how its tensors are named."""

    name: str
    role: str  # "body" or "drafter"
    architecture: str
    model_type: str
    quant: str | None  # "compressed-tensors", "modelopt" or None (BF16)
    layers: int
    hidden: int
    max_position_embeddings: int
    date: str
    vision: str | None = None  # "qwen" (model.visual.*), "gemma" (model.vision_tower.*) or None
    mtp: bool = False
    moe: bool = False
    linear_attention: bool = False
    extra_config: Mapping[str, Any] = field(default_factory=dict)


KINDS: dict[str, ModelKind] = {
    k.name: k
    for k in (
        ModelKind(
            "qwen36-35b-a3b-nvfp4",
            "body",
            "Qwen3_5MoeForConditionalGeneration",
            "qwen3_5_moe",
            "compressed-tensors",
            40,
            2048,
            262144,
            "2026-06-18",
            vision="qwen",
            moe=True,
            linear_attention=True,
        ),
        ModelKind(
            "qwen36-35b-a3b-dflash",
            "drafter",
            "DFlashDraftModel",
            "qwen3",
            None,
            8,
            2048,
            262144,
            "2026-05-02",
            extra_config={
                "dflash_config": {"target_layer_ids": [1, 9, 17, 25, 33], "block_size": 16},
                "num_target_layers": 40,
            },
        ),
        ModelKind(
            "qwen36-27b-mm-nvfp4-mtp",
            "body",
            "Qwen3_5ForConditionalGeneration",
            "qwen3_5",
            "modelopt",
            64,
            5120,
            262144,
            "2026-06-20",
            vision="qwen",
            mtp=True,
            linear_attention=True,
        ),
        ModelKind(
            "qwen36-27b-dflash",
            "drafter",
            "DFlashDraftModel",
            "qwen3",
            None,
            5,
            5120,
            262144,
            "2026-05-10",
            extra_config={
                "dflash_config": {"target_layer_ids": [1, 16, 31, 46, 61], "block_size": 16},
                "num_target_layers": 64,
            },
        ),
        ModelKind(
            "gemma4-26b-a4b-nvfp4",
            "body",
            "Gemma4ForConditionalGeneration",
            "gemma4",
            "compressed-tensors",
            30,
            2816,
            262144,
            "2026-06-15",
            vision="gemma",
            moe=True,
        ),
        ModelKind(
            "gemma4-26b-a4b-dflash",
            "drafter",
            "DFlashDraftModel",
            "gemma4_text",
            None,
            5,
            2816,
            262144,
            "2026-06-01",
            extra_config={
                "sliding_window": 2048,
                "num_target_layers": 30,
                "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
            },
        ),
        ModelKind(
            "qwen35-35b-a3b-bf16",
            "body",
            "Qwen3_5MoeForConditionalGeneration",
            "qwen3_5_moe",
            None,
            40,
            2048,
            262144,
            "2026-03-02",
            vision="qwen",
            moe=True,
            linear_attention=True,
        ),
    )
}

#: Known hub repos -> model kind (anything else is guessed by :func:`kind_for_repo`).
REPO_KINDS = {
    "AEON-7/Qwen3.6-35B-A3B-heretic-NVFP4": "qwen36-35b-a3b-nvfp4",
    "z-lab/Qwen3.6-35B-A3B-DFlash": "qwen36-35b-a3b-dflash",
    "AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-Multimodal-NVFP4-MTP": "qwen36-27b-mm-nvfp4-mtp",
    "z-lab/Qwen3.6-27B-DFlash": "qwen36-27b-dflash",
    "AEON-7/Gemma-4-26B-A4B-it-Uncensored-NVFP4": "gemma4-26b-a4b-nvfp4",
    "z-lab/gemma-4-26B-A4B-it-DFlash": "gemma4-26b-a4b-dflash",
    "Qwen/Qwen3.5-35B-A3B": "qwen35-35b-a3b-bf16",
}


def kind_for_repo(repo: str, role: str | None = None) -> str:
    """The model kind of a hub repo: a known repo, else a guess from its name and role."""
    if repo in REPO_KINDS:
        return REPO_KINDS[repo]
    lowered = repo.lower()
    drafter = role == "drafter" or "dflash" in lowered
    if "gemma" in lowered:
        return "gemma4-26b-a4b-dflash" if drafter else "gemma4-26b-a4b-nvfp4"
    if "27b" in lowered:
        return "qwen36-27b-dflash" if drafter else "qwen36-27b-mm-nvfp4-mtp"
    if "qwen3.5" in lowered or "qwen35" in lowered:
        return "qwen36-35b-a3b-dflash" if drafter else "qwen35-35b-a3b-bf16"
    return "qwen36-35b-a3b-dflash" if drafter else "qwen36-35b-a3b-nvfp4"


# --- tensors -------------------------------------------------------------------------
@dataclass(frozen=True)
class Tensor:
    """One tensor of a tiny model: name, safetensors dtype, shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data."""
        n = 1
        for dim in self.shape:
            n *= dim
        return n * _DTYPE_BYTES[self.dtype]


def _linear(prefix: str, quant: str | None) -> list[Tensor]:
    """A linear layer's tensors in each checkpoint format."""
    if quant == "compressed-tensors":
        return [
            Tensor(f"{prefix}.weight_packed", "U8", (4, 4)),
            Tensor(f"{prefix}.weight_scale", "F8_E4M3", (4, 1)),
            Tensor(f"{prefix}.weight_global_scale", "F32", (1,)),
            Tensor(f"{prefix}.input_global_scale", "F32", (1,)),
        ]
    if quant == "modelopt":
        return [
            Tensor(f"{prefix}.weight", "U8", (4, 4)),
            Tensor(f"{prefix}.weight_scale", "F8_E4M3", (4, 1)),
            Tensor(f"{prefix}.weight_scale_2", "F32", (1,)),
            Tensor(f"{prefix}.input_scale", "F32", (1,)),
        ]
    return [Tensor(f"{prefix}.weight", "BF16", (4, 4))]


def _norm(name: str) -> Tensor:
    return Tensor(name, "BF16", (4,))


def _qwen_vision(prefix: str) -> list[Tensor]:
    """The 27-block ViT: 27 x 12 block tensors + 9 patch/pos/merger tensors = 333."""
    out: list[Tensor] = []
    for b in range(27):
        p = f"{prefix}.blocks.{b}"
        for sub in ("attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2", "norm1", "norm2"):
            out.append(Tensor(f"{p}.{sub}.weight", "BF16", (4, 4) if "norm" not in sub else (4,)))
            out.append(Tensor(f"{p}.{sub}.bias", "BF16", (4,)))
    out += [
        Tensor(f"{prefix}.patch_embed.proj.weight", "BF16", (4, 4)),
        Tensor(f"{prefix}.patch_embed.proj.bias", "BF16", (4,)),
        Tensor(f"{prefix}.pos_embed.weight", "BF16", (4, 4)),
        Tensor(f"{prefix}.merger.norm.weight", "BF16", (4,)),
        Tensor(f"{prefix}.merger.norm.bias", "BF16", (4,)),
        Tensor(f"{prefix}.merger.linear_fc1.weight", "BF16", (4, 4)),
        Tensor(f"{prefix}.merger.linear_fc1.bias", "BF16", (4,)),
        Tensor(f"{prefix}.merger.linear_fc2.weight", "BF16", (4, 4)),
        Tensor(f"{prefix}.merger.linear_fc2.bias", "BF16", (4,)),
    ]
    return out


def tensors_for(kind: ModelKind, variant: str = "good", embed_rows: int = 8) -> list[Tensor]:
    """Every tensor of a tiny model of ``kind`` in ``variant``'s layout."""
    if kind.role == "drafter":
        out = [
            Tensor("fc.weight", "BF16", (4, 4)),
            _norm("hidden_norm.weight"),
            _norm("norm.weight"),
        ]
        for n in range(kind.layers):
            p = f"layers.{n}"
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out += _linear(f"{p}.self_attn.{proj}", None)
            for proj in ("gate_proj", "up_proj", "down_proj"):
                out += _linear(f"{p}.mlp.{proj}", None)
            out += [
                _norm(f"{p}.input_layernorm.weight"),
                _norm(f"{p}.post_attention_layernorm.weight"),
            ]
        return out
    text = "model.layers" if variant == "v1-keys" else "model.language_model.layers"
    root = "model" if variant == "v1-keys" else "model.language_model"
    out = [
        Tensor(f"{root}.embed_tokens.weight", "BF16", (embed_rows, 4)),
        _norm(f"{root}.norm.weight"),
        Tensor("lm_head.weight", "BF16", (4, 4)),
    ]
    for n in range(kind.layers):
        p = f"{text}.{n}"
        if kind.linear_attention and n % 4 != 3:
            # Gated DeltaNet layers stay BF16 in every AEON checkpoint.
            for proj in ("in_proj_qkvz", "in_proj_ba", "out_proj"):
                out += _linear(f"{p}.linear_attn.{proj}", None)
            out += [
                Tensor(f"{p}.linear_attn.conv1d.weight", "BF16", (4, 1, 4)),
                Tensor(f"{p}.linear_attn.A_log", "F32", (4,)),
                Tensor(f"{p}.linear_attn.dt_bias", "BF16", (4,)),
                _norm(f"{p}.linear_attn.norm.weight"),
            ]
        else:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out += _linear(f"{p}.self_attn.{proj}", kind.quant)
            out += [_norm(f"{p}.self_attn.q_norm.weight"), _norm(f"{p}.self_attn.k_norm.weight")]
        if kind.moe:
            out.append(Tensor(f"{p}.mlp.gate.weight", "BF16", (4, 4)))
            # Two experts stand for all of them: 122,880 expert tensors would make the model 10 MB.
            for e in range(2):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    out += _linear(f"{p}.mlp.experts.{e}.{proj}", kind.quant)
            if kind.model_type.startswith("qwen"):
                out.append(Tensor(f"{p}.mlp.shared_expert_gate.weight", "BF16", (1, 4)))
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    out += _linear(f"{p}.mlp.shared_expert.{proj}", kind.quant)
        else:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                out += _linear(f"{p}.mlp.{proj}", kind.quant)
        out += [_norm(f"{p}.input_layernorm.weight"), _norm(f"{p}.post_attention_layernorm.weight")]
    if kind.mtp:
        out += [Tensor("mtp.fc.weight", "BF16", (4, 8)), _norm("mtp.norm.weight")]
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out += _linear(f"mtp.layers.0.self_attn.{proj}", None)
    if kind.vision == "qwen":
        out += _qwen_vision(
            "model.language_model.visual" if variant == "misnested-vision" else "model.visual"
        )
    elif kind.vision == "gemma":
        for b in range(4):
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out.append(
                    Tensor(
                        f"model.vision_tower.encoder.layers.{b}.self_attn.{proj}.weight",
                        "BF16",
                        (4, 4),
                    )
                )
        out.append(Tensor("model.embed_vision.embedding_projection.weight", "BF16", (4, 4)))
    return out


def _fill(name: str, nbytes: int) -> Iterator[bytes]:
    """Deterministic tensor data (so that every write of a model hashes the same), in chunks."""
    seed = hashlib.sha256(name.encode()).digest()
    block = seed * (1 << 15)  # 1 MiB
    left = nbytes
    while left > 0:
        chunk = block[: min(left, len(block))]
        left -= len(chunk)
        yield chunk


def write_safetensors(
    path: Path, tensors: list[Tensor], metadata: Mapping[str, str] | None = None
) -> None:
    """Write one safetensors file: 8-byte LE header length, JSON header (space-padded to 8), data."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for t in tensors:
            for chunk in _fill(t.name, t.nbytes):
                fh.write(chunk)


# --- config and tokenizer ------------------------------------------------------------------
def config_for(kind: ModelKind, variant: str, date: str) -> dict[str, Any]:
    """config.json of a tiny model (real field names; layer counts of the real model)."""
    text_config: dict[str, Any] = {
        "hidden_size": kind.hidden,
        "num_hidden_layers": kind.layers,
        "max_position_embeddings": kind.max_position_embeddings,
        "vocab_size": 248320 if kind.model_type.startswith("qwen") else 262144,
    }
    if kind.linear_attention:
        text_config["layer_types"] = [
            "full_attention" if n % 4 == 3 else "linear_attention" for n in range(kind.layers)
        ]
    if kind.moe:
        text_config.update(
            {
                "num_experts": 256 if kind.model_type.startswith("qwen") else 128,
                "num_experts_per_tok": 8,
            }
        )
    architecture = kind.architecture
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": kind.model_type,
        "torch_dtype": "bfloat16",
        "transformers_version": "5.12.1",
        "revision_date": date,
    }
    if kind.role == "drafter":
        config.update(text_config)
        config.update(dict(kind.extra_config))
    elif variant == "v1-keys":
        # v1 stripped the language_model prefix to load through the text-only class.
        config["architectures"] = [architecture.replace("ForConditionalGeneration", "ForCausalLM")]
        config.update(text_config)
    else:
        config["text_config"] = {"model_type": f"{kind.model_type}_text", **text_config}
        if kind.vision:
            config["vision_config"] = {
                "depth": 27 if kind.vision == "qwen" else 4,
                "hidden_size": 1152,
            }
    if kind.quant == "compressed-tensors":
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "type": "float",
                        "group_size": 16,
                        "strategy": "tensor_group",
                    },
                    "input_activations": {
                        "num_bits": 4,
                        "type": "float",
                        "group_size": 16,
                        "dynamic": "local",
                    },
                }
            },
            "ignore": ["lm_head", "re:.*visual.*", "re:.*linear_attn.*", "re:.*mlp.gate$"],
        }
    elif kind.quant == "modelopt":
        config["quantization_config"] = {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "group_size": 16,
            "exclude_modules": ["lm_head", "model.visual*", "*linear_attn*"],
        }
    return config


def _tokenizer_files(kind: ModelKind) -> dict[str, Any]:
    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"]
    added = [
        {
            "id": len(vocab) + i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, s in enumerate(specials)
    ]
    tokenizer: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    )
    return {
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": {
            "tokenizer_class": "Qwen2Tokenizer"
            if kind.model_type.startswith("qwen")
            else "GemmaTokenizer",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "model_max_length": kind.max_position_embeddings,
            "chat_template": template,
        },
        "generation_config.json": {
            "do_sample": True,
            "temperature": 0.6,
            "top_p": 0.95,
            "top_k": 20,
        },
    }


# --- writing a model directory ------------------------------------------------------------
def _variant(name: str) -> str:
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
    """Write a tiny model of ``kind`` in ``variant`` into ``directory`` (created; must be empty or absent).

    ``size_bytes`` pads the embedding table so that the model's data totals about that many
    bytes (throughput benchmarks); ``date`` overrides the revision date. Returns the directory.
    """
    canonical = _variant(variant)
    if kind not in KINDS:
        raise FleetError(f"unknown model kind {kind!r}", fix=f"use one of: {', '.join(KINDS)}")
    spec = KINDS[kind]
    if canonical == "stale-drafter" and spec.role != "drafter":
        raise FleetError(f"variant stale-drafter needs a drafter kind, not {kind!r}")
    if canonical in ("misnested-vision", "v1-keys") and spec.vision != "qwen":
        raise FleetError(f"variant {canonical} needs a Qwen multimodal body kind, not {kind!r}")
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
    for name, content in _tokenizer_files(spec).items():
        (out / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
    if spec.role == "drafter":
        files = {"model.safetensors": tensors}
    else:
        n = max(1, shards)
        files = {}
        per = -(-len(tensors) // n)
        for i in range(n):
            files[f"model-{i + 1:05d}-of-{n:05d}.safetensors"] = tensors[i * per : (i + 1) * per]
        files = {k: v for k, v in files.items() if v}
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


# --- the weights mirror ---------------------------------------------------------------------
@dataclass(frozen=True)
class MirrorSpec:
    """One revision of one repo to put in the mirror."""

    repo: str
    revision: str
    kind: str | None = None
    variant: str = "good"
    date: str | None = None


@dataclass(frozen=True)
class MirrorEntry:
    """One revision written to the mirror: where, and its manifest."""

    repo: str
    revision: str
    path: Path
    manifest: dict[str, Any]


def manifest_for(
    directory: Path, *, repo: str, revision: str, revision_date: str | None
) -> dict[str, Any]:
    """``{"files": [{"path", "size", "sha256"}], "repo", "revision", "revision_date"}`` of a directory."""
    files = []
    for path in sorted(
        p for p in directory.rglob("*") if p.is_file() and p.name != "manifest.json"
    ):
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        files.append(
            {
                "path": path.relative_to(directory).as_posix(),
                "size": path.stat().st_size,
                "sha256": digest.hexdigest(),
            }
        )
    return {"files": files, "repo": repo, "revision": revision, "revision_date": revision_date}


def _specs(items: Iterable[Any] | Mapping[str, Any]) -> list[MirrorSpec]:
    """Mirror specs from MirrorSpecs, Recipe objects, or raw ``fleetctl_recipes`` mappings."""
    values: Iterable[Any] = items.values() if isinstance(items, Mapping) else items
    out: list[MirrorSpec] = []
    for item in values:
        if isinstance(item, MirrorSpec):
            out.append(item)
            continue
        weights = (
            item.get("weights", []) if isinstance(item, Mapping) else getattr(item, "weights", ())
        )
        for w in weights:
            get = (
                w.get
                if isinstance(w, Mapping)
                else (lambda key, default=None, _w=w: getattr(_w, key, default))
            )
            repo, revision, role = get("repo"), get("revision", "main"), get("role", None)
            if not repo:
                raise FleetError(
                    "a recipe weight set has no repo", fix="give every weight set a repo"
                )
            out.append(
                MirrorSpec(
                    repo=str(repo),
                    revision=str(revision or "main"),
                    kind=kind_for_repo(str(repo), role),
                )
            )
    return out


def repo_recipes() -> Mapping[str, Any]:
    """The raw ``fleetctl_recipes`` of the checkout's lab inventory (inventory/lab/group_vars/all)."""
    import yaml

    from fleetctl import paths

    path = paths.project_root() / "inventory/lab/group_vars/all/recipes.yml"
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise FleetError(
            f"cannot read the lab recipes {path}: {exc}", fix="restore the file from git"
        ) from None
    recipes = raw.get("fleetctl_recipes") if isinstance(raw, Mapping) else None
    if not isinstance(recipes, Mapping):
        raise FleetError(f"{path} has no fleetctl_recipes mapping", fix="restore the file from git")
    return recipes


def populate_mirror(
    root: Path | str, recipes_or_specs: Iterable[Any] | Mapping[str, Any] | None = None
) -> list[MirrorEntry]:
    """Write every recipe's body and drafter (or each MirrorSpec) as ``<root>/<repo>/<revision>/`` + manifest.json.

    Accepts ``fleetctl_recipes`` (a mapping name -> recipe dict), Recipe objects (with
    ``.weights``), or MirrorSpec items; None means the checkout's lab recipes. A revision
    already present with a manifest is kept as is (a second ``lab up`` is fast); duplicates
    are written once.
    """
    base = Path(root)
    written: list[MirrorEntry] = []
    seen: set[tuple[str, str]] = set()
    for spec in _specs(repo_recipes() if recipes_or_specs is None else recipes_or_specs):
        if (spec.repo, spec.revision) in seen:
            continue
        seen.add((spec.repo, spec.revision))
        target = base / spec.repo / spec.revision
        manifest_path = target / "manifest.json"
        if manifest_path.is_file():
            written.append(
                MirrorEntry(spec.repo, spec.revision, target, json.loads(manifest_path.read_text()))
            )
            continue
        kind = spec.kind or kind_for_repo(spec.repo)
        tmp = target.with_name(target.name + ".tmp")
        if tmp.exists():
            _rmtree(tmp)
        write_model(tmp, kind, spec.variant, date=spec.date)
        date = json.loads((tmp / "config.json").read_text()).get("revision_date")
        manifest = manifest_for(tmp, repo=spec.repo, revision=spec.revision, revision_date=date)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if target.exists():
            _rmtree(target)
        tmp.rename(target)
        written.append(MirrorEntry(spec.repo, spec.revision, target, manifest))
    return written


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)
