"""``rollback``'s question is asked once the targets are known, before anything is recorded or
changed,
and not at all when no host would change (the CLI then says "nothing to do")."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import click
import pytest

from fleetctl import inventory, paths
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

from .sim import OK, SOAKFAIL, SimFleet, SimGates, digest_of

INV = paths.project_root() / "inventory" / "example"
HOSTS = ["spark-01", "spark-02", "spark-03"]
A, B, BAD = "v1", "v2", "v-soakfail"


def _engine(fleet: SimFleet, state: Path) -> Engine:
    eng = Engine(inventory.load(INV), state_dir=state, secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
    fleet.watch(eng.ledger)
    return eng


def _rolled_out(state: Path) -> SimFleet:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    eng = _engine(fleet, state)
    try:
        assert (
            eng.rollout(Options(tag=B, limit=",".join(HOSTS), soak=1.0)).status
            == fleet_records.COMPLETED
        )
    finally:
        eng.close()
    return fleet


def test_refusing_the_question_changes_and_records_nothing(tmp_path: Path) -> None:
    fleet = _rolled_out(tmp_path)
    asked: list[Mapping[str, str | None]] = []

    def no(targets: Mapping[str, str | None]) -> None:
        asked.append(dict(targets))
        raise click.exceptions.Abort()

    eng = _engine(fleet, tmp_path)
    try:
        with pytest.raises(click.exceptions.Abort):
            eng.rollback(confirm=no)
    finally:
        eng.close()
    assert asked == [dict.fromkeys(HOSTS, A)], "asked once, each host with the tag it goes back to"
    assert {fleet.serving_digest(h) for h in HOSTS} == {digest_of(B)}, "nothing was changed"
    with fleet_ledger.open_ledger(tmp_path) as led:
        assert [r.kind for r in led.history(10)] == ["rollout"], (
            "the refused rollback left no record"
        )
        assert not led.ids(statuses=fleet_records.ACTIVE)
    eng = _engine(fleet, tmp_path)
    try:
        assert eng.rollback(confirm=lambda t: None).status == fleet_records.COMPLETED, (
            "the lock was let go"
        )
    finally:
        eng.close()
    assert {fleet.serving_digest(h) for h in HOSTS} == {digest_of(A)}


def test_no_question_when_no_host_would_change(tmp_path: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, BAD: SOAKFAIL})
    eng = _engine(fleet, tmp_path)
    try:
        # The canary fails its gate and goes back to v1: every host serves v1, nothing to roll back.
        assert (
            eng.rollout(Options(tag=BAD, limit=",".join(HOSTS), soak=1.0)).status
            == fleet_records.FAILED
        )
        asked: list[object] = []
        again = eng.rollback(confirm=asked.append)
    finally:
        eng.close()
    assert not asked
    assert {h.status for h in again.hosts} == {fleet_records.SKIPPED}
