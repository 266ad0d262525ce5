"""The emulator's ``vllm serve`` command line."""

from __future__ import annotations

import pytest

from fleetctl.lab.emulator.args import UsageError, parse


def test_the_seed_recipe_command_line() -> None:
    args = parse(
        [
            "serve",
            "/models/qwen36",
            "--served-model-name",
            "qwen36-35b-heretic",
            "qwen36-fast",
            "qwen36-deep",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--quantization",
            "compressed-tensors",
            "--max-model-len",
            "262144",
            "--max-num-seqs",
            "64",
            "--max-num-batched-tokens",
            "32768",
            "--gpu-memory-utilization",
            "0.70",
            "--enable-chunked-prefill",
            "--enable-prefix-caching",
            "--trust-remote-code",
            "--reasoning-parser",
            "qwen3",
            "--speculative-config",
            '{"method":"dflash","model":"/models/qwen36-dflash","num_speculative_tokens":11}',
            "--attention-backend",
            "flash_attn",
            "--some-future-flag",
            "--another",
            "value",
        ]
    )
    assert args.model == "/models/qwen36"
    assert args.served_model_names == ("qwen36-35b-heretic", "qwen36-fast", "qwen36-deep")
    assert (args.host, args.port) == ("0.0.0.0", 8000)
    assert args.spec_method == "dflash" and args.num_spec_tokens == 11
    assert (args.max_num_seqs, args.max_num_batched_tokens, args.max_model_len) == (
        64,
        32768,
        262144,
    )
    assert args.gpu_memory_utilization == 0.70
    assert args.reasoning_parser == "qwen3"
    assert args.extra["attention-backend"] == "flash_attn"
    assert args.extra["some-future-flag"] is True
    assert args.extra["another"] == "value"


def test_api_server_form_equals_and_underscores() -> None:
    args = parse(
        ["--model=/model", "--max_num_seqs=8", "--port", "9000", "--kv-cache-dtype", "nvfp4"]
    )
    assert args.model == "/model"
    assert args.served_model_names == ("/model",)
    assert args.max_num_seqs == 8 and args.port == 9000 and args.kv_cache_dtype == "nvfp4"
    assert (
        args.speculative_config is None and args.num_spec_tokens == 0 and args.spec_method is None
    )


def test_max_model_len_suffixes() -> None:
    assert parse(["serve", "/m", "--max-model-len", "32k"]).max_model_len == 32000
    assert parse(["serve", "/m", "--max-model-len", "1M"]).max_model_len == 1_000_000


@pytest.mark.parametrize(
    "argv",
    [
        ["serve"],
        ["serve", "/m", "--port", "eighty"],
        ["serve", "/m", "--speculative-config", "{not json"],
        ["serve", "/m", "--speculative-config", "[1]"],
        ["serve", "/m", "--served-model-name"],
    ],
)
def test_usage_errors(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        parse(argv)
