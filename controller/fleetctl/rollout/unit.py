"""Serving units in the rollout engine (docs/units.md).

The engine steps one host at a time: stopping and starting the members of a unit (N Sparks serving one
model over their fabric) one by one would start each as a lone server of a model that does not fit it, and
leave the unit on two versions between steps. Until the engine steps a unit as one, a rollout, rollback or
abort that would touch a unit's member, or that carries a multi-node recipe, is refused here, before any
container is pulled, stopped or started. A rollout's preflight first probes each unit's fabric and parity
(:func:`fabric_problems`) and refuses on any finding, so that a faulty fabric is named before anything else.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl import status
from fleetctl.errors import FleetError
from fleetctl.inventory import Inventory, Unit
from fleetctl.recipes import Recipe

#: Seconds a member's status and fabric probes may take at preflight.
PROBE_TIMEOUT = 60.0


def units_in(inv: Inventory, selected: Sequence[str]) -> dict[str, Unit]:
    """The units with a member in ``selected``, by name, in selection order."""
    out: dict[str, Unit] = {}
    for name in selected:
        u = inv.unit_of(name)
        if u is not None:
            out.setdefault(u.name, u)
    return out


def fabric_problems(inv: Inventory, selected: Sequence[str]) -> list[str]:
    """The fabric and parity findings of every unit with a member in ``selected`` (all its members probed,
    whether selected or not: a unit changes as one), one line each naming the member, the figure measured,
    the expected one and the fix; a member that could not be probed is a problem too (its fabric is unknown).

    The probes are ``fleetctl status``'s (its host probe and fabric probe, in parallel, bounded by
    ``ssh.fan_out``), judged by ``fleetctl.fabric``; parity against the head once every member answered.
    """
    units = units_in(inv, selected)
    if not units:
        return []
    members = [inv.host(m) for u in units.values() for m in u.members]
    found = status.probe_fleet(inv, members, timeout=PROBE_TIMEOUT)
    out: list[str] = []
    for h in members:
        st = found[h.name]
        if not st.reachable:
            out.append(f"{h.name}: unit {h.unit}'s member did not answer ({st.error}): its fabric is unknown")
        elif st.fabric is None or st.fabric.error is not None:
            why = st.fabric.error if st.fabric is not None else "not probed"
            out.append(f"{h.name}: the fabric probe of unit {h.unit}'s member failed ({why}): its fabric is unknown")
        else:
            out += [f.message() for f in st.fabric.findings]
    return out


def refuse_multinode_recipe(inv: Inventory, recipe: Recipe, selected: Sequence[str]) -> None:
    """A multi-node recipe rolled out to hosts of no unit is refused (no host touched, no network)."""
    if recipe.topology.nodes > 1 and not units_in(inv, selected):
        raise FleetError(
            f"rollout of recipe {recipe.name!r} refused before any change: it spans {recipe.topology.nodes} "
            f"nodes, and none of the selected hosts ({', '.join(selected) or 'none'}) is in a unit",
            fix="roll out a single-node recipe (--recipe NAME) to single hosts, or select a unit's members")


def refuse_units(inv: Inventory, selected: Sequence[str], verb: str) -> None:
    """Refuse ``verb`` (rollout, rollback, abort) when ``selected`` holds a unit member: one message naming
    each unit, its members and the fix."""
    units = units_in(inv, selected)
    if units:
        listed = "; ".join(f"unit {u.name!r} ({', '.join(u.members)})" for u in units.values())
        members = [m for u in units.values() for m in u.members]
        exclude = ":".join(f"!{m}" for m in members)
        raise FleetError(
            f"{verb} of {listed} refused before any change: the rollout engine does not yet step a unit's "
            f"members as one (it would start each member alone, and leave the unit on two versions)",
            host=next(iter(units.values())).head,
            fix=f"leave the unit out with --limit '{exclude}', and change its members by hand together")
