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

Within a run, a host's or a unit's step is one :class:`Step`: the run, the recipe, the host (a
unit's head), the :class:`Row` it shows, the plan and the step's timings. A host's step
(:mod:`.step`), a unit's (:mod:`.unit_step`), a rollback's (:mod:`.rollback`,
:mod:`.rollback_unit`), the bake's undo and the front door's drain hand one ``Step`` to the
collaborators they call instead of the same six values as arguments and the row as an untyped
dict; a :class:`Failure` says why a step is undone.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.progress import Event, Progress
from fleetctl.recipes import Recipe
from fleetctl.rollout import gate
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.groups import merge_waves
from fleetctl.rollout.results import Options, RolloutResult, host_outcome
from fleetctl.rollout.session import Session
from fleetctl.rollout.webhook import Webhook
from fleetctl.state import hoststate
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records


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

    def record(self, name: str) -> fleet_records.HostRecord | None:
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

    def save_logs(self, h: Host, ops: remote.ServingOps, name: str) -> str | None:
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


#: What a soak's or readiness's progress events carry through to a rollout's live views and event
#: log (soak.phases.SoakState.emit, run_requests, readiness.await_ready): phase k of n, time so far,
#: the level's requests against its plan, errors, tok/s against the baseline's, acceptance;
#: readiness's wait and timeout.
LIVE_FIGURES = frozenset({"step", "steps", "elapsed", "level", "concurrency", "requests",
                          "planned_requests", "errors", "tok_s", "baseline", "acceptance_rate",
                          "level_elapsed", "level_seconds", "waited", "timeout"})


@dataclass(frozen=True)
class Row:
    """What a host's row in the live views and the event log shows: its wave, the version, its
    unit, its health, and the gate's figures (tok/s, acceptance, a bar's waited/timeout)."""

    wave: int
    tag: str | None
    digest: str | None = None
    unit: str | None = None
    health: str | None = None
    figures: Mapping[str, object] = field(default_factory=dict)

    def at(self, health: str | None = None, **figures: object) -> Row:
        """This row with ``health`` (unless None) and more figures."""
        return replace(self, health=self.health if health is None else health,
                       figures={**self.figures, **figures})

    def showing(self, tag: str | None) -> Row:
        """This row showing another version (the one a host serves again)."""
        return replace(self, tag=tag)

    def data(self) -> dict[str, object]:
        """The row as an event's data (a key that is not set is left out)."""
        out: dict[str, object] = {"wave": self.wave, "tag": self.tag}
        if self.digest is not None:
            out["digest"] = self.digest
        if self.unit is not None:
            out["unit"] = self.unit
        if self.health is not None:
            out["health"] = self.health
        return {**out, **self.figures}


@dataclass(frozen=True)
class Failure:
    """Why a step is undone: the cause, the gate's verdict if one was reached, whether it is a
    verdict on the version (Ctrl-C is not), and whether a dead controller's undo is being
    finished (whose restore may already have happened)."""

    why: str
    verdict: Any = None
    judged: bool = True
    resumed: bool = False


@dataclass(frozen=True)
class Step:
    """One host's or unit's step of a run: the run, the recipe its hosts serve (a unit's inside a
    unit), the host (a unit's head; :meth:`on` for a member), the row it shows, the group's plan
    (None in a rollback), and the step's timings, shared by every copy of it."""

    run: Run
    recipe: Recipe
    host: Host
    row: Row
    plan: wave_plan.Plan | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def p(self) -> wave_plan.Plan:
        """The plan (a rollout's step always has one)."""
        assert self.plan is not None, "a rollout's step has a plan"
        return self.plan

    @property
    def session(self) -> Session:
        """The run's session."""
        return self.run.session

    def on(self, h: Host) -> Step:
        """The same step on another host (a unit's member): the same row and timings."""
        return replace(self, host=h)

    def shown(self, row: Row) -> Step:
        """The same step showing ``row`` (the same timings)."""
        return replace(self, row=row)

    def phase(self, phase: str, detail: str | None = None, row: Row | None = None,
              **fields: Any) -> None:
        """Commit the host's phase to the ledger, then show it with ``row`` (default: the
        step's)."""
        self.run.phase(self.host, phase, detail, (row or self.row).data(), **fields)

    def live(self, phase: str, cancellable: bool = True) -> Progress:
        """The host's soak/readiness events as rows of the live table (:meth:`Session.live`)."""
        return live(self.session, self.host, self.row, phase, cancellable)


def live(s: Session, h: Host, row: Row | None, phase: str, cancellable: bool = True) -> Progress:
    """Soak/readiness events as rows of the live table (phase kept, figures picked out), ``row``'s
    fields first (None: the host's name alone).

    A cancellable one raises KeyboardInterrupt after Ctrl-C, so that a long soak stops at its next
    event."""
    shown = row.data() if row is not None else {}

    def forward(event: Event) -> None:
        if cancellable:
            s.check_cancel()
        data = {**shown, "health": phase, **gate.table_figures(event.data),
                **{k: v for k, v in event.data.items() if k in LIVE_FIGURES},
                "soak_phase": event.phase}
        s.progress(Event(phase, event.message or event.phase, h.name, data))
    return forward
