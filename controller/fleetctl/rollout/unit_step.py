"""A serving unit's step of a rollout: every member stopped, started in the launch's order, the
head's readiness (it serves only once every rank joined), the soak against the head's API; any
failure restores EVERY member to what it served before, together (docs/units.md).

The planner sees a unit as one slot (:func:`fleetctl.rollout.unit.slot_names`): its members share a
wave and a step, and count once against --max-unavailable and --failure-budget. The forward path
hands the unit to :meth:`UnitStep.step`, which steps the whole unit; a single host goes to
:class:`~.step.HostStep`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from fleetctl import fabric, ssh
from fleetctl.container import Container
from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Unit
from fleetctl.recipes import Recipe
from fleetctl.rollout import gate, outcome
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout import unit as unit_plan
from fleetctl.rollout.outcome import fix_for, recoverable_why
from fleetctl.rollout.run import Failure, Row, Run, Step
from fleetctl.rollout.session import RECOVERABLE, Session
from fleetctl.serving import container_name
from fleetctl.soak import baselines
from fleetctl.state import records as fleet_records

#: Seconds between two looks at every member's container during a unit's soak.
WATCH_INTERVAL = 3.0


class MemberWatch:
    """Every member's serving container watched during the soak (one ``docker inspect`` each per
    interval, members one after another: a unit has a handful). A member whose container stops, is
    replaced or restarts breaks the unit, and the head then answers /health with no token (a wedged
    engine): the watcher records which member and how, and stops the head's container, so that the
    soak fails on the spot instead of waiting out its requests' timeouts; the unit's restore
    follows."""

    def __init__(self, members: Sequence[Host], ops: Callable[[Host], remote.ServingOps]) -> None:
        self.members = list(members)
        self.ops = ops
        self.lost: str | None = None
        self._stop = threading.Event()
        self._first = {h.name: self._look(h) for h in self.members}
        self._thread = threading.Thread(target=self._run, name="unit-watch", daemon=True)

    def _look(self, h: Host) -> tuple[str, bool, int] | None:
        c = self.ops(h).inspect(container_name(h))
        return None if c is None else (c.id, c.running, c.restart_count)

    def __enter__(self) -> MemberWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            for h in self.members:
                try:
                    now = self._look(h)
                except FleetError:
                    continue  # SSH lost for a moment: the next look, or the soak, tells
                was = self._first[h.name]
                if now != was:
                    self.lost = f"{h.name}'s serving container {lost_how(was, now)} during the soak"
                    head = self.members[0]
                    if h is not head:
                        with contextlib.suppress(FleetError):
                            self.ops(head).stop(container_name(head))
                    return


def lost_how(was: tuple[str, bool, int] | None, now: tuple[str, bool, int] | None) -> str:
    """How a member's container changed between two looks (``(id, running, restarts)``, None: no
    container)."""
    if now is None:
        return "gone"
    if not now[1]:
        return "stopped"
    return "replaced" if was is not None and now[0] != was[0] else "restarted"


def each(hosts: Sequence[Host], fn: Callable[[Host], Any], what: str) -> dict[str, Any]:
    """``fn`` on every host at once (bounded by ssh.fan_out); the first host's error raised, naming
    it."""
    outs = ssh.fan_out(hosts, fn, timeout=180)
    for h in hosts:
        o = outs[h.name]
        if o.error is not None:
            raise o.error
    return {h.name: outs[h.name].value for h in hosts}


#: What a host serves, and what it keeps as ``.prev``.
Looks = dict[str, tuple[Container | None, Container | None]]


def inspect_both(ops: Callable[[Host], remote.ServingOps], hosts: Sequence[Host]) -> Looks:
    """What each host serves, and what it keeps as ``.prev``, looked at on every host at once."""
    return each(hosts, lambda h: (ops(h).inspect(container_name(h)),
                                  ops(h).inspect(container_name(h) + remote.PREV_SUFFIX)),
                "inspect")


class UnitStep:
    """A unit's step of a rollout: every member to the target together, gated as one; its undo."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def step(self, run: Run, recipe: Recipe, p: wave_plan.Plan, unit: Unit, wave: int) -> None:
        """Deploy the target on every member of ``unit`` and gate the unit; a failure restores every
        member."""
        members = unit_plan.members(self.s.inv, unit)
        head = members[0]
        step = Step(run, recipe, head, Row(wave + 1, p.tag, unit=unit.name), p)
        recs = {h.name: run.record(h.name) for h in members}
        if any(r is not None and r.phase == "rolling-back" for r in recs.values()):
            why = next((r.error for r in recs.values() if r is not None and r.error), None)
            self.fail(step, unit, Failure(
                why or "the unit's gate failed before the controller died", resumed=True))
            return
        self.s.check_cancel()
        names = {h.name: container_name(h) for h in members}
        cur = each(members, lambda h: self.s.ops(h).inspect(names[h.name]), "inspect")
        ours = all((c := cur[h.name]) is not None and c.running and c.rollout == run.id
                   and c.digest == p.digest for h in members)
        befores: dict[str, str | None] = {
            h.name: (r.before_tag if (r := recs[h.name]) is not None else None) for h in members}
        if not ours:
            for h in members:
                c = cur[h.name]
                step.on(h).phase("stopping", f"unit {unit.name}: {c.tag if c else 'nothing'}",
                                 status=fleet_records.IN_PROGRESS)
            t0 = time.monotonic()
            # every member at once: the unit serves nothing from its first stop anyway
            before = each(members, lambda h: self.s.ops(h).retire(names[h.name], run.id, p.digest),
                          "stop")
            step.timings["stop"] = time.monotonic() - t0
            for h in members:
                r, b = recs[h.name], before[h.name]
                if (r is not None and r.before_digest is None and b is not None
                        and b.digest != p.digest):
                    befores[h.name] = b.tag
                    run.ledger.host_phase(run.id, h.name, "stopping",
                                          "recorded the stopped container as the previous "
                                           "version", before_tag=b.tag, before_digest=b.digest,
                                          before=b.settings)
        else:
            for h in members:
                step.on(h).phase("loading",
                                 "already running this rollout's container: gating the unit",
                                 status=fleet_records.IN_PROGRESS)
        try:
            self._start_and_gate(step, unit, ours, befores[head.name])
        except RECOVERABLE as e:
            self.fail(step, unit, Failure(recoverable_why(e),
                                          judged=not isinstance(e, KeyboardInterrupt)))
            if isinstance(e, KeyboardInterrupt):
                raise

    def _start(self, step: Step, unit: Unit) -> None:
        """Every member started in the launch's order (native: workers first, the head last; ray:
        the head first), each with its own command and fabric environment."""
        run, recipe, p = step.run, step.recipe, step.p
        t0 = time.monotonic()
        for name in recipe.topology.start_order(unit):
            self.s.check_cancel()
            h = self.s.inv.host(name)
            step.on(h).phase("starting", f"unit {unit.name} rank {unit.rank(name)}")
            self.s.ops(h).start(remote.StartRequest(
                recipe, p.pull_ref, p.tag, p.digest, run.id, self.s.container_secrets(recipe),
                self.s.cache_key(h, recipe, p.digest), recipe.launch(unit, name)))
        step.timings["start"] = time.monotonic() - t0

    def _start_and_gate(self, step: Step, unit: Unit, ours: bool, before_tag: str | None) -> None:
        run, recipe, p, head, t = step.run, step.recipe, step.p, step.host, step.timings
        members = unit_plan.members(self.s.inv, unit)
        if not ours:
            self._start(step, unit)
        self.s.check_cancel()
        cfg = gate.config(recipe, run.opts.soak, head)
        for h in members:
            step.on(h).phase("loading",
                             f"unit {unit.name}: waiting for every rank and the head's /health",
                             step.row.at("loading"))
        t0 = time.monotonic()
        # The head's API opens only once every rank joined: its readiness is the unit's.
        ready = self.s.gates.wait(head, recipe, p.tag, cfg, run.opts.ready_timeout,
                                  step.live("loading"))
        t["ready"] = time.monotonic() - t0
        if not ready.ready:
            self.fail(step, unit, Failure(f"readiness {ready.outcome.value}: {ready.message}"))
            return
        down = self.not_running(members)
        if down:
            self.fail(step, unit, Failure(f"member(s) not running once the head was ready: {down}"))
            return
        self.s.check_cancel()
        for h in members:
            step.on(h).phase(
                "soak", f"unit {unit.name}: {cfg.sustained_duration:.0f}s sustained on {head.name}",
                step.row.at("ready"))
        t0 = time.monotonic()
        art = run.artifacts(head)
        with MemberWatch(members, self.s.ops) as watch:
            # judged against the unit's own baseline (keyed by the unit, not by the host that is its
            # head)
            verdict = self.s.gates.soak(
                gate.Judged(head, recipe, p.tag, cfg),
                gate.Baseline(run.ledger, before_tag, baselines.unit_key(unit.name)), art,
                f"{run.id}/{art.name}", step.live("soak"))
        t["soak"] = time.monotonic() - t0
        self._judge(step.shown(step.row.at(**gate.figures(verdict))), unit, verdict, watch.lost,
                    gate.summarise(verdict, t, cfg.sustained_duration))

    def _judge(self, step: Step, unit: Unit, verdict: Any, lost: str | None,
               summary: Mapping[str, Any]) -> None:
        """The unit's soak verdict recorded on every member: passed, paused, or failed (every member
        restored); a member lost during the soak fails the unit whatever the verdict."""
        members = unit_plan.members(self.s.inv, unit)
        if lost is not None:
            self.fail(step, unit, Failure(
                f"soak fail: {lost} (the head's container was stopped to end "
                f"the soak: a unit with a member lost serves no token)", verdict))
            return
        down = self.not_running(members)
        if down and verdict.outcome.value == "pass":
            self.fail(step, unit,
                      Failure(f"member(s) stopped during the soak: {down}", verdict))
            return
        if verdict.outcome.value == "pass":
            now = each(members, lambda h: self.s.ops(h).inspect(container_name(h)), "inspect")
            # every member's known-good before any is done: a kill between them leaves the unit to
            # re-check
            for h in members:
                outcome.keep_known_good(step.on(h), now[h.name])
            for h in members:
                outcome.passed(step.on(h), f"unit {unit.name}: {verdict.summary}", verdict,
                               summary, now[h.name])
        elif verdict.outcome.value == "inconclusive" and step.run.opts.on_inconclusive == "pause":
            for h in members:
                outcome.paused(step.on(h), f"unit {unit.name}: {verdict.summary}", verdict,
                               summary)
        else:
            self.fail(step, unit, Failure(
                f"soak {verdict.outcome.value}: {gate.failed_checks_text(verdict)}", verdict))

    def not_running(self, members: Sequence[Host]) -> str:
        """The members whose serving container does not run, as text (empty when all run)."""
        now = each(members, lambda h: self.s.ops(h).inspect(container_name(h)), "inspect")
        return ", ".join(f"{n} ({c.status if c else 'no container'})" for n, c in now.items()
                         if c is None or not c.running)

    def fail(self, step: Step, unit: Unit, failure: Failure) -> None:
        """Every member back to what it served before, together: the new containers killed on all
        members first (no member serves the new version while another is back), then each ``.prev``
        started in the launch's order, the head's readiness and a smoke test. A member without a
        previous version leaves the whole unit down (killed), recorded as failed with the fix.
        ``step``'s host is the unit's head."""
        run, t = step.run, step.timings
        why, verdict = failure.why, failure.verdict
        members = unit_plan.members(self.s.inv, unit)
        head = members[0]
        summary = outcome.fail_summary(failure, t)
        for h in members:
            step.on(h).phase("rolling-back", f"unit {unit.name}: {why}", step.row.at("failed"),
                             error=why, verdict=summary,
                             artifacts=verdict.artifacts_dir if verdict is not None else None)
        fix = fix_for(run, unit.members)
        t0 = time.monotonic()
        try:
            logs = {h.name: run.save_logs(h, self.s.ops(h), container_name(h)) for h in members}
            if failure.judged and not failure.resumed:
                why = with_collective_errors(why, logs)
            prev_tag = self._restore(step, unit, why, fix, failure.resumed)
            if prev_tag is False:
                return
            back = step.shown(step.row.showing(prev_tag or "?"))
            for h in members:
                back.on(h).phase("rolling-back",
                                 f"unit {unit.name}: restored {prev_tag}; waiting for the head",
                                 back.row.at("loading"))
            try:
                outcome.check_restored(back.on(head), prev_tag, "rolling-back", since=t0)
            finally:
                summary["timings"] = dict(t)
            down = self.not_running(members)
            if down:
                raise FleetError(f"restored member(s) not running: {down}", host=head.name)
        except Exception as e:
            cause = e.message() if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            for h in members:
                step.on(h).phase(
                    "failed", f"{why}; the unit's rollback failed: {cause}", step.row.at("down"),
                    status=fleet_records.HOST_FAILED,
                    error=f"{why}; unit {unit.name}'s rollback failed: {cause}; fix: {fix}",
                    verdict=summary)
            return
        now = each(members, lambda h: self.s.ops(h).inspect(container_name(h)), "inspect")
        for h in members:
            outcome.after_restore(back.on(h), replace(failure, why=why),
                                  f"unit {unit.name}: serving {prev_tag} again", now[h.name],
                                  prev_tag, summary)

    def _restore(self, step: Step, unit: Unit, why: str, fix: str,
                 resumed: bool) -> str | Literal[False] | None:
        """Each member's previous container started again, in the launch's order; the tag it serves
        (the head's), or False when a member had none: the unit is then down, recorded as failed."""
        run, recipe = step.run, step.recipe
        members = unit_plan.members(self.s.inv, unit)
        recs = {h.name: run.record(h.name) for h in members}
        looks = inspect_both(self.s.ops, members)
        # A member whose serving name already holds what it served before (a restore done before the
        # controller died) has nothing to restore: it is stopped and started again with the others.
        placed = {h.name: resumed and (c := looks[h.name][0]) is not None and c.rollout != run.id
                  and (r := recs[h.name]) is not None and c.digest == r.before_digest
                  for h in members}
        already = all(placed[h.name] and (c := looks[h.name][0]) is not None and c.running
                      for h in members)
        back_of = {h.name: looks[h.name][0] if placed[h.name] else looks[h.name][1]
                   for h in members}
        head = back_of[members[0].name]
        prev_tag = head.tag if head is not None else None
        if already:
            return prev_tag
        missing = [h.name for h in members if back_of[h.name] is None]
        if missing:
            each(members, lambda h: self.s.ops(h).kill(container_name(h)), "kill")
            for h in members:
                step.on(h).phase("failed", f"{why}; {', '.join(missing)} had no previous version: "
                                 f"the unit {unit.name} is down", step.row.at("down"),
                                 status=fleet_records.HOST_FAILED,
                                 error=f"{why}; unit {unit.name} down (no previous version on "
                                       f"{', '.join(missing)}); fix: {fix}")
            return False
        # nothing of the failed version keeps running on any member (a restored one is stopped, so
        # that every rank joins anew), then each previous one started in the launch's order
        each(members, lambda h: (self.s.ops(h).stop if placed[h.name] else self.s.ops(h).kill)(
            container_name(h)), "kill")
        for name in recipe.topology.start_order(unit):
            member = self.s.inv.host(name)
            if placed[name]:
                self.s.ops(member).start_again(container_name(member))
            else:
                self.s.ops(member).restore(container_name(member))
        return prev_tag


def with_collective_errors(why: str, logs: Mapping[str, str | None], most: int = 4) -> str:
    """``why`` with the NCCL/Gloo error and timeout lines of the members' logs quoted as its cause
    (``fleetctl.fabric.collective_errors``: the last two of each member, ``most`` in all)."""
    quoted = [f"{m}: {line}" for m,
              text in logs.items() if text for line in fabric.collective_errors(text)[-2:]]
    if not quoted:
        return why
    return f"{why}; cause in the members' logs: " + " | ".join(quoted[:most])
