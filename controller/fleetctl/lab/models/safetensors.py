"""Each model kind's tensors, and ``*.safetensors`` files with valid headers whose
``data_offsets`` tile the data exactly."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.lab.models.kinds import ModelKind

#: Safetensors dtype -> bytes per element.
_DTYPE_BYTES = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}


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
        return _drafter_tensors(kind)
    text = "model.layers" if variant == "v1-keys" else "model.language_model.layers"
    root = "model" if variant == "v1-keys" else "model.language_model"
    out = [
        Tensor(f"{root}.embed_tokens.weight", "BF16", (embed_rows, 4)),
        _norm(f"{root}.norm.weight"),
        Tensor("lm_head.weight", "BF16", (4, 4)),
    ]
    for n in range(kind.layers):
        out += _layer_tensors(kind, f"{text}.{n}", n)
    if kind.mtp:
        out += [Tensor("mtp.fc.weight", "BF16", (4, 8)), _norm("mtp.norm.weight")]
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out += _linear(f"mtp.layers.0.self_attn.{proj}", None)
    return out + _vision_tensors(kind, variant)


def _drafter_tensors(kind: ModelKind) -> list[Tensor]:
    """A drafter's tensors (z-lab's layout: one ``model.safetensors``)."""
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


def _layer_tensors(kind: ModelKind, p: str, n: int) -> list[Tensor]:
    """Decoder layer ``n`` of a body, under the prefix ``p``: its attention and its MLP."""
    out: list[Tensor] = []
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
    out += _mlp_tensors(kind, p)
    out += [_norm(f"{p}.input_layernorm.weight"), _norm(f"{p}.post_attention_layernorm.weight")]
    return out


def _mlp_tensors(kind: ModelKind, p: str) -> list[Tensor]:
    """A layer's MLP: dense, or experts (two stand for all) with Qwen's shared expert."""
    out: list[Tensor] = []
    if not kind.moe:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            out += _linear(f"{p}.mlp.{proj}", kind.quant)
        return out
    out.append(Tensor(f"{p}.mlp.gate.weight", "BF16", (4, 4)))
    # Two experts stand for all of them: 122,880 expert tensors would make the model 10 MB.
    for e in range(2):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            out += _linear(f"{p}.mlp.experts.{e}.{proj}", kind.quant)
    if kind.model_type.startswith("qwen"):
        out.append(Tensor(f"{p}.mlp.shared_expert_gate.weight", "BF16", (1, 4)))
        for proj in ("gate_proj", "up_proj", "down_proj"):
            out += _linear(f"{p}.mlp.shared_expert.{proj}", kind.quant)
    return out


def _vision_tensors(kind: ModelKind, variant: str) -> list[Tensor]:
    """The vision tower's tensors (Qwen's or Gemma's; none for a text-only kind)."""
    if kind.vision == "qwen":
        return _qwen_vision(
            "model.language_model.visual" if variant == "misnested-vision" else "model.visual"
        )
    if kind.vision != "gemma":
        return []
    out = [
        Tensor(f"model.vision_tower.encoder.layers.{b}.self_attn.{proj}.weight", "BF16", (4, 4))
        for b in range(4)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj")
    ]
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
    """Write one safetensors file: 8-byte LE header length, JSON header (space-padded to 8),
    data."""
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
