"""The soak against hostile or broken servers on loopback (tests/soak/fakevllm.py): each case
asserts the verdict and its message; the hostile ones also a wall-time and memory ceiling in this
process."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from pathlib import Path
from typing import Any

from aiohttp import web

from fleetctl.progress import Recorder
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.run import run_soak
from fleetctl.soak.verdict import Outcome, SoakTarget, Verdict

from .fakevllm import (
    MODEL,
    FakeVLLM,
    answer_for,
    event,
    good_chat,
    prompt_of,
    serve,
    sse_start,
    stream_tokens,
    words,
)


def quick(**over: Any) -> SoakConfig:
    """A soak of seconds against the fake server: one class, two levels, a short sustained phase."""
    raw: dict[str, Any] = {
        "concurrency": [1, 2], "classes": ["coding"], "max_tokens": 24, "readiness_timeout": 10,
        "request_timeout": 10, "level_timeout": 10, "class_requests": 2,
        "sustained": {"duration": 3, "concurrency": 2, "window": 1, "shared_prefix_tokens": 0},
        "checks": {"correctness": {"long_decode_tokens": 0}},
    }
    raw.update(over)
    return load_config(raw, profile="lab", served_model_names=(MODEL,), speculative=True)


def soak(fake: FakeVLLM, cfg: SoakConfig, tmp_path: Path) -> Verdict:
    return run_soak(SoakTarget("fake", fake.url), cfg, artifacts_dir=tmp_path / "run")


def _lying_spec_metrics(f: FakeVLLM) -> str:
    # 4 draft tokens per draft, and 4.636 "accepted" per draft: 115.9 %.
    g = f.generated
    return (
        f'vllm:request_success_total{{finished_reason="length"}} {f.finished}\n'
        f"vllm:generation_tokens_total {g}\nvllm:num_preemptions_total 0\n"
        f"vllm:spec_decode_num_drafts_total {g}\nvllm:spec_decode_num_draft_tokens_total {4 * g}\n"
        f"vllm:spec_decode_num_accepted_tokens_total {4.636 * g}\n"
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {0.9 * g}\n'
    )


def test_impossible_acceptance_counters_make_the_acceptance_checks_inconclusive(
    tmp_path: Path,
) -> None:
    with serve(FakeVLLM(metrics=_lying_spec_metrics)) as fake:
        v = soak(fake, quick(), tmp_path)
    acc = v.check("acceptance")
    assert acc.outcome is Outcome.INCONCLUSIVE, acc.message
    assert (
        "metrics inconsistent" in acc.message
        and "vllm:spec_decode_num_accepted_tokens_total" in acc.message
    )
    assert "115.9%" in acc.message  # what it would have read, named as impossible
    assert v.check("acceptance_decay").outcome is Outcome.INCONCLUSIVE
    assert v.outcome is Outcome.INCONCLUSIVE, v.summary
    assert "acceptance 115.9" not in v.summary
    assert all(w.acceptance_rate is None or w.acceptance_rate <= 1 for w in v.windows)


def spec_metrics(f: FakeVLLM) -> str:
    """Healthy speculative-decoding counters: 4 draft tokens a draft, half accepted."""
    g = f.generated
    return (
        f'vllm:request_success_total{{finished_reason="length"}} {f.finished}\n'
        f"vllm:generation_tokens_total {g}\nvllm:num_preemptions_total 0\n"
        f"vllm:prompt_tokens_total {f.prompt_tokens}\n"
        f"vllm:spec_decode_num_drafts_total {g / 4}\nvllm:spec_decode_num_draft_tokens_total {g}\n"
        f"vllm:spec_decode_num_accepted_tokens_total {g / 2}\n"
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {g / 5}\n'
    )


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


#: What a hostile server may cost this process's peak memory (the endless stream once grew it 5.8
#: GB).
MEMORY_CEILING_MB = 300


async def _endless(f: FakeVLLM, r: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Valid SSE content events forever, never [DONE]."""
    resp = await sse_start(r)
    block = event("tok ") * 256
    with contextlib.suppress(ConnectionError, RuntimeError):
        while True:
            await resp.write(block)
    return resp


def test_an_endless_stream_is_cut_at_its_byte_cap(tmp_path: Path) -> None:
    before = _peak_rss_mb()
    with serve(FakeVLLM(chat=_endless)) as fake:
        v = soak(fake, quick(), tmp_path)
    assert _peak_rss_mb() - before < MEMORY_CEILING_MB
    smoke = v.check("smoke")
    assert v.outcome is Outcome.FAIL and smoke.outcome is Outcome.FAIL
    assert "the stream passed" in smoke.message and "bytes a token" in smoke.message, smoke.message


