"""``fleetctl rollout --resume``: a paused or interrupted run continued from each host's real
state."""

from __future__ import annotations

import dataclasses
import time

from fleetctl.errors import FleetError
from fleetctl.rollout import deploy, groups
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.forward import Forward
from fleetctl.rollout.results import Options, RolloutResult
from fleetctl.rollout.rollback import Rollback
from fleetctl.rollout.run import Group, Run
from fleetctl.rollout.session import Session, command_line
from fleetctl.state import records as fleet_records


class Resume:
    """Resume: the ledger's active record made a run again, handed to the forward path or the
    rollback."""

    def __init__(self, session: Session, forward: Forward, rollback: Rollback) -> None:
        self.s = session
        self.forward = forward
        self.rollback = rollback

    def resume(self, opts: Options) -> RolloutResult:
        """Continue the paused or interrupted rollout, from each host's real state."""
        s = self.s
        t_start = time.monotonic()
        s.webhook("resume", opts.webhook, check_only=True)
        rec = s.ledger.latest(statuses=fleet_records.ACTIVE)
        if rec is None:
            raise FleetError("there is no paused or interrupted rollout to resume",
                             fix="see `fleetctl history`; start a new one with `fleetctl rollout "
                                 "--tag T`")
        stale = s.ledger.acquire(rec.id)
        run = Run(s, rec.id, rec.kind)
        try:
            if stale is not None:
                s.emit("resume", f"took over the lock of dead controller pid {stale.pid} "
                                 f"({stale.rollout_id})")
            s.ledger.note(rec.id, "resumed", command_line())
            run.held = s.hold(rec.id, rec.kind, [s.inv.host(h.host) for h in rec.hosts])
            if rec.kind == "rollback":
                run.groups.extend(self.rollback.groups(rec))
                # the run it undoes, left active when the rollback was killed before marking it
                for undone in self.rollback.active_chain(rec.parent):
                    s.ledger.set_status(undone, fleet_records.ABORTED, f"undone by {rec.id}")
                s.ledger.set_status(rec.id, fleet_records.RUNNING)
                run.hook = s.webhook(rec.id, opts.webhook)
                try:
                    return self.rollback.run(run)
                finally:
                    run.hook.close()
            run.opts = self._options(rec, opts)
            for hr in rec.hosts:
                # refused before the record runs again, not in the middle of a wave
                deploy.deploy_via(s.inv.host(hr.host))
            for p in self._plans(rec):
                recipe = s.recipe(p.recipe)
                s.check_recipe(recipe)
                run.groups.append(Group(recipe, {hp.host: s.inv.host(hp.host) for hp in p.hosts},
                                        p))
            s.ledger.set_status(rec.id, fleet_records.RUNNING)
            return self.forward.run(run, resume=True, t0=t_start)
        finally:
            run.release()
            s.ledger.release(rec.id)

    @staticmethod
    def _options(rec: fleet_records.RolloutRecord, opts: Options) -> Options:
        """The recorded rollout's options, overridden by those given to ``--resume``."""
        o = rec.options
        soak = opts.soak if opts.soak is not None else o.get("soak")
        bake = opts.bake if opts.bake is not None else o.get("bake")
        return dataclasses.replace(opts, tag=rec.tag, recipe=rec.recipe, soak=soak,
                                   bake=float(bake or 0.0),
                                   on_inconclusive=opts.on_inconclusive or o.get("on_inconclusive",
                                                                                 "pause"),
                                   ready_timeout=opts.ready_timeout or o.get("ready_timeout"))

    def _plans(self, rec: fleet_records.RolloutRecord) -> list[wave_plan.Plan]:
        """The recorded rollout's plans, one per recipe group, as the ledger has them (no host
        asked, nothing resolved); a record of an older fleetctl has one group."""
        left = set(rec.options.get("left") or ())  # their recipe's image lacked the tag
        rows = tuple(wave_plan.HostPlan(h.host, h.wave, h.step, h.before_tag, h.before_digest,
                                        "skip" if h.status == fleet_records.SKIPPED else "deploy")
                     for h in rec.hosts if h.host not in left)
        recorded = rec.options.get("groups") or []
        if len(recorded) > 1:
            # each host in its recipe's group (a host left out, its image lacking the tag, in none)
            return groups.recorded_plans(rec.options, [w.hosts for w in rec.waves], rows,
                                         {h.host: h.recipe for h in rec.hosts})
        if recorded:
            # one group: every host (a unit's member in a run of --recipe serves its unit's)
            return groups.recorded_plans(rec.options, [w.hosts for w in rec.waves], rows,
                                         {h.host: recorded[0]["recipe"] for h in rec.hosts})
        recipe = self.s.recipe(rec.recipe)
        return [self._plan(rec, recipe.name, recipe.image)]

    @staticmethod
    def _plan(rec: fleet_records.RolloutRecord, recipe: str, image: str) -> wave_plan.Plan:
        """A record of one group's plan, as the ledger has it (no host asked, nothing resolved)."""
        o = rec.options
        return wave_plan.Plan(
            recipe, rec.image or image, rec.requested or "", rec.tag or "", rec.digest or "",
            str(o["pull_ref"]), tuple(w.hosts for w in rec.waves), int(o["max_unavailable"]),
            int(o["failure_budget"]),
            tuple(wave_plan.HostPlan(h.host, h.wave, h.step, h.before_tag, h.before_digest,
                                     "skip" if h.status == fleet_records.SKIPPED else "deploy")
                  for h in rec.hosts))
