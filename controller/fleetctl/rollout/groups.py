"""A fleet serving several models: a run's hosts grouped by recipe, and the plan of every group.

Without ``--recipe``, each selected host (a unit: every member) is rolled forward on the recipe it
is configured to serve (``fleetctl_recipe`` from its host_vars or group_vars; a unit's member: its
unit's), so a run has one :class:`~fleetctl.rollout.run.Group` per recipe. Each group resolves the
tag in its own recipe's image, and has its own plan: its canary, its waves, its capacity floor and
its failure budget. A :class:`FleetPlan` holds them, with the hosts left out because their recipe's
image has no such tag, and the hosts whose model the run would switch; the run goes wave by wave
over every group's wave of that index (:func:`merge_waves`: the canaries of every group first).
Nothing here touches a host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetctl.errors import FleetError
from fleetctl.rollout import plan as wave_plan


@dataclass(frozen=True)
class Switch:
    """A host the run moves to another model: from the recipe it serves (or, serving none that
    fleetctl labelled, is configured to serve) to the group's."""

    host: str
    before: str
    after: str

    def describe(self) -> str:
        """``switch: qwen36-27b-mm → qwen36-35b-heretic``."""
        return f"switch: {self.before} → {self.after}"


@dataclass(frozen=True)
class Left:
    """A recipe's hosts the run leaves as they are: its image has no such tag (``why``)."""

    recipe: str
    image: str
    hosts: tuple[str, ...]
    why: str


def switch_of(host: str, serving: str | None, configured_name: str, target: str) -> Switch | None:
    """The switch a step of ``host`` to recipe ``target`` would be: from the recipe its container
    serves (its ``fleetctl.recipe`` label), else, nothing labelled serving, from the one it is
    configured to serve; None when that is ``target``."""
    before = serving or configured_name
    return Switch(host, before, target) if before != target else None


def merge_waves(plans: Sequence[wave_plan.Plan]) -> list[list[str]]:
    """The run's waves: wave ``w`` is every group's wave ``w`` (the canaries of every group first,
    then their next waves), groups in order."""
    n = max((len(p.waves) for p in plans), default=0)
    return [[h for p in plans if w < len(p.waves) for h in p.waves[w]] for w in range(n)]


@dataclass(frozen=True)
class FleetPlan:
    """The plans of a run's recipe groups (one today for a fleet of one recipe), the hosts left out
    (their recipe's image lacks the tag) and the model switches the run would make."""

    plans: tuple[wave_plan.Plan, ...]
    left: tuple[Left, ...] = ()
    switches: tuple[Switch, ...] = ()

    @property
    def first(self) -> wave_plan.Plan:
        """The first group's plan (the only one of a fleet of one recipe)."""
        return self.plans[0]

    @property
    def hosts(self) -> tuple[wave_plan.HostPlan, ...]:
        """Every group's hosts' plans, group after group."""
        return tuple(h for p in self.plans for h in p.hosts)

    @property
    def waves(self) -> list[list[str]]:
        """The run's waves (:func:`merge_waves`)."""
        return merge_waves(self.plans)

    def changing(self) -> list[wave_plan.HostPlan]:
        """The hosts the run changes."""
        return [h for h in self.hosts if h.action != "skip"]

    def recipe_of(self, host: str) -> str:
        """The recipe of the group ``host`` is planned in."""
        return next(p.recipe for p in self.plans if any(h.host == host for h in p.hosts))

    def refusal(self, skip_missing: bool, switch_model: bool) -> FleetError | None:
        """Why the run may not go on without the operator's word (None: it may): hosts left out
        unless ``skip_missing``, a model switch unless ``switch_model``. It names every host."""
        if self.left and not skip_missing:
            tag = self.first.requested
            what = "; ".join(f"recipe {lf.recipe} ({', '.join(lf.hosts)}): {lf.why}"
                             for lf in self.left)
            return FleetError(
                f"tag {tag} is missing from the image of some recipes, whose hosts the rollout "
                f"would leave as they are: {what}",
                fix="push the tag to those images, leave their hosts out with --limit, or pass "
                    "--skip-missing to roll the other recipes forward without them")
        if self.switches and not switch_model:
            what = "; ".join(f"{s.host}: {s.describe()}" for s in self.switches)
            return FleetError(
                f"the rollout would change the model {len(self.switches)} host(s) serve: {what}",
                host=self.switches[0].host,
                fix="pass --switch-model to switch them (recorded as switches), or leave them out "
                    "with --limit '!NAME' (a host serves its configured recipe: fleetctl_recipe "
                    "in its host_vars)")
        return None


def rows_left(left: Sequence[Left], tag: str) -> list[dict[str, object]]:
    """The ledger rows of the hosts left out (skipped, with why)."""
    import json

    return [{"host": n, "wave": -1, "step": -1, "status": "skipped", "phase": "skipped",
             "recipe": lf.recipe, "target_tag": tag,
             "verdict": json.dumps({"summary": f"skipped: recipe {lf.recipe}: {lf.why}"})}
            for lf in left for n in lf.hosts]


def group_options(plans: Sequence[wave_plan.Plan]) -> list[dict[str, object]]:
    """What the ledger keeps of each group's plan, for ``--resume`` (no host asked again)."""
    return [{"recipe": p.recipe, "image": p.image, "requested": p.requested, "tag": p.tag,
             "digest": p.digest, "pull_ref": p.pull_ref, "max_unavailable": p.max_unavailable,
             "failure_budget": p.failure_budget,
             "capacity": p.capacity.describe() if p.capacity else None} for p in plans]


def recorded_plans(options: Mapping[str, object],
                   waves: Sequence[Sequence[str]],
                   hosts: Sequence[wave_plan.HostPlan],
                   recipe_of: Mapping[str, str | None]) -> list[wave_plan.Plan]:
    """The groups' plans as a rollout's record has them (``options["groups"]``, the run's waves,
    each host's row and recipe): each group's waves are its own hosts' of the run's waves."""
    out: list[wave_plan.Plan] = []
    raw = options.get("groups")
    assert isinstance(raw, list)
    for g in raw:
        mine = [h for h in hosts if recipe_of.get(h.host) == g["recipe"]]
        names = {h.host for h in mine}
        gw = [tuple(h for h in w if h in names) for w in waves]
        while gw and not gw[-1]:
            gw.pop()
        out.append(wave_plan.Plan(
            str(g["recipe"]), str(g["image"]), str(g["requested"] or ""), str(g["tag"]),
            str(g["digest"]), str(g["pull_ref"]), tuple(gw), int(g["max_unavailable"]),
            int(g["failure_budget"]), tuple(mine)))
    return out
