"""The rollout commands as one object: ``Engine`` builds the collaborators once and fronts the
verbs.

Who owns what (docs/design.md draws it): the session (``session.py``) holds the seams; each verb
makes a run context (``run.py``) and hands it to the collaborators it calls: the preflight and plan
(``preflight.py``), the prefetch (``prefetch.py``), the front door's steps (``door.py``), a host's
step (``step.py``), a unit's (``unit_step.py``), the bake (``bake.py``) and, on the way back, a
host's and a unit's rollback (``rollback.py``, ``rollback_unit.py``). The gate (``gate.py``) is the
one bridge to ``fleetctl.soak``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from fleetctl.facts import Facts
from fleetctl.inventory import Host, Inventory
from fleetctl.progress import NULL, Progress
from fleetctl.recipes import Recipe
from fleetctl.rollout import deploy
from fleetctl.rollout.bake import Bake
from fleetctl.rollout.door import DoorSteps
from fleetctl.rollout.forward import Confirm, Forward
from fleetctl.rollout.groups import FleetPlan
from fleetctl.rollout.prefetch import Prefetch
from fleetctl.rollout.preflight import Preflight
from fleetctl.rollout.results import Options, RollbackOptions, RolloutResult
from fleetctl.rollout.resume import Resume
from fleetctl.rollout.rollback import Rollback
from fleetctl.rollout.rollback_unit import UnitRollback
from fleetctl.rollout.run import Group
from fleetctl.rollout.session import NO_SEAMS, Seams, Session
from fleetctl.rollout.step import HostStep, Steps
from fleetctl.rollout.unit_step import UnitStep
from fleetctl.state import ledger as fleet_ledger


class Engine:
    """Runs rollouts and rollbacks for one inventory, recording everything in its ledger."""

    def __init__(self, inventory: Inventory, progress: Progress = NULL, *,
                 secrets: Mapping[str, str] | None = None, state_dir: Path | None = None,
                 take_over: bool = False, seams: Seams = NO_SEAMS) -> None:
        """The seams are :class:`Session`'s (see there); the collaborators are built once, here."""
        s = self.session = Session(inventory, progress, secrets=secrets, state_dir=state_dir,
                                   take_over=take_over, seams=seams)
        self.preflight = Preflight(s)
        self.prefetch = Prefetch(s)
        self.door = DoorSteps(s)
        self.hosts = HostStep(s, self.door)
        self.units = UnitStep(s)
        steps = Steps(self.door, self.hosts, self.units)
        self.bake = Bake(s, steps)
        self.forward = Forward(s, self.preflight, self.prefetch, steps, self.bake)
        self.back = Rollback(s, self.door, self.prefetch,
                             UnitRollback(s, self.units, self.prefetch))
        self.resumer = Resume(s, self.forward, self.back)

    # -- the verbs ---------------------------------------------------------------------------

    def rollout(self, opts: Options, confirm: Confirm | None = None) -> RolloutResult:
        """Plan once, then (unless dry-run) prefetch and go wave by wave through the gates.

        ``confirm`` is shown the plan once it is cut (under the locks, before anything is recorded
        or changed); it raises to refuse, and nothing is recorded then."""
        return self.forward.rollout(opts, confirm)

    def resume(self, opts: Options) -> RolloutResult:
        """Continue the paused or interrupted rollout or rollback, from each host's real state."""
        return self.resumer.resume(opts)

    def rollback(self, opts: RollbackOptions | None = None,
                 confirm: Callable[[Mapping[str, str | None]],
                                   None] | None = None) -> RolloutResult:
        """Every selected host back to its last known-good version (or to ``opts.to``); see
        :class:`Rollback`."""
        return self.back.rollback(opts or RollbackOptions(), confirm)

    def abort(self, webhook: str | None = None, force: bool = False,
              confirm: Callable[[Mapping[str, str | None]], None] | None = None) -> RolloutResult:
        """Undo the paused or interrupted rollout: every host it touched back to its previous
        version."""
        return self.back.abort(webhook=webhook, force=force, confirm=confirm)

    def plan(self, opts: Options) -> tuple[FleetPlan, list[Group], dict[str, Facts]]:
        """Resolve the tag in each recipe group's image, preflight the hosts and cut each group's
        waves. Touches nothing."""
        return self.preflight.plan(opts)

    def check(self, opts: Options) -> list[Group]:
        """Every option, the tag's form, the recipes and the selection (in recipe groups) checked:
        no network, no host."""
        return self.preflight.check(opts)

    def door_states(self, hosts: Iterable[Host]) -> list[dict[str, Any]]:
        """Each host as the front door sees it, and whether fleetctl holds it out (for
        ``status``)."""
        return self.door.states(hosts)

    def close(self) -> None:
        """Close the ledger and SSH connections."""
        self.session.close()

    # -- the session's parts that callers read -------------------------------------------------

    def recipe(self, name: str | None = None) -> Recipe:
        """The recipe ``name`` (default: the inventory's ``fleetctl_recipe``)."""
        return self.session.recipe(name)

    @property
    def inv(self) -> Inventory:
        """The inventory."""
        return self.session.inv

    @property
    def ledger(self) -> fleet_ledger.Ledger:
        """The fleet's ledger."""
        return self.session.ledger

    @property
    def mirrors(self) -> dict[str, str]:
        """The registry mirrors (``fleetctl_registry_mirrors``)."""
        return self.session.mirrors

    @property
    def progress(self) -> Progress:
        """Where the runs' events go."""
        return self.session.progress

    @progress.setter
    def progress(self, value: Progress) -> None:
        self.session.progress = value

    @property
    def deployer(self) -> deploy.Deployer | None:
        """The deploy step's runner for hosts deployed via Ansible (None: every host over SSH)."""
        return self.session.deployer

    @deployer.setter
    def deployer(self, value: deploy.Deployer | None) -> None:
        self.session.deployer = value
