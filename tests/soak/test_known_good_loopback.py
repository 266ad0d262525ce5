"""The known-good comparison against the emulator on loopback (real HTTP, the ledger in SQLite).

A healthy version's passing soak records the recipe's reference set; the degenerate build
(scenario ``degenerate``: long answers loop after ~100 tokens, at every concurrency) then fails
the ``known_good`` check with both texts, where its own c=1 references loop as well; a healthy
build soaked again against the reference passes (no false alarm). Side by side: the same prompts
asked of a host still on the old version stand for the known-good where the ledger has none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fleetctl import inventory, paths
from fleetctl.lab.scenarios import SCENARIOS
from fleetctl.rollout import side_by_side
from fleetctl.soak import references
from fleetctl.soak.answerset import ReferenceSet
from fleetctl.soak.phases.answer_set import collect
from fleetctl.soak.run import Against, run_soak
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
    v = run_soak(
        dataclasses.replace(bad.target, tag="v-degen", digest="sha256:" + "b" * 64),
        _cfg(),
        Against(reference=known),
        run_id="soak-degen",
    )
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
    again = run_soak(
        dataclasses.replace(healthy.target, tag="v-next"),
        _cfg(),
        Against(reference=known),
    )
    assert again.outcome is Outcome.PASS, again.summary
    assert "100.0% identical" in again.check("known_good").message
    led.close()


def test_side_by_side_a_host_still_on_the_old_version_is_the_known_good(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    # No set in the ledger (a recipe's first rollout under fleetctl): the same greedy prompts asked
    # of a host still on the old version while the canary soaks are what the canary is judged by.
    old = emulator(EMU_SPEED="8")
    bad = emulator(EMU_SPEED="8", **DEGENERATE)
    pool = ThreadPoolExecutor(1)
    side = pool.submit(lambda: ReferenceSet(
        collect(dataclasses.replace(old.target, tag="v-old"), _cfg()), tag="v-old",
        host="spark-02", source="side-by-side"))
    v = run_soak(dataclasses.replace(bad.target, tag="v-degen"), _cfg(), Against(side=side))
    pool.shutdown()
    kg = v.check("known_good")
    assert kg.outcome is Outcome.FAIL, kg.message
    assert "on a host still serving it" in kg.message and "v-old" in kg.message
    assert "a loop the known-good did not have" in kg.message
    assert any(m.label.startswith("side-by-side ") for m in kg.measurements)
    # ... and a healthy canary agrees with the old host answer for answer.
    side = ThreadPoolExecutor(1).submit(lambda: ReferenceSet(
        collect(old.target, _cfg()), tag="v-old", source="side-by-side"))
    good = run_soak(dataclasses.replace(old.target, tag="v-new"), _cfg(), Against(side=side))
    assert good.check("known_good").outcome is Outcome.PASS, good.check("known_good").message
    assert "100.0% identical" in good.check("known_good").message


def test_the_peer_is_a_pending_host_of_the_rollout_still_on_another_digest(
    tmp_path: Path,
) -> None:
    inv = inventory.load(paths.project_root() / "inventory" / "example")
    with fleet_ledger.open_ledger(tmp_path) as led:
        hosts = [{"host": n, "wave": 0, "step": i, "before_tag": "v-old",
                  "before_digest": "sha256:" + "a" * 64, "target_tag": "v-new",
                  "target_digest": "sha256:" + "b" * 64}
                 for i, n in enumerate(("spark-01", "spark-02", "spark-03"))]
        led.create("ro-1", kind="rollout", recipe="qwen", requested="v-new", tag="v-new",
                   digest="sha256:" + "b" * 64, image="img", options={}, command="test",
                   waves=[["spark-01"], ["spark-02", "spark-03"]], hosts=hosts)
        found = side_by_side.peer(led, inv, "ro-1", "spark-01")
        assert found is not None
        host, tag, digest = found
        assert host.name in ("spark-02", "spark-03") and tag == "v-old"
        assert digest == "sha256:" + "a" * 64
        for n in ("spark-02", "spark-03"):  # once the old hosts moved, there is none to ask
            led.host_phase("ro-1", n, "done", status=fleet_ledger.DONE)
        assert side_by_side.peer(led, inv, "ro-1", "spark-01") is None
        assert side_by_side.peer(led, inv, "no-such-rollout", "spark-01") is None
