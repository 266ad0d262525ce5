"""The capacity floor through the engine, on the simulated fleet: the plan a dry run prints (floor,
steps, expected time from the recipe's soak config), the steps a rollout and a rollback really take,
and the
inventory's fleetctl_min_available."""

from __future__ import annotations

import shutil
from pathlib import Path

from fleetctl import inventory, paths
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RollbackOptions, RolloutResult
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger

from .sim import OK, SimFleet, SimGates

HOSTS = ["spark-01", "spark-02", "spark-03"]
LIMIT = ",".join(HOSTS)


def _inventory(tmp_path: Path, floor: str | None = None) -> Path:
    inv = tmp_path / "inv"
    shutil.copytree(paths.project_root() / "inventory" / "example", inv, dirs_exist_ok=True)
    if floor is not None:
        (inv / "group_vars" / "all" / "capacity.yml").write_text(
            f"fleetctl_min_available: {floor!r}\n"
        )
    return inv / "hosts.yml"


def _engine(tmp_path: Path, fleet: SimFleet, floor: str | None = None) -> Engine:
    return Engine(inventory.load(_inventory(tmp_path, floor)), state_dir=tmp_path / "state",
                  secrets={},
                  seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))


def _steps(r: RolloutResult, tmp_path: Path) -> list[int]:
    with fleet_ledger.open_ledger(tmp_path / "state") as led:
        rec = led.get(r.id or "")
    keys = sorted({(h.wave, h.step) for h in rec.hosts if h.wave >= 0})
    return [sum(1 for h in rec.hosts if (h.wave, h.step) == k) for k in keys]


def test_dry_run_plan_shows_the_floor_the_steps_and_the_expected_time(tmp_path: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, "v1"), {"v1": OK, "v2": OK})
    eng = _engine(tmp_path, fleet)
    try:
        r = eng.rollout(Options(tag="v2", limit=LIMIT, dry_run=True, soak=90.0))
    finally:
        eng.close()
    p = r.plan
    assert p is not None and p.capacity is not None and p.estimate is not None
    # 75 % of 3 keeps all 3: one host still goes at a time.
    assert (p.capacity.per_step, p.capacity.source, p.max_unavailable) == (1, "default", 1)
    assert [len(s) for s in p.estimate.steps] == [1, 1, 1]
    # The example recipe's profile is a Spark's: a 4 min load; --soak 90s.
    assert (p.estimate.load_seconds, p.estimate.soak_seconds, p.estimate.seconds) == (
        240.0,
        90.0,
        3 * 330.0,
    )


def test_the_inventorys_floor_sets_the_steps_of_a_rollout_and_a_rollback(tmp_path: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, "v1"), {"v1": OK, "v2": OK})
    eng = _engine(tmp_path, fleet, floor="1")  # one of 3 kept serving: 2 at a time
    try:
        r = eng.rollout(Options(tag="v2", limit=LIMIT, soak=1.0))
    finally:
        eng.close()
    assert r.status == "completed", r.error
    assert _steps(r, tmp_path) == [1, 2]
    eng = _engine(tmp_path, fleet, floor="1")
    try:
        rb = eng.rollback(RollbackOptions(limit=LIMIT))
    finally:
        eng.close()
    assert rb.status == "completed", rb.error
    assert _steps(rb, tmp_path) == [2, 1]
    # A flag wins over the inventory.
    eng = _engine(tmp_path, fleet, floor="1")
    try:
        r2 = eng.rollout(Options(tag="v2", limit=LIMIT, soak=1.0, max_unavailable="1"))
    finally:
        eng.close()
    assert r2.status == "completed" and _steps(r2, tmp_path) == [1, 1, 1]


def test_the_next_plan_learns_its_estimate_from_the_steps_that_passed(tmp_path: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, "v1"), {"v1": OK, "v2": OK, "v3": OK})
    eng = _engine(tmp_path, fleet)
    try:
        assert eng.rollout(Options(tag="v2", limit=LIMIT, soak=1.0)).status == "completed"
        r = eng.rollout(Options(tag="v3", limit=LIMIT, dry_run=True, soak=90.0))
    finally:
        eng.close()
    with fleet_ledger.open_ledger(tmp_path / "state") as led:
        passed = led.passed_steps(r.plan.recipe if r.plan else "")
    # every passed step recorded its timings and the sustained seconds it was asked for
    assert len(passed) == 3 and all(
        v["sustained_s"] == 1.0 and "ready" in v["timings"] for v in passed
    )
    e = r.plan.estimate if r.plan else None
    assert (
        e is not None
        and e.basis == "load: median of 3 past steps; soak: sustained + median extra of 3"
    )
    # the simulated hosts load at once, not in the recipe's 4 min; the soak is this run's 90 s plus
    # what the simulated gates took beyond their 1 s (nothing: they return at once)
    assert e.load_seconds < 5 and e.soak_seconds == 90.0
