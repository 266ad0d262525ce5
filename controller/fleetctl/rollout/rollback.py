"""``fleetctl rollback`` and ``fleetctl rollout abort``: every host back to its last known-good version."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleetctl import registry, ssh
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.rollout import gate, imagetree
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout import unit as unit_plan
from fleetctl.rollout.forward import Forward
from fleetctl.rollout.results import RolloutResult
from fleetctl.rollout.session import (
    RECOVERABLE,
    command_line,
    same_version,
)
from fleetctl.rollout.step import recoverable_why
from fleetctl.rollout.unit_step import UnitRollback
from fleetctl.rollout.webhook import Webhook
from fleetctl.serving import container_name
from fleetctl.state import hoststate
from fleetctl.state import ledger as fleet_ledger


class Rollback(Forward, UnitRollback):
    """Rollback and abort: hosts back to their last known-good (or a given tag), readiness + smoke."""

    def rollback(self, to: str | None = None, limit: str | None = None, max_unavailable: str | None = None,
                 recipe_name: str | None = None, webhook: str | None = None,
                 only_active: bool = False, min_available: str | None = None,
                 confirm: Callable[[Mapping[str, str | None]], None] | None = None) -> RolloutResult:
        """Every selected host back to the version it served before the last rollout or rollback (or to ``to``).

        Fast path: the kept ``.prev`` container is swapped in when it holds the
        wanted digest; otherwise the image is pulled and the recipe started
        from it. Gate: readiness and smoke, no full soak; a host whose target
        fails is put back on what it served. Usable while a rollout or rollback
        is paused or after its controller died: that one is then aborted.

        ``confirm`` is shown the hosts that will change (host -> target tag) once they are known,
        before anything is recorded or changed; it raises to refuse. It is not called when no host
        changes (every selected host skipped: nothing to ask about).
        """
        if to is not None:
            registry.check_tag(to, "--to")
        # Bad options and a bad --limit are refused before any lock or host; the floor against the
        # selection (the hosts rolled back are a subset of it: checked again on them below).
        wave_plan.check_options(None, max_unavailable, None, min_available,
                                total=len(self.inv.select(limit)), inventory_min_available=self.min_available())
        rid = fleet_ledger.new_id("rollback")
        hook = self._webhook(rid, webhook)
        self.ledger.acquire(rid)
        try:
            active = self.ledger.latest(statuses=fleet_ledger.ACTIVE)
            if only_active and active is None:
                raise FleetError("there is no paused or interrupted rollout or rollback to abort",
                                 fix="use `fleetctl rollback` to return to the previous version")
            parent = active or self.ledger.latest()
            recipe = self.recipe(recipe_name or (parent.recipe if parent else None))
            self._check_recipe(recipe)
            everyone = [h.name for h in self.inv.select(limit)]
            if limit or parent is None or (to and not only_active):
                selected = everyone
            else:
                # Without --limit, the hosts of the last (or the interrupted) rollout or rollback.
                mine = {h.host for h in parent.hosts}
                selected = [n for n in everyone if n in mine]
            # a unit goes back as one: every member, selected or not
            selected = [h.name for h in unit_plan.whole_units(self.inv, [self.inv.host(n) for n in selected])]
            unit_plan.refuse_other_images(self.inv, recipe, selected)  # one image digest per rollback
            skips: dict[str, str] = {n: f"not in the last {parent.kind} ({parent.id})" for n in everyone
                                     if n not in selected and parent is not None}
            self._hold(rid, "rollback", [self.inv.host(n) for n in selected])
            imagetree.sweep_relays([self.inv.host(n) for n in selected], self.ops)
            name = {n: container_name(self.inv.host(n)) for n in selected}
            looks = ssh.fan_out([self.inv.host(n) for n in selected], lambda h: self.ops(h).inspect(name[h.name]),
                                timeout=120)
            unreachable = [o.error.message() for o in looks.values() if o.error is not None]
            if unreachable:
                raise FleetError("could not look at every host before the rollback:\n  " + "\n  ".join(unreachable),
                                 fix="bring the host back, or leave it out with --limit '!NAME'")
            current = {n: looks[n].value for n in selected}
            targets: dict[str, tuple[str | None, str, str]] = {}
            # The container settings (fingerprint) each target ran with, when known: a recipe-only
            # change is undone by going back to the old settings, not only to the old image.
            fps: dict[str, str | None] = {}
            img = self._resolve(recipe.image, to, self.mirrors) if to else None
            tgt: tuple[str | None, str]
            for n in selected:
                cur = current[n]
                serving = (cur.digest, cur.fingerprint) if cur is not None and cur.running else None
                if img is not None:
                    # An explicit --to checks a host already there (readiness + smoke) rather than skip it.
                    tgt = (img.tag, img.digest)
                    fps[n] = remote.fingerprint(recipe)
                elif only_active:
                    hr = parent.host(n) if parent is not None else None
                    if hr is None or hr.status == fleet_ledger.SKIPPED:
                        skips[n] = f"not changed by {parent.id if parent else 'it'}"
                        continue
                    if not hr.before_digest:
                        skips[n] = "first deploy: nothing served before it (leave it, or `fleetctl rollout` a version)"
                        continue
                    tgt = (hr.before_tag, hr.before_digest)
                    fps[n] = ((hr.before or {}).get("labels") or {}).get(remote.LABEL_FINGERPRINT)
                    if serving is not None and same_version(hr.before_digest, fps[n], *serving):
                        skips[n] = f"already there (serving {hr.before_tag})"
                        continue
                else:
                    known = self.ledger.known_good(n)
                    if not known:
                        # A host this ledger never knew (another operator's checkout): its own record.
                        v = self._known_good([n]).get(n)
                        if v is None:
                            skips[n] = "first deploy: no known-good version recorded (pass --to TAG)"
                        elif serving is not None and serving[0] == v.digest:
                            skips[n] = f"already there (serving its last known-good {v.tag}, recorded on the host)"
                        else:
                            targets[n] = (v.tag, v.digest, registry.pull_ref(recipe.image, v.digest, self.mirrors))
                        continue
                    # The newest known-good that is not what the host serves now.
                    other = [k for k in known if serving is None or not same_version(k.digest, k.fingerprint, *serving)]
                    if not other and len(known) == 1 and known[0].source == "gate":
                        skips[n] = f"first deploy: {known[0].tag} is the only version known good here"
                        continue
                    if not other:
                        skips[n] = f"already there (serving its last known-good {known[0].tag})"
                        continue
                    tgt = (other[0].tag, other[0].digest)
                    fps[n] = other[0].fingerprint or None
                targets[n] = (tgt[0], tgt[1], registry.pull_ref(recipe.image, tgt[1], self.mirrors))
            unit_plan.unit_targets(self.inv, selected, targets, skips, fps)
            names = [n for n in selected if n in targets]
            if confirm is not None and names:
                confirm({n: targets[n][0] for n in names})
            for n in names:
                c = current[n]
                if c is not None and c.running and c.digest and not self.ledger.known_good(n):
                    self.ledger.add_known_good(n, tag=c.tag, digest=c.digest, fingerprint=c.fingerprint,
                                               settings=c.settings, source="found", rollout_id=None)
            # The same floor as a rollout's, over the hosts this rollback selected (skipped ones keep serving).
            cap = wave_plan.capacity(max(1, len(selected)), max_unavailable=max_unavailable,
                                     min_available=min_available, inventory_min_available=self.min_available())
            mu = cap.per_step
            rows: list[dict[str, Any]] = [
                {"host": n, "wave": 0, "step": i // mu, "target_tag": targets[n][0], "target_digest": targets[n][1]}
                for i, n in enumerate(names)]
            rows += [{"host": n, "wave": -1, "step": -1, "status": fleet_ledger.SKIPPED, "phase": "skipped",
                      "verdict": json.dumps({"summary": f"skipped: {why}"})} for n, why in skips.items()]
            self.ledger.create(rid, kind="rollback", recipe=recipe.name, requested=to,
                               tag=targets[names[0]][0] if to and names else to,
                               digest=targets[names[0]][1] if to and names else None, image=recipe.image,
                               options={"max_unavailable": mu, "capacity": cap.describe(), "to": to,
                                        "fingerprints": {n: fps[n] for n in names if fps.get(n)}},
                               command=command_line(), waves=[names],
                               hosts=rows, parent=parent.id if parent else None)
            if self.held is not None:
                now = time.time()
                self.held.seed({n: (hoststate.Version(targets[n][0], targets[n][1], rid, now), None) for n in names})
            if active is not None:
                self.ledger.set_status(active.id, fleet_ledger.ABORTED, f"undone by {rid}")
            hook.send("rollback", parent=parent.id if parent else None, hosts=names, to=to)
            return self._rollback_run(rid, recipe, hook)
        finally:
            hook.close()
            self._unhold()
            self.ledger.release(rid)

    def _rollback_run(self, rid: str, recipe: Recipe, hook: Webhook) -> RolloutResult:
        """The steps of a recorded rollback (new or resumed): hosts not yet done, ``max_unavailable`` at once."""
        t0 = time.monotonic()
        rec = self.ledger.get(rid)
        mu = int(rec.options.get("max_unavailable") or 1)
        todo = [h for h in rec.hosts if h.status not in (fleet_ledger.DONE, fleet_ledger.ROLLED_BACK, fleet_ledger.HOST_FAILED, fleet_ledger.SKIPPED)]
        fps: Mapping[str, str] = rec.options.get("fingerprints") or {}
        targets = {h.host: (h.target_tag, h.target_digest or "",
                            registry.pull_ref(recipe.image, h.target_digest or "", self.mirrors),
                            fps.get(h.host)) for h in todo}
        for step in unit_plan.split_steps(self.inv, [h.host for h in todo], mu):
            try:
                # a unit as one slot, dispatched as its head (its members' targets are one version)
                outs = self._parallel(unit_plan.slots(self.inv, [self.inv.host(n) for n in step]),
                                      lambda h: self._rollback_slot(rid, recipe, h, targets))
            except KeyboardInterrupt:
                self.ledger.set_status(rid, fleet_ledger.PAUSED, "interrupted by Ctrl-C (hosts being changed were restored)")
                raise
            for n, err in outs.items():
                if err is not None:
                    self.ledger.host_phase(rid, n, "failed", err.message(), status=fleet_ledger.HOST_FAILED,
                                           error=err.message())
        rec = self.ledger.get(rid)
        door_problems = self._door_reconcile(rid, recipe, [h.host for h in rec.hosts])
        bad = [h for h in rec.hosts if h.status not in (fleet_ledger.DONE, fleet_ledger.SKIPPED)]
        status = fleet_ledger.FAILED if bad or door_problems else fleet_ledger.COMPLETED
        error = "; ".join([f"{h.host}: {h.error}" for h in bad] + door_problems) or None
        self.ledger.set_status(rid, status, error)
        hook.send("completion" if not bad else "failure", error=error)
        return self._result(rid, seconds=time.monotonic() - t0)

    def _known_good(self, names: Sequence[str]) -> dict[str, hoststate.Version]:
        """The last known-good recorded on each of ``names`` (hosts without one are left out)."""
        if not names:
            return {}
        states = hoststate.read_all(self.host_store, [self.inv.host(n) for n in names])
        return {n: s.last_known_good for n, s in states.items() if s.last_known_good is not None}

    def _rollback_host(self, rid: str, recipe: Recipe, h: Host, tag: str | None, digest: str, ref: str,
                       fingerprint: str | None = None) -> None:
        """One host to ``digest`` (with the settings ``fingerprint`` when known), checked by readiness and
        smoke; a target that fails is itself undone."""
        name = container_name(h)
        ops = self.ops(h)
        show = {"wave": 1, "tag": tag or "?"}
        t: dict[str, float] = {}
        t0 = time.monotonic()
        rec = self.ledger.host_record(rid, h.name)
        cur = ops.inspect(name)
        prev = ops.inspect(name + remote.PREV_SUFFIX)
        if rec is not None and rec.phase == "undoing":
            # Killed while putting back what served before: finish that.
            self._undo_rollback(rid, recipe, h, ops, rec.error or "the target failed", show)
            return
        def wanted(s: remote.Serving | None) -> bool:
            return s is not None and same_version(digest, fingerprint, s.digest, s.fingerprint)

        if not wanted(cur) and not wanted(prev) and fingerprint and fingerprint != remote.fingerprint(recipe):
            # Only a kept container has the old settings; starting the image with today's recipe would
            # not be the version that was good. Nothing has been touched: the host keeps serving.
            raise FleetError(
                f"its known-good {tag} ran with other container settings (fingerprint {fingerprint[:12]}) than "
                f"recipe {recipe.name} renders now ({remote.fingerprint(recipe)[:12]}), and that container is gone",
                host=h.name, fix=f"restore the recipe as it was, then `fleetctl rollout --tag {tag} --limit {h.name}`"
                                 f"; or `fleetctl rollback --to {tag} --limit {h.name}` for {tag} with today's recipe")
        if cur is not None and rec is not None and rec.before_digest is None and not wanted(cur):
            self.ledger.host_phase(rid, h.name, "inspected", status=fleet_ledger.IN_PROGRESS, before_tag=cur.tag,
                                   before_digest=cur.digest, before=cur.settings)
        try:
            self._check_cancel()
            if cur is not None and cur.running and wanted(cur):
                self._phase(rid, h, "loading", f"serving {tag}: checking it", {**show, "health": "loading"},
                            status=fleet_ledger.IN_PROGRESS)
            elif prev is not None and wanted(prev):
                self._door_out(rid, h, recipe, show, t, reason="rollback")
                self._phase(rid, h, "restoring", f"starting the kept {name}{remote.PREV_SUFFIX} ({tag})", show,
                            status=fleet_ledger.IN_PROGRESS)
                ops.swap(name)
            else:
                self._phase(rid, h, "pull", ref.rsplit("/", 1)[-1][:40], show, status=fleet_ledger.IN_PROGRESS)
                t["pull"] = self._pull(ops, recipe.image, ref)
                self._door_out(rid, h, recipe, show, t, reason="rollback")
                self._phase(rid, h, "stopping", None, show)
                # The version being left is abandoned: killed, not drained (it is kept as .prev).
                ops.retire(name, rid, digest, grace=0)
                self._phase(rid, h, "starting", None, show)
                ops.start(recipe, ref, tag=tag or digest[:19], digest=digest, rollout_id=rid,
                          secrets=self._container_secrets(recipe), cache_key=self.cache_key(h, recipe, digest))
            cfg = gate.config(recipe, None, h)
            ready = self.gates.wait(h, recipe, tag or "", cfg, None, self._forward(h, show, "loading"))
            t["ready"] = time.monotonic() - t0
            if not ready.ready:
                raise FleetError(f"readiness {ready.outcome.value}: {ready.message}", host=h.name)
            self._check_cancel()
            self._phase(rid, h, "smoke", None, {**show, "health": "ready"})
            v = self.gates.smoke(h, recipe, tag or "", cfg, self._artifacts(rid, h))
            t["total"] = time.monotonic() - t0
            if v.outcome.value != "pass":
                raise FleetError(f"smoke {v.outcome.value}: {gate.failed_checks_text(v)}", host=h.name)
        except RECOVERABLE as e:
            self._undo_rollback(rid, recipe, h, ops, f"{tag} failed: {recoverable_why(e, full=False)}", show)
            if isinstance(e, KeyboardInterrupt):
                raise
            return
        door_error = self._door_in_or_record(rid, h, t)
        self._phase(rid, h, "done", f"serving {tag}" + (f"; {door_error}" if door_error else ""),
                    {**show, "health": "ok"}, status=fleet_ledger.DONE, after_tag=tag,
                    after_digest=digest, verdict=gate.summarise(v, t), artifacts=v.artifacts_dir)

    def _undo_rollback(self, rid: str, recipe: Recipe, h: Host, ops: remote.HostOps, why: str,
                       show: Mapping[str, Any]) -> None:
        """Put back what ``h`` served before this rollback (kept as ``.prev``) after its target failed."""
        name = container_name(h)
        self._phase(rid, h, "undoing", why, {**show, "health": "failed"}, error=why)
        rec = self.ledger.host_record(rid, h.name)
        before = rec.before_digest if rec is not None else None
        fix = self._fix_for(rid, [h.name])
        before_fp = (((rec.before or {}).get("labels") or {}).get(remote.LABEL_FINGERPRINT)
                     if rec is not None else None)
        try:
            cur = ops.inspect(name)
            if before is None:
                raise FleetError("nothing served before this rollback", host=h.name)
            if not (cur is not None and cur.running and same_version(before, before_fp, cur.digest, cur.fingerprint)):
                prev = ops.inspect(name + remote.PREV_SUFFIX)
                if prev is None or not same_version(before, before_fp, prev.digest, prev.fingerprint):
                    raise FleetError("the previous container is gone", host=h.name)
                ops.restore(name)
            self._check_restored(rid, recipe, h, rec.before_tag if rec else None, show, "undoing", smoke=False)
        except Exception as e:
            cause = e.cause if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            self._phase(rid, h, "failed", f"{why}; undo failed: {cause}", {**show, "health": "down"},
                        status=fleet_ledger.HOST_FAILED, error=f"{why}; undo failed: {cause}; fix: {fix}")
            return
        tag_b = rec.before_tag if rec is not None else None
        door_error = self._door_in_or_record(rid, h)
        self._phase(rid, h, "rolled-back", f"{why}; serving {tag_b} again" + (f"; {door_error}" if door_error else ""),
                    {**show, "health": "ok", "tag": tag_b},
                    status=fleet_ledger.ROLLED_BACK, after_tag=tag_b, after_digest=before, error=why)

    def abort(self, webhook: str | None = None, force: bool = False,
              confirm: Callable[[Mapping[str, str | None]], None] | None = None) -> RolloutResult:
        """Undo the paused or interrupted rollout: every host it touched back to its previous version."""
        if force:
            self.ledger.release(None)
            self.take_over = True
        return self.rollback(webhook=webhook, only_active=True, confirm=confirm)
