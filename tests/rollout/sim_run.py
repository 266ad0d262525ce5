"""Running the recovery harnesses' fault cases on the simulated fleet (tests/rollout/sim.py)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from fleetctl import paths
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RollbackOptions, RolloutResult
from fleetctl.state import records as fleet_records

if TYPE_CHECKING:
    from tests.rollout.sim import SimFleet


def run_command(eng: Engine, what: str, opts: Options, limit: str,
                to: str | None = None) -> RolloutResult:
    """Run one command of a fault case on ``eng`` and close it: ``rollout``, ``resume``, ``abort``,
    else ``rollback``."""
    try:
        if what == "rollout":
            return eng.rollout(opts)
        if what == "resume":
            return eng.resume(opts)
        if what == "abort":
            return eng.abort()
        return eng.rollback(RollbackOptions(to=to, limit=limit))
    finally:
        eng.close()


def active(state: Path) -> list[str]:
    """The ids of the ledger's active records (running or paused)."""
    from fleetctl.state import ledger as fleet_ledger

    with fleet_ledger.open_ledger(state) as led:
        return led.ids(statuses=fleet_records.ACTIVE)


def recover(run: Callable[[str], RolloutResult], state: Path, how: str) -> None:
    """What a new controller does after a kill: ``resume`` or ``abort`` an active record, or
    ``rollback``."""
    if how in ("resume", "abort") and active(state):
        run(how)
    elif how == "rollback":
        run("rollback")


def kill_then_recover(fleet: SimFleet, state: Path, k: int, run: Callable[[str], RolloutResult],
                      how: str) -> None:
    """The controller killed at point ``k`` of ``run("rollout")``, then a new one's ``how``."""
    import pytest

    from tests.rollout.sim import Killed

    fleet.kill_at = k
    with pytest.raises(Killed):
        run("rollout")
    fleet.revive()
    recover(run, state, how)


def assert_not_wedged(fleet: SimFleet, state: Path, run_to: Callable[[str], RolloutResult],
                      tag: str) -> None:
    """No active record, and a later rollout of ``tag`` completes with every host serving it."""

    assert active(state) == []
    r = run_to(tag)
    assert r.status == fleet_records.COMPLETED, r.error
    assert set(fleet.serving_tags().values()) == {tag}


def count_points(fleet: SimFleet, run: Callable[[SimFleet, Path], RolloutResult],
                 want: str) -> int:
    """How many points a clean run (``run(fleet, state dir)``, ending ``want``) goes through."""
    with tempfile.TemporaryDirectory() as d:
        r = run(fleet, Path(d))
    assert r.status == want, f"the clean run the kill points are counted on: {r.status} {r.error}"
    return len(fleet.points)


def kill_points(good: int, failing: int) -> list[tuple[bool, int]]:
    """Every kill point of a good run's ``good`` points and a failing run's ``failing`` ones, as
    (failing, k)."""
    return [(False, k) for k in range(1, good + 1)] + [(True, k) for k in range(1, failing + 1)]


def example_inventory(recipes: Mapping[str, str | None]) -> Path:
    """A copy of the example inventory (removed at exit) whose hosts serve the given recipes
    (``fleetctl_recipe`` in each one's host_vars, as Ansible users write it; None: the fleet's);
    the example's own per-host recipe is dropped, so ``{}`` is a fleet of one recipe."""
    root = Path(tempfile.mkdtemp(prefix="fleetctl-example-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    shutil.copytree(paths.project_root() / "inventory" / "example", root / "inv")
    hosts_file = root / "inv" / "hosts.yml"
    hosts = yaml.safe_load(hosts_file.read_text())
    for h in hosts["all"]["children"]["sparks"]["hosts"].values():
        h.pop("fleetctl_recipe", None)
    hosts_file.write_text(yaml.safe_dump(hosts))
    for name, recipe in recipes.items():
        if recipe is not None:
            d = root / "inv" / "host_vars" / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "recipe.yml").write_text(f"fleetctl_recipe: {recipe}\n")
    return hosts_file