def test_a_lying_tokenize_is_not_believed_and_the_prompt_stays_bounded(tmp_path: Path) -> None:
    before = _peak_rss_mb()
    asked: list[int] = []

    def lying(text: str) -> dict[str, int]:
        asked.append(len(text))
        return {"count": 10}

    with serve(FakeVLLM(tokenize=lying, metrics=spec_metrics)) as fake:
        v = soak(
            fake, quick(classes=["coding", "long_context"], long_context_tokens=3000), tmp_path
        )
    assert _peak_rss_mb() - before < MEMORY_CEILING_MB
    assert asked and max(asked) <= 3000 * 16  # never grown past 16 characters a token
    lc = v.check("long_context")
    assert lc.outcome is Outcome.INCONCLUSIVE, lc.message
    assert "/tokenize not believed: 10 tokens for" in lc.message, lc.message


async def _hang_after_smoke(
    f: FakeVLLM, r: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    if f.chats == 1:
        return await good_chat(f, r, body)
    await asyncio.sleep(3600)  # never answers; /health stays 200
    raise AssertionError("unreachable")


def test_a_server_that_hangs_after_smoke_is_a_wedged_engine_and_the_soak_stops(
    tmp_path: Path,
) -> None:
    rec = Recorder()
    with serve(FakeVLLM(chat=_hang_after_smoke)) as fake:
        v = run_soak(
            SoakTarget("fake", fake.url),
            quick(
                checks={"correctness": {"long_decode_tokens": 0}, "liveness": {"token_timeout": 2}}
            ),
            progress=rec,
            artifacts_dir=tmp_path / "run",
        )
        chats = fake.chats
    live = v.check("liveness")
    assert v.outcome is Outcome.FAIL and live.outcome is Outcome.FAIL, v.summary
    assert "engine wedged on fake" in live.message and "no token for 2s" in live.message, (
        live.message
    )
    assert "/health answered 200" in live.message
    # Stopped at the first wedged request: smoke + one canary reference, no load level.
    assert chats == 2 and not v.levels
    assert any(e.phase == "deadline" and e.message.startswith("hard deadline") for e in rec.events)


def test_without_the_liveness_check_a_hang_still_stops_the_soak_early(tmp_path: Path) -> None:
    with serve(FakeVLLM(chat=_hang_after_smoke)) as fake:
        cfg = quick(
            request_timeout=1, checks={"correctness": {"long_decode_tokens": 0}, "liveness": False}
        )
        v = soak(fake, cfg, tmp_path)
        chats = fake.chats
    errors = v.check("errors")
    assert v.outcome is Outcome.FAIL and errors.outcome is Outcome.FAIL, v.summary
    assert "soak stopped early: every canary reference failed" in errors.message, errors.message
    assert chats == 3 and not v.levels


async def _slow(f: FakeVLLM, r: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    prompt = prompt_of(body)
    right = answer_for(prompt)
    toks = (
        [w + " " for w in right.split()]
        if right
        else words(prompt, int(body.get("max_tokens", 16)))
    )
    return await stream_tokens(f, r, body, toks, delay=0.05)


def test_the_hard_deadline_stops_a_soak_and_says_where(tmp_path: Path) -> None:
    with serve(FakeVLLM(chat=_slow)) as fake:
        v = soak(fake, quick(deadline=4, sustained={"duration": 60, "concurrency": 2, "window": 1,
                                                    "shared_prefix_tokens": 0}), tmp_path)
    errors = v.check("errors")
    assert v.outcome is Outcome.INCONCLUSIVE, v.summary
    assert (
        "soak stopped early: the soak reached its hard deadline of 4s during" in errors.message
    ), errors.message


def test_the_hard_deadline_adds_up_every_phase_bound() -> None:
    cfg = quick()
    total, how = cfg.hard_deadline()
    assert total > cfg.readiness_timeout + cfg.sustained_duration
    assert "readiness 10s" in how and "sustained" in how
    assert quick(deadline=90).hard_deadline() == (90.0, "set by the recipe's soak.deadline")


async def _wedge_mid_stream(
    f: FakeVLLM, r: web.Request, body: dict[str, Any]
) -> web.StreamResponse:
    """Healthy for its first 8 answers, then every stream stops after two tokens (/health stays
    200)."""
    if f.chats <= 8:
        return await good_chat(f, r, body)
    resp = await sse_start(r)
    await resp.write(event("still ") + event("here "))
    await asyncio.sleep(3600)
    return resp


def test_a_wedge_mid_stream_is_named_with_its_seconds_and_host(tmp_path: Path) -> None:
    with serve(FakeVLLM(chat=_wedge_mid_stream)) as fake:
        v = soak(
            fake,
            quick(
                checks={"correctness": {"long_decode_tokens": 0}, "liveness": {"token_timeout": 2}}
            ),
            tmp_path,
        )
    live = v.check("liveness")
    assert live.outcome is Outcome.FAIL, v.summary
    assert (
        "engine wedged on fake" in live.message
        and "no token for 2s after 1 token read(s)" in live.message
    ), live.message
    (m,) = [m for m in live.measurements if m.outcome is Outcome.FAIL]
    assert m.bound == 2 and isinstance(m.measured, float) and m.measured >= 2
    assert "timeout" not in v.check("errors").message  # a stall, not a generic timeout
