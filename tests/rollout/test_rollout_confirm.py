"""``rollout``'s question is asked of the one plan the rollout runs: the preflight (access, fabric,
bandwidth, every host's facts) and the registry are asked once per interactive rollout, and a
refused question records and changes nothing."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from fleetctl import inventory, paths
from fleetctl.progress import Event
from fleetctl.rollout.api import Engine
from fleetctl.rollout.groups import FleetPlan
from fleetctl.rollout.results import Options
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

from .sim import OK, SimFleet, SimGates, digest_of

INV = paths.project_root() / "inventory" / "example"
HOSTS = ["spark-01", "spark-02", "spark-03"]
A, B = "v1", "v2"


class Recorder:
    """Every event of a run."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def count(self, phase: str, host: str | None = None, message: str = "") -> int:
        return sum(1 for e in self.events
                   if e.phase == phase and e.host == host and e.message.startswith(message))


def _engine(fleet: SimFleet, state: Path, rec: Recorder) -> Engine:
    eng = Engine(inventory.load(INV), rec, state_dir=state, secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
    fleet.watch(eng.ledger)
    return eng


def _opts() -> Options:
    return Options(tag=B, limit=",".join(HOSTS), soak=1.0)


def test_an_interactive_rollout_runs_its_preflight_once(tmp_path: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    rec = Recorder()
    shown: list[FleetPlan] = []
    eng = _engine(fleet, tmp_path, rec)
    try:
        r = eng.rollout(_opts(), confirm=shown.append)
    finally:
        eng.close()
    assert r.status == fleet_records.COMPLETED
    assert [h.host for h in shown[0].hosts] == HOSTS
    assert r.plan == shown[0].first, "the plan asked about is the one run"
    assert rec.count("preflight", None, "checking") == 1, "one preflight"
    assert all(rec.count("preflight", h) == 1 for h in HOSTS), "each host's facts fetched once"
    assert rec.count("resolve", None, f"{B} ->") == 1, "the registry asked once"


def test_refusing_the_plan_records_and_changes_nothing(tmp_path: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    asked: list[FleetPlan] = []

    def no(p: FleetPlan) -> None:
        asked.append(p)
        raise click.exceptions.Abort()

    eng = _engine(fleet, tmp_path, Recorder())
    try:
        with pytest.raises(click.exceptions.Abort):
            eng.rollout(_opts(), confirm=no)
        assert len(asked) == 1 and {h.action for h in asked[0].hosts} == {"deploy"}
        with fleet_ledger.open_ledger(tmp_path) as led:
            assert led.history(10) == [], "the refused rollout left no record"
        assert {fleet.serving_digest(h) for h in HOSTS} == {digest_of(A)}, "nothing was changed"
        again = eng.rollout(_opts(), confirm=lambda p: None)
        assert again.status == fleet_records.COMPLETED, "the locks were let go"
    finally:
        eng.close()
    assert {fleet.serving_digest(h) for h in HOSTS} == {digest_of(B)}


def test_a_dry_run_asks_nothing_and_plans_once(tmp_path: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    rec = Recorder()
    eng = _engine(fleet, tmp_path, rec)
    try:
        r = eng.rollout(Options(tag=B, limit=",".join(HOSTS), dry_run=True))
    finally:
        eng.close()
    assert r.status == "planned" and rec.count("preflight", None, "checking") == 1
