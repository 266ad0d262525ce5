"""``fleetctl rollout --resume``: a paused or interrupted run continued from each host's real state."""

from __future__ import annotations

import dataclasses
import time

from fleetctl.errors import FleetError
from fleetctl.rollout import deploy
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.results import Options, RolloutResult
from fleetctl.rollout.rollback import Rollback
from fleetctl.rollout.session import (
    command_line,
)
from fleetctl.state import ledger as fleet_ledger


class Resume(Rollback):
    """Resume: continue a paused or interrupted rollout or rollback from each host's real state."""

    def resume(self, opts: Options) -> RolloutResult:
        """Continue the paused or interrupted rollout, from each host's real state."""
        t_start = time.monotonic()
        self._webhook("resume", opts.webhook, check_only=True)
        rec = self.ledger.latest(statuses=fleet_ledger.ACTIVE)
        if rec is None:
            raise FleetError("there is no paused or interrupted rollout to resume",
                             fix="see `fleetctl history`; start a new one with `fleetctl rollout --tag T`")
        stale = self.ledger.acquire(rec.id)
        try:
            if stale is not None:
                self._emit("resume", f"took over the lock of dead controller pid {stale.pid} ({stale.rollout_id})")
            self.ledger.note(rec.id, "resumed", command_line())
            recipe = self.recipe(rec.recipe)
            self._hold(rec.id, rec.kind, [self.inv.host(h.host) for h in rec.hosts])
            self._check_recipe(recipe)
            if rec.kind == "rollback":
                self.ledger.set_status(rec.id, fleet_ledger.RUNNING)
                hook = self._webhook(rec.id, opts.webhook)
                try:
                    return self._rollback_run(rec.id, recipe, hook)
                finally:
                    hook.close()
            o = rec.options
            soak = opts.soak if opts.soak is not None else o.get("soak")
            bake = opts.bake if opts.bake is not None else o.get("bake")
            ropts = dataclasses.replace(opts, tag=rec.tag, recipe=rec.recipe, soak=soak, bake=float(bake or 0.0),
                                        on_inconclusive=opts.on_inconclusive or o.get("on_inconclusive", "pause"),
                                        ready_timeout=opts.ready_timeout or o.get("ready_timeout"))
            hosts = {h.host: self.inv.host(h.host) for h in rec.hosts}
            for hh in hosts.values():
                deploy.deploy_via(hh)  # refused before the record runs again, not in the middle of a wave
            p = wave_plan.Plan(recipe.name, rec.image or recipe.image, rec.requested or "", rec.tag or "", rec.digest or "",
                       str(o["pull_ref"]), tuple(w.hosts for w in rec.waves), int(o["max_unavailable"]),
                       int(o["failure_budget"]),
                       tuple(wave_plan.HostPlan(h.host, h.wave, h.step, h.before_tag, h.before_digest,
                                        "skip" if h.status == fleet_ledger.SKIPPED else "deploy") for h in rec.hosts))
            self.ledger.set_status(rec.id, fleet_ledger.RUNNING)
            return self._run(rec.id, recipe, ropts, p, hosts, resume=True, t0=t_start)
        finally:
            self._unhold()
            self.ledger.release(rec.id)
