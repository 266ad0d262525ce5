"""A serving unit's step of a rollout: every member stopped, started in the launch's order, the head's
readiness (it serves only once every rank joined), the soak against the head's API; any failure restores
EVERY member to what it served before, together (docs/units.md).

The planner sees a unit as one slot (:func:`fleetctl.rollout.unit.plan_units`): its members share a wave
and a step, and count once against --max-unavailable and --failure-budget. The engine hands the unit's
head to :meth:`UnitSteps._slot_step`, which steps the whole unit; a single host goes to ``_host_step``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleetctl import fabric, ssh
from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Unit
from fleetctl.recipes import Recipe
from fleetctl.rollout import deploy, gate
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.results import Options
from fleetctl.rollout.session import RECOVERABLE
from fleetctl.rollout.step import HostSteps, recoverable_why
from fleetctl.rollout.unit import unit_recipe
from fleetctl.serving import container_name
from fleetctl.soak import baselines
from fleetctl.state import ledger as fleet_ledger

#: Seconds between two looks at every member's container during a unit's soak.
WATCH_INTERVAL = 3.0


class MemberWatch:
    """Every member's serving container watched during the soak (one ``docker inspect`` each per interval,
    members one after another: a unit has a handful). A member whose container stops, is replaced or
    restarts breaks the unit, and the head then answers /health with no token (a wedged engine): the
    watcher records which member and how, and stops the head's container, so that the soak fails on
    the spot instead of waiting out its requests' timeouts; the unit's restore follows."""

    def __init__(self, members: Sequence[Host], ops: Callable[[Host], remote.HostOps]) -> None:
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
    """How a member's container changed between two looks (``(id, running, restarts)``, None: no container)."""
    if now is None:
        return "gone"
    if not now[1]:
        return "stopped"
    return "replaced" if was is not None and now[0] != was[0] else "restarted"


