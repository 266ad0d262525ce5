"""What the rollout engine does with each kind of failed or undecided gate, on the simulated fleet
(tests/rollout/sim.py).

These cases once ran on the lab, each a real rollout to the canary with its own image and soak
(tests/rollout/test_rollout_lab.py). What in them needs real SSH, Docker and sshd is still checked
there or on loopback; the engine's part (which hosts are touched, what they serve after, what the
result and the ledger say) is checked here, against ``Engine``'s verbs only:

- a canary that cannot boot (readiness fails with the cause from its logs): rolled back, the cause
in its
  error, the other hosts never touched. The cause's extraction from a real container's logs:
  tests/soak/test_lab.py (a lab node over SSH) and tests/soak/test_engine_loopback.py.
- a canary that fails its soak (acceptance decaying under load was the lab's case): rolled back, the
  others never touched. The decay check itself: tests/soak/test_engine_loopback.py (the emulator
  with EMU_ACCEPT_DECAY_PER_MIN) and tests/soak/test_checks.py; a failed gate rolled back on real
  nodes: the lab's crash-at-32 case, which stays.
- an inconclusive gate: the rollout pauses (exit 2) with the canary on the new version, a new
rollout is
  refused naming the paused one, and ``abort`` puts every host back. Why a 1 s sustained phase is
  inconclusive: tests/soak/test_checks.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl import inventory
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.progress import Progress
from fleetctl.recipes import Recipe
from fleetctl.rollout.api import Engine
from fleetctl.rollout.gate import Baseline, Judged
from fleetctl.rollout.results import Options, RollbackOptions, RolloutResult
from fleetctl.rollout.session import Seams
from fleetctl.soak import Readiness, SoakConfig, Verdict
from fleetctl.soak.verdict import Outcome
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

from .sim import EXIT1, OK, SOAKFAIL, SimFleet, SimGates, digest_of
from .sim_run import example_inventory

HOSTS = ["spark-01", "spark-02", "spark-03", "spark-04"]
#: The lab's shape: four hosts of one recipe.
INV = example_inventory({})
OLD, NEW, BOOTFAIL, DECAY, UNSURE = (
    "v0.23.0",
    "v0.24.0",
    "2026-07-02-bootfail",
    "2026-07-02-decay",
    "v-unsure",
)
TAGS = {OLD: OK, NEW: OK, BOOTFAIL: EXIT1, DECAY: SOAKFAIL, UNSURE: OK}


#: What the soak's readiness says of the lab's boot-failure image (its cause read from the
#: container's log).
BOOT_CAUSE = "ValueError: max_num_scheduled_tokens is set to -512"


class Gates(SimGates):
    """The simulated gates; a container that exits names its boot failure's cause, as the soak's
    readiness reads it from the container's log, and a soak of ``UNSURE`` cannot judge (one window:
    no trend
    to see)."""

    def wait(self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, timeout: float | None,
             progress: Progress) -> Readiness:
        r = super().wait(host, recipe, tag, cfg, timeout, progress)
        if r.outcome is Outcome.FAIL and tag == BOOTFAIL:
            return Readiness(Outcome.FAIL, f"container exited: {BOOT_CAUSE}", 0.0, cause=BOOT_CAUSE)
        return r

    def soak(self, judged: Judged, baseline: Baseline, artifacts: Path, run_id: str,
             progress: Progress) -> Verdict:
        tag = judged.tag
        v = super().soak(judged, baseline, artifacts, run_id, progress)
        if tag == UNSURE:
            return Verdict(
                v.run_id,
                v.target,
                v.base_url,
                Outcome.INCONCLUSIVE,
                "inconclusive: acceptance decay: one window, no trend",
                "",
                "",
                0.0,
                tag=tag,
                artifacts_dir=v.artifacts_dir,
            )
        return v


def _engine(fleet: SimFleet, state: Path) -> Engine:
    return Engine(inventory.load(INV), state_dir=state, secrets={},
                  seams=Seams(ops=fleet.ops, gates=Gates(fleet), resolve=fleet.resolve))


def _rollout(fleet: SimFleet, state: Path, tag: str) -> RolloutResult:
    eng = _engine(fleet, state)
    try:
        return eng.rollout(Options(tag=tag, limit=",".join(HOSTS), soak=1.0))
    finally:
        eng.close()


def _abort(fleet: SimFleet, state: Path) -> RolloutResult:
    eng = _engine(fleet, state)
    try:
        return eng.abort()
    finally:
        eng.close()


def _container_ids(fleet: SimFleet) -> dict[str, str | None]:
    return {n: (c.id if (c := h.serving()) is not None else None) for n, h in fleet.hosts.items()}


@pytest.fixture
def fleet() -> SimFleet:
    """Four hosts serving NEW (the lab's scenario tests rolled away from it)."""
    return SimFleet(dict.fromkeys(HOSTS, NEW), TAGS)


@pytest.mark.parametrize(
    ("tag", "cause"),
    [(BOOTFAIL, f"readiness fail: container exited: {BOOT_CAUSE}"), (DECAY, "soak fail")],
    ids=["boot-failure", "failed-soak"],
)
def test_a_canary_failing_its_gate_is_rolled_back_and_no_other_host_is_touched(
        fleet: SimFleet, tmp_path: Path, tag: str, cause: str) -> None:
    before = _container_ids(fleet)
    r = _rollout(fleet, tmp_path, tag)
    assert r.status == "failed" and r.exit_code == 1, r
    canary, *others = r.hosts
    assert canary.host == "spark-01" and canary.status == "rolled-back", canary
    assert canary.after_tag == NEW, canary
    assert cause in (canary.error or ""), canary
    assert r.error and "spark-01" in r.error
    assert [h.status for h in others] == ["pending"] * 3
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, NEW)
    after = _container_ids(fleet)
    # never touched: the same containers, never replaced
    assert {n: after[n] for n in HOSTS[1:]} == {n: before[n] for n in HOSTS[1:]}
    # nothing of the failed tag is left running anywhere
    assert all(digest_of(tag) not in {c.digest for c in h.containers.values() if c.running}
               for h in fleet.hosts.values())
    assert r.id is not None
    with fleet_ledger.open_ledger(tmp_path) as led:
        assert led.get(r.id).status == fleet_records.FAILED and led.holder() is None


