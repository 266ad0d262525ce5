"""The run context: what one rollout, rollback or resume carries, handed to every collaborator.

A verb (``forward``, ``rollback``, ``resume``) makes one :class:`Run` and passes it explicitly to
the collaborators it calls (the front door's steps, a host's or a unit's step, the bake, the
prefetch), instead of threading a rollout id and its options through ``self``. Reading a
collaborator's signature tells what it touches: the run (its id, options, groups, ledger, events,
host locks) and the host or unit it changes.

A run serves its hosts in :class:`Group`\\ s, each with its recipe, hosts and plan: a rollout
without ``--recipe`` has one group per recipe its hosts are configured to serve (:mod:`.groups`),
with ``--recipe`` one (a unit's members serve their unit's recipe inside it,
:func:`fleetctl.rollout.unit.unit_recipe`); a rollback one per recipe its hosts go back to.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.groups import merge_waves
from fleetctl.rollout.results import Options, RolloutResult, host_outcome
from fleetctl.rollout.session import Session
from fleetctl.rollout.webhook import Webhook
from fleetctl.state import hoststate
from fleetctl.state import ledger as fleet_ledger


@dataclass
class Group:
    """Hosts that a run moves to one recipe's version: the recipe, the hosts by name, and their plan
    (None for a rollback, whose targets are per host in the ledger)."""

    recipe: Recipe
    hosts: dict[str, Host]
    plan: wave_plan.Plan | None = None

    @property
    def p(self) -> wave_plan.Plan:
        """The group's plan (a rollout's group always has one)."""
        assert self.plan is not None, "a rollout's group has a plan"
        return self.plan


@dataclass
class Run:
    """One command's run: its id and kind, options, groups, host locks and webhook, over the
    session's ledger and events. Every phase a collaborator records goes through :meth:`phase`."""

    session: Session
    id: str
    kind: str
    opts: Options = field(default_factory=Options)
    groups: list[Group] = field(default_factory=list)
    #: The hosts' locks this run holds (None: not claimed, or released).
    held: hoststate.HostLocks | None = None
    hook: Webhook | None = None
    #: Where this run's prefetch got the image on each host (RolloutResult.pull_via).
    pull_via: dict[str, str] = field(default_factory=dict)

    @property
    def ledger(self) -> fleet_ledger.Ledger:
        """The fleet's ledger (the session's)."""
        return self.session.ledger

    @property
    def group(self) -> Group:
        """The run's first group (its only one on a fleet of one recipe)."""
        return self.groups[0]

    def group_of(self, name: str) -> Group:
        """The group host ``name`` belongs to."""
        return next(g for g in self.groups if name in g.hosts)

    @property
    def waves(self) -> list[list[str]]:
        """The run's waves: each group's wave of that index (the canaries of every group first)."""
        return merge_waves([g.p for g in self.groups])

    def send(self, event: str, **data: Any) -> None:
        """A webhook event (none without a webhook)."""
        if self.hook is not None:
            self.hook.send(event, **data)

    def emit(self, phase: str, message: str = "", host: str | None = None, **data: Any) -> None:
        """Show an event (nothing recorded)."""
        self.session.emit(phase, message, host, **data)

    def phase(self, h: Host, phase: str, detail: str | None = None,
              data: Mapping[str, Any] | None = None,
              **fields: Any) -> None:
        """Commit ``h``'s phase to the ledger, then show it."""
        self.ledger.host_phase(self.id, h.name, phase, detail, **fields)
        self.session.emit(phase, detail or "", h.name, **dict(data or {}))

    def record(self, name: str) -> fleet_ledger.HostRecord | None:
        """The ledger's record of host ``name`` in this run."""
        return self.ledger.host_record(self.id, name)

    def artifacts(self, h: Host) -> Path:
        """``state_dir/runs/<run id>/soak-<host>``: the gate's samples, scrapes and verdict.json,
        plus a failed container's log and the rollback's smoke check; the ledger records it. The
        name is made one plain path component whatever the inventory held (a ``../`` in it would
        otherwise write outside the state directory)."""
        return self.session.state_dir / "runs" / self.id / f"soak-{paths.host_component(h.name)}"

    def known_good_on_host(self, h: Host, tag: str, digest: str) -> None:
        """``h``'s state file records ``tag`` as its last known-good (while this run holds the
        locks)."""
        if self.held is not None:
            self.held.record(h.name,
                             last_known_good=hoststate.Version(tag, digest, self.id, time.time()))

    def save_logs(self, h: Host, ops: remote.HostOps, name: str) -> str | None:
        """Keep the failed container's log in the run's artifacts (the container itself is removed);
        the log's text (None when it could not be read)."""
        try:
            text = ops.logs(name, 300)
        except FleetError:
            return None
        d = paths.private_dir(self.artifacts(h))
        paths.write_private(d / "failed-container.log", text)
        return text

    def result(self, p: wave_plan.Plan | None = None, seconds: float = 0.0, prefetch: float = 0.0,
               waves: tuple[float, ...] = (),
               pulls: Mapping[str, float] | None = None) -> RolloutResult:
        """The run as the ledger has it now."""
        rec = self.ledger.get(self.id)
        return RolloutResult(
            rec.id, rec.kind, rec.status, rec.recipe or "", rec.tag, rec.digest, rec.image,
            tuple(host_outcome(h) for h in rec.hosts), plan=p, error=rec.error, seconds=seconds,
            prefetch_seconds=prefetch, pull_seconds=dict(pulls or {}), wave_seconds=waves,
            pull_via=dict(self.pull_via))

    def release(self) -> None:
        """Release the hosts' locks this run holds."""
        if self.held is not None:
            self.held.release()
            self.held = None
