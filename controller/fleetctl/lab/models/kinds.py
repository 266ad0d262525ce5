"""The model kinds the lab can write (Qwen3.6 bodies, their drafters, ...), the failure variants
of docs/domain.md#weights, the revision dates they stand for, and which hub repo is which kind."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