def test_an_inconclusive_gate_pauses_then_abort_puts_every_host_back(
    fleet: SimFleet, tmp_path: Path
) -> None:
    r = _rollout(fleet, tmp_path, UNSURE)
    assert r.status == "paused" and r.exit_code == 2, r
    assert r.id is not None
    assert r.hosts[0].status == "paused" and "inconclusive" in (r.hosts[0].error or ""), r.hosts[0]
    assert [h.status for h in r.hosts[1:]] == ["pending"] * 3
    assert fleet.serving_tags() == {"spark-01": UNSURE, **dict.fromkeys(HOSTS[1:], NEW)}
    # a new rollout is refused while one is paused, naming it
    with pytest.raises(FleetError) as e:
        _rollout(fleet, tmp_path, OLD)
    assert "paused" in e.value.message() and r.id in e.value.message()
    ab = _abort(fleet, tmp_path)
    assert {h.status for h in ab.hosts} <= {"done", "skipped"}, ab.hosts
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, NEW)
    with fleet_ledger.open_ledger(tmp_path) as led:
        assert led.get(r.id).status == fleet_records.ABORTED and led.holder() is None


def test_an_inconclusive_gate_with_on_inconclusive_fail_is_a_failed_gate(
    fleet: SimFleet, tmp_path: Path
) -> None:
    eng = _engine(fleet, tmp_path)
    try:
        r = eng.rollout(
            Options(tag=UNSURE, limit=",".join(HOSTS), soak=1.0, on_inconclusive="fail")
        )
    finally:
        eng.close()
    assert r.status == "failed" and r.exit_code == 1, r
    assert (
        r.hosts[0].status == "rolled-back" and [h.status for h in r.hosts[1:]] == ["pending"] * 3
    ), r.hosts
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, NEW)


def test_a_rollback_to_an_image_that_exits_at_start_leaves_every_host_as_it_was_and_names_the_cause(
        fleet: SimFleet, tmp_path: Path) -> None:
    """The lab's ``rollback --to`` an image whose entrypoint exits 1
    (tests/rollout/test_recovery_lab.py once;
    an image docker cannot start at all: tests/rollout/test_recovery_harness.py)."""
    before = _container_ids(fleet)
    eng = _engine(fleet, tmp_path)
    try:
        r = eng.rollback(RollbackOptions(to=BOOTFAIL, limit=",".join(HOSTS)))
    finally:
        eng.close()
    assert r.status == "failed" and r.exit_code == 1, r
    assert BOOT_CAUSE in (r.error or ""), r.error
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, NEW)
    after = _container_ids(fleet)
    # the hosts it never reached still run the very container they ran
    assert all(after[h.host] == before[h.host] for h in r.hosts if h.status != "rolled-back"), (
        r.hosts
    )
