"""``fleetctl history`` says what each record is: rollout, rollback, abort or remediation, in a
column kept at 80 columns. The records are the ones the engine writes on the simulated fleet
(tests/rollout/sim.py), the remediation's the one ``watch --remediate`` writes
(remediate/record.py), read back through the real ledger and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetctl import inventory, paths, recipes
from fleetctl.cli.history import what
from fleetctl.cli.main import cli
from fleetctl.remediate import policy
from fleetctl.remediate.record import Record
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records
from tests.cli.test_width import WIDTH, assert_fits
from tests.rollout.sim import OK, Killed, SimFleet, SimGates, digest_of

INV = paths.project_root() / "inventory" / "example"
HOSTS = ["spark-01", "spark-02", "spark-03", "spark-04"]
A, B, C = "v1", "v2", "v3"
CAUSE = "engine wedged on spark-02: the canary request got no token for 5s while /health answered"


def _engine(fleet: SimFleet, state: Path) -> Engine:
    eng = Engine(inventory.load(INV), state_dir=state, secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
    fleet.watch(eng.ledger)
    return eng


def _rollout(fleet: SimFleet, state: Path, tag: str) -> None:
    eng = _engine(fleet, state)
    try:
        eng.rollout(Options(tag=tag, limit=",".join(HOSTS), soak=1.0))
    finally:
        eng.close()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A ledger holding, oldest first: a rollout to B, a rollout to C killed after its canary, its
    abort, a rollback, and a remediation of spark-02."""
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK, C: OK})
    _rollout(fleet, tmp_path, B)
    fleet.kill_on = "ledger.host_phase:done"
    with pytest.raises(Killed):
        _rollout(fleet, tmp_path, C)
    fleet.revive()
    for verb in ("abort", "rollback"):
        eng = _engine(fleet, tmp_path)
        try:
            r = eng.abort() if verb == "abort" else eng.rollback()
        finally:
            eng.close()
        assert r.status == fleet_records.COMPLETED, (verb, r.error)
    inv = inventory.load(INV)
    host = inv.hosts["spark-02"]
    with fleet_ledger.open_ledger(tmp_path) as led:
        rid = Record.new_id(host.name)
        rec = Record(led)
        rec.start(rid, host, [host.name], recipes.recipe_for(inv, host=host), B, digest_of(B),
                  "liveness", CAUSE, "restart", policy.from_mapping(None, "sim"))
        rec.finish(rid, "healed", "re-gated and re-admitted", ok=True)
    return tmp_path


def test_the_table_names_each_record_at_80_columns(state: Path) -> None:
    env = {"FLEETCTL_STATE_DIR": str(state), "COLUMNS": str(WIDTH)}
    r = CliRunner().invoke(cli, ["-i", str(INV / "hosts.yml"), "history"], env=env)
    assert r.exit_code == 0, r.output
    assert_fits(r.output, 5)
    rows = [ln for ln in r.output.splitlines() if ln.startswith("│")]
    kinds = [ln.strip("│ ").split()[0] for ln in rows]
    assert kinds == ["remediation", "rollback", "abort", "rollout", "rollout"], r.output
    with fleet_ledger.open_ledger(state) as led:
        ids = [x.id for x in led.history(10)]
    assert all(i in row for i, row in zip(ids, rows, strict=True)), "each id whole: " + r.output
    out = CliRunner().invoke(cli, ["-i", str(INV / "hosts.yml"), "history", "--json"], env=env)
    assert out.exit_code == 0, out.output
    got = [(x["kind"], x["what"]) for x in json.loads(out.output)]
    assert got == [("remediate", "remediation"), ("rollback", "rollback"), ("rollback", "abort"),
                   ("rollout", "rollout"), ("rollout", "rollout")]


def test_one_record_says_what_it_is(state: Path) -> None:
    with fleet_ledger.open_ledger(state) as led:
        abort = next(x for x in led.history(10) if what(x) == "abort")
    env = {"FLEETCTL_STATE_DIR": str(state), "COLUMNS": str(WIDTH)}
    r = CliRunner().invoke(cli, ["-i", str(INV / "hosts.yml"), "history", abort.id], env=env)
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"abort {abort.id} completed"), r.output


def test_an_abort_recorded_before_the_note_is_told_by_its_command(tmp_path: Path) -> None:
    with fleet_ledger.open_ledger(tmp_path) as led:
        for rid, command in (("rb-1", "fleetctl -i fleet.yml rollout abort --yes"),
                             ("rb-2", "fleetctl rollback --to abort-tag --yes")):
            led.create(rid, kind="rollback", recipe=None, requested=None, tag=None, digest=None,
                       image=None, options={}, command=command, waves=[["spark-01"]],
                       hosts=[{"host": "spark-01", "wave": 0, "step": 0}])
        assert [what(led.get(i)) for i in ("rb-1", "rb-2")] == ["abort", "rollback"]