class UnitSteps(HostSteps):
    """The step of a slot: a single host's, or a whole unit's (given its head)."""

    def _slot_step(self, rid: str, recipe: Recipe, opts: Options, p: wave_plan.Plan, h: Host, wave: int,
                   batch: deploy.StepBatch | None = None) -> None:
        unit = self.inv.unit_of(h.name)
        if unit is None:
            self._host_step(rid, recipe, opts, p, h, wave, batch=batch)
            return
        self._unit_step(rid, unit_recipe(self.inv, unit, recipe), opts, p, unit, wave)

    def _fingerprint_for(self, h: Host, recipe: Recipe) -> str:
        """The container settings ``h`` must run in a rollout of ``recipe`` (a unit's member: its unit's)."""
        unit = self.inv.unit_of(h.name)
        return remote.fingerprint(recipe if unit is None else unit_recipe(self.inv, unit, recipe))

    def _members(self, unit: Unit) -> list[Host]:
        return [self.inv.host(m) for m in unit.members]

    def _unit_step(self, rid: str, recipe: Recipe, opts: Options, p: wave_plan.Plan, unit: Unit, wave: int) -> None:
        """Deploy the target on every member of ``unit`` and gate the unit; a failure restores every member."""
        members = self._members(unit)
        head = members[0]
        show = {"wave": wave + 1, "tag": p.tag, "unit": unit.name}
        t: dict[str, float] = {}
        recs = {h.name: self.ledger.host_record(rid, h.name) for h in members}
        if any(r is not None and r.phase == "rolling-back" for r in recs.values()):
            why = next((r.error for r in recs.values() if r is not None and r.error), None)
            self._fail_unit(rid, recipe, unit, why or "the unit's gate failed before the controller died", None, show,
                            t, resumed=True)
            return
        self._check_cancel()
        names = {h.name: container_name(h) for h in members}
        cur = self._each(members, lambda h: self.ops(h).inspect(names[h.name]), "inspect")
        ours = all((c := cur[h.name]) is not None and c.running and c.rollout == rid and c.digest == p.digest
                   for h in members)
        befores: dict[str, str | None] = {h.name: (r.before_tag if (r := recs[h.name]) is not None else None)
                                          for h in members}
        if not ours:
            for h in members:
                c = cur[h.name]
                self._phase(rid, h, "stopping", f"unit {unit.name}: {c.tag if c else 'nothing'}", show,
                            status=fleet_ledger.IN_PROGRESS)
            t0 = time.monotonic()
            # every member at once: the unit serves nothing from its first stop anyway
            before = self._each(members, lambda h: self.ops(h).retire(names[h.name], rid, p.digest), "stop")
            t["stop"] = time.monotonic() - t0
            for h in members:
                r, b = recs[h.name], before[h.name]
                if r is not None and r.before_digest is None and b is not None and b.digest != p.digest:
                    befores[h.name] = b.tag
                    self.ledger.host_phase(rid, h.name, "stopping", "recorded the stopped container as the previous "
                                           "version", before_tag=b.tag, before_digest=b.digest, before=b.settings)
        else:
            for h in members:
                self._phase(rid, h, "loading", "already running this rollout's container: gating the unit", show,
                            status=fleet_ledger.IN_PROGRESS)
        try:
            self._start_and_gate(rid, recipe, opts, p, unit, ours, show, t, befores[head.name])
        except RECOVERABLE as e:
            self._fail_unit(rid, recipe, unit, recoverable_why(e), None, show, t,
                            judged=not isinstance(e, KeyboardInterrupt))
            if isinstance(e, KeyboardInterrupt):
                raise

    def _start_and_gate(self, rid: str, recipe: Recipe, opts: Options, p: wave_plan.Plan, unit: Unit, ours: bool,
                        show: Mapping[str, Any], t: dict[str, float], before_tag: str | None) -> None:
        members = self._members(unit)
        head = members[0]
        if not ours:
            t0 = time.monotonic()
            # In the launch's order (native: workers first, the head last; ray: the head first), each member
            # with its own command and fabric environment.
            for name in recipe.topology.start_order(unit):
                self._check_cancel()
                h = self.inv.host(name)
                self._phase(rid, h, "starting", f"unit {unit.name} rank {unit.rank(name)}", show)
                self.ops(h).start(recipe, p.pull_ref, tag=p.tag, digest=p.digest, rollout_id=rid,
                                  secrets=self._container_secrets(recipe), launch=recipe.launch(unit, name),
                                  cache_key=self.cache_key(h, recipe, p.digest))
            t["start"] = time.monotonic() - t0
        self._check_cancel()
        cfg = gate.config(recipe, opts.soak, head)
        for h in members:
            self._phase(rid, h, "loading", f"unit {unit.name}: waiting for every rank and the head's /health",
                        {**show, "health": "loading"})
        t0 = time.monotonic()
        # The head's API opens only once every rank joined: its readiness is the unit's.
        ready = self.gates.wait(head, recipe, p.tag, cfg, opts.ready_timeout, self._forward(head, show, "loading"))
        t["ready"] = time.monotonic() - t0
        if not ready.ready:
            self._fail_unit(rid, recipe, unit, f"readiness {ready.outcome.value}: {ready.message}", None, show, t)
            return
        down = self._not_running(members)
        if down:
            self._fail_unit(rid, recipe, unit, f"member(s) not running once the head was ready: {down}", None, show, t)
            return
        self._check_cancel()
        for h in members:
            self._phase(rid, h, "soak", f"unit {unit.name}: {cfg.sustained_duration:.0f}s sustained on {head.name}",
                        {**show, "health": "ready"})
        t0 = time.monotonic()
        art = self._artifacts(rid, head)
        with MemberWatch(members, self.ops) as watch:
            # judged against the unit's own baseline (keyed by the unit, not by the host that is its head)
            verdict = self.gates.soak(head, recipe, p.tag, cfg, self.ledger, before_tag, art, f"{rid}/{art.name}",
                                      self._forward(head, show, "soak"), baseline_key=baselines.unit_key(unit.name))
        t["soak"] = time.monotonic() - t0
        summary = gate.summarise(verdict, t, cfg.sustained_duration)
        figures = gate.figures(verdict)
        if watch.lost is not None:
            self._fail_unit(rid, recipe, unit, f"soak fail: {watch.lost} (the head's container was stopped to end "
                            f"the soak: a unit with a member lost serves no token)", verdict, {**show, **figures}, t)
            return
        down = self._not_running(members)
        if down and verdict.outcome.value == "pass":
            self._fail_unit(rid, recipe, unit, f"member(s) stopped during the soak: {down}", verdict,
                            {**show, **figures}, t)
            return
        if verdict.outcome.value == "pass":
            now = self._each(members, lambda h: self.ops(h).inspect(container_name(h)), "inspect")
            # every member's known-good before any is done: a kill between them leaves the unit to re-check
            for h in members:
                self._keep_known_good(rid, recipe, p, h, now[h.name])
            for h in members:
                self._passed(rid, recipe, p, h, f"unit {unit.name}: {verdict.summary}", {**show, **figures}, verdict,
                             summary, now[h.name])
        elif verdict.outcome.value == "inconclusive" and opts.on_inconclusive == "pause":
            for h in members:
                self._paused(rid, h, f"unit {unit.name}: {verdict.summary}", {**show, **figures}, verdict, summary)
        else:
            self._fail_unit(rid, recipe, unit, f"soak {verdict.outcome.value}: {gate.failed_checks_text(verdict)}",
                            verdict, {**show, **figures}, t)

    def _not_running(self, members: Sequence[Host]) -> str:
        """The members whose serving container does not run, as text (empty when all run)."""
        now = self._each(members, lambda h: self.ops(h).inspect(container_name(h)), "inspect")
        return ", ".join(f"{n} ({c.status if c else 'no container'})" for n, c in now.items()
                         if c is None or not c.running)

    def _each(self, members: Sequence[Host], fn: Any, what: str) -> dict[str, Any]:
        """``fn`` on every member at once (bounded by ssh.fan_out); the first member's error raised, naming it."""
        outs = ssh.fan_out(members, fn, timeout=180)
        for h in members:
            o = outs[h.name]
            if o.error is not None:
                raise o.error
        return {h.name: outs[h.name].value for h in members}

    def _fail_unit(self, rid: str, recipe: Recipe, unit: Unit, why: str, verdict: Any, show: Mapping[str, Any],
                   t: dict[str, float], judged: bool = True, resumed: bool = False) -> None:
        """Every member back to what it served before, together: the new containers killed on all members
        first (no member serves the new version while another is back), then each ``.prev`` started in the
        launch's order, the head's readiness and a smoke test. A member without a previous version leaves
        the whole unit down (killed), recorded as failed with the fix."""
        members = self._members(unit)
        head = members[0]
        summary = gate.summarise(verdict, t) if verdict is not None else {
            "outcome": "fail", "summary": why, "failed_checks": [why], "timings": dict(t)}
        for h in members:
            self._phase(rid, h, "rolling-back", f"unit {unit.name}: {why}", {**show, "health": "failed"}, error=why,
                        verdict=summary, artifacts=verdict.artifacts_dir if verdict is not None else None)
        recs = {h.name: self.ledger.host_record(rid, h.name) for h in members}
        fix = self._fix_for(rid, unit.members)
        back = dict(show)
        t0 = time.monotonic()
        try:
            logs = {h.name: self._save_logs(rid, h, self.ops(h), container_name(h)) for h in members}
            if judged and not resumed:
                why = with_collective_errors(why, logs)
            looks = self._each(members, lambda h: (self.ops(h).inspect(container_name(h)),
                                                   self.ops(h).inspect(container_name(h) + remote.PREV_SUFFIX)),
                               "inspect")
            # A member whose serving name already holds what it served before (a restore done before the
            # controller died) has nothing to restore: it is stopped and started again with the others.
            placed = {h.name: resumed and (c := looks[h.name][0]) is not None and c.rollout != rid
                      and (r := recs[h.name]) is not None and c.digest == r.before_digest for h in members}
            already = all(placed[h.name] and looks[h.name][0].running for h in members)
            back_of = {h.name: looks[h.name][0] if placed[h.name] else looks[h.name][1] for h in members}
            prev_tag = back_of[head.name].tag if back_of[head.name] is not None else None
            if not already:
                missing = [h.name for h in members if back_of[h.name] is None]
                if missing:
                    self._each(members, lambda h: self.ops(h).kill(container_name(h)), "kill")
                    for h in members:
                        self._phase(rid, h, "failed", f"{why}; {', '.join(missing)} had no previous version: the "
                                    f"unit {unit.name} is down", {**show, "health": "down"},
                                    status=fleet_ledger.HOST_FAILED,
                                    error=f"{why}; unit {unit.name} down (no previous version on "
                                          f"{', '.join(missing)}); fix: {fix}")
                    return
                # nothing of the failed version keeps running on any member (a restored one is stopped, so that
                # every rank joins anew), then each previous one started in the launch's order
                self._each(members, lambda h: (self.ops(h).stop if placed[h.name] else self.ops(h).kill)(
                    container_name(h)), "kill")
                for name in recipe.topology.start_order(unit):
                    member = self.inv.host(name)
                    if placed[name]:
                        self.ops(member).start_again(container_name(member))
                    else:
                        self.ops(member).restore(container_name(member))
            back = {**show, "tag": prev_tag or "?"}
            for h in members:
                self._phase(rid, h, "rolling-back", f"unit {unit.name}: restored {prev_tag}; waiting for the head",
                            {**back, "health": "loading"})
            try:
                self._check_restored(rid, recipe, head, prev_tag, back, "rolling-back", t, since=t0)
            finally:
                summary["timings"] = dict(t)
            down = self._not_running(members)
            if down:
                raise FleetError(f"restored member(s) not running: {down}", host=head.name)
        except Exception as e:
            cause = e.message() if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            for h in members:
                self._phase(rid, h, "failed", f"{why}; the unit's rollback failed: {cause}", {**show, "health": "down"},
                            status=fleet_ledger.HOST_FAILED,
                            error=f"{why}; unit {unit.name}'s rollback failed: {cause}; fix: {fix}", verdict=summary)
            return
        now = self._each(members, lambda h: self.ops(h).inspect(container_name(h)), "inspect")
        for h in members:
            self._after_restore(rid, h, why, f"unit {unit.name}: serving {prev_tag} again", back, judged, now[h.name],
                                prev_tag, summary)


