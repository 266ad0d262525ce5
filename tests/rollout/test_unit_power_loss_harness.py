"""The unit recovery harness's fleet (a single host and a unit of two, tests/rollout/sim.py) after
the controller was killed between the unit worker's start and its head's, and the worker's host
(and the head's) lost power: the recovery command, itself killed at any of its first points, then a
new controller's ``abort``, ``resume`` or ``rollback``.

Each ends with the unit's two members on one known version (what they served before, or the new
tag once it passed the unit's gate), no active record left, and a later rollout taking every host
to a new tag; a record that says ``completed`` never leaves a member serving nothing.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from fleetctl.state import records as fleet_records

from .sim import Killed, SimFleet
from .test_unit_recovery_harness import (
    HEAD,
    SINGLE,
    WORKER,
    A,
    B,
    _assert_known,
    _fleet,
    _not_wedged,
    _run,
)

#: The unit's points between the worker's start and the head's: the worker's container started,
#: and the head's "starting" recorded.
BETWEEN = ("start", "ledger")
#: How many of the first recovery command's points the harness kills it at (its record created,
#: the run it undoes marked, the hosts' intents, its first steps).
FIRST_POINTS = 12


def _power_loss(fleet: SimFleet, host: str) -> None:
    """The host lost power and came back: every container stopped (the kept ``.prev`` was
    already)."""
    for c in fleet.hosts[host].containers.values():
        c.running, c.status = False, "exited"


def _killed_between_the_members_starts(fleet: SimFleet, state: Path, where: str) -> None:
    """A rollout to B killed after the worker's container started on B, before the head's did."""
    fleet.kill_on = f"{WORKER}:start"
    if where == "ledger":
        # one point later: the head's "starting" recorded, its container not started
        fleet.kill_on = None
        orig = fleet.point

        def point(what: str) -> None:
            orig(what)
            if what == f"{WORKER}:start":
                fleet.kill_on = "ledger.host_phase:starting"
        fleet.point = point  # type: ignore[method-assign]
    with pytest.raises(Killed):
        _run(fleet, state, "rollout", tag=B)
    if where == "ledger":
        del fleet.point
    fleet.revive()
    assert fleet.serving_tags()[WORKER] == B and fleet.serving_tags()[HEAD] is None


def _check(fleet: SimFleet, state: Path, status: str | None) -> None:
    """Both members on one version they served before, or B (which passed the unit's gate only
    on a completed resume); an honest record; nothing wedged."""
    tags = fleet.serving_tags()
    if status == fleet_records.COMPLETED:
        assert tags[HEAD] is not None and tags[WORKER] is not None, (status, tags)
    _assert_known(fleet, {SINGLE: {A, B}, HEAD: {A, B}, WORKER: {A, B}})
    _not_wedged(fleet, state)


@pytest.mark.parametrize("head_lost", [False, True])
@pytest.mark.parametrize("how", ["abort", "resume", "rollback"])
@pytest.mark.parametrize("where", BETWEEN)
def test_a_power_loss_after_a_kill_between_the_members_starts(tmp_path: Path, where: str,
                                                               how: str, head_lost: bool) -> None:
    fleet = _fleet()
    _killed_between_the_members_starts(fleet, tmp_path, where)
    _power_loss(fleet, WORKER)
    if head_lost:
        _power_loss(fleet, HEAD)
    r = _run(fleet, tmp_path, how)
    assert r.status in (fleet_records.COMPLETED, fleet_records.FAILED), (r.status, r.error)
    _check(fleet, tmp_path, r.status)


@pytest.mark.parametrize("how", ["abort", "resume", "rollback"])
@pytest.mark.parametrize("first", ["abort", "rollback"])
@pytest.mark.parametrize("k", range(1, FIRST_POINTS + 1))
def test_the_recovery_killed_too_then_a_new_controllers_command(tmp_path: Path, k: int,
                                                                 first: str, how: str) -> None:
    """The first recovery command of the power loss's case killed at its k-th point (its
    record created, the rollout it undoes perhaps not yet marked aborted), then ``how``: the
    record the kill left holds no previous version of any host, and an ``abort`` of it once
    skipped every host ("first deploy") and reported ``completed`` with the head serving nothing
    and the worker on B."""
    fleet = _fleet()
    _killed_between_the_members_starts(fleet, tmp_path, "start")
    _power_loss(fleet, WORKER)
    fleet.kill_at = k
    with contextlib.suppress(Killed):
        _run(fleet, tmp_path, first)
    fleet.revive()
    r = _run(fleet, tmp_path, how)
    assert r.status in (fleet_records.COMPLETED, fleet_records.FAILED), (r.status, r.error)
    _check(fleet, tmp_path, r.status)
