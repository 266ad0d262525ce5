"""Before any change: the hosts' facts checked (GPU, runtime, weights, disk), the plan cut, the image pulled
everywhere in parallel."""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl import registry, ssh
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.rollout import deploy, gate, imagetree
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout import unit as unit_plan
from fleetctl.rollout.results import Options
from fleetctl.rollout.session import (
    Session,
    StopRollout,
)
from fleetctl.rollout.unit import fabric_problems, refuse_multinode_recipe
from fleetctl.state import ledger as fleet_ledger

GB10 = remote.GB10
#: Free disk (GB) a host needs for an image it does not have yet (images are 9-22 GB).
DEFAULT_IMAGE_FREE_GB = 25.0


class Planning(Session):
    """Preflight, plan and prefetch: everything a rollout checks before it changes a host."""

    def _preflight(self, hosts: Sequence[Host], recipe: Recipe, ref: str) -> dict[str, remote.Facts]:
        """Facts about every host; refuse the whole rollout (every host and cause) if one is unfit."""
        self._emit("preflight", f"checking {len(hosts)} host(s)")
        problems: list[str] = []
        if self.ops is remote.SshHostOps:
            # The login's rights (sudo, docker) once per host, before any step needs them: one
            # message per host naming the user, what is missing and the fix.
            # A root login has every right: nothing to probe.
            access = ssh.fan_out([h for h in hosts if h.user != "root"],
                                 lambda h: self.ops(h).check_access(), timeout=60)
            problems += [o.error.message() for o in access.values() if o.error is not None]
            hosts = [h for h in hosts if h.name not in access or access[h.name].error is None]
            # Each unit's fabric and parity (every member, selected or not): before any change.
            problems += fabric_problems(self.inv, [h.name for h in hosts])
            # ... and its all_reduce bandwidth, measured in the rollout's image, against its floor.
            problems += unit_plan.bandwidth_problems(self.inv, [h.name for h in hosts], recipe, ref, remote.pull)
        outcomes = ssh.fan_out(hosts, lambda h: self.ops(h).facts(self._recipe_of(h, recipe), ref), timeout=120)
        out: dict[str, remote.Facts] = {}
        for h in hosts:
            o = outcomes[h.name]
            if o.error is not None or o.value is None:
                problems.append(f"{h.name}: {o.error.cause if o.error else 'no answer'}")
                continue
            f = o.value
            out[h.name] = f
            need = float(h.vars.get("fleetctl_image_free_gb", DEFAULT_IMAGE_FREE_GB))
            if f.gpu != GB10:
                problems.append(f"{h.name}: GPU is {f.gpu!r}, not {GB10}: the images are built for sm_121a only")
            if not f.nvidia_runtime:
                problems.append(f"{h.name}: Docker has no nvidia runtime (nvidia-container-toolkit missing)"
                                " - run `fleetctl provision`")
            for why in f.missing_weights:
                problems.append(f"{h.name}: {why} - run `fleetctl stage --recipe {self._recipe_of(h, recipe).name} "
                                f"--limit {h.name}`")
            if not f.has_image and f.free_gb < need:
                problems.append(f"{h.name}: {f.free_gb:.1f} GB free for the image, needs {need:.0f} GB")
            self._emit("preflight", "ok" if not problems else "checked", h.name)
        if problems:
            raise FleetError("preflight refused the rollout before any change:\n  " + "\n  ".join(problems),
                             fix="fix each host above, or leave it out with --limit '!NAME'")
        return out

    def _recipe_of(self, h: Host, recipe: Recipe) -> Recipe:
        """The recipe ``h`` serves in a rollout of ``recipe`` (a unit's member: its unit's)."""
        unit = self.inv.unit_of(h.name)
        return recipe if unit is None else unit_plan.unit_recipe(self.inv, unit, recipe)

    def check(self, opts: Options) -> tuple[Recipe, list[Host]]:
        """Every option, the tag's form, the recipe and the selection checked: no network, no host."""
        if not opts.tag:
            raise FleetError("no tag given", fix="pass --tag, e.g. --tag v0.24.0")
        registry.check_tag(opts.tag, "--tag")
        wave_plan.check_options(opts.waves, opts.max_unavailable, opts.failure_budget, opts.min_available)
        recipe = self.recipe(opts.recipe)
        self._check_recipe(recipe)
        hosts = self.inv.select(opts.limit)
        refuse_multinode_recipe(self.inv, recipe, [h.name for h in hosts])
        unit_plan.refuse_other_images(self.inv, recipe, [h.name for h in hosts])
        hosts = unit_plan.whole_units(self.inv, hosts)  # a unit changes as one: every member, selected or not
        wave_plan.check_options(opts.waves, opts.max_unavailable, opts.failure_budget, opts.min_available,
                                total=len(hosts), inventory_min_available=self.min_available())
        for h in hosts:
            deploy.deploy_via(h)  # a bad value is refused before anything is resolved or touched
        return recipe, hosts

    def resolve(self, recipe: Recipe, tag: str) -> registry.ResolvedImage:
        """``tag`` of the recipe's image through the registry (asked once per command)."""
        key = (recipe.image, tag)
        if key not in self._resolved:
            self._emit("resolve", f"{recipe.image}:{tag}")
            img = self._resolve(recipe.image, tag, self.mirrors)
            self._emit("resolve", f"{tag} -> {img.tag} ({img.digest[:19]})")
            self._resolved[key] = img
        return self._resolved[key]

    def plan(self, opts: Options) -> tuple[wave_plan.Plan, Recipe, dict[str, remote.Facts], list[Host]]:
        """Resolve the tag, preflight the hosts and cut the waves. Touches nothing."""
        recipe, hosts = self.check(opts)
        img = self.resolve(recipe, opts.tag or "")
        ref = registry.pull_ref(recipe.image, img.digest, self.mirrors)
        facts = self._preflight(hosts, recipe, ref)
        self.gpus.update({n: f.gpu for n, f in facts.items()})
        names = [h.name for h in hosts]
        current = {n: (f.serving.tag, f.serving.digest) if f.serving and f.serving.running else (None, None)
                   for n, f in facts.items()}
        fps = {n: f.serving.fingerprint if f.serving and f.serving.running else None for n, f in facts.items()}
        # The planner sees slots (a single host, or a unit as its head), so that waves, --max-unavailable and
        # --failure-budget count units; the plan of slots is then expanded to every member.
        slot_current, slot_fps = unit_plan.slot_versions(self.inv, names, current, fps, recipe, remote.fingerprint)
        p = wave_plan.build(recipe=recipe.name, image=img.image, requested=opts.tag or "", tag=img.tag, digest=img.digest,
                    pull_ref=ref, hosts=unit_plan.slot_names(self.inv, names), current=slot_current, waves=opts.waves,
                    max_unavailable=opts.max_unavailable, failure_budget=opts.failure_budget,
                    fingerprint=remote.fingerprint(recipe), current_fingerprints=slot_fps,
                    min_available=opts.min_available, inventory_min_available=self.min_available())
        p = unit_plan.expand(self.inv, p, names, current)
        # The estimate from the soak config of the first host that moves (its profile: the lab's or a Spark's).
        movers = [h for h in hosts if p.host(h.name).action == "deploy"] or list(hosts)
        cfg = gate.config(recipe, opts.soak, movers[0])
        # ... and from what this recipe's passed steps took before, once there are a few (plan.learned).
        p = p.with_estimate(*wave_plan.learned(self.ledger.passed_steps(recipe.name), cfg.load_time,
                                               cfg.sustained_duration))
        return p, recipe, facts, hosts

    def min_available(self) -> object:
        """The inventory's floor (``fleetctl_min_available`` in group ``all``), or None."""
        return self.inv.vars.get(wave_plan.MIN_AVAILABLE_VAR)


    def _prefetch(self, rid: str, hosts: Sequence[Host], ref: str, image: str) -> dict[str, float]:
        """Pull the image on every target before anything is stopped; seconds per host. Enough hosts
        needing it: through a tree of relays (:mod:`.imagetree`), else each from the registry in parallel."""
        if not hosts:
            return {}
        self.ledger.note(rid, "prefetch", ref)
        for h in hosts:
            self._emit("pull", ref.rsplit("@", 1)[0].rsplit("/", 1)[-1], h.name)
        tree = self._image_tree(hosts, ref, image)
        if tree is None:
            imagetree.sweep_relays(hosts, self.ops)  # relays a killed prefetch left
            outs = self._direct_pulls(hosts, ref, image)
        else:
            tree_hosts, present = tree
            outs = {n: ssh.Outcome(n, value=0.0) for n in present}
            for n in present:
                self.pull_via[n] = "present"
                self._emit("pulled", "already here", n)
            if tree_hosts:
                outs.update(self._tree_pull(rid, tree_hosts, ref, image))
        bad = {n: o.error for n, o in outs.items() if o.error is not None}
        if bad:
            why = "; ".join(f"{n}: {e.cause if e else '?'}" for n, e in bad.items())
            raise StopRollout(fleet_ledger.FAILED, f"prefetch failed before any host was changed: {why}")
        return {n: float(o.value or 0.0) for n, o in outs.items()}

    def _direct_pulls(self, hosts: Sequence[Host], ref: str, image: str) -> dict[str, ssh.Outcome[float]]:
        """Every host pulls ``ref`` from the registry (or its mirror), in parallel; seconds per host."""
        outs = ssh.fan_out(hosts, lambda h: self._pull(self.ops(h), image, ref), timeout=None)
        for n, o in outs.items():
            if o.error is None:
                self._emit("pulled", f"pulled in {o.value:.1f}s", n)
                self.pull_via[n] = "registry"
        return outs

    def _image_tree(self, hosts: Sequence[Host], ref: str, image: str) -> tuple[list[Host], list[str]] | None:
        """The hosts the tree is to serve and those already holding the image, or None: every host pulls
        from the registry (the tree off, a simulated fleet, fewer hosts than its ``min_hosts`` need it, or an
        image smaller than its ``min_mb``; an image whose size the registry does not say is taken as large)."""
        cfg = self.image_tree
        if not cfg.enabled or len(hosts) < cfg.min_hosts:
            return None
        sizes = self._platform_layers(image, ref.rsplit("@", 1)[-1])
        if sizes and max(sum(p.values()) for p in sizes) < cfg.min_mb * 1_000_000:
            return None
        # A relay a killed controller left behind goes first (the fleet's lock: no other prefetch runs).
        has = ssh.fan_out(hosts, lambda h: imagetree.holds_image(self.ops(h), ref), timeout=90)
        present = [n for n, o in has.items() if o.value]
        need = [h for h in hosts if not has[h.name].value]
        if len(need) < cfg.min_hosts:
            return None
        return need, present

    def _tree_pull(self, rid: str, hosts: Sequence[Host], ref: str, image: str) -> dict[str, ssh.Outcome[float]]:
        """Pull ``ref`` on ``hosts`` through the image tree; the ledger notes how many hosts the registry served."""
        cfg = self.image_tree
        relay = registry.ImageName.parse(cfg.relay_image)
        tag = cfg.relay_image.rsplit("/", 1)[-1].partition(":")[2] or "latest"
        origin = registry.endpoint(registry.ImageName.parse(image).registry, self.mirrors).base
        try:
            relay_ref = registry.pull_ref(relay.ref, self._resolve(relay.ref, tag, self.mirrors).digest, self.mirrors)
        except FleetError as e:
            self._emit("pull", f"image tree off: its relay image {cfg.relay_image} is not found ({e.cause})")
            return self._direct_pulls(hosts, ref, image)
        tree = imagetree.Tree(cfg, ref, origin, relay_ref, ops=self.ops,
                              pull=lambda h, r: self._pull(self.ops(h), image, r),
                              direct=lambda h, r: self.ops(h).pull(r),
                              emit=lambda kind, msg, host: self._emit(kind, msg, host))
        got = tree.run(hosts)
        out: dict[str, ssh.Outcome[float]] = {}
        direct: list[str] = []
        via: dict[str, str] = {}
        for n, o in got.items():
            if o.value is not None:
                via[n] = "registry" if o.value.via in (None, "registry") else f"relay:{o.value.via}"
                if o.value.via is None:
                    direct.append(n)
            out[n] = ssh.Outcome(n, value=o.value.seconds if o.value else None, error=o.error)
        self.pull_via.update(via)
        self.ledger.note(rid, "prefetch", f"image tree: {len(hosts)} host(s), "
                         f"{sum(v.startswith('relay:') for v in via.values())} through relays, "
                         f"layers read from the registry by {list(via.values()).count('registry')}"
                         + (f" (direct: {', '.join(sorted(direct))})" if direct else ""))
        return out
