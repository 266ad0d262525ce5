"""``fleetctl rollback`` and ``fleetctl rollout abort``: every host back to its last known-good
version.

:class:`Rollback` chooses each host's target (:func:`targets`), records the rollback and steps its
slots: a single host here (:meth:`Rollback.host`), a unit through
:class:`~.rollback_unit.UnitRollback`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetctl import registry, ssh
from fleetctl.container import LABEL_FINGERPRINT, Container
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe, configured_recipe
from fleetctl.rollout import gate, imagetree
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout import unit as unit_plan
from fleetctl.rollout.door import DoorSteps
from fleetctl.rollout.outcome import check_restored, fix_for, recoverable_why
from fleetctl.rollout.prefetch import Prefetch
from fleetctl.rollout.results import RollbackOptions, RolloutResult
from fleetctl.rollout.rollback_unit import Target, UnitRollback
from fleetctl.rollout.run import Group, Row, Run, Step
from fleetctl.rollout.session import RECOVERABLE, Session, command_line, same_version
from fleetctl.serving import container_name
from fleetctl.soak import Verdict
from fleetctl.state import hoststate
from fleetctl.state import records as fleet_records

#: Shown the hosts that will change (host -> target tag); raises to refuse.
Confirm = Callable[[Mapping[str, str | None]], None]
#: A host's rollback target: tag, digest, pull reference.
Chosen = tuple[str | None, str, str]
#: How far up its parents an abort looks for what a host served before (each one a rollback that
#: was itself interrupted before it looked at the host).
MAX_PARENTS = 8


@dataclass
class Choice:
    """What a rollback does to each selected host: a target, or a reason to skip it; and the
    container settings (fingerprint) each target ran with, when known."""

    targets: dict[str, Chosen] = field(default_factory=dict)
    skips: dict[str, str] = field(default_factory=dict)
    fps: dict[str, str | None] = field(default_factory=dict)
    #: The recipe each host goes back to.
    recipes: dict[str, str] = field(default_factory=dict)


class Rollback:
    """Rollback and abort: hosts back to their last known-good (or a given tag), readiness +
    smoke."""

    def __init__(self, session: Session, door: DoorSteps, prefetch: Prefetch,
                 units: UnitRollback) -> None:
        self.s = session
        self.door = door
        self.prefetch = prefetch
        self.units = units
        #: (image, tag) -> what the registry answered for ``--to`` (asked once per image).
        self._resolved: dict[tuple[str, str], registry.ResolvedImage] = {}

    def rollback(self, opts: RollbackOptions | None = None,
                 confirm: Confirm | None = None) -> RolloutResult:
        """Every selected host back to the version it served before the last rollout or rollback (or
        to ``to``).

        Fast path: the kept ``.prev`` container is swapped in when it holds the
        wanted digest; otherwise the image is pulled and the recipe started
        from it. Gate: readiness and smoke, no full soak; a host whose target
        fails is put back on what it served. Usable while a rollout or rollback
        is paused or after its controller died: that one is then aborted.

        ``confirm`` is shown the hosts that will change (host -> target tag) once they are known,
        before anything is recorded or changed; it raises to refuse. It is not called when no host
        changes (every selected host skipped: nothing to ask about).
        """
        s = self.s
        opts = opts or RollbackOptions()
        to, limit, only_active = opts.to, opts.limit, opts.only_active
        recipe_name = opts.recipe_name
        if to is not None:
            registry.check_tag(to, "--to")
        # Bad options and a bad --limit are refused before any lock or host; the floor against the
        # selection (the hosts rolled back are a subset of it: checked again on them below).
        wave_plan.check_options(None, opts.max_unavailable, None, opts.min_available,
                                total=len(s.inv.select(limit)),
                                inventory_min_available=s.min_available())
        rid = fleet_records.new_id("rollback")
        run = Run(s, rid, "rollback", hook=s.webhook(rid, opts.webhook))
        s.ledger.acquire(rid)
        try:
            active = s.ledger.latest(statuses=fleet_records.ACTIVE)
            if only_active and active is None:
                raise FleetError("there is no paused or interrupted rollout or rollback to abort",
                                 fix="use `fleetctl rollback` to return to the previous version")
            parent = active or s.ledger.latest()
            everyone = [h.name for h in s.inv.select(limit)]
            if limit or parent is None or (to and not only_active):
                selected = everyone
            else:
                # Without --limit, the hosts of the last (or the interrupted) rollout or rollback.
                mine = {h.host for h in parent.hosts}
                selected = [n for n in everyone if n in mine]
            # a unit goes back as one: every member, selected or not
            selected = [h.name for h in unit_plan.whole_units(s.inv,
                                                              [s.inv.host(n) for n in selected])]
            skips = {n: f"not in the last {parent.kind} ({parent.id})" for n in everyone
                     if n not in selected and parent is not None}
            run.held = s.hold(rid, "rollback", [s.inv.host(n) for n in selected])
            imagetree.sweep_relays([s.inv.host(n) for n in selected], s.ops)
            current = self._look(selected)
            choice = Choice(skips=skips)
            self._choose(choice, recipe_name, selected, current, to,
                         parent if only_active else None)
            unit_plan.unit_targets(s.inv, selected, choice.targets, choice.skips, choice.fps)
            run.groups.extend(self._groups(choice.recipes))
            names = [n for n in selected if n in choice.targets]
            if confirm is not None and names:
                confirm({n: choice.targets[n][0] for n in names})
            self._record(run, choice, names, current, opts, parent)
            if only_active and parent is not None:  # `history` names the record an abort
                s.ledger.note(rid, "abort", f"undoes {parent.id}")
            for undone in self.active_chain(active.id if active else None):
                s.ledger.set_status(undone, fleet_records.ABORTED, f"undone by {rid}")
            run.send("rollback", parent=parent.id if parent else None, hosts=names, to=to)
            return self.run(run)
        finally:
            if run.hook is not None:
                run.hook.close()
            run.release()
            s.ledger.release(rid)

    def active_chain(self, rid: str | None) -> list[str]:
        """Record ``rid`` and its parents, while they are active: a rollback killed before it
        marked the run it undoes aborted leaves both active, and whatever finishes it undoes
        both."""
        out: list[str] = []
        while rid is not None and len(out) < MAX_PARENTS:
            try:
                rec = self.s.ledger.get(rid)
            except FleetError:
                break  # pruned from the ledger
            if rec.status not in fleet_records.ACTIVE:
                break
            out.append(rec.id)
            rid = rec.parent
        return out

    def _look(self, selected: Sequence[str]) -> dict[str, Container | None]:
        """What each selected host serves now; refused when one cannot be looked at."""
        s = self.s
        looks = ssh.fan_out([s.inv.host(n) for n in selected],
                            lambda h: s.ops(h).inspect(container_name(h)), timeout=120)
        unreachable = [o.error.message() for o in looks.values() if o.error is not None]
        if unreachable:
            raise FleetError("could not look at every host before the rollback:\n  "
                             + "\n  ".join(unreachable),
                             fix="bring the host back, or leave it out with --limit '!NAME'")
        return {n: looks[n].value for n in selected}

    def _choose(self, c: Choice, recipe_name: str | None, selected: Sequence[str],
                current: Mapping[str, Container | None], to: str | None,
                aborted: fleet_records.RolloutRecord | None) -> None:
        """Each selected host's target into ``c``: ``to`` when given, else (an abort) what it served
        before ``aborted``, else the newest known-good that is not what it serves now; and the
        recipe it goes back to: ``recipe_name`` when given, else the one it served that version
        with when recorded (a model switch undone), else its own (:func:`.configured_recipe`)."""
        s = self.s
        for n in selected:
            c.recipes[n] = recipe_name or configured_recipe(s.inv, s.inv.host(n))
            cur = current[n]
            serving = (cur.digest, cur.fingerprint) if cur is not None and cur.running else None
            if to:
                # An explicit --to checks a host already there (readiness + smoke) rather than skip
                # it.
                recipe = s.recipe(c.recipes[n])
                img = self.preflight_resolve(recipe, to)
                tgt: tuple[str | None, str] | None = (img.tag, img.digest)
                c.fps[n] = remote.fingerprint(recipe)
            elif aborted is not None:
                tgt = self._before(c, n, aborted, serving, pinned=recipe_name is not None)
            else:
                tgt = self._known(c, n, serving, pinned=recipe_name is not None)
            if tgt is not None:
                image = s.recipe(c.recipes[n]).image
                c.targets[n] = (tgt[0], tgt[1], registry.pull_ref(image, tgt[1], s.mirrors))

    def preflight_resolve(self, recipe: Recipe, tag: str) -> registry.ResolvedImage:
        """``tag`` in the recipe's image (asked once per image)."""
        key = (recipe.image, tag)
        if key not in self._resolved:
            self._resolved[key] = self.s.resolve_image(recipe.image, tag, self.s.mirrors)
        return self._resolved[key]

    def _groups(self, recipes: Mapping[str, str | None]) -> list[Group]:
        """Hosts by the recipe each goes back to (None: the one it is configured to serve), the
        groups' recipes checked (a recipe's missing secrets refused before any change)."""
        by: dict[str, dict[str, Host]] = {}
        for n, name in recipes.items():
            h = self.s.inv.host(n)
            by.setdefault(name or configured_recipe(self.s.inv, h), {})[n] = h
        out = [Group(self.s.recipe(name), hosts) for name, hosts in by.items()]
        for g in out:
            self.s.check_recipe(g.recipe)
        return out

    def groups(self, rec: fleet_records.RolloutRecord) -> list[Group]:
        """A recorded rollback's hosts by the recipe each goes back to (a record of an older
        fleetctl: its one recipe)."""
        known = set(self.s.recipe_names())
        return self._groups({h.host: h.recipe or (rec.recipe if rec.recipe in known else None)
                             for h in rec.hosts})

    def _before(self, c: Choice, n: str, aborted: fleet_records.RolloutRecord,
                serving: tuple[str | None, str | None] | None,
                pinned: bool = False) -> tuple[str | None, str] | None:
        """An abort's target of ``n``: what it served before ``aborted`` changed it (None:
        skipped), with the recipe it served it with (unless ``pinned`` by --recipe)."""
        hr = self._changed_by(aborted, n)
        if hr is not None and hr.before_recipe and not pinned:
            c.recipes[n] = hr.before_recipe
        if hr is None or hr.status == fleet_records.SKIPPED:
            c.skips[n] = f"not changed by {aborted.id}"
            return None
        if not hr.before_digest:
            c.skips[n] = ("first deploy: nothing served before it (leave it, or `fleetctl rollout` "
                          "a version)")
            return None
        c.fps[n] = ((hr.before or {}).get("labels") or {}).get(LABEL_FINGERPRINT)
        if serving is not None and same_version(hr.before_digest, c.fps[n], *serving):
            c.skips[n] = f"already there (serving {hr.before_tag})"
            return None
        return hr.before_tag, hr.before_digest

    def _changed_by(self, aborted: fleet_records.RolloutRecord,
                    n: str) -> fleet_records.HostRecord | None:
        """``n``'s row in ``aborted``; for a rollback whose rows of ``n``'s slot (``n``, or every
        member of its unit) hold no one previous version (killed before it looked at a member, or a
        member served nothing then), the rows of the record it undid, up its parents: what the slot
        served before that chain changed it. A rollback killed before its first step would else
        leave every host as the run it undid left them (a unit's head down, its worker on the new
        tag) and report its abort completed."""
        unit = self.s.inv.unit_of(n)
        names = unit.members if unit is not None else (n,)
        rows = {m: aborted.host(m) for m in names}
        rec = aborted
        for _ in range(MAX_PARENTS):
            if (rec.kind != "rollback" or not rec.parent or _one_before(rows.values())
                    or any(r is not None and r.status == fleet_records.SKIPPED
                           for r in rows.values())):
                break
            try:
                rec = self.s.ledger.get(rec.parent)
            except FleetError:
                break  # pruned from the ledger
            up = {m: rec.host(m) for m in names}
            if _one_before(up.values()):
                rows = up
                break
        return rows[n]

    def _known(self, c: Choice, n: str, serving: tuple[str | None, str | None] | None,
               pinned: bool = False) -> tuple[str | None, str] | None:
        """A rollback's target of ``n``: its newest known-good that it does not serve (None:
        skipped, or set in ``c`` already from the host's own record), with the recipe it served it
        with when recorded (unless ``pinned`` by --recipe)."""
        recipe = self.s.recipe(c.recipes[n])
        known = self.s.ledger.known_good(n)
        if not known:
            # A host this ledger never knew (another operator's checkout): its own record.
            v = self._known_good([n]).get(n)
            if v is None:
                c.skips[n] = "first deploy: no known-good version recorded (pass --to TAG)"
            elif serving is not None and serving[0] == v.digest:
                c.skips[n] = (f"already there (serving its last known-good {v.tag}, recorded on "
                              "the host)")
            else:
                c.targets[n] = (v.tag, v.digest,
                                registry.pull_ref(recipe.image, v.digest, self.s.mirrors))
            return None
        # The newest known-good that is not what the host serves now.
        other = [k for k in known if serving is None or not same_version(k.digest, k.fingerprint,
                                                                         *serving)]
        if not other and len(known) == 1 and known[0].source == "gate":
            c.skips[n] = f"first deploy: {known[0].tag} is the only version known good here"
            return None
        if not other:
            c.skips[n] = f"already there (serving its last known-good {known[0].tag})"
            return None
        c.fps[n] = other[0].fingerprint or None
        if other[0].recipe and not pinned:
            c.recipes[n] = other[0].recipe
        return other[0].tag, other[0].digest

    def _record(self, run: Run, c: Choice, names: Sequence[str],
                current: Mapping[str, Container | None], opts: RollbackOptions,
                parent: fleet_records.RolloutRecord | None) -> None:
        """The rollback in the ledger (its steps within the capacity floor), and the hosts'
        intents."""
        s = self.s
        to, max_unavailable, min_available = opts.to, opts.max_unavailable, opts.min_available
        for n in names:
            cur = current[n]
            if cur is not None and cur.running and cur.digest and not s.ledger.known_good(n):
                s.ledger.add_known_good(n, tag=cur.tag, digest=cur.digest,
                                        fingerprint=cur.fingerprint, settings=cur.settings,
                                        source="found", rollout_id=None, recipe=cur.recipe)
        # The same floor as a rollout's, each recipe's over the hosts of it this rollback selected
        # (skipped ones keep serving): a small model's hosts are never all out at once.
        caps = {g.recipe.name: wave_plan.capacity(max(1, len(g.hosts)),
                                                  max_unavailable=max_unavailable,
                                                  min_available=min_available,
                                                  inventory_min_available=s.min_available())
                for g in run.groups}
        cap = next(iter(caps.values()), None) or wave_plan.capacity(
            1, max_unavailable=max_unavailable, min_available=min_available,
            inventory_min_available=s.min_available())
        described = ("; ".join(f"{r}: {k.describe()}" for r, k in caps.items()) if len(caps) > 1
                     else cap.describe())
        seen: dict[str, int] = {}
        rows: list[dict[str, Any]] = []
        for n in names:
            i = seen[c.recipes[n]] = seen.get(c.recipes[n], -1) + 1
            rows.append({"host": n, "wave": 0, "step": i // caps[c.recipes[n]].per_step,
                         "target_tag": c.targets[n][0], "target_digest": c.targets[n][1],
                         "recipe": c.recipes[n],
                         "before_recipe": cur.recipe if (cur := current[n]) is not None else None})
        rows += [{"host": n, "wave": -1, "step": -1, "status": fleet_records.SKIPPED,
                  "phase": "skipped", "recipe": c.recipes.get(n),
                  "verdict": json.dumps({"summary": f"skipped: {why}"})} for n,
                 why in c.skips.items()]
        s.ledger.create(run.id, kind="rollback",
                        recipe=", ".join(g.recipe.name for g in run.groups) or None, requested=to,
                        tag=c.targets[names[0]][0] if to and names else to,
                        digest=c.targets[names[0]][1] if to and names else None,
                        image=run.groups[0].recipe.image if run.groups else None,
                        options={"max_unavailable": cap.per_step, "capacity": described,
                                 "per_step": {r: k.per_step for r, k in caps.items()}, "to": to,
                                 "fingerprints": {n: c.fps[n] for n in names if c.fps.get(n)}},
                        command=command_line(), waves=[list(names)],
                        hosts=rows, parent=parent.id if parent else None)
        if run.held is not None:
            now = time.time()
            run.held.seed({n: (hoststate.Version(c.targets[n][0], c.targets[n][1], run.id, now),
                               None)
                           for n in names})

    def run(self, run: Run) -> RolloutResult:
        """The steps of a recorded rollback (new or resumed): hosts not yet done,
        ``max_unavailable`` at once."""
        s = self.s
        t0 = time.monotonic()
        rec = run.ledger.get(run.id)
        mu = int(rec.options.get("max_unavailable") or 1)
        todo = [h for h in rec.hosts if h.status not in (fleet_records.DONE,
                                                         fleet_records.ROLLED_BACK,
                                                         fleet_records.HOST_FAILED,
                                                         fleet_records.SKIPPED)]
        fps: Mapping[str, str] = rec.options.get("fingerprints") or {}
        targets = {h.host: Target(h.target_tag, h.target_digest or "",
                                  registry.pull_ref(run.group_of(h.host).recipe.image,
                                                    h.target_digest or "", s.mirrors),
                                  fps.get(h.host)) for h in todo}
        # Each recipe's steps within its own floor; the recipes' k-th steps side by side.
        per_step: Mapping[str, int] = rec.options.get("per_step") or {}
        by_group = [unit_plan.split_steps(s.inv, [h.host for h in todo if h.host in g.hosts],
                                          int(per_step.get(g.recipe.name) or mu))
                    for g in run.groups]
        steps = [[n for st in by_group if k < len(st) for n in st[k]]
                 for k in range(max((len(st) for st in by_group), default=0))]
        for step in steps:
            try:
                # a unit as one slot, dispatched as its head (its members' targets are one version)
                outs = s.parallel(unit_plan.slots(s.inv, [s.inv.host(n) for n in step]),
                                  lambda h: self._slot(run, run.group_of(h.name).recipe, h,
                                                       targets))
            except KeyboardInterrupt:
                run.ledger.set_status(run.id, fleet_records.PAUSED,
                                      "interrupted by Ctrl-C (hosts being changed were restored)")
                raise
            for n, err in outs.items():
                if err is not None:
                    run.ledger.host_phase(run.id, n, "failed", err.message(),
                                          status=fleet_records.HOST_FAILED,
                                          error=err.message())
        rec = run.ledger.get(run.id)
        door_problems = [why for g in run.groups
                         for why in self.door.reconcile(run, g.recipe,
                                                        [h.host for h in rec.hosts
                                                         if h.host in g.hosts])]
        bad = [h for h in rec.hosts if h.status not in (fleet_records.DONE, fleet_records.SKIPPED)]
        status = fleet_records.FAILED if bad or door_problems else fleet_records.COMPLETED
        error = "; ".join([f"{h.host}: {h.error}" for h in bad] + door_problems) or None
        run.ledger.set_status(run.id, status, error)
        run.send("completion" if not bad else "failure", error=error)
        return run.result(seconds=time.monotonic() - t0)

    def _slot(self, run: Run, recipe: Recipe, h: Host, targets: Mapping[str, Target]) -> None:
        """A slot's rollback step: a single host's here, a unit's (given its head) through its
        members."""
        unit = self.s.inv.unit_of(h.name)
        if unit is None:
            self.host(Step(run, recipe, h, Row(1, targets[h.name].tag or "?")), targets[h.name])
            return
        # one version for every member (fleetctl.rollout.unit.unit_targets); a member done already
        # has none left
        target = next(targets[m] for m in unit.members if m in targets)
        self.units.step(run, unit_plan.unit_recipe(self.s.inv, unit, recipe), unit, target)

    def _known_good(self, names: Sequence[str]) -> dict[str, hoststate.Version]:
        """The last known-good recorded on each of ``names`` (hosts without one are left out)."""
        if not names:
            return {}
        states = hoststate.read_all(self.s.host_store, [self.s.inv.host(n) for n in names])
        return {n: st.last_known_good for n, st in states.items() if st.last_known_good is not None}

    def host(self, step: Step, target: Target) -> None:
        """The step's host to the target's digest (with its settings when known), checked by
        readiness and smoke; a target that fails is itself undone."""
        run, recipe, h, t = step.run, step.recipe, step.host, step.timings
        tag, digest, ref, fingerprint = target.tag, target.digest, target.ref, target.fingerprint
        name = container_name(h)
        ops = self.s.ops(h)
        t0 = time.monotonic()
        rec = run.record(h.name)
        cur = ops.inspect(name)
        prev = ops.inspect(name + remote.PREV_SUFFIX)
        if rec is not None and rec.phase == "undoing":
            # Killed while putting back what served before: finish that.
            self._undo(step, ops, rec.error or "the target failed")
            return
        def wanted(s: Container | None) -> bool:
            return s is not None and same_version(digest, fingerprint, s.digest, s.fingerprint)

        if (not wanted(cur) and not wanted(prev) and fingerprint
                and fingerprint != remote.fingerprint(recipe)):
            # Only a kept container has the old settings; starting the image with today's recipe
            # would not be the version that was good. Nothing has been touched: the host keeps
            # serving.
            raise FleetError(
                f"its known-good {tag} ran with other container settings (fingerprint "
                f"{fingerprint[:12]}) than recipe {recipe.name} renders now "
                f"({remote.fingerprint(recipe)[:12]}), and that container is gone",
                host=h.name,
                fix=f"restore the recipe as it was, then `fleetctl rollout --tag {tag} --limit "
                    f"{h.name}`; or `fleetctl rollback --to {tag} --limit {h.name}` for {tag} "
                    "with today's recipe")
        if cur is not None and rec is not None and rec.before_digest is None and not wanted(cur):
            run.ledger.host_phase(run.id, h.name, "inspected", status=fleet_records.IN_PROGRESS,
                                  before_tag=cur.tag, before_digest=cur.digest, before=cur.settings)
        try:
            self.s.check_cancel()
            if cur is not None and cur.running and wanted(cur):
                step.phase("loading", f"serving {tag}: checking it", step.row.at("loading"),
                           status=fleet_records.IN_PROGRESS)
            elif prev is not None and wanted(prev):
                self.door.out(step, reason="rollback")
                step.phase("restoring", f"starting the kept {name}{remote.PREV_SUFFIX} ({tag})",
                           status=fleet_records.IN_PROGRESS)
                ops.swap(name)
            else:
                step.phase("pull", ref.rsplit("/", 1)[-1][:40], status=fleet_records.IN_PROGRESS)
                t["pull"] = self.prefetch.pull(ops, recipe.image, ref)
                self.door.out(step, reason="rollback")
                step.phase("stopping")
                # The version being left is abandoned: killed, not drained (it is kept as .prev).
                ops.retire(name, run.id, digest, grace=0)
                step.phase("starting")
                ops.start(remote.StartRequest(recipe, ref, tag or digest[:19], digest, run.id,
                                              self.s.container_secrets(recipe),
                                              self.s.cache_key(h, recipe, digest)))
            v = self._check(step, tag, t0)
        except RECOVERABLE as e:
            self._undo(step, ops, f"{tag} failed: {recoverable_why(e, full=False)}")
            if isinstance(e, KeyboardInterrupt):
                raise
            return
        door_error = self.door.back_in_or_record(run, h, t)
        step.phase("done", f"serving {tag}" + (f"; {door_error}" if door_error else ""),
                   step.row.at("ok"), status=fleet_records.DONE, after_tag=tag,
                   after_digest=digest, verdict=gate.summarise(v, t), artifacts=v.artifacts_dir)

    def _check(self, step: Step, tag: str | None, t0: float) -> Verdict:
        """The step's host's readiness and smoke test on its target; raises FleetError."""
        run, recipe, h, t = step.run, step.recipe, step.host, step.timings
        cfg = gate.config(recipe, None, h)
        ready = self.s.gates.wait(h, recipe, tag or "", cfg, None, step.live("loading"))
        t["ready"] = time.monotonic() - t0
        if not ready.ready:
            raise FleetError(f"readiness {ready.outcome.value}: {ready.message}", host=h.name)
        self.s.check_cancel()
        step.phase("smoke", None, step.row.at("ready"))
        v = self.s.gates.smoke(h, recipe, tag or "", cfg, run.artifacts(h))
        t["total"] = time.monotonic() - t0
        if v.outcome.value != "pass":
            raise FleetError(f"smoke {v.outcome.value}: {gate.failed_checks_text(v)}", host=h.name)
        return v

    def _undo(self, step: Step, ops: remote.ServingOps, why: str) -> None:
        """Put back what the step's host served before this rollback (kept as ``.prev``) after its
        target failed."""
        run, h = step.run, step.host
        name = container_name(h)
        step.phase("undoing", why, step.row.at("failed"), error=why)
        rec = run.record(h.name)
        before = rec.before_digest if rec is not None else None
        fix = fix_for(run, [h.name])
        before_fp = (((rec.before or {}).get("labels") or {}).get(LABEL_FINGERPRINT)
                     if rec is not None else None)
        try:
            cur = ops.inspect(name)
            if before is None:
                raise FleetError("nothing served before this rollback", host=h.name)
            if not (cur is not None and cur.running and same_version(before, before_fp, cur.digest,
                                                                     cur.fingerprint)):
                prev = ops.inspect(name + remote.PREV_SUFFIX)
                if prev is None or not same_version(before, before_fp, prev.digest,
                                                    prev.fingerprint):
                    raise FleetError("the previous container is gone", host=h.name)
                ops.restore(name)
            check_restored(step, rec.before_tag if rec else None, "undoing", smoke=False,
                           timed=False)
        except Exception as e:
            cause = e.cause if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            step.phase("failed", f"{why}; undo failed: {cause}", step.row.at("down"),
                       status=fleet_records.HOST_FAILED,
                       error=f"{why}; undo failed: {cause}; fix: {fix}")
            return
        tag_b = rec.before_tag if rec is not None else None
        door_error = self.door.back_in_or_record(run, h)
        step.phase("rolled-back",
                   f"{why}; serving {tag_b} again" + (f"; {door_error}" if door_error else ""),
                   step.row.showing(tag_b).at("ok"),
                   status=fleet_records.ROLLED_BACK, after_tag=tag_b, after_digest=before,
                   error=why)

    def abort(self, webhook: str | None = None, force: bool = False,
              confirm: Confirm | None = None) -> RolloutResult:
        """Undo the paused or interrupted rollout: every host it touched back to its previous
        version."""
        if force:
            self.s.ledger.release(None)
            self.s.take_over = True
        return self.rollback(RollbackOptions(webhook=webhook, only_active=True), confirm=confirm)


def _one_before(rows: Iterable[fleet_records.HostRecord | None]) -> bool:
    """Every row there, changed by its run, with one previous version (a unit's members go back
    together)."""
    rs = list(rows)
    return (all(r is not None and r.status != fleet_records.SKIPPED and r.before_digest for r in rs)
            and len({r.before_digest for r in rs if r is not None}) == 1)
