"""Before any change: the options checked, the tag resolved, the hosts' facts checked (access,
fabric, GPU, runtime, weights, disk) and the plan cut. Touches nothing; a rollout runs it once."""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl import registry, ssh
from fleetctl.errors import FleetError
from fleetctl.facts import Facts
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe, configured_recipe, hosts_by_recipe
from fleetctl.rollout import deploy, gate, groups, rejected
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout import unit as unit_plan
from fleetctl.rollout.results import Options
from fleetctl.rollout.run import Group
from fleetctl.rollout.session import Session
from fleetctl.rollout.unit import fabric_problems, refuse_multinode_recipe

GB10 = remote.GB10
#: Free disk (GB) a host needs for an image it does not have yet (images are 9-22 GB).
DEFAULT_IMAGE_FREE_GB = 25.0


class Preflight:
    """Check, resolve, preflight and plan: everything a rollout checks before it changes a host."""

    def __init__(self, session: Session) -> None:
        self.s = session
        #: (image, requested tag) -> what the registry answered, asked once per command.
        self._resolved: dict[tuple[str, str], registry.ResolvedImage] = {}
        #: (image, requested tag) -> the registry's refusal (an image without that tag).
        self._missing: dict[tuple[str, str], FleetError] = {}

    def facts(self, hosts: Sequence[Host], recipe: Recipe, ref: str) -> dict[str, Facts]:
        """Facts about every host; refuse the whole rollout (every host and cause) if one is
        unfit."""
        self.s.emit("preflight", f"checking {len(hosts)} host(s)")
        problems: list[str] = []
        if self.s.ops is remote.SshHostOps:
            # The login's rights (sudo, docker) once per host, before any step needs them: one
            # message per host naming the user, what is missing and the fix.
            # A root login has every right: nothing to probe.
            access = ssh.fan_out([h for h in hosts if h.user != "root"],
                                 lambda h: self.s.ops(h).check_access(), timeout=60)
            problems += [o.error.message() for o in access.values() if o.error is not None]
            hosts = [h for h in hosts if h.name not in access or access[h.name].error is None]
            # Each unit's fabric and parity (every member, selected or not): before any change.
            problems += fabric_problems(self.s.inv, [h.name for h in hosts])
            # ... and its all_reduce bandwidth, measured in the rollout's image, against its floor.
            problems += unit_plan.bandwidth_problems(self.s.inv, [h.name for h in hosts], recipe,
                                                     ref, remote.pull)
        outcomes = ssh.fan_out(hosts, lambda h: self.s.ops(h).facts(self.recipe_of(h, recipe), ref),
                               timeout=120)
        out: dict[str, Facts] = {}
        for h in hosts:
            o = outcomes[h.name]
            if o.error is not None or o.value is None:
                problems.append(f"{h.name}: {o.error.cause if o.error else 'no answer'}")
                continue
            f = o.value
            out[h.name] = f
            need = float(h.vars.get("fleetctl_image_free_gb", DEFAULT_IMAGE_FREE_GB))
            if f.gpu != GB10:
                problems.append(
                    f"{h.name}: GPU is {f.gpu_or_why!r}, not {GB10}: the images are built for "
                    f"sm_121a only"
                )
            if not f.nvidia_runtime:
                problems.append(f"{h.name}: Docker has no nvidia runtime "
                                "(nvidia-container-toolkit missing) - run `fleetctl provision`")
            for why in f.missing_weights:
                problems.append(f"{h.name}: {why} - run `fleetctl stage --recipe "
                                f"{self.recipe_of(h, recipe).name} "
                                f"--limit {h.name}`")
            if not f.has_image and (f.image_free_gb or 0.0) < need:
                problems.append(f"{h.name}: {f.image_free_gb or 0.0:.1f} GB free for the image, "
                                f"needs {need:.0f} GB")
            self.s.emit("preflight", "ok" if not problems else "checked", h.name)
        if problems:
            raise FleetError("preflight refused the rollout before any change:\n  "
                             + "\n  ".join(problems),
                             fix="fix each host above, or leave it out with --limit '!NAME'")
        return out

    def recipe_of(self, h: Host, recipe: Recipe) -> Recipe:
        """The recipe ``h`` serves in a rollout of ``recipe`` (a unit's member: its unit's)."""
        unit = self.s.inv.unit_of(h.name)
        return recipe if unit is None else unit_plan.unit_recipe(self.s.inv, unit, recipe)

    def check(self, opts: Options) -> list[Group]:
        """Every option, the tag's form, the recipes and the selection checked: no network, no
        host. The selected hosts in recipe groups (no plan yet): without ``--recipe``, by the recipe
        each is configured to serve; with it, that recipe's hosts (of ``--limit``'s, when given)."""
        if not opts.tag:
            raise FleetError("no tag given", fix="pass --tag, e.g. --tag v0.24.0")
        registry.check_tag(opts.tag, "--tag")
        wave_plan.check_options(opts.waves, opts.max_unavailable, opts.failure_budget,
                                opts.min_available)
        inv = self.s.inv
        hosts = inv.select(opts.limit)
        if opts.recipe:
            recipe = self.s.recipe(opts.recipe)
            if not opts.limit:
                hosts = [h for h in hosts if configured_recipe(inv, h) == recipe.name]
                if not hosts:
                    raise FleetError(
                        f"no host is configured to serve recipe {recipe.name}",
                        fix=f"name the hosts to switch to it: --recipe {recipe.name} --limit NAME "
                            "--switch-model, or set fleetctl_recipe in their host_vars")
            refuse_multinode_recipe(inv, recipe, [h.name for h in hosts])
            unit_plan.refuse_other_images(inv, recipe, [h.name for h in hosts])
            # a unit changes as one: every member, selected or not
            hosts = unit_plan.whole_units(inv, hosts)
            selected = [Group(recipe, {h.name: h for h in hosts})]
        else:
            selected = []
            for name, members in hosts_by_recipe(inv, unit_plan.whole_units(inv, hosts)).items():
                recipe = self.s.recipe(name)
                refuse_multinode_recipe(inv, recipe, [h.name for h in members])
                selected.append(Group(recipe, {h.name: h for h in members}))
        self._check_floors(opts, selected)
        for g in selected:
            self.s.check_recipe(g.recipe)
            for h in g.hosts.values():
                deploy.deploy_via(h)  # a bad value is refused before anything is resolved
        return selected

    def _check_floors(self, opts: Options, selected: Sequence[Group]) -> None:
        """The floor against every selected host, then each recipe's against its own hosts (each
        keeps its own), a group's refusal naming its recipe."""
        def check(total: int) -> None:
            wave_plan.check_options(opts.waves, opts.max_unavailable, opts.failure_budget,
                                    opts.min_available, total=total,
                                    inventory_min_available=self.s.min_available())

        check(sum(len(g.hosts) for g in selected))
        for g in selected:
            try:
                check(len(g.hosts))
            except FleetError as e:
                if len(selected) == 1:
                    raise
                raise FleetError(f"recipe {g.recipe.name} ({len(g.hosts)} host(s)): {e.cause}",
                                 fix=f"{e.fix or ''} (each recipe keeps its own floor: a "
                                     "percentage suits a fleet of several recipes)") from e

    def resolve(self, recipe: Recipe, tag: str) -> registry.ResolvedImage:
        """``tag`` of the recipe's image through the registry (asked once per command)."""
        key = (recipe.image, tag)
        if key in self._missing:
            raise self._missing[key]
        if key not in self._resolved:
            self.s.emit("resolve", f"{recipe.image}:{tag}")
            try:
                img = self.s.resolve_image(recipe.image, tag, self.s.mirrors)
            except FleetError as e:
                self._missing[key] = e
                raise
            self.s.emit("resolve", f"{tag} -> {img.tag} ({img.digest[:19]})")
            self._resolved[key] = img
        return self._resolved[key]

    def resolve_groups(self, selected: Sequence[Group], tag: str) -> list[groups.Left]:
        """``tag`` resolved in each group's image; the groups whose image lacks it, as hosts left
        out. A run of one group, or one where no group's image has it, is refused (the error)."""
        left: list[groups.Left] = []
        first: FleetError | None = None
        for g in selected:
            try:
                self.resolve(g.recipe, tag)
            except FleetError as e:
                if len(selected) == 1:
                    raise
                first = first or e
                left.append(groups.Left(g.recipe.name, g.recipe.image, tuple(g.hosts), e.cause))
        if first is not None and len(left) == len(selected):
            raise first
        return left

    def plan(self, opts: Options) -> tuple[groups.FleetPlan, list[Group], dict[str, Facts]]:
        """Resolve the tag in each group's image, preflight the hosts and cut each group's waves,
        and name the switches. Touches nothing. The plan, the groups it moves (each with its plan),
        every moved host's facts."""
        selected = self.check(opts)
        left = self.resolve_groups(selected, opts.tag or "")
        out = [g for g in selected if g.recipe.name not in {lf.recipe for lf in left}]
        facts: dict[str, Facts] = {}
        switches: list[groups.Switch] = []
        for g in out:
            f = self._plan_group(opts, g)
            facts.update(f)
            for hp in g.p.hosts:
                h = g.hosts[hp.host]
                serving = f[hp.host].serving
                sw = groups.switch_of(hp.host, serving.recipe if serving and serving.running
                                      else None, configured_recipe(self.s.inv, h),
                                      self.recipe_of(h, g.recipe).name)
                if sw is not None and hp.action == "deploy":
                    switches.append(sw)
        fp = groups.FleetPlan(tuple(g.p for g in out), tuple(left), tuple(switches))
        return fp, out, facts

    def _plan_group(self, opts: Options, g: Group) -> dict[str, Facts]:
        """One group's preflight and plan (into ``g.plan``); its hosts' facts."""
        recipe, hosts = g.recipe, list(g.hosts.values())
        img = self.resolve(recipe, opts.tag or "")
        rejected.refuse(self.s.ledger, recipe.name, img.digest, img.tag, opts.retry_rejected)
        ref = registry.pull_ref(recipe.image, img.digest, self.s.mirrors)
        facts = self.facts(hosts, recipe, ref)
        self.s.gpus.update({n: f.gpu_or_why for n, f in facts.items()})
        names = [h.name for h in hosts]
        current = {n: (f.serving.tag,
                       f.serving.digest) if f.serving and f.serving.running else (None, None)
                   for n, f in facts.items()}
        fps = {n: f.serving.fingerprint if f.serving and f.serving.running else None for n,
               f in facts.items()}
        # The planner sees slots (a single host, or a unit as its head), so that waves,
        # --max-unavailable and --failure-budget count units; the plan of slots is then expanded to
        # every member.
        slot_current, slot_fps = unit_plan.slot_versions(self.s.inv, names, current, fps, recipe,
                                                         remote.fingerprint)
        p = wave_plan.build(
            wave_plan.Desired(recipe.name, img.image, opts.tag or "", img.tag, img.digest, ref,
                              remote.fingerprint(recipe)),
            unit_plan.slot_names(self.s.inv, names), slot_current,
            wave_plan.Pacing(opts.waves, opts.max_unavailable, opts.failure_budget,
                             opts.min_available, self.s.min_available()),
            slot_fps)
        p = unit_plan.expand(self.s.inv, p, names, current)
        # The estimate from the soak config of the first host that moves (its profile: the lab's or
        # a Spark's).
        movers = [h for h in hosts if p.host(h.name).action == "deploy"] or list(hosts)
        cfg = gate.config(recipe, opts.soak, movers[0])
        # ... and from what this recipe's passed steps took before, once there are a few
        # (plan.learned).
        g.plan = p.with_estimate(*wave_plan.learned(self.s.ledger.passed_steps(recipe.name),
                                                    cfg.load_time, cfg.sustained_duration))
        return facts
