"""Serving units in the rollout engine (docs/units.md).

A unit (N Sparks serving one model over their fabric) changes as one: selecting a member selects
the unit (:func:`whole_units`); the planner sees it as one slot, so that waves, --max-unavailable
and --failure-budget count units (:func:`slot_names`, :func:`expand`, :func:`split_steps`,
:func:`count_failed`); a
rollback takes
every member to one version (:func:`unit_targets`). A rollout's preflight probes each unit's fabric
and parity (:func:`fabric_problems`) and refuses on any finding before any change; a multi-node
recipe on hosts of no unit is refused before any network (:func:`refuse_multinode_recipe`). The
steps: ``rollout/unit_step.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from fleetctl import bandwidth, ssh, status
from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Inventory, Unit
from fleetctl.recipes import Recipe, recipe_for
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.host import SshHostOps
from fleetctl.state import records as fleet_records

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
    """The fabric and parity findings of every unit with a member in ``selected`` (all its members
    probed, whether selected or not: a unit changes as one), one line each naming the member, the
    figure measured, the expected one and the fix; a member that could not be probed is a problem
    too (its fabric is unknown).

    The probes are ``fleetctl status``'s (its host probe and fabric probe, in parallel, bounded by
    ``ssh.fan_out``), judged by ``fleetctl.fabric``; parity against the head once every member
    answered.
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
            out.append(
                f"{h.name}: unit {h.unit}'s member did not answer ({st.error}): its fabric is "
                "unknown"
            )
        elif st.fabric is None or st.fabric.error is not None:
            why = st.fabric.error if st.fabric is not None else "not probed"
            out.append(
                f"{h.name}: the fabric probe of unit {h.unit}'s member failed ({why}): its fabric "
                "is unknown"
            )
        else:
            out += [f.message() for f in st.fabric.findings]
    return out


def bandwidth_problems(inv: Inventory, selected: Sequence[str], recipe: Recipe, ref: str,
                       pull: Callable[[Host, str], float],
                       ops: Callable[[Host], bandwidth.ProbeOps] = SshHostOps) -> list[str]:
    """Each unit's all_reduce bus bandwidth measured in the rollout's image
    (``fleetctl.bandwidth``) against
    its floor, one line per finding naming the member, the figure, the floor and the fix; a probe
    that could not run is a problem too. Only units whose every member is in ``selected`` (the hosts
    that passed the access check) are measured; the image is pulled on their members first
    (``pull``: the prefetch's own, done early for units; nothing that serves is touched), then
    probed through ``ops`` (each
    member's HostOps). Each measurement is recorded for ``fleetctl status``."""
    units = [u for u in units_in(inv, selected).values() if set(u.members) <= set(selected)]
    if not units:
        return []
    members = [inv.host(m) for u in units for m in u.members]
    pulled = ssh.fan_out(members, lambda h: pull(h, ref), timeout=None)
    out = [
        f"{n}: pulling {ref} to measure the fabric failed: {o.error.cause}"
        for n, o in pulled.items()
        if o.error is not None
    ]
    ready = [u for u in units if all(pulled[m].error is None for m in u.members)]
    recipes = {u.name: unit_recipe(inv, u, recipe) for u in ready}
    got = bandwidth.measure_units(inv, ready, recipes, ref, ops)
    for m in got.values():
        if isinstance(m, FleetError):
            out.append(m.message())
        else:
            out += [f.message() for f in m.findings]
    return out


def refuse_multinode_recipe(inv: Inventory, recipe: Recipe, selected: Sequence[str]) -> None:
    """A multi-node recipe rolled out to hosts of no unit is refused (no host touched, no
    network)."""
    singles = [n for n in selected if inv.unit_of(n) is None]
    if recipe.topology.nodes > 1 and singles:
        raise FleetError(
            f"rollout of recipe {recipe.name!r} refused before any change: it spans "
            f"{recipe.topology.nodes} "
            f"nodes, and the selected hosts {', '.join(singles)} are in no unit",
            fix="roll out a single-node recipe (--recipe NAME) to single hosts (each unit then "
                "serves its own "
            "recipe), or select only a unit's members",
        )


