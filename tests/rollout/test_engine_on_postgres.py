"""The rollout engine on the shared PostgreSQL ledger: a controller killed mid-rollout, then
another recovers.

The same simulated fleet as the recovery harness (tests/rollout/sim.py), with
the ledger in a real PostgreSQL server (tests/plugins/postgres.py) chosen the
way an operator chooses it (``fleetctl_ledger_url`` + ``fleetctl_fleet`` in the
inventory): the engine's whole bookkeeping (create, phases, known-good,
resume's takeover, abort, rollback) runs on the PostgreSQL backend.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest

from fleetctl import inventory, paths
from fleetctl.lab.pgserver import PgServer
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RolloutResult
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

from .sim import OK, SOAKFAIL, Killed, SimFleet, SimGates, digest_of, run_command

INV = paths.project_root() / "inventory" / "example"
HOSTS = ["spark-01", "spark-02", "spark-03"]
A, B, SOAKBAD = "v1", "v2", "v-soakfail"


def _inventory(pg_server: PgServer) -> inventory.Inventory:
    inv = inventory.load(INV)
    fleet = f"engine-{uuid.uuid4().hex[:8]}"
    return dataclasses.replace(inv, vars={**inv.vars, "fleetctl_ledger_url": pg_server.url(),
                                          "fleetctl_fleet": fleet})


def _run(
    fleet: SimFleet, inv: inventory.Inventory, state: Path, what: str, tag: str = B
) -> RolloutResult:
    eng = Engine(inv, state_dir=state, secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
    fleet.watch(eng.ledger)
    return run_command(
        eng,
        what,
        Options(tag=tag, limit=",".join(HOSTS), waves="1,100%", soak=1.0),
        ",".join(HOSTS),
    )


@pytest.fixture(scope="module")
def points(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> int:
    """How many points (side effects and ledger transitions) a clean rollout goes through."""
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK, SOAKBAD: SOAKFAIL})
    r = _run(fleet, _inventory(pg_server), tmp_path_factory.mktemp("clean"), "rollout")
    assert r.status == fleet_records.COMPLETED, r.error
    return len(fleet.points)


@pytest.mark.parametrize(
    ("where", "how"), [(0.25, "resume"), (0.5, "abort"), (0.75, "resume"), (0.9, "abort")]
)
def test_a_killed_rollout_is_recovered_by_another_controller(
    pg_server: PgServer, tmp_path: Path, points: int, where: float, how: str
) -> None:
    inv = _inventory(pg_server)
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK, SOAKBAD: SOAKFAIL})
    fleet.kill_at = max(1, int(points * where))
    with pytest.raises(Killed):
        _run(fleet, inv, tmp_path, "rollout")
    fleet.revive()
    with fleet_ledger.open_for(inv, tmp_path) as led:
        assert len(led.ids(statuses=fleet_records.ACTIVE)) == 1  # left active for --resume or abort
    r = _run(fleet, inv, tmp_path, how)
    assert r.status in (fleet_records.COMPLETED, fleet_records.ABORTED), r.error
    want = B if how == "resume" else A
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, want)
    with fleet_ledger.open_for(inv, tmp_path) as led:
        assert led.ids(statuses=fleet_records.ACTIVE) == [] and led.holder() is None
        # Each host's known-good went to the shared database: a rollback from here undoes the
        # rollout.
        assert all(led.known_good(h) for h in HOSTS)
    if how == "resume":
        rb = _run(fleet, inv, tmp_path, "rollback")
        assert rb.status == fleet_records.COMPLETED, rb.error
        assert fleet.serving_tags() == dict.fromkeys(HOSTS, A)
        assert {fleet.serving_digest(h) for h in HOSTS} == {digest_of(A)}
    assert not (tmp_path / fleet_ledger.LEDGER_NAME).exists()  # nothing went to a local SQLite file
