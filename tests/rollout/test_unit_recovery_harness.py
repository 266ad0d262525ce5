"""The recovery harness on a fleet with a serving unit (tests/rollout/sim.py): one single host and
a unit of two.

The controller is killed at every ledger transition and after every remote side effect of a rollout
that steps the single host (the canary) and then the unit, both when the unit passes its gate and
when it fails it; a new controller then runs ``--resume``, ``abort`` or ``rollback``. For every kill
point the unit's two members serve one version (what they served before, or the new tag once the
unit passed its gate), never two; every host serves a known version or is reported down with the
command that fixes it; the ledger holds no active record; and a later rollout takes every host, the
unit's members together, to a new tag.

The simulated unit behaves as the lab's emulator does: its head answers readiness, soak and smoke
only while every member runs the head's version (a lost rank wedges the engine).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from fleetctl import inventory, paths
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RolloutResult
from fleetctl.rollout.session import Seams
from fleetctl.state import records as fleet_records

from .sim import (
    OK,
    SOAKFAIL,
    Killed,
    SimFleet,
    SimGates,
    assert_not_wedged,
    digest_of,
    run_command,
)
from .sim_run import count_points, kill_points, kill_then_recover

SINGLE, HEAD, WORKER = "spark-01", "spark-03", "spark-04"
HOSTS = [SINGLE, HEAD, WORKER]
UNIT = [HEAD, WORKER]
A, B, C = "v1", "v2", "v3"
TAGS = {A: OK, B: OK, C: OK}


def _inventory(root: Path) -> Path:
    """The example inventory cut to spark-01 (alone, the canary) and unit pair-a (spark-03 +
    spark-04) on the
    two-node recipe; the single host on the one-node recipe of the same image."""
    inv = root / "inv"
    shutil.copytree(paths.project_root() / "inventory" / "example", inv)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    sparks = hosts["all"]["children"]["sparks"]["hosts"]
    for name in list(sparks):
        if name not in HOSTS:
            del sparks[name]
            continue
        sparks[name].pop("fleetctl_recipe", None)
    for i, m in enumerate(UNIT):
        sparks[m]["fleetctl_fabric"] = {"addresses": [f"192.168.177.{21 + i}"]}
    hosts["all"]["children"]["unit_pair_a"] = {"hosts": {m: None for m in UNIT}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (inv / "group_vars" / "unit_pair_a.yml").write_text(
        "fleetctl_unit: pair-a\nfleetctl_recipe: qwen35-35b-bf16-pair\n")
    rf = inv / "group_vars" / "all" / "recipes.yml"
    recipes = yaml.safe_load(rf.read_text())
    recipes["fleetctl_recipe"] = "qwen35-35b-bf16"
    rf.write_text(yaml.safe_dump(recipes))
    return inv / "hosts.yml"


_INV_DIR = tempfile.mkdtemp(prefix="fleetctl-unit-harness-")
atexit.register(shutil.rmtree, _INV_DIR, ignore_errors=True)
INV = _inventory(Path(_INV_DIR))


def _fleet(unit_fails: bool = False) -> SimFleet:
    """Every host on A; with ``unit_fails``, B fails the unit's soak (its worker's image behaves so
    there)."""
    fleet = SimFleet(dict.fromkeys(HOSTS, A), TAGS)
    fleet.units = {HEAD: list(UNIT)}
    if unit_fails:
        fleet.hosts[WORKER].behaviour[digest_of(B)] = SOAKFAIL
    return fleet


def _engine(fleet: SimFleet, state: Path) -> Engine:
    eng = Engine(inventory.load(INV), state_dir=state, secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
    fleet.watch(eng.ledger)
    return eng


def _run(fleet: SimFleet, state: Path, what: str, tag: str | None = None) -> RolloutResult:
    opts = Options(tag=tag or B, limit=",".join(HOSTS), waves="1,100%", soak=1.0)
    return run_command(_engine(fleet, state), what, opts, ",".join(HOSTS), to=tag)


def _assert_known(fleet: SimFleet, allowed: dict[str, set[str]]) -> None:
    """Each host serves an allowed version, and the unit's two members serve ONE. Stricter than the
    single hosts' harness (which accepts a host reported down with its fix): here every host always
    has a
    previous version to go back to, so nothing may end down."""
    tags = fleet.serving_tags()
    for n in HOSTS:
        assert tags[n] in allowed[n], (
            f"{n} serves {tags[n]} ({fleet.hosts[n].containers}); allowed {allowed[n]}"
        )
    assert tags[HEAD] == tags[WORKER], f"the unit's members serve two versions: {tags}"


def _clean_points(unit_fails: bool) -> int:
    want = fleet_records.FAILED if unit_fails else fleet_records.COMPLETED
    return count_points(_fleet(unit_fails), lambda f, d: _run(f, d, "rollout", tag=B), want)


KILL_POINTS = kill_points(_clean_points(False), _clean_points(True))


def _not_wedged(fleet: SimFleet, state: Path) -> None:
    """No active record, and a later rollout takes every host, the unit's members together, to C."""
    assert_not_wedged(fleet, state, lambda tag: _run(fleet, state, "rollout", tag=tag), C)


