"""The weights role's tree fan-out: which host copies from which, round by round.

Every host that holds a verified weight set serves it to the next ones: the seed
fetches once, then each round every source (the seed and every host that copied
and verified in an earlier round) serves at most ``fanout`` receivers. The hosts
holding the set grow ``(fanout + 1)`` times a round, so N hosts need
``ceil(log_{fanout+1} N)`` rounds and the seed uploads ``fanout`` times a round:
O(log N) uploads, where one seed serving everyone uploaded N - 1 times.

A round is planned from what actually happened (who verified, whose copy failed
from whom), so a failed source or receiver costs a retry from another source,
not the run. Between members of one serving unit the copy runs over the fabric
(their QSFP link) when the inventory gives fabric addresses.

Pure functions (``plan_round``, ``rounds_for``) carry the logic and are unit-tested
for 1..300 hosts; the filters read the play's hostvars and call them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence


def rounds_for(hosts: int, fanout: int) -> int:
    """Rounds of copies for ``hosts`` hosts needing the set (the seed among them), none failing."""
    if fanout < 1:
        raise ValueError(f"fanout must be at least 1, got {fanout}")
    have, rounds = 1, 0
    while have < hosts:
        have += have * fanout
        rounds += 1
    return rounds


def plan_round(
    ready: Sequence[str],
    pending: Sequence[str],
    fanout: int,
    *,
    units: Mapping[str, str] | None = None,
    failed: Mapping[str, Collection[str]] | None = None,
    needs: Mapping[str, Collection[str]] | None = None,
    has: Mapping[str, Collection[str]] | None = None,
) -> dict[str, str]:
    """One round: receiver -> source, each source serving at most ``fanout`` receivers.

    ``ready``: hosts that hold a verified set and serve it (the seed first);
    ``pending``: hosts still without it, in the order they are served;
    ``units``: host -> serving unit (a receiver copies from a member of its own unit
    first: over the fabric); ``failed``: receiver -> sources whose copy to it failed
    (never asked again); ``needs``/``has``: the weight sets (roles) a receiver needs
    and a source holds (a source must hold all of the receiver's).
    """
    if fanout < 1:
        raise ValueError(f"fanout must be at least 1, got {fanout}")
    units = units or {}
    failed = failed or {}
    load = dict.fromkeys(ready, 0)
    out: dict[str, str] = {}

    def eligible(r: str, s: str) -> bool:
        if load[s] >= fanout or s in failed.get(r, ()) or s == r:
            return False
        return needs is None or has is None or set(needs.get(r, ())) <= set(has.get(s, ()))

    # Members of a unit copy from a member that has the set: over their own link.
    for r in pending:
        unit = units.get(r)
        if not unit:
            continue
        peer = next((s for s in ready if units.get(s) == unit and eligible(r, s)), None)
        if peer is not None:
            out[r] = peer
            load[peer] += 1
    # The others from the least loaded source (the earliest ready on a tie): the load spreads.
    for r in pending:
        if r in out:
            continue
        cands = [s for s in ready if eligible(r, s)]
        if cands:
            s = min(cands, key=lambda c: load[c])
            out[r] = s
            load[s] += 1
    return out


def _get(hostvars: Mapping[str, object], host: str, key: str, default: object = None) -> object:
    hv = hostvars[host]
    return hv.get(key, default) if isinstance(hv, Mapping) else default


def _strings(hostvars: Mapping[str, object], host: str, key: str) -> list[str]:
    v = _get(hostvars, host, key)
    return [str(x) for x in v] if isinstance(v, list) else []


def _fabric_address(hostvars: Mapping[str, object], host: str) -> str:
    fabric = _get(hostvars, host, "fleetctl_fabric")
    addresses = fabric.get("addresses") if isinstance(fabric, Mapping) else None
    return str(addresses[0]) if isinstance(addresses, list) and addresses else ""


def weights_tree_round(needing: Sequence[str], hostvars: Mapping[str, object], fanout: int,
                       attempts: int) -> dict[str, dict[str, object]]:
    """The next round's copies, from the play's hostvars: receiver -> where to copy from.

    Reads ``_weights_serves`` (a host holds a verified set and accepts this run's key),
    ``_weights_have`` (it holds one), ``_weights_failed_from`` (sources whose copy to it
    failed), ``_weights_needs``/``_weights_union``, ``fleetctl_unit`` and ``fleetctl_fabric``.
    A receiver is given up after ``attempts`` failed copies.
    """
    ready = [h for h in needing if _get(hostvars, h, "_weights_serves")]
    failed = {h: _strings(hostvars, h, "_weights_failed_from") for h in needing}
    pending = [
        h
        for h in needing
        if not _get(hostvars, h, "_weights_have") and len(failed[h]) < int(attempts)
    ]
    units = {h: str(_get(hostvars, h, "fleetctl_unit") or "") for h in needing}
    needs = {h: _strings(hostvars, h, "_weights_needs") for h in needing}
    has = {h: _strings(hostvars, h, "_weights_holds") for h in needing}
    plan = plan_round(ready, pending, int(fanout), units=units, failed=failed, needs=needs, has=has)
    out: dict[str, dict[str, object]] = {}
    for r, s in plan.items():
        mgmt = str(_get(hostvars, s, "ansible_host") or s)
        fabric = _fabric_address(hostvars, s) if units[r] and units[r] == units[s] else ""
        out[r] = {
            "host": s, "address": fabric or mgmt, "via": "fabric" if fabric else "lan",
            # The source's host key is the one the controller verified for its management address.
            "host_key_alias": mgmt if fabric else "",
            "port": int(str(_get(hostvars, s, "ansible_port") or 22)),
            "user": str(_get(hostvars, s, "ansible_user") or "root"),
        }
    return out


def weights_tree_rounds(needing: Sequence[str], fanout: int, attempts: int) -> list[int]:
    """Round numbers to loop over: the tree's depth, plus one round per retry a failure may need."""
    return list(range(1, rounds_for(len(needing), int(fanout)) + int(attempts)))


def weights_tree_addresses(hosts: Sequence[str], hostvars: Mapping[str, object]) -> list[str]:
    """Every address a receiver may copy from: management addresses, and fabric ones of unit
    members."""
    out: list[str] = []
    for h in hosts:
        for a in (str(_get(hostvars, h, "ansible_host") or h), _fabric_address(hostvars, h)
                  if _get(hostvars, h, "fleetctl_unit") else ""):
            if a and a not in out:
                out.append(a)
    return out


class FilterModule:
    """Ansible's entry point for the filters above."""

    def filters(self) -> dict[str, object]:
        return {
            "weights_tree_round": weights_tree_round,
            "weights_tree_rounds": weights_tree_rounds,
            "weights_tree_addresses": weights_tree_addresses,
        }
