"""The workload that triggers the known bugs, against the emulator: multi-turn conversations
sharing a context longer than the model's cache block (prefix-cache hits), prompts sized in tokens
by /tokenize,
and a decay that happens only with prefix-cache hits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fleetctl.soak.client import Client
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.run import run_soak
from fleetctl.soak.verdict import Outcome

from .conftest import SERVED, Served


def config(**sustained: Any) -> SoakConfig:
    raw: dict[str, Any] = {
        "concurrency": [1],
        "classes": ["coding", "long_context"],
        "max_tokens": 24,
        "long_context_tokens": 3000,
        "readiness_timeout": 20,
        "sustained": {
            "duration": 12,
            "concurrency": 4,
            "window": 2,
            "shared_prefix_tokens": 2560,
            "turns": 3,
            **sustained,
        },
    }
    return load_config(raw, profile="lab", served_model_names=SERVED, speculative=True)


def test_tokenize_counts_like_the_completion_usage(emulator: Callable[..., Served]) -> None:
    served = emulator(EMU_SPEED="4")

    async def go() -> tuple[int | None, int | None]:
        async with Client(served.target.base_url) as c:
            return await c.tokenize(SERVED[0], "one two three, four."), await c.tokenize(
                "no-such-model", ""
            )

    n, other = asyncio.run(go())
    assert n == 6 and other is not None  # like vLLM, the count does not depend on the name


def test_conversations_hit_the_prefix_cache_and_prompts_meet_their_token_targets(
        emulator: Callable[..., Served]) -> None:
    served = emulator(EMU_SPEED="4")
    v = run_soak(served.target, config(), None)
    assert v.outcome is Outcome.PASS, v.summary
    decay = v.check("acceptance_decay")
    hits = next(m for m in decay.measurements if m.label == "prefix cache")
    assert (
        hits.outcome is Outcome.PASS and isinstance(hits.measured, float) and hits.measured > 0.3
    ), hits.message
    for check, name in (
        ("long_context", "long_context prompt"),
        ("acceptance_decay", "shared_prefix prompt"),
    ):
        m = next(m for m in v.check(check).measurements if m.label == name)
        assert m.outcome is Outcome.PASS and "sized by tokenize" in m.message, m.message
        assert isinstance(m.measured, int) and isinstance(m.bound, int)
        assert abs(m.measured - m.bound) / m.bound < 0.25, m.message


def test_a_decay_that_needs_prefix_cache_hits_is_caught(emulator: Callable[..., Served]) -> None:
    served = emulator(EMU_SPEED="4", EMU_DECAY_PER_CACHE_HIT="0.02")
    # A context configured shorter than the server's 2048-token block (vllm:cache_config_info) would
    # never hit the cache; the soak grows it to 1.25 blocks and the decay shows.
    v = run_soak(served.target, config(shared_prefix_tokens=512), None)
    decay = v.check("acceptance_decay")
    assert decay.outcome is Outcome.FAIL and "fell" in decay.message, decay.message
    size = next(m for m in decay.measurements if m.label == "shared_prefix prompt")
    assert size.bound == 2560, size.message
    assert v.check("errors").outcome is Outcome.PASS
    assert v.outcome is Outcome.FAIL


def test_without_shared_prefixes_the_same_server_is_inconclusive_not_passed(
    emulator: Callable[..., Served],
) -> None:
    served = emulator(EMU_SPEED="4", EMU_DECAY_PER_CACHE_HIT="0.02")
    v = run_soak(served.target, config(shared_prefix_tokens=0, turns=1), None)
    decay = v.check("acceptance_decay")
    assert decay.outcome is Outcome.INCONCLUSIVE, decay.message
    assert "never exercised" in decay.message


def test_foreign_traffic_is_detected_and_makes_its_checks_inconclusive(
    emulator: Callable[..., Served],
) -> None:
    served = emulator(EMU_SPEED="4", EMU_FOREIGN_RPS="20")
    v = run_soak(served.target, config(shared_prefix_tokens=0), None)
    tp = v.check("throughput")
    assert tp.outcome is Outcome.INCONCLUSIVE and "another client is using it" in tp.message, (
        tp.message
    )
    assert "fleetctl_front_door" in tp.message, tp.message  # the way to soak a host out of rotation
    assert any(m.label.endswith("foreign") for m in v.check("acceptance_decay").measurements)
    assert v.outcome is Outcome.INCONCLUSIVE, v.summary
    clean = run_soak(emulator(EMU_SPEED="4").target, config(), None)
    assert all(w.foreign_requests is not None and w.foreign_requests <= 3 for w in clean.windows), \
        [(w.label, w.foreign_requests) for w in clean.windows]


def test_trials_warm_up_itl_and_an_open_loop_level(emulator: Callable[..., Served]) -> None:
    served = emulator(EMU_SPEED="4")
    raw: dict[str, Any] = {
        "concurrency": [1, 4],
        "classes": ["coding"],
        "max_tokens": 24,
        "readiness_timeout": 20,
        "trials": 3,
        "stagger": 0.02,
        "request_rates": [6],
        "requests_per_level": 2,
        "min_requests_per_level": 6,
        "sustained": {"duration": 0},
    }
    v = run_soak(
        served.target,
        load_config(raw, profile="lab", served_model_names=SERVED, speculative=True),
        None,
    )
    assert v.outcome is Outcome.PASS, v.summary
    sweep = {lv.label: lv for lv in v.levels if lv.phase == "sweep"}
    assert set(sweep) == {"c=1", "c=4"}
    for lv in sweep.values():
        assert len(lv.trials) == 3 and lv.tok_s is not None
        assert abs(lv.tok_s - sorted(lv.trials)[1]) < 0.1  # the median trial (trials are rounded)
        assert lv.requests == 3 * max(2 * lv.concurrency, 6) and lv.warmup == 3 * lv.concurrency
        assert lv.itl_p50 is not None and lv.itl_p99 is not None and lv.itl_p50 <= lv.itl_p99
    rate = next(lv for lv in v.levels if lv.phase == "rate")
    assert rate.label == "r=6/s" and rate.requests == 12 and rate.errors == 0 and rate.tok_s