def unit_recipe(inv: Inventory, unit: Unit, recipe: Recipe) -> Recipe:
    """The recipe ``unit`` serves in a rollout of ``recipe``: that one when it spans the unit's
    size (``--recipe`` named a unit's recipe), else the unit's own ``fleetctl_recipe`` (a rollout of
    a single-node recipe to a mix
    of single hosts and units)."""
    if recipe.topology.nodes == unit.size:
        return recipe
    return recipe_for(inv, None, inv.host(unit.head))


def refuse_other_images(inv: Inventory, recipe: Recipe, selected: Sequence[str]) -> None:
    """One rollout pins one image digest: a unit whose own recipe runs another image is refused,
    naming it."""
    for u in units_in(inv, selected).values():
        r = unit_recipe(inv, u, recipe)
        if r.image != recipe.image:
            raise FleetError(
                f"unit {u.name!r} serves recipe {r.name!r} of image {r.image}, this rollout pins "
                f"{recipe.image} "
                f"(recipe {recipe.name!r})",
                host=u.head,
                fix=f"roll the unit out on its own: --recipe {r.name} --limit "
                    f"{','.join(u.members)}",
            )


# ---- planning: a unit is one slot
# -------------------------------------------------------------------------------


def whole_units(inv: Inventory, hosts: Sequence[Host]) -> list[Host]:
    """``hosts`` with every member of each unit they touch (a unit changes as one), in the order
    given, a
    unit's members in rank order where its first selected member stood."""
    out: list[Host] = []
    seen: set[str] = set()
    for h in hosts:
        u = inv.unit_of(h.name)
        for name in (u.members if u is not None else (h.name,)):
            if name not in seen:
                seen.add(name)
                out.append(inv.host(name))
    return out


def slot_names(inv: Inventory, names: Sequence[str]) -> list[str]:
    """The planner's slots: each single host, and each unit once, as its head."""
    out: list[str] = []
    for n in names:
        u = inv.unit_of(n)
        s = u.head if u is not None else n
        if s not in out:
            out.append(s)
    return out


def slot_versions(
    inv: Inventory,
    names: Sequence[str],
    current: Mapping[str, tuple[str | None, str | None]],
    fps: Mapping[str, str | None],
    recipe: Recipe,
    fingerprint: Callable[[Recipe], str],
) -> tuple[dict[str, tuple[str | None, str | None]], dict[str, str | None]]:
    """What each slot serves, for the planner: a single host's own; a unit's head's when every
    member serves the same digest, else nothing known (digest None: the unit needs a step); a unit
    whose members all run its own recipe's settings reads as running the rollout's (the planner
    compares one
    fingerprint)."""
    cur, fp = dict(current), dict(fps)
    for n in slot_names(inv, names):
        u = inv.unit_of(n)
        if u is None:
            continue
        if len({current.get(m, (None, None))[1] for m in u.members}) != 1:
            cur[n] = (current.get(n, (None, None))[0], None)
        mine = fingerprint(unit_recipe(inv, u, recipe))
        fp[n] = fingerprint(recipe) if all(fps.get(m) == mine for m in u.members) else None
    return cur, fp


def expand(inv: Inventory, p: wave_plan.Plan, names: Sequence[str],
           current: Mapping[str, tuple[str | None, str | None]]) -> wave_plan.Plan:
    """The plan of slots made a plan of hosts: each unit's workers in its head's wave and step,
    with its action; the waves list every member (the counts, --max-unavailable and
    --failure-budget, stay the
    planner's: in slots)."""
    by_slot = {hp.host: hp for hp in p.hosts}
    hosts: list[wave_plan.HostPlan] = []
    for n in names:
        u = inv.unit_of(n)
        if u is None or n == u.head:
            hp = by_slot[n]
            if u is not None:
                tag, digest = current.get(n, (None, None))
                hp = replace(hp, current_tag=tag, current_digest=digest)
            hosts.append(hp)
            continue
        head = by_slot[u.head]
        tag, digest = current.get(n, (None, None))
        hosts.append(
            wave_plan.HostPlan(n, head.wave, head.step, tag, digest, head.action, head.reason)
        )
    waves = tuple(tuple(m for s in wave for m in _members_of(inv, s)) for wave in p.waves)
    return replace(p, waves=waves, hosts=tuple(hosts))


