"""A serving unit's step of a rollback: every member to the target together, the head's readiness
and smoke; a target that fails puts every member back on what it served before this rollback
(docs/units.md).

A single host's rollback step is ``rollback.py``'s; a unit's rollout step and its undo
``unit_step.py``'s.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from fleetctl.container import Container
from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Unit
from fleetctl.recipes import Recipe
from fleetctl.rollout import gate, outcome
from fleetctl.rollout import host as remote
from fleetctl.rollout import unit as unit_plan
from fleetctl.rollout.outcome import fix_for, recoverable_why
from fleetctl.rollout.prefetch import Prefetch
from fleetctl.rollout.run import Row, Run, Step
from fleetctl.rollout.session import RECOVERABLE, Session
from fleetctl.rollout.unit_step import UnitStep, each, inspect_both
from fleetctl.serving import container_name
from fleetctl.soak import Verdict
from fleetctl.state import records as fleet_records


@dataclass(frozen=True)
class Target:
    """The version a unit goes back to: its tag, digest, pull reference and (when known)
    settings."""

    tag: str | None
    digest: str
    ref: str
    fingerprint: str | None

    def wanted(self, s: Container | None) -> bool:
        """``s`` is this version (its settings too, when both are known)."""
        return s is not None and s.digest == self.digest and (
            self.fingerprint is None or s.fingerprint in (self.fingerprint, None))


class UnitRollback:
    """A unit's rollback step and its undo."""

    def __init__(self, session: Session, units: UnitStep, prefetch: Prefetch) -> None:
        self.s = session
        self.units = units
        self.prefetch = prefetch

    def step(self, run: Run, recipe: Recipe, unit: Unit, target: Target) -> None:
        """Every member of ``unit`` to the target's digest together, the head's readiness and smoke;
        a target that fails puts every member back on what it served before this rollback."""
        members = unit_plan.members(self.s.inv, unit)
        tag = target.tag
        step = Step(run, recipe, members[0], Row(1, tag or "?", unit=unit.name))
        t0 = time.monotonic()
        recs = {h.name: run.record(h.name) for h in members}
        if any(r is not None and r.phase == "undoing" for r in recs.values()):
            self._undo(step, unit, "the target failed before the controller died")
            return
        looks = inspect_both(self.s.ops, members)
        for h in members:
            cur, r = looks[h.name][0], recs[h.name]
            if (cur is not None and r is not None and r.before_digest is None
                    and not target.wanted(cur)):
                run.ledger.host_phase(run.id, h.name, "inspected", status=fleet_records.IN_PROGRESS,
                                      before_tag=cur.tag, before_digest=cur.digest,
                                      before=cur.settings)
        try:
            self.s.check_cancel()
            self._place(step, unit, target, looks)
            v = self._check(step, unit, tag, t0)
        except RECOVERABLE as e:
            self._undo(step, unit, f"{tag} failed: {recoverable_why(e, full=False)}")
            if isinstance(e, KeyboardInterrupt):
                raise
            return
        for h in members:
            step.on(h).phase("done", f"unit {unit.name}: serving {tag}", step.row.at("ok"),
                             status=fleet_records.DONE, after_tag=tag, after_digest=target.digest,
                             verdict=gate.summarise(v, step.timings), artifacts=v.artifacts_dir)

    def _place(self, step: Step, unit: Unit, target: Target,
               looks: Mapping[str, tuple[Container | None, Container | None]]
               ) -> None:
        """The target on every member: already there (checked), the kept ``.prev`` swapped in, or
        pulled and started, in the launch's order."""
        run, recipe = step.run, step.recipe
        members = unit_plan.members(self.s.inv, unit)
        tag, digest, ref = target.tag, target.digest, target.ref
        if all((c := looks[h.name][0]) is not None and c.running and target.wanted(c)
               for h in members):
            for h in members:
                step.on(h).phase("loading", f"unit {unit.name}: serving {tag}: checking it",
                                 step.row.at("loading"), status=fleet_records.IN_PROGRESS)
        elif all(target.wanted(looks[h.name][1]) for h in members):
            for h in members:
                step.on(h).phase("restoring", f"unit {unit.name}: the kept {tag}",
                                 status=fleet_records.IN_PROGRESS)
            # every member stopped first, so that no old member joins a new head; then each kept one
            # started in the launch's order (the abandoned one kept as .prev)
            each(members, lambda h: self.s.ops(h).stop(container_name(h)), "stop")
            for name in recipe.topology.start_order(unit):
                self.s.ops(self.s.inv.host(name)).swap(container_name(self.s.inv.host(name)))
        else:
            for h in members:
                step.on(h).phase("pull", ref.rsplit("/", 1)[-1][:40],
                                 status=fleet_records.IN_PROGRESS)
            each(members, lambda h: self.prefetch.pull(self.s.ops(h), recipe.image, ref), "pull")
            each(members,
                 lambda h: self.s.ops(h).retire(container_name(h), run.id, digest, grace=0), "stop")
            for name in recipe.topology.start_order(unit):
                member = self.s.inv.host(name)
                step.on(member).phase("starting", f"unit {unit.name} rank {unit.rank(name)}")
                self.s.ops(member).start(remote.StartRequest(
                    recipe, ref, tag or digest[:19], digest, run.id,
                    self.s.container_secrets(recipe), self.s.cache_key(member, recipe, digest),
                    recipe.launch(unit, name)))

    def _check(self, step: Step, unit: Unit, tag: str | None, t0: float) -> Verdict:
        """The head's readiness, every member running, and the head's smoke test; raises
        FleetError."""
        run, recipe, head, t = step.run, step.recipe, step.host, step.timings
        members = unit_plan.members(self.s.inv, unit)
        cfg = gate.config(recipe, None, head)
        ready = self.s.gates.wait(head, recipe, tag or "", cfg, None, step.live("loading"))
        t["ready"] = time.monotonic() - t0
        if not ready.ready:
            raise FleetError(f"readiness {ready.outcome.value}: {ready.message}", host=head.name)
        down = self.units.not_running(members)
        if down:
            raise FleetError(f"member(s) not running: {down}", host=head.name)
        self.s.check_cancel()
        for h in members:
            step.on(h).phase("smoke", f"unit {unit.name} on {head.name}", step.row.at("ready"))
        v = self.s.gates.smoke(head, recipe, tag or "", cfg, run.artifacts(head))
        t["total"] = time.monotonic() - t0
        if v.outcome.value != "pass":
            raise FleetError(f"smoke {v.outcome.value}: {gate.failed_checks_text(v)}",
                             host=head.name)
        return v

    def _undo(self, step: Step, unit: Unit, why: str) -> None:
        """Every member back on what it served before this rollback (its ``.prev``), together."""
        run = step.run
        members = unit_plan.members(self.s.inv, unit)
        head = members[0]
        for h in members:
            step.on(h).phase("undoing", f"unit {unit.name}: {why}", step.row.at("failed"),
                             error=why)
        recs = {h.name: run.record(h.name) for h in members}
        tag_b = next((r.before_tag for r in recs.values() if r is not None and r.before_tag), None)
        fix = fix_for(run, unit.members)
        try:
            if any(r is None or r.before_digest is None for r in recs.values()):
                raise FleetError("nothing served before this rollback on every member",
                                 host=head.name)
            self._put_back(step.recipe, unit,
                           {n: r.before_digest for n, r in recs.items() if r is not None})
            outcome.check_restored(step.on(head), tag_b, "undoing", smoke=False, timed=False)
        except Exception as e:
            cause = e.cause if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            for h in members:
                step.on(h).phase("failed", f"{why}; undo failed: {cause}", step.row.at("down"),
                                 status=fleet_records.HOST_FAILED,
                                 error=f"{why}; unit {unit.name}'s undo failed: {cause}; "
                                       f"fix: {fix}")
            return
        back = step.row.showing(tag_b).at("ok")
        for h in members:
            r = recs[h.name]
            step.on(h).phase("rolled-back", f"unit {unit.name}: {why}; serving {tag_b} again",
                             back, status=fleet_records.ROLLED_BACK,
                             after_tag=r.before_tag if r else None,
                             after_digest=r.before_digest if r else None, error=why)

    def _put_back(self, recipe: Recipe, unit: Unit, before: Mapping[str, str | None]) -> None:
        """Every member on its ``before`` digest: unless all run it already, every member stopped,
        then each one's previous container (restored from ``.prev``, or started again) in the
        launch's order. Raises FleetError when a member has it neither serving nor kept."""
        members = unit_plan.members(self.s.inv, unit)
        looks = inspect_both(self.s.ops, members)

        def is_before(h: Host, s: Container | None) -> bool:
            return s is not None and s.digest == before.get(h.name)

        if all((c := looks[h.name][0]) is not None and c.running and is_before(h,
                                                                               c) for h in members):
            return
        gone = [h.name for h in members if not is_before(h, looks[h.name][0])
                and not is_before(h, looks[h.name][1])]
        if gone:
            raise FleetError(f"the previous container is gone on {', '.join(gone)}",
                             host=members[0].name)
        each(members, lambda h: self.s.ops(h).stop(container_name(h)), "stop")
        for name in recipe.topology.start_order(unit):
            member = self.s.inv.host(name)
            if not is_before(member, looks[name][0]):
                self.s.ops(member).restore(container_name(member))
            else:
                self.s.ops(member).start_again(container_name(member))
