"""The forward path of ``fleetctl rollout``: the plan recorded, then the canary and the waves."""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Mapping

from fleetctl import warmcache
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout import unit as unit_plan
from fleetctl.rollout.bake import BakeSteps
from fleetctl.rollout.results import HostOutcome, Options, RolloutResult
from fleetctl.rollout.session import (
    StopRollout,
    command_line,
)
from fleetctl.rollout.webhook import Webhook
from fleetctl.serving import container_name
from fleetctl.state import hoststate
from fleetctl.state import ledger as fleet_ledger


class Forward(BakeSteps):
    """The forward path: record the plan, then the canary and the waves, each step gated (each wave baked)."""

    def rollout(self, opts: Options) -> RolloutResult:
        """Plan, then (unless dry-run) prefetch and go wave by wave through the gates."""
        rid = fleet_ledger.new_id("rollout")
        t_start = time.monotonic()
        self._webhook(rid, opts.webhook, check_only=True)
        # Bad options and an unknown tag are refused before the ledger's lock or any host's is tried.
        recipe, _ = self.check(opts)
        bake = self._bake_seconds(opts)
        self._bake_limits()
        self._bake_prometheus()
        self.resolve(recipe, opts.tag or "")
        if opts.dry_run:
            p, recipe, _facts, _hosts = self.plan(opts)
            return RolloutResult(None, "rollout", "planned", recipe.name, p.tag, p.digest, p.image,
                                 tuple(HostOutcome(h.host, h.wave, h.action, "planned", h.current_tag,
                                                   h.current_digest, None, None) for h in p.hosts), plan=p)
        self.ledger.acquire(rid)
        try:
            self._check_idle()
            self._hold(rid, "rollout", unit_plan.whole_units(self.inv, self.inv.select(opts.limit)))
            p, recipe, facts, hosts = self.plan(opts)
            options = {"waves": opts.waves or wave_plan.DEFAULT_WAVES, "max_unavailable": p.max_unavailable,
                       "capacity": p.capacity.describe() if p.capacity else None,
                       "failure_budget": p.failure_budget, "soak": opts.soak,
                       "on_inconclusive": opts.on_inconclusive, "ready_timeout": opts.ready_timeout,
                       "pull_ref": p.pull_ref, "bake": bake}
            rows = []
            for hp in p.hosts:
                f = facts[hp.host]
                before = f.serving if f.serving and f.serving.running else None
                rows.append({"host": hp.host, "wave": hp.wave, "step": hp.step,
                             "status": fleet_ledger.SKIPPED if hp.action == "skip" else fleet_ledger.PENDING,
                             "before_tag": before.tag if before else None,
                             "before_digest": before.digest if before else None,
                             "before": before.settings if before else None,
                             "target_tag": p.tag, "target_digest": p.digest})
            for hp in p.hosts:
                b = facts[hp.host].serving
                if b is not None and b.running and b.digest and hp.action == "deploy":
                    # What a host serves when a rollout moves it away is known good to go back to
                    # (before fleetctl first touched it: ``found``).
                    first = not self.ledger.known_good(hp.host)
                    self.ledger.add_known_good(hp.host, tag=b.tag, digest=b.digest, fingerprint=b.fingerprint,
                                               settings=b.settings, source="found" if first else "served",
                                               rollout_id=None)
            self.ledger.create(rid, kind="rollout", recipe=recipe.name, requested=p.requested, tag=p.tag,
                               digest=p.digest, image=p.image, options=options, command=command_line(),
                               waves=p.waves, hosts=rows)
            if self.held is not None:
                now = time.time()
                self.held.seed({hp.host: (hoststate.Version(p.tag, p.digest, rid, now) if hp.action == "deploy"
                                          else None,
                                          hoststate.Version(hp.current_tag, hp.current_digest, None, now)
                                          if hp.current_digest else None) for hp in p.hosts})
            return self._run(rid, recipe, dataclasses.replace(opts, bake=bake), p, {h.name: h for h in hosts},
                             resume=False, t0=t_start)
        finally:
            self._unhold()
            self.ledger.release(rid)


    def _run(self, rid: str, recipe: Recipe, opts: Options, p: wave_plan.Plan, hosts: Mapping[str, Host],
             resume: bool, t0: float) -> RolloutResult:
        """The waves of a recorded rollout; ``t0`` is when the command started (planning included)."""
        hook = self._webhook(rid, opts.webhook)
        try:
            return self._waves(rid, recipe, opts, p, hosts, resume, t0, hook)
        finally:
            hook.close()

    def _waves(self, rid: str, recipe: Recipe, opts: Options, p: wave_plan.Plan, hosts: Mapping[str, Host],
               resume: bool, t0: float, hook: Webhook) -> RolloutResult:
        hook.send("start" if not resume else "wave", tag=p.tag, digest=p.digest, recipe=recipe.name,
                  hosts=[h.host for h in p.hosts], waves=[list(w) for w in p.waves], resumed=resume)
        for hp in p.hosts:
            self._emit("planned" if hp.action == "deploy" else "skip", "", hp.host, wave=hp.wave + 1 if hp.wave >= 0 else "-",
                       tag=hp.current_tag or "-")
        todo = [hosts[h.host] for h in p.hosts if h.action == "deploy"]
        t_pre = time.monotonic()
        try:
            pulls = self._prefetch(rid, todo, p.pull_ref, p.image)
        except StopRollout as e:
            self.ledger.set_status(rid, e.status, e.error)
            hook.send("failure", error=e.error)
            return self._result(rid, p=p, seconds=time.monotonic() - t0)
        prefetch_s = time.monotonic() - t_pre
        wave_secs: list[float] = []
        status, error = fleet_ledger.COMPLETED, None
        bake = opts.bake or 0.0
        pool = [self.inv.host(hp.host) for hp in p.hosts]
        if resume:
            # Hosts a killed controller left out after their step count against the floor: back in first.
            self._door_reconcile(rid, recipe, [hp.host for hp in p.hosts])
        try:
            for w, members in enumerate(p.waves):
                tw = time.monotonic()
                rec = self.ledger.get(rid)
                pending = [h for h in members
                           if (r := rec.host(h)) is not None
                           and not self._host_finished(rid, r, p, hosts[h], self._fingerprint_for(hosts[h], recipe))]
                if not pending:
                    if bake and self._bake_due(rid, members):
                        # A killed controller (or a paused bake) left this wave's bake unfinished: bake it again.
                        self._bake(rid, recipe, opts, p, w, members, hosts, hook, bake)
                        self.ledger.set_wave(rid, w, fleet_ledger.DONE)
                    continue
                self.ledger.set_wave(rid, w, fleet_ledger.RUNNING)
                if w > 0:
                    self._warm(rid, recipe, p, hosts, [h for h in pending if self.inv.unit_of(h) is None])
                hook.send("wave", wave=w + 1, of=len(p.waves), hosts=list(members))
                # The fleet-wide line under the live table: which wave runs (a fleet of hundreds scrolls).
                self._emit("wave", f"{w + 1} of {len(p.waves)}: {len(pending)} host(s), "
                                   f"{p.max_unavailable} at a time")
                for step in unit_plan.split_steps(self.inv, pending, p.max_unavailable):
                    # Never below the plan's floor: hosts already out (failed, drained by anyone) are waited for.
                    self._door_wait_capacity(rid, pool, step, p.floor())
                    batch = self._batch(rid, recipe, [hosts[h] for h in step if self.inv.unit_of(h) is None])
                    try:
                        # a unit is dispatched once, as its head, which steps every member
                        outs = self._parallel(unit_plan.slots(self.inv, [hosts[h] for h in step]),
                                              functools.partial(self._slot_step, rid, recipe, opts, p, wave=w,
                                                                batch=batch))
                    except KeyboardInterrupt:
                        self.ledger.set_status(rid, fleet_ledger.PAUSED, "interrupted by Ctrl-C (hosts being changed were restored)")
                        hook.send("pause", error="interrupted by Ctrl-C")
                        raise
                    for name, err in outs.items():
                        if err is not None:
                            # An exception that escaped the step (its restore failed too): the host is down.
                            self.ledger.host_phase(rid, name, "error", detail=err.message(),
                                                   status=fleet_ledger.HOST_FAILED, error=err.message())
                    rec = self.ledger.get(rid)
                    paused = [h for h in step if (r := rec.host(h)) is not None and r.status == fleet_ledger.HOST_PAUSED]
                    bad = [h for h in step if (r := rec.host(h)) is not None and r.status in (fleet_ledger.ROLLED_BACK, fleet_ledger.HOST_FAILED)]
                    # Counted from the ledger, so that the budget is carried across resumes.
                    failures = unit_plan.count_failed(self.inv, rec.hosts)  # a unit counts once
                    if bad:
                        why = "; ".join(f"{h}: {rec.host(h).error}" for h in bad if rec.host(h) is not None)  # type: ignore[union-attr]
                        hook.send("failure", hosts=bad, error=why)
                        if any(rec.host(h).status == fleet_ledger.ROLLED_BACK for h in bad):  # type: ignore[union-attr]
                            hook.send("rollback", hosts=[h for h in bad if rec.host(h).status == fleet_ledger.ROLLED_BACK])  # type: ignore[union-attr]
                        if w == 0 or failures > p.failure_budget:
                            self.ledger.set_wave(rid, w, fleet_ledger.FAILED)
                            raise StopRollout(fleet_ledger.FAILED, why)
                    if paused:
                        self.ledger.set_wave(rid, w, fleet_ledger.PAUSED)
                        why = "; ".join(f"{h}: {rec.host(h).error}" for h in paused)  # type: ignore[union-attr]
                        hook.send("pause", hosts=paused, error=why)
                        out = all(rec.host(h).phase == "out-of-rotation" for h in paused)  # type: ignore[union-attr]
                        raise StopRollout(fleet_ledger.PAUSED, why if out else f"inconclusive gate: {why}")
                if bake:
                    self._bake(rid, recipe, opts, p, w, members, hosts, hook, bake)
                self.ledger.set_wave(rid, w, fleet_ledger.DONE)
                wave_secs.append(time.monotonic() - tw)
            failed = [r for r in self.ledger.get(rid).hosts if r.status in (fleet_ledger.ROLLED_BACK, fleet_ledger.HOST_FAILED)]
            if failed:
                status = fleet_ledger.COMPLETED_WITH_FAILURES
                error = "; ".join(f"{r.host}: {r.error}" for r in failed)
        except StopRollout as e:
            status, error = e.status, e.error
        # Hosts a killed controller left out of rotation and this run left serving go back in.
        door_problems = self._door_reconcile(rid, recipe, [h.host for h in p.hosts])
        if door_problems:
            error = "; ".join([error or "", *door_problems]).lstrip("; ")
            status = fleet_ledger.COMPLETED_WITH_FAILURES if status == fleet_ledger.COMPLETED else status
        self.ledger.set_status(rid, status, error)
        if status == fleet_ledger.COMPLETED:
            hook.send("completion", tag=p.tag, digest=p.digest)
        elif status == fleet_ledger.COMPLETED_WITH_FAILURES:
            hook.send("failure", error=error)
        self._emit(status, error or f"{p.tag} on {len(todo)} host(s)")
        return self._result(rid, p=p, seconds=time.monotonic() - t0, prefetch=prefetch_s, waves=tuple(wave_secs),
                            pulls=pulls)

    def _warm(self, rid: str, recipe: Recipe, p: wave_plan.Plan, hosts: Mapping[str, Host],
              pending: list[str]) -> None:
        """Copy the passed canary's compile caches to the wave's hosts before they restart (a warm start).

        Each host's outcome (warm: the canary's cache verified in its key directory; cold: why not) is
        recorded as a phase of the host in the ledger and shown; nothing here fails a host."""
        if not recipe.compile_cache or not pending or not p.waves:
            return
        rec = self.ledger.get(rid)
        canary = next((h for h in p.waves[0] if (r := rec.host(h)) is not None and r.status == fleet_ledger.DONE
                       and self.inv.unit_of(h) is None), None)
        if canary is None:
            return
        src_key = self.cache_key(hosts[canary], recipe, p.digest)
        # a unit's members serve another recipe (their own, across ranks): a single host's cache is not theirs
        keys = {hosts[h]: k for h in pending
                if self.inv.unit_of(h) is None and (k := self.cache_key(hosts[h], recipe, p.digest)) is not None}
        if src_key is None or not keys:
            return
        self._emit("warm", f"copying {canary}'s compile cache to {len(keys)} host(s)")
        seeded = warmcache.share(recipe, p.pull_ref, hosts[canary], src_key, keys, self.ops)
        for s in seeded.values():
            self.ledger.host_phase(rid, s.host, "warm-start" if s.warm else "cold-start",
                                   detail=json.dumps({**s.to_dict(), "source": canary}))
            self._emit("warm" if s.warm else "cold", s.detail, s.host)
        self.ledger.note(rid, "warm-start", warmcache.summary(list(seeded.values())))

    def _host_finished(self, rid: str, r: fleet_ledger.HostRecord, p: wave_plan.Plan, h: Host, fp: str) -> bool:
        """True when the host needs no step: skipped, already judged (rolled back or reported down:
        a resume never re-gates a version its gate failed), or done AND really serving the target."""
        if r.status in (fleet_ledger.SKIPPED, fleet_ledger.ROLLED_BACK, fleet_ledger.HOST_FAILED):
            return True
        if r.status != fleet_ledger.DONE:
            return False
        cur = self.ops(h).inspect(container_name(h))
        if cur is not None and cur.running and cur.digest == p.digest and cur.fingerprint in (fp, None):
            return True
        self.ledger.host_phase(rid, h.name, "drifted", detail="the ledger said done but the host does not serve "
                               "the target: redoing it", status=fleet_ledger.PENDING)
        return False
