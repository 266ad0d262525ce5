"""The recovery harness on a fleet serving two models (tests/rollout/sim.py): two hosts on the
fleet's recipe and two on another recipe of another image, rolled forward by tag in two recipe
groups (each with its canary, the canaries in one wave).

The controller is killed at every ledger transition and after every remote side effect of that
rollout, both when every gate passes and when the second recipe's canary fails its gate; a new
controller then runs ``--resume``, ``abort`` or ``rollback``. For every kill point each host serves
a version of ITS OWN recipe (what it served before, or the new tag once it passed its gate), or is
reported down with the command that fixes it; the ledger holds no active record; and a later
rollout takes every host, each on its own recipe, to a new tag.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl import inventory
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RolloutResult
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

from .sim import (
    OK,
    SOAKFAIL,
    SimFleet,
    SimGates,
    assert_not_wedged,
    digest_of,
    run_command,
)
from .sim_run import count_points, example_inventory, kill_points, kill_then_recover

HERETIC, BF16 = "qwen36-35b-heretic", "qwen35-35b-bf16"
RECIPES = {"spark-01": HERETIC, "spark-02": HERETIC, "spark-03": BF16, "spark-04": BF16}
HOSTS = list(RECIPES)
INV = example_inventory({"spark-03": BF16, "spark-04": BF16})
A, B, C = "v1", "v2", "v3"
TAGS = {A: OK, B: OK, C: OK}


def _fleet(canary_fails: bool = False) -> SimFleet:
    """Every host on A of its own recipe; with ``canary_fails``, B fails the second recipe's
    canary's gate."""
    fleet = SimFleet(dict.fromkeys(HOSTS, A), TAGS, recipes=RECIPES)
    if canary_fails:
        fleet.hosts["spark-03"].behaviour[digest_of(B)] = SOAKFAIL
    return fleet


def _engine(fleet: SimFleet, state: Path) -> Engine:
    eng = Engine(inventory.load(INV), state_dir=state, secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
    fleet.watch(eng.ledger)
    return eng


def _run(fleet: SimFleet, state: Path, what: str, tag: str | None = None) -> RolloutResult:
    opts = Options(tag=tag or B, waves="1,100%", soak=1.0)
    return run_command(_engine(fleet, state), what, opts, ",".join(HOSTS), to=tag)


def _assert_own_recipe(fleet: SimFleet, state: Path, allowed: dict[str, set[str]]) -> None:
    """Each host serves an allowed version of its own recipe, or is reported down with its fix."""
    with fleet_ledger.open_ledger(state) as led:
        history = led.history()
    for n in HOSTS:
        c = fleet.hosts[n].serving()
        if c is not None:
            assert c.tag in allowed[n], f"{n} serves {c.tag}; allowed {allowed[n]}"
            label = c.labels.get("fleetctl.recipe")
            assert label in (None, RECIPES[n]), f"{n} serves recipe {label}, not {RECIPES[n]}"
            continue
        reported = [r for rec in history if (r := rec.host(n)) is not None
                    and r.status == fleet_records.HOST_FAILED and "fix:" in (r.error or "")]
        assert reported, f"{n} serves nothing and is not reported down with a fix"


def _clean_points(canary_fails: bool) -> int:
    want = fleet_records.FAILED if canary_fails else fleet_records.COMPLETED
    return count_points(_fleet(canary_fails), lambda f, d: _run(f, d, "rollout", tag=B), want)


KILL_POINTS = kill_points(_clean_points(False), _clean_points(True))


@pytest.mark.parametrize("how", ["resume", "abort", "rollback"])
@pytest.mark.parametrize(("canary_fails", "k"), KILL_POINTS)
def test_kill_anywhere_in_a_rollout_of_two_recipes(tmp_path: Path, canary_fails: bool, k: int,
                                                   how: str) -> None:
    fleet = _fleet(canary_fails)
    kill_then_recover(fleet, tmp_path, k, lambda what: _run(fleet, tmp_path, what), how)
    # spark-03 never keeps B when B fails its gate there
    allowed = {n: {A, B} for n in HOSTS}
    if canary_fails:
        allowed["spark-03"] = {A}
    _assert_own_recipe(fleet, tmp_path, allowed)
    if how == "resume" and not canary_fails:
        assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)
    if canary_fails:
        fleet.hosts["spark-03"].behaviour.clear()
    assert_not_wedged(fleet, tmp_path, lambda tag: _run(fleet, tmp_path, "rollout", tag=tag), C)
    _assert_own_recipe(fleet, tmp_path, {key: {C} for key in HOSTS})


def test_a_clean_run_has_one_canary_per_recipe_and_each_host_keeps_its_recipe(
        tmp_path: Path) -> None:
    fleet = _fleet()
    r = _run(fleet, tmp_path, "rollout", tag=B)
    assert r.status == fleet_records.COMPLETED, r.error
    with fleet_ledger.open_ledger(tmp_path) as led:
        rec = led.history(1)[0]
    assert [w.hosts for w in rec.waves] == [("spark-01", "spark-03"), ("spark-02", "spark-04")]
    _assert_own_recipe(fleet, tmp_path, {key: {B} for key in HOSTS})
