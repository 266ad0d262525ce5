"""Build a tiny random-weight Llama for the real-vLLM conformance test (run with the vLLM venv's
python).

    python tiny_llama.py OUT_DIR

Hidden size 128, 2 layers, head_dim 32 (vLLM's CPU attention needs >= 32), a byte-level
BPE tokenizer trained here on a few lines, and a chat template. Random weights: the text
is nonsense, but the server, its streaming, usage and /metrics are all real. This file
imports torch/transformers/tokenizers, which only the vLLM venv has: pytest never imports it.
"""

from __future__ import annotations

import sys
from pathlib import Path

CORPUS = [
    "What is 17 x 23? The answer is 391. ",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. ",
    "2026-07-01T12:00:00Z INFO api request id=000001 took 12 ms status=200\n",
]
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def build(out: Path) -> None:
    """Write tokenizer + config + random weights (safetensors) into ``out``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([line * 3 for line in CORPUS] * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="float32",
    )
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
