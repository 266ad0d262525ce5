"""The forward path of ``fleetctl rollout``: planned once, confirmed, recorded, then the canary and
the waves, each step gated (each wave baked)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from fleetctl import warmcache
from fleetctl.inventory import Host
from fleetctl.rollout import groups
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout import unit as unit_plan
from fleetctl.rollout.bake import Bake
from fleetctl.rollout.groups import FleetPlan, Switch
from fleetctl.rollout.prefetch import Prefetch
from fleetctl.rollout.preflight import Preflight
from fleetctl.rollout.results import HostOutcome, Options, RolloutResult
from fleetctl.rollout.run import Group, Run
from fleetctl.rollout.session import Session, StopRollout, command_line
from fleetctl.rollout.step import Steps
from fleetctl.rollout.unit import unit_recipe
from fleetctl.serving import container_name
from fleetctl.state import hoststate
from fleetctl.state import records as fleet_records
from fleetctl.state.records import HostRecord

#: Shown the plan once it is cut, before anything is recorded or changed; raises to refuse.
Confirm = Callable[[FleetPlan], None]

#: Host statuses a wave's step ends on that stop the rollout (within the budget: go on).
BAD = (fleet_records.ROLLED_BACK, fleet_records.HOST_FAILED)


class Forward:
    """The forward path: plan, confirm and record the rollout, then the canary and the waves."""

    def __init__(self, session: Session, preflight: Preflight, prefetch: Prefetch, steps: Steps,
                 bake: Bake) -> None:
        self.s = session
        self.preflight = preflight
        self.prefetch = prefetch
        self.door, self.hosts, self.units = steps.door, steps.hosts, steps.units
        self.bake = bake

    def rollout(self, opts: Options, confirm: Confirm | None = None) -> RolloutResult:
        """Plan (once), then (unless dry-run, or ``confirm`` refuses) prefetch and go wave by wave
        through the gates. ``confirm`` is shown the plan before anything is recorded or changed;
        without one, hosts left out or a model switch are refused unless the options allow them
        (:meth:`~.groups.FleetPlan.refusal`), and with one, ``confirm`` decides."""
        s = self.s
        rid = fleet_records.new_id("rollout")
        t_start = time.monotonic()
        s.webhook(rid, opts.webhook, check_only=True)
        # Bad options and an unknown tag are refused before the ledger's lock or any host's is
        # tried.
        selected = self.preflight.check(opts)
        bake = self.bake.seconds(opts)
        self.bake.limits()
        self.bake.prometheus()
        self.preflight.resolve_groups(selected, opts.tag or "")
        if opts.dry_run:
            fp, _groups, _facts = self.preflight.plan(opts)
            p = fp.first
            return RolloutResult(None, "rollout", "planned", p.recipe, p.tag, p.digest, p.image,
                                 tuple(HostOutcome(h.host, h.wave, h.action, "planned",
                                                   h.current_tag,
                                                   h.current_digest, None, None,
                                                   recipe=fp.recipe_of(h.host))
                                       for h in fp.hosts),
                                 plan=p, groups=fp)
        s.ledger.acquire(rid)
        run = Run(s, rid, "rollout", dataclasses.replace(opts, bake=bake))
        try:
            s.check_idle()
            run.held = s.hold(rid, "rollout", [h for g in selected for h in g.hosts.values()])
            fp, moved, facts = self.preflight.plan(opts)
            if confirm is not None:
                confirm(fp)
            elif (refused := fp.refusal(opts.skip_missing, opts.switch_model)) is not None:
                raise refused
            run.groups.extend(moved)
            self._record(run, fp, facts)
            return self.run(run, resume=False, t0=t_start)
        finally:
            run.release()
            s.ledger.release(rid)

    def _record(self, run: Run, fp: FleetPlan, facts: dict[str, Any]) -> None:
        """The plan in the ledger: every host's row with what it serves now (and its recipe), the
        known-good versions it moves away from, and the hosts' intents in their state files."""
        s, first, opts = self.s, fp.first, run.opts
        switched = {sw.host: sw for sw in fp.switches}
        options = {"waves": opts.waves or wave_plan.DEFAULT_WAVES,
                   "max_unavailable": first.max_unavailable,
                   "capacity": first.capacity.describe() if first.capacity else None,
                   "failure_budget": first.failure_budget, "soak": opts.soak,
                   "on_inconclusive": opts.on_inconclusive, "ready_timeout": opts.ready_timeout,
                   "pull_ref": first.pull_ref, "bake": opts.bake,
                   "groups": groups.group_options(fp.plans),
                   "switches": {h: sw.describe() for h, sw in switched.items()},
                   "left": [n for lf in fp.left for n in lf.hosts]}
        rows: list[dict[str, Any]] = []
        for g in run.groups:
            for hp in g.p.hosts:
                rows.append(self._row(run, g, hp, facts[hp.host], switched.get(hp.host)))
        rows += groups.rows_left(fp.left, first.tag)
        s.ledger.create(run.id, kind="rollout",
                        recipe=", ".join(p.recipe for p in fp.plans), requested=first.requested,
                        tag=first.tag, digest=first.digest, image=first.image, options=options,
                        command=command_line(), waves=fp.waves, hosts=rows)
        if run.held is not None:
            now = time.time()
            run.held.seed({hp.host: (hoststate.Version(p.tag, p.digest, run.id, now)
                                     if hp.action == "deploy" else None,
                                     hoststate.Version(hp.current_tag, hp.current_digest, None, now)
                                     if hp.current_digest else None)
                           for p in fp.plans for hp in p.hosts})

    def _row(self, run: Run, g: Group, hp: wave_plan.HostPlan, f: Any,
             switch: Switch | None) -> dict[str, Any]:
        """One host's row of a new rollout (and, moving it away from a version it serves, that
        version as a known-good)."""
        s, p = self.s, g.p
        b = f.serving if f.serving and f.serving.running else None
        recipe = unit_recipe(s.inv, u, g.recipe) if (u := s.inv.unit_of(hp.host)) else g.recipe
        if b is not None and b.digest and hp.action == "deploy":
            # What a host serves when a rollout moves it away is known good to go back to
            # (before fleetctl first touched it: ``found``).
            first = not s.ledger.known_good(hp.host)
            s.ledger.add_known_good(hp.host, tag=b.tag, digest=b.digest,
                                    fingerprint=b.fingerprint, settings=b.settings,
                                    source="found" if first else "served", rollout_id=None,
                                    recipe=b.recipe)
        return {"host": hp.host, "wave": hp.wave, "step": hp.step,
                "status": (fleet_records.SKIPPED if hp.action == "skip" else fleet_records.PENDING),
                "before_tag": b.tag if b else None, "before_digest": b.digest if b else None,
                "before": b.settings if b else None, "target_tag": p.tag, "target_digest": p.digest,
                "recipe": recipe.name,
                "before_recipe": switch.before if switch else (b.recipe if b else None)}

    def run(self, run: Run, resume: bool, t0: float) -> RolloutResult:
        """The waves of a recorded rollout (new or resumed); ``t0`` is when the command started
        (planning included). Its webhook posts from here to the end."""
        run.hook = self.s.webhook(run.id, run.opts.webhook)
        try:
            return self._waves(run, resume, t0)
        finally:
            run.hook.close()

    def _waves(self, run: Run, resume: bool, t0: float) -> RolloutResult:
        first = run.group.p
        waves = run.waves
        run.send("start" if not resume else "wave", tag=first.tag, digest=first.digest,
                 recipe=", ".join(g.recipe.name for g in run.groups),
                 hosts=[h.host for g in run.groups for h in g.p.hosts],
                 waves=[list(w) for w in waves], resumed=resume)
        for g in run.groups:
            for hp in g.p.hosts:
                run.emit("planned" if hp.action == "deploy" else "skip", "", hp.host,
                         wave=hp.wave + 1 if hp.wave >= 0 else "-", tag=hp.current_tag or "-")
        todo = {g.recipe.name: [g.hosts[h.host] for h in g.p.hosts if h.action == "deploy"]
                for g in run.groups}
        t_pre = time.monotonic()
        pulls: dict[str, float] = {}
        try:
            for g in run.groups:
                pulls.update(self.prefetch.run(run, todo[g.recipe.name], g.p.pull_ref, g.p.image))
        except StopRollout as e:
            run.ledger.set_status(run.id, e.status, e.error)
            run.send("failure", error=e.error)
            return run.result(p=first, seconds=time.monotonic() - t0)
        prefetch_s = time.monotonic() - t_pre
        wave_secs: list[float] = []
        status, error = fleet_records.COMPLETED, None
        if resume:
            # Hosts a killed controller left out after their step count against the floor: back in
            # first.
            for g in run.groups:
                self.door.reconcile(run, g.recipe, [hp.host for hp in g.p.hosts])
        try:
            for w in range(len(waves)):
                tw = time.monotonic()
                if self._wave(run, w):
                    wave_secs.append(time.monotonic() - tw)
            failed = [r for r in run.ledger.get(run.id).hosts if r.status in BAD]
            if failed:
                status = fleet_records.COMPLETED_WITH_FAILURES
                error = "; ".join(f"{r.host}: {r.error}" for r in failed)
        except StopRollout as e:
            status, error = e.status, e.error
        self._finish(run, status, error, sum(len(t) for t in todo.values()))
        return run.result(p=first, seconds=time.monotonic() - t0, prefetch=prefetch_s,
                          waves=tuple(wave_secs), pulls=pulls)

    def _wave(self, run: Run, w: int) -> bool:
        """Wave ``w`` of every group (each group's steps within its own floor; the groups' steps
        side by side), then each group's bake; False when it had nothing left to do. Raises
        StopRollout."""
        bake = run.opts.bake or 0.0
        rec = run.ledger.get(run.id)
        parts = [(g, list(g.p.waves[w])) for g in run.groups if w < len(g.p.waves)]
        pending = {g.recipe.name: [h for h in members if (r := rec.host(h)) is not None
                                   and not self._host_finished(run, g, r, g.hosts[h])]
                   for g, members in parts}
        if not any(pending.values()):
            # A killed controller (or a paused bake) left this wave's bake unfinished: bake it
            # again.
            due = [(g, m) for g, m in parts if bake and self.bake.due(run, m)]
            for g, members in due:
                self.bake.bake(run, g, w, members, bake)
            if due:
                run.ledger.set_wave(run.id, w, fleet_records.DONE)
            return False
        run.ledger.set_wave(run.id, w, fleet_records.RUNNING)
        if w > 0:
            for g, _members in parts:
                self._warm(run, g, [h for h in pending[g.recipe.name]
                                    if self.s.inv.unit_of(h) is None])
        n = len(run.waves)
        run.send("wave", wave=w + 1, of=n, hosts=[h for _g, m in parts for h in m])
        # The fleet-wide line under the live table: which wave runs (a fleet of hundreds scrolls).
        count = sum(len(v) for v in pending.values())
        run.emit("wave", f"{w + 1} of {n}: {count} host(s), "
                         + ", ".join(f"{g.p.max_unavailable} at a time" if len(parts) == 1
                                     else f"{g.recipe.name} {g.p.max_unavailable} at a time"
                                     for g, _m in parts))
        steps = {g.recipe.name: unit_plan.split_steps(self.s.inv, pending[g.recipe.name],
                                                      g.p.max_unavailable) for g, _m in parts}
        for k in range(max(len(v) for v in steps.values())):
            step = [(g, steps[g.recipe.name][k]) for g, _m in parts
                    if k < len(steps[g.recipe.name])]
            for g, hosts in step:
                # Never below the group's floor: hosts already out (failed, drained by anyone) are
                # waited for.
                self.door.wait_capacity([self.s.inv.host(hp.host) for hp in g.p.hosts], hosts,
                                        g.p.floor())
            self._step(run, w, step)
            self._judge(run, w, [h for _g, hosts in step for h in hosts])
        if bake:
            for g, members in parts:
                self.bake.bake(run, g, w, members, bake)
        run.ledger.set_wave(run.id, w, fleet_records.DONE)
        return True

    def _step(self, run: Run, w: int, step: Sequence[tuple[Group, list[str]]]) -> None:
        """One step's slots at once (each group's part of it): a single host through
        :class:`HostStep` (its group's deploys batched), a unit, dispatched once as its head,
        through :class:`UnitStep`."""
        inv = self.s.inv
        batches = {g.recipe.name: self.hosts.batch(run, g.recipe,
                                                   [g.hosts[h] for h in hosts
                                                    if inv.unit_of(h) is None])
                   for g, hosts in step}

        def slot(h: Host) -> None:
            g = run.group_of(h.name)
            unit = inv.unit_of(h.name)
            if unit is None:
                self.hosts.step(run, g, h, w, batch=batches[g.recipe.name])
            else:
                self.units.step(run, unit_recipe(inv, unit, g.recipe), g.p, unit, w)

        try:
            outs = self.s.parallel(
                unit_plan.slots(inv, [g.hosts[h] for g, hosts in step for h in hosts]), slot)
        except KeyboardInterrupt:
            run.ledger.set_status(run.id, fleet_records.PAUSED,
                                  "interrupted by Ctrl-C (hosts being changed were restored)")
            run.send("pause", error="interrupted by Ctrl-C")
            raise
        for name, err in outs.items():
            if err is not None:
                # An exception that escaped the step (its restore failed too): the host is down.
                run.ledger.host_phase(run.id, name, "error", detail=err.message(),
                                      status=fleet_records.HOST_FAILED, error=err.message())

    def _judge(self, run: Run, w: int, step: Sequence[str]) -> None:
        """After a step: StopRollout when a canary failed, a group's budget is spent, or a host
        paused."""
        rec = run.ledger.get(run.id)
        recs = {h: r for h in step if (r := rec.host(h)) is not None}
        paused = [h for h, r in recs.items() if r.status == fleet_records.HOST_PAUSED]
        bad = [h for h, r in recs.items() if r.status in BAD]
        if bad:
            why = "; ".join(f"{h}: {recs[h].error}" for h in bad)
            run.send("failure", hosts=bad, error=why)
            rolled = [h for h in bad if recs[h].status == fleet_records.ROLLED_BACK]
            if rolled:
                run.send("rollback", hosts=rolled)
            # Counted from the ledger (so that the budget is carried across resumes), per group.
            spent = [g for g in {run.group_of(h).recipe.name: run.group_of(h) for h in bad}.values()
                     if unit_plan.count_failed(self.s.inv, [r for r in rec.hosts if r.host in
                                                            g.hosts]) > g.p.failure_budget]
            if w == 0 or spent:
                run.ledger.set_wave(run.id, w, fleet_records.FAILED)
                raise StopRollout(fleet_records.FAILED, why)
        if paused:
            run.ledger.set_wave(run.id, w, fleet_records.PAUSED)
            why = "; ".join(f"{h}: {recs[h].error}" for h in paused)
            run.send("pause", hosts=paused, error=why)
            out = all(recs[h].phase == "out-of-rotation" for h in paused)
            raise StopRollout(fleet_records.PAUSED, why if out else f"inconclusive gate: {why}")

    def _finish(self, run: Run, status: str, error: str | None, moved: int) -> None:
        """The run's end: hosts left out of rotation re-admitted, the status recorded, the webhook
        told."""
        p = run.group.p
        # Hosts a killed controller left out of rotation and this run left serving go back in.
        door_problems = [why for g in run.groups
                         for why in self.door.reconcile(run, g.recipe, [h.host for h in g.p.hosts])]
        if door_problems:
            error = "; ".join([error or "", *door_problems]).lstrip("; ")
            if status == fleet_records.COMPLETED:
                status = fleet_records.COMPLETED_WITH_FAILURES
        run.ledger.set_status(run.id, status, error)
        if status == fleet_records.COMPLETED:
            run.send("completion", tag=p.tag, digest=p.digest)
        elif status == fleet_records.COMPLETED_WITH_FAILURES:
            run.send("failure", error=error)
        run.emit(status, error or f"{p.tag} on {moved} host(s)"
                 + (f" ({', '.join(g.recipe.name for g in run.groups)})"
                    if len(run.groups) > 1 else ""))

    def _warm(self, run: Run, g: Group, pending: list[str]) -> None:
        """Copy the passed canary's compile caches to the wave's hosts before they restart (a warm
        start).

        Each host's outcome (warm: the canary's cache verified in its key directory; cold: why not)
        is recorded as a phase of the host in the ledger and shown; nothing here fails a host."""
        recipe, p, hosts = g.recipe, g.p, g.hosts
        if not recipe.compile_cache or not pending or not p.waves:
            return
        inv = self.s.inv
        rec = run.ledger.get(run.id)
        canary = next((h for h in p.waves[0] if (r := rec.host(h)) is not None
                       and r.status == fleet_records.DONE and inv.unit_of(h) is None), None)
        if canary is None:
            return
        src_key = self.s.cache_key(hosts[canary], recipe, p.digest)
        # a unit's members serve another recipe (their own, across ranks): a single host's cache is
        # not theirs
        keys = {hosts[h]: k for h in pending
                if inv.unit_of(h) is None and (k := self.s.cache_key(hosts[h], recipe,
                                                                     p.digest)) is not None}
        if src_key is None or not keys:
            return
        run.emit("warm", f"copying {canary}'s compile cache to {len(keys)} host(s)")
        seeded = warmcache.share(recipe, p.pull_ref, hosts[canary], src_key, keys, self.s.ops)
        for sd in seeded.values():
            run.ledger.host_phase(run.id, sd.host, "warm-start" if sd.warm else "cold-start",
                                  detail=json.dumps({**sd.to_dict(), "source": canary}))
            run.emit("warm" if sd.warm else "cold", sd.detail, sd.host)
        run.ledger.note(run.id, "warm-start", warmcache.summary(list(seeded.values()))
                        + (f" ({recipe.name})" if len(run.groups) > 1 else ""))

    def _host_finished(self, run: Run, g: Group, r: HostRecord, h: Host) -> bool:
        """True when the host needs no step: skipped, already judged (rolled back or reported down:
        a resume never re-gates a version its gate failed), or done AND really serving the
        target."""
        if r.status in (fleet_records.SKIPPED, *BAD):
            return True
        if r.status != fleet_records.DONE:
            return False
        p = g.p
        fp = unit_plan.fingerprint_for(self.s.inv, h, g.recipe)
        cur = self.s.ops(h).inspect(container_name(h))
        if cur is not None and cur.running and cur.digest == p.digest and cur.fingerprint in (fp,
                                                                                              None):
            return True
        run.ledger.host_phase(run.id, h.name, "drifted",
                              detail="the ledger said done but the host does not "
                              "serve the target: redoing it", status=fleet_records.PENDING)
        return False