@pytest.mark.parametrize("how", ["resume", "abort", "rollback"])
@pytest.mark.parametrize(("unit_fails", "k"), KILL_POINTS)
def test_kill_anywhere_in_a_rollout_of_a_host_and_a_unit(tmp_path: Path, unit_fails: bool, k: int,
                                                          how: str) -> None:
    fleet = _fleet(unit_fails)
    kill_then_recover(fleet, tmp_path, k, lambda what: _run(fleet, tmp_path, what), how)
    # the unit never keeps B when B fails its gate; the single host may keep B (it passed as the
    # canary)
    _assert_known(fleet, {SINGLE: {A, B}, HEAD: {A} if unit_fails else {A, B},
                          WORKER: {A} if unit_fails else {A, B}})
    if how == "resume" and not unit_fails:
        assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)
    if unit_fails:
        fleet.hosts[WORKER].behaviour.clear()
    _not_wedged(fleet, tmp_path)


def test_a_clean_rollout_steps_the_unit_as_one(tmp_path: Path) -> None:
    fleet = _fleet()
    r = _run(fleet, tmp_path, "rollout", tag=B)
    assert r.status == fleet_records.COMPLETED, r.error
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)
    # native launch: the worker started before the head, each as its rank
    starts = [p for p in fleet.points if p.endswith(":start")]
    assert starts == [f"{SINGLE}:start", f"{WORKER}:start", f"{HEAD}:start"]
    ranks = {m: fleet.hosts[m].containers["vllm"].labels.get("fleetctl.unit.rank") for m in UNIT}
    assert ranks == {HEAD: "0", WORKER: "1"}
    # ... and both members' previous version kept to go back to together
    assert {fleet.hosts[m].containers["vllm.prev"].tag for m in UNIT} == {A}


def test_a_unit_failing_its_gate_puts_both_members_back_and_stops(tmp_path: Path) -> None:
    fleet = _fleet(unit_fails=True)
    r = _run(fleet, tmp_path, "rollout", tag=B)
    assert r.status == fleet_records.FAILED
    assert fleet.serving_tags() == {SINGLE: B, HEAD: A, WORKER: A}
    by = {h.host: h for h in r.hosts}
    assert {by[m].status for m in UNIT} == {fleet_records.ROLLED_BACK}
    assert all("unit pair-a" in (by[m].error or "") or "soak" in (by[m].error or "") for m in UNIT)


def test_a_worker_dying_mid_soak_puts_both_members_back(tmp_path: Path) -> None:
    fleet = _fleet()
    fleet.kill_in_soak = WORKER
    r = _run(fleet, tmp_path, "rollout", tag=B)
    assert r.status == fleet_records.FAILED
    assert fleet.serving_tags() == {SINGLE: B, HEAD: A, WORKER: A}
    _not_wedged(fleet, tmp_path)


def test_ctrl_c_in_the_units_soak_restores_both_members_then_resume_finishes(
    tmp_path: Path,
) -> None:
    fleet = _fleet()
    fleet.ctrl_c_in_soak = HEAD
    with pytest.raises(KeyboardInterrupt):
        _run(fleet, tmp_path, "rollout", tag=B)
    assert fleet.serving_tags() == {SINGLE: B, HEAD: A, WORKER: A}
    r = _run(fleet, tmp_path, "resume")
    assert r.status == fleet_records.COMPLETED, r.error
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)


def test_members_left_on_two_versions_by_a_power_loss_are_put_on_one(tmp_path: Path) -> None:
    """A kill between the two members' starts, then the worker's host lost power and came back with
    its container stopped: the next command sees it from the hosts and finishes the job on both
    members."""
    fleet = _fleet()
    # by name: the single host's canary runs beside the unit's (two recipes), so the index of this
    # point differs from run to run
    fleet.kill_on = f"{WORKER}:start"
    with pytest.raises(Killed):
        _run(fleet, tmp_path, "rollout", tag=B)
    fleet.revive()
    assert fleet.serving_tags()[WORKER] == B and fleet.serving_tags()[HEAD] is None
    fleet.hosts[WORKER].containers["vllm"].running = False  # the power loss
    r = _run(fleet, tmp_path, "abort")
    assert r.kind == "rollback" and r.status == fleet_records.COMPLETED, (r.status, r.error)
    tags = fleet.serving_tags()
    assert tags[HEAD] == tags[WORKER] == A, tags
    _not_wedged(fleet, tmp_path)
