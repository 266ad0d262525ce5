"""Serving units in the rollout engine (docs/units.md).

The engine steps one host at a time: stopping and starting the members of a unit (N Sparks serving one
model over their fabric) one by one would start each as a lone server of a model that does not fit it, and
leave the unit on two versions between steps. Until the engine steps a unit as one, a rollout, rollback or
abort that would touch a unit's member, or that carries a multi-node recipe, is refused here, before any
lock is taken on a host or anything is pulled, stopped or started.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl.errors import FleetError
from fleetctl.inventory import Inventory
from fleetctl.recipes import Recipe


def refuse_units(inv: Inventory, recipe: Recipe, selected: Sequence[str], verb: str) -> None:
    """Refuse ``verb`` (rollout, rollback, abort) when ``selected`` holds a unit member or ``recipe`` spans
    several nodes: one message naming each unit, its members and the fix."""
    units = {}
    for name in selected:
        u = inv.unit_of(name)
        if u is not None:
            units[u.name] = u
    if not units and recipe.topology.nodes <= 1:
        return
    if units:
        listed = "; ".join(f"unit {u.name!r} ({', '.join(u.members)})" for u in units.values())
        members = [m for u in units.values() for m in u.members]
        exclude = ":".join(f"!{m}" for m in members)
        raise FleetError(
            f"{verb} of {listed} refused before any change: the rollout engine does not yet step a unit's "
            f"members as one (it would start each member alone, and leave the unit on two versions)",
            host=next(iter(units.values())).head,
            fix=f"leave the unit out with --limit '{exclude}', and change its members by hand together")
    raise FleetError(
        f"{verb} of recipe {recipe.name!r} refused before any change: it spans {recipe.topology.nodes} nodes, "
        f"and the rollout engine does not yet step a unit as one",
        fix="roll out a single-node recipe (--recipe NAME) to single hosts")