def with_collective_errors(why: str, logs: Mapping[str, str | None], most: int = 4) -> str:
    """``why`` with the NCCL/Gloo error and timeout lines of the members' logs quoted as its cause
    (``fleetctl.fabric.collective_errors``: the last two of each member, ``most`` in all)."""
    quoted = [f"{m}: {line}" for m, text in logs.items() if text for line in fabric.collective_errors(text)[-2:]]
    if not quoted:
        return why
    return f"{why}; cause in the members' logs: " + " | ".join(quoted[:most])


class UnitRollback(UnitSteps):
    """A unit's rollback step: every member to the target together, the head's readiness and smoke; a target
    that fails puts every member back on what it served before this rollback."""

    def _rollback_slot(self, rid: str, recipe: Recipe, h: Host,
                       targets: Mapping[str, tuple[str | None, str, str, str | None]]) -> None:
        unit = self.inv.unit_of(h.name)
        if unit is None:
            self._rollback_host(rid, recipe, h, *targets[h.name])  # type: ignore[attr-defined]
            return
        # one version for every member (fleetctl.rollout.unit.unit_targets); a member done already has none left
        tag, digest, ref, fingerprint = next(targets[m] for m in unit.members if m in targets)
        self._rollback_unit(rid, unit_recipe(self.inv, unit, recipe), unit, tag, digest, ref, fingerprint)

    def _rollback_unit(self, rid: str, recipe: Recipe, unit: Unit, tag: str | None, digest: str, ref: str,
                       fingerprint: str | None) -> None:
        members = self._members(unit)
        head = members[0]
        show = {"wave": 1, "tag": tag or "?", "unit": unit.name}
        t: dict[str, float] = {}
        t0 = time.monotonic()
        recs = {h.name: self.ledger.host_record(rid, h.name) for h in members}
        if any(r is not None and r.phase == "undoing" for r in recs.values()):
            self._undo_unit(rid, recipe, unit, "the target failed before the controller died", show)
            return

        def wanted(s: remote.Container | None) -> bool:
            return s is not None and s.digest == digest and (fingerprint is None or s.fingerprint in (fingerprint, None))

        looks = self._each(members, lambda h: (self.ops(h).inspect(container_name(h)),
                                               self.ops(h).inspect(container_name(h) + remote.PREV_SUFFIX)), "inspect")
        for h in members:
            cur, r = looks[h.name][0], recs[h.name]
            if cur is not None and r is not None and r.before_digest is None and not wanted(cur):
                self.ledger.host_phase(rid, h.name, "inspected", status=fleet_ledger.IN_PROGRESS, before_tag=cur.tag,
                                       before_digest=cur.digest, before=cur.settings)
        try:
            self._check_cancel()
            if all((c := looks[h.name][0]) is not None and c.running and wanted(c) for h in members):
                for h in members:
                    self._phase(rid, h, "loading", f"unit {unit.name}: serving {tag}: checking it",
                                {**show, "health": "loading"}, status=fleet_ledger.IN_PROGRESS)
            elif all(wanted(looks[h.name][1]) for h in members):
                for h in members:
                    self._phase(rid, h, "restoring", f"unit {unit.name}: the kept {tag}", show,
                                status=fleet_ledger.IN_PROGRESS)
                # every member stopped first, so that no old member joins a new head; then each kept one
                # started in the launch's order (the abandoned one kept as .prev)
                self._each(members, lambda h: self.ops(h).stop(container_name(h)), "stop")
                for name in recipe.topology.start_order(unit):
                    self.ops(self.inv.host(name)).swap(container_name(self.inv.host(name)))
            else:
                for h in members:
                    self._phase(rid, h, "pull", ref.rsplit("/", 1)[-1][:40], show, status=fleet_ledger.IN_PROGRESS)
                self._each(members, lambda h: self._pull(self.ops(h), recipe.image, ref), "pull")
                self._each(members, lambda h: self.ops(h).retire(container_name(h), rid, digest, grace=0), "stop")
                for name in recipe.topology.start_order(unit):
                    member = self.inv.host(name)
                    self._phase(rid, member, "starting", f"unit {unit.name} rank {unit.rank(name)}", show)
                    self.ops(member).start(recipe, ref, tag=tag or digest[:19], digest=digest, rollout_id=rid,
                                           secrets=self._container_secrets(recipe), launch=recipe.launch(unit, name),
                                           cache_key=self.cache_key(member, recipe, digest))
            cfg = gate.config(recipe, None, head)
            ready = self.gates.wait(head, recipe, tag or "", cfg, None, self._forward(head, show, "loading"))
            t["ready"] = time.monotonic() - t0
            if not ready.ready:
                raise FleetError(f"readiness {ready.outcome.value}: {ready.message}", host=head.name)
            down = self._not_running(members)
            if down:
                raise FleetError(f"member(s) not running: {down}", host=head.name)
            self._check_cancel()
            for h in members:
                self._phase(rid, h, "smoke", f"unit {unit.name} on {head.name}", {**show, "health": "ready"})
            v = self.gates.smoke(head, recipe, tag or "", cfg, self._artifacts(rid, head))
            t["total"] = time.monotonic() - t0
            if v.outcome.value != "pass":
                raise FleetError(f"smoke {v.outcome.value}: {gate.failed_checks_text(v)}", host=head.name)
        except RECOVERABLE as e:
            self._undo_unit(rid, recipe, unit, f"{tag} failed: {recoverable_why(e, full=False)}", show)
            if isinstance(e, KeyboardInterrupt):
                raise
            return
        for h in members:
            self._phase(rid, h, "done", f"unit {unit.name}: serving {tag}", {**show, "health": "ok"},
                        status=fleet_ledger.DONE, after_tag=tag, after_digest=digest, verdict=gate.summarise(v, t),
                        artifacts=v.artifacts_dir)

    def _undo_unit(self, rid: str, recipe: Recipe, unit: Unit, why: str, show: Mapping[str, Any]) -> None:
        """Every member back on what it served before this rollback (its ``.prev``), together."""
        members = self._members(unit)
        head = members[0]
        for h in members:
            self._phase(rid, h, "undoing", f"unit {unit.name}: {why}", {**show, "health": "failed"}, error=why)
        recs = {h.name: self.ledger.host_record(rid, h.name) for h in members}
        tag_b = next((r.before_tag for r in recs.values() if r is not None and r.before_tag), None)
        fix = self._fix_for(rid, unit.members)
        try:
            if any(r is None or r.before_digest is None for r in recs.values()):
                raise FleetError("nothing served before this rollback on every member", host=head.name)
            looks = self._each(members, lambda h: (self.ops(h).inspect(container_name(h)),
                                                   self.ops(h).inspect(container_name(h) + remote.PREV_SUFFIX)),
                               "inspect")

            def is_before(h: Host, s: remote.Container | None) -> bool:
                r = recs[h.name]
                return s is not None and r is not None and s.digest == r.before_digest

            if not all(looks[h.name][0] is not None and looks[h.name][0].running and is_before(h, looks[h.name][0])
                       for h in members):
                gone = [h.name for h in members if not is_before(h, looks[h.name][0]) and not is_before(h, looks[h.name][1])]
                if gone:
                    raise FleetError(f"the previous container is gone on {', '.join(gone)}", host=head.name)
                self._each(members, lambda h: self.ops(h).stop(container_name(h)), "stop")
                for name in recipe.topology.start_order(unit):
                    member = self.inv.host(name)
                    if not is_before(member, looks[name][0]):
                        self.ops(member).restore(container_name(member))
                    else:
                        self.ops(member).start_again(container_name(member))
            self._check_restored(rid, recipe, head, tag_b, show, "undoing", smoke=False)
        except Exception as e:
            cause = e.cause if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            for h in members:
                self._phase(rid, h, "failed", f"{why}; undo failed: {cause}", {**show, "health": "down"},
                            status=fleet_ledger.HOST_FAILED, error=f"{why}; unit {unit.name}'s undo failed: {cause}; "
                                                                  f"fix: {fix}")
            return
        for h in members:
            r = recs[h.name]
            self._phase(rid, h, "rolled-back", f"unit {unit.name}: {why}; serving {tag_b} again",
                        {**show, "health": "ok", "tag": tag_b}, status=fleet_ledger.ROLLED_BACK, after_tag=r.before_tag
                        if r else None, after_digest=r.before_digest if r else None, error=why)
