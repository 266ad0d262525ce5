"""Running the recovery harnesses' fault cases on the simulated fleet (tests/rollout/sim.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RolloutResult

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
        return eng.rollback(to=to, limit=limit)
    finally:
        eng.close()


def active(state: Path) -> list[str]:
    """The ids of the ledger's active records (running or paused)."""
    from fleetctl.state import ledger as fleet_ledger

    with fleet_ledger.open_ledger(state) as led:
        return led.ids(statuses=fleet_ledger.ACTIVE)


def recover(run: Callable[[str], RolloutResult], state: Path, how: str) -> None:
    """What a new controller does after a kill: ``resume`` or ``abort`` an active record, or
    ``rollback``."""
    if how in ("resume", "abort") and active(state):
        run(how)
    elif how == "rollback":
        run("rollback")


def assert_not_wedged(fleet: SimFleet, state: Path, run_to: Callable[[str], RolloutResult],
                      tag: str) -> None:
    """No active record, and a later rollout of ``tag`` completes with every host serving it."""
    from fleetctl.state import ledger as fleet_ledger

    assert active(state) == []
    r = run_to(tag)
    assert r.status == fleet_ledger.COMPLETED, r.error
    assert set(fleet.serving_tags().values()) == {tag}