def members(inv: Inventory, unit: Unit) -> list[Host]:
    """The unit's members as hosts, its head first."""
    return [inv.host(m) for m in unit.members]


def fingerprint_for(inv: Inventory, h: Host, recipe: Recipe) -> str:
    """The container settings ``h`` must run in a rollout of ``recipe`` (a unit's member: its
    unit's)."""
    unit = inv.unit_of(h.name)
    return remote.fingerprint(recipe if unit is None else unit_recipe(inv, unit, recipe))


def _members_of(inv: Inventory, name: str) -> tuple[str, ...]:
    u = inv.unit_of(name)
    return u.members if u is not None else (name,)


def _unit_name(inv: Inventory, name: str) -> str | None:
    u = inv.unit_of(name)
    return u.name if u is not None else None


def split_steps(inv: Inventory, wave: Sequence[str], max_unavailable: int) -> list[list[str]]:
    """A wave's hosts cut into steps of at most ``max_unavailable`` slots, a unit's members
    together."""
    slots: list[list[str]] = []
    index: dict[str, int] = {}
    for n in wave:
        key = _unit_name(inv, n) or n
        if key not in index:
            index[key] = len(slots)
            slots.append([])
        slots[index[key]].append(n)
    size = max(1, max_unavailable)
    return [[h for s in slots[i:i + size] for h in s] for i in range(0, len(slots), size)]


def slots(inv: Inventory, hosts: Sequence[Host]) -> list[Host]:
    """The hosts a step dispatches: each single host, and each unit's head (which steps its
    unit)."""
    return [inv.host(n) for n in slot_names(inv, [h.name for h in hosts])]


def count_failed(inv: Inventory, records: Sequence[fleet_records.HostRecord]) -> int:
    """Failed slots (rolled back or down), a unit counted once, for --failure-budget."""
    return len({_unit_name(inv, r.host) or r.host for r in records
                if r.status in (fleet_records.ROLLED_BACK, fleet_records.HOST_FAILED)})


def unit_targets(
    inv: Inventory,
    selected: Sequence[str],
    targets: dict[str, tuple[str | None, str, str]],
    skips: dict[str, str],
    fps: dict[str, str | None],
) -> None:
    """A rollback's targets made whole per unit (in place): every member of a unit with a target
    goes to that one version together (a member already there is stepped with the others); members
    whose known-goods
    differ, or one with nothing to go back to, are refused before any change, naming them."""
    for u in units_in(inv, selected).values():
        have = {m: targets[m] for m in u.members if m in targets}
        if not have:
            continue
        versions = {(t[0], t[1]) for t in have.values()}
        if len(versions) > 1:
            listed = ", ".join(f"{m} {t[0]}" for m, t in have.items())
            raise FleetError(
                f"the members of unit {u.name!r} would go back to different versions ({listed})",
                host=u.head,
                fix=f"pass --to TAG for the unit (--limit {','.join(u.members)})",
            )
        target = next(iter(have.values()))
        fp = next((fps[m] for m in have if fps.get(m)), None)
        for m in u.members:
            if m in targets:
                continue
            why = skips.pop(m, "")
            if why and not why.startswith("already there"):
                skips[m] = why
                raise FleetError(
                    f"unit {u.name!r} cannot go back together: {m} is skipped ({why})",
                    host=m,
                    fix=f"pass --to TAG for the unit (--limit {','.join(u.members)})",
                )
            targets[m] = target
            fps[m] = fp
