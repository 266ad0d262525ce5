"""The known-good comparison against the emulator on loopback (real HTTP, the ledger in SQLite).

A healthy version's passing soak records the recipe's reference set; the degenerate build
(scenario ``degenerate``: long answers loop after ~100 tokens, at every concurrency) then fails
the ``known_good`` check with both texts, where its own c=1 references loop as well; a healthy
build soaked again against the reference passes (no false alarm).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from fleetctl.lab.scenarios import SCENARIOS
from fleetctl.soak import references
from fleetctl.soak.run import run_soak
from fleetctl.soak.verdict import Outcome
from fleetctl.state import ledger as fleet_ledger

from .conftest import Served
from .test_engine_loopback import fast_config

DEGENERATE = SCENARIOS["degenerate"]


def _cfg():  # type: ignore[no-untyped-def]
    # No sustained phase and one class: the comparison needs the reference set, not the load.
    return fast_config(concurrency=[1, 4], classes=["coding"],
                       sustained={"duration": 0, "concurrency": 1, "window": 1},
                       checks={"long_prompts": {"tokens": []}})


def test_a_degenerate_build_fails_against_the_known_good_and_a_healthy_one_passes(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    led = fleet_ledger.open_ledger(tmp_path)
    key = references.key("qwen")
    healthy = emulator(EMU_SPEED="8")
    first = run_soak(dataclasses.replace(healthy.target, tag="v-good", digest="sha256:" + "a" * 64),
                     _cfg(), None, run_id="soak-good")
    assert first.outcome is Outcome.PASS, first.summary
    assert "first deploy" in first.check("known_good").message
    assert references.save(led, key, first, "qwen") is not None
    known = references.load(led, key)
    assert known is not None and known.tag == "v-good" and known.run_id == "soak-good"
    assert all(a.finish_reason == "stop" for a in known.answers if a.kind != "long_decode")

    bad = emulator(EMU_SPEED="8", **DEGENERATE)
    v = run_soak(dataclasses.replace(bad.target, tag="v-degen", digest="sha256:" + "b" * 64),
                 _cfg(), None, run_id="soak-degen", reference=known)
    assert v.outcome is Outcome.FAIL
    kg = v.check("known_good")
    assert kg.outcome is Outcome.FAIL, kg.message
    assert "a loop the known-good did not have" in kg.message
    assert "where the known-good stopped by itself" in kg.message
    assert "I can help with that." in kg.message and "v-degen" in kg.message
    assert "v-good" in kg.message  # both versions, both texts
    assert v.known_good_run_id == "soak-good"
    # A failed soak never becomes the known-good.
    assert references.save(led, key, v, "qwen") is None
    assert references.load(led, key) == known

    # Without the known-good, the same build's loops are inconclusive, never a pass.
    alone = run_soak(bad.target, _cfg(), None)
    assert alone.check("known_good").outcome is Outcome.INCONCLUSIVE
    assert alone.outcome is not Outcome.PASS

    # A healthy new version still passes against the reference: its greedy answers agree.
    again = run_soak(dataclasses.replace(healthy.target, tag="v-next"), _cfg(), None,
                     reference=known)
    assert again.outcome is Outcome.PASS, again.summary
    assert "100.0% identical" in again.check("known_good").message
    led.close()
