"""A model's ``config.json`` (with its ``revision_date``) and its tokenizer files."""

from __future__ import annotations

from typing import Any

from fleetctl.lab.models.kinds import ModelKind


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


def tokenizer_files(kind: ModelKind) -> dict[str, Any]:
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
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% "
        "endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% "
        "endif %}{% endif %}"
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
