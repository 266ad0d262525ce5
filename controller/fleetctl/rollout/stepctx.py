"""A host's or a unit's step, as one typed context: the run, the recipe, the plan, the host, the
row it shows and the step's timings.

A host's step (:mod:`.step`), a unit's (:mod:`.unit_step`, whose host is the unit's head), a
rollback's (:mod:`.rollback`, :mod:`.rollback_unit`), the bake's undo and the front door's drain
all hand one :class:`Step` to the collaborators they call, instead of the same six values as
arguments and the row as an untyped dict: a signature then says what it touches beyond the step
(an ``ops``, a container, a verdict).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fleetctl.inventory import Host
from fleetctl.progress import Event, Progress
from fleetctl.recipes import Recipe
from fleetctl.rollout import gate
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.run import Run
from fleetctl.rollout.session import Session

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
