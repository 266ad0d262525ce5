"""The re-gate's burst of load (``soak/burst.py``) against the emulator on loopback: a healthy
server passes with tokens on every request and the canaries right; one that dies under concurrent
requests (smoke, one request at a time, passes) and a wedged one fail, and the burst ends."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetctl.progress import Recorder
from fleetctl.soak import burst, prompts, smoke_check
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.verdict import Outcome, SoakTarget
from tests.soak.conftest import Served
from tests.soak.fakevllm import FakeVLLM, answer_for, good_chat, prompt_of, serve, stream_tokens

MODEL = ("qwen36-35b-heretic",)


def test_a_healthy_server_passes_a_burst_of_concurrent_greedy_requests_and_canaries(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    served = emulator(spec=False)
    cfg = load_config({}, profile="lab", served_model_names=MODEL)
    rec = Recorder()
    v = burst.short_load(served.target, cfg, 2.0, artifacts_dir=tmp_path / "load", progress=rec)
    assert v.outcome is Outcome.PASS, v.summary
    assert {c.name: c.outcome for c in v.checks} == dict.fromkeys(
        ("load", "liveness", "tokens", "canary"), Outcome.PASS)
    (lv,) = v.levels
    # Concurrent: every worker's requests plus the canaries; tokens on all of them.
    assert lv.concurrency == burst.CONCURRENCY and lv.errors == 0
    assert lv.requests >= burst.CONCURRENCY + len(prompts.CANARIES) and lv.output_tokens > 0
    samples = [json.loads(x) for x in (tmp_path / "load" / "samples.jsonl").read_text().split("\n")
               if x]
    assert len(samples) == lv.requests and all(s["output_tokens"] for s in samples)
    assert {s["cls"] for s in samples} >= {f"canary-{c.name}" for c in prompts.CANARIES}
    assert max(s["concurrency"] for s in samples) == burst.CONCURRENCY
    assert json.loads((tmp_path / "load" / "verdict.json").read_text())["outcome"] == "pass"
    assert [e.phase for e in rec.events] == ["load", "load"]


def test_a_server_that_dies_under_concurrency_passes_smoke_and_fails_the_burst(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    served = emulator(spec=False, EMU_CRASH_AT_CONCURRENCY=str(burst.CONCURRENCY))
    cfg = load_config({"checks": {"liveness": {"token_timeout": 2}}}, profile="lab",
                      served_model_names=MODEL)
    assert smoke_check(served.target, cfg, artifacts_dir=tmp_path / "smoke").passed
    v = burst.short_load(served.target, cfg, 2.0, artifacts_dir=tmp_path / "load")
    assert v.outcome is Outcome.FAIL and v.check("load").outcome is Outcome.FAIL, v.summary
    assert v.summary.startswith("fail: load: ") and v.levels[0].errors > 0


def test_a_wedged_server_fails_the_burst_on_liveness_and_the_burst_ends(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    served = emulator(spec=False)
    served.proc.send_signal(signal.SIGUSR1)  # no token; /health and /metrics answer
    cfg = load_config({"checks": {"liveness": {"token_timeout": 1}}}, profile="lab",
                      served_model_names=MODEL)
    v = burst.short_load(served.target, cfg, 1.0, artifacts_dir=tmp_path / "load")
    assert v.outcome is Outcome.FAIL, v.summary
    live = v.check("liveness")
    assert live.outcome is Outcome.FAIL and "no token for 1s" in live.message, live
    assert v.check("canary").outcome is Outcome.FAIL and v.levels[0].requests >= 1


def test_requests_that_finish_without_a_token_fail_the_burst(tmp_path: Path) -> None:
    """A server that answers the canaries but finishes every other request at once, empty."""

    async def empty(f: FakeVLLM, r: Any, body: dict[str, Any]) -> Any:
        if answer_for(prompt_of(body)) is not None:
            return await good_chat(f, r, body)
        return await stream_tokens(f, r, body, [])

    cfg = load_config({}, profile="lab", served_model_names=("fake-model",))
    with serve(FakeVLLM(chat=empty)) as fake:
        v = burst.short_load(SoakTarget("fake", fake.url), cfg, 1.0)
    assert v.check("canary").outcome is Outcome.PASS, v.check("canary")
    flow = v.check("tokens")
    assert flow.outcome is Outcome.FAIL and "streamed no token" in flow.message, flow
    assert v.outcome is Outcome.FAIL
