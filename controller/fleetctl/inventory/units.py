"""Serving units (docs/units.md): a pair or ring of Sparks linked through their QSFP ports, serving
one model: which hosts form a unit, in which rank order, and each member's fabric, read from
``fleetctl_unit``, ``fleetctl_unit_rank`` and ``fleetctl_fabric`` and checked."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleetctl.errors import InventoryError
from fleetctl.inventory.host import Host

#: The variable naming a host's unit (usually a group var of one group per unit).
UNIT_VAR = "fleetctl_unit"


#: A member's rank in its unit (0: the head); unset on every member: the inventory's order.
RANK_VAR = "fleetctl_unit_rank"


#: A member's fabric: ``{addresses: [...], interfaces: [...], hcas: [...], mtu: 9000, rate_gbps:
#: 200}``.
FABRIC_VAR = "fleetctl_fabric"


#: The NCCL all_reduce bus bandwidth a unit must reach (GB/s), set for the unit's members.
FLOOR_VAR = "fleetctl_fabric_floor_gbs"


#: A Spark's QSFP cable port is two PCIe x4 halves, each an Ethernet netdev and a RoCE HCA
#: (docs/domain.md#the-fabric). The defaults: the outer port (the one a single cable uses), both
#: halves.
SPARK_INTERFACES = ("enp1s0f1np1", "enP2p1s0f1np1")


SPARK_HCAS = ("rocep1s0f1", "roceP2p1s0f1")


#: Jumbo frames on both ends: at 1500 the link carries a fraction of its bandwidth.
FABRIC_MTU = 9000


#: The rate ``ibstat`` reports for each HCA of a Spark linked by a 200G cable (Gb/s).
SPARK_HCA_RATE_GBPS = 200


#: The all_reduce bus bandwidth floor (GB/s) when the inventory sets none: a Spark pair with both
#: HCAs and MTU 9000 measures ~23.7 GB/s, over one half or the management network ~3.
SPARK_PAIR_BUSBW_FLOOR_GBS = 20.0


_UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")


_IFNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,14}\Z")  # Linux: at most 15 bytes


_HCA = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


_FABRIC_KEYS = ("addresses", "interfaces", "hcas", "mtu", "rate_gbps")


@dataclass(frozen=True)
class Fabric:
    """One member's side of the link: its netdevs, their addresses, its RoCE HCAs."""

    #: The netdevs of the QSFP port, in order; the first carries NCCL's and Gloo's sockets.
    interfaces: tuple[str, ...] = SPARK_INTERFACES
    #: The member's address on each interface (aligned with ``interfaces``; at least the first).
    addresses: tuple[str, ...] = ()
    #: The RoCE HCAs NCCL uses (``NCCL_IB_HCA``): both halves for the port's full bandwidth.
    hcas: tuple[str, ...] = SPARK_HCAS
    mtu: int = FABRIC_MTU
    #: The rate each HCA must report (``ibstat``'s ``Rate:``, Gb/s).
    rate_gbps: int = SPARK_HCA_RATE_GBPS

    @property
    def address(self) -> str:
        """The member's address on the fabric (``VLLM_HOST_IP``, the head's is the master
        address)."""
        return self.addresses[0]

    @property
    def interface(self) -> str:
        """The netdev NCCL, Gloo and UCX open their sockets on."""
        return self.interfaces[0]


@dataclass(frozen=True)
class Unit:
    """N hosts serving one model together, in rank order (the head first)."""

    name: str
    members: tuple[str, ...]
    fabric: Mapping[str, Fabric]
    #: The all_reduce bus bandwidth (GB/s) the unit's fabric must measure.
    busbw_floor_gbs: float = SPARK_PAIR_BUSBW_FLOOR_GBS

    @property
    def head(self) -> str:
        """Rank 0: the member whose API serves."""
        return self.members[0]

    @property
    def workers(self) -> tuple[str, ...]:
        """Ranks 1..N-1."""
        return self.members[1:]

    @property
    def size(self) -> int:
        """How many hosts the unit spans."""
        return len(self.members)

    def rank(self, host: str) -> int:
        """``host``'s rank (0: the head)."""
        return self.members.index(host)


def placed(hosts: Mapping[str, Host], units: Mapping[str, Unit]) -> dict[str, Host]:
    """The hosts, each unit member with its unit's name and its rank in it."""
    def unit(h: Host) -> Unit | None:
        return next((u for u in units.values() if h.name in u.members), None)
    return {n: replace(h, unit=u.name, unit_rank=u.members.index(n)) if (u := unit(h)) else h
            for n, h in hosts.items()}


def units_of(path: Path, hosts: Mapping[str, Host], groups: Mapping[str, tuple[str, ...]],
             declared: Mapping[str, Any]) -> dict[str, Unit]:
    """The serving units of an inventory, checked: each refusal names the host, the file and the
    fix.

    ``declared`` is each group's own ``fleetctl_unit`` (without Ansible's precedence), so that a
    host placed in two units through two groups is refused, where Ansible would keep one silently.
    """
    members = _members(path, hosts)
    _one_unit_each(path, hosts, groups, declared)
    return {unit: _unit(path, unit, names, hosts) for unit, names in members.items()}


def _members(path: Path, hosts: Mapping[str, Host]) -> dict[str, list[str]]:
    """Each unit's members in inventory order, from their ``fleetctl_unit``."""
    members: dict[str, list[str]] = {}
    for name, h in hosts.items():
        value = h.vars.get(UNIT_VAR)
        if value is None or value == "":
            continue
        if not isinstance(value, str) or not _UNIT_NAME.match(value):
            raise InventoryError(
                f"{path}: {UNIT_VAR} {value!r} is not a unit name",
                host=name,
                fix="name the unit with letters, digits and . _ -, e.g. fleetctl_unit: pair-a",
            )
        members.setdefault(value, []).append(name)
    return members


def _one_unit_each(path: Path, hosts: Mapping[str, Host], groups: Mapping[str, tuple[str, ...]],
                   declared: Mapping[str, Any]) -> None:
    """Refuse a host placed in two units through two groups (Ansible would keep one silently)."""
    for group, value in declared.items():
        for name in groups.get(group, ()):
            mine = hosts[name].vars.get(UNIT_VAR) if name in hosts else None
            if mine != value:
                others = [g for g, v in declared.items() if v == mine and name in groups.get(g, ())]
                where = f"group {others[0]}" if others else "its host vars"
                raise InventoryError(
                    f"{path}: the host is in two units: {value!r} (group {group}) and {mine!r} "
                    f"({where})",
                    host=name,
                    fix="a host serves in one unit: remove it from one of the groups, or drop the "
                        "other fleetctl_unit",
                )


def _unit(path: Path, unit: str, names: list[str], hosts: Mapping[str, Host]) -> Unit:
    """One unit, checked: two members or more, ranked, each with its own fabric address; a floor."""
    if len(names) < 2:
        raise InventoryError(
            f"{path}: unit {unit!r} has one member",
            host=names[0],
            fix=f"add its other members to the unit, or remove {UNIT_VAR} from this host",
        )
    names = _ranked(path, unit, names, hosts)
    fabric = {n: _fabric(path, unit, hosts[n]) for n in names}
    seen: dict[str, str] = {}
    for n, f in fabric.items():
        for a in f.addresses:
            if a in seen:
                raise InventoryError(
                    f"{path}: fabric address {a} of unit {unit!r} is also {seen[a]}'s", host=n,
                    fix=f"give each member its own address on the link ({FABRIC_VAR}.addresses)")
            seen[a] = n
    floor = hosts[names[0]].vars.get(FLOOR_VAR, SPARK_PAIR_BUSBW_FLOOR_GBS)
    if isinstance(floor, bool) or not isinstance(floor, int | float) or floor <= 0:
        raise InventoryError(
            f"{path}: {FLOOR_VAR} {floor!r} is not a bandwidth in GB/s", host=names[0],
            fix=f"e.g. {FLOOR_VAR}: {SPARK_PAIR_BUSBW_FLOOR_GBS} (a Spark pair measures ~23.7)")
    return Unit(unit, tuple(names), fabric, float(floor))


def _ranked(path: Path, unit: str, names: list[str], hosts: Mapping[str, Host]) -> list[str]:
    """The members in rank order: ``fleetctl_unit_rank`` when set on every member, else inventory
    order."""
    ranks = {n: hosts[n].vars.get(RANK_VAR) for n in names}
    given = [n for n, r in ranks.items() if r is not None]
    if not given:
        return names
    if len(given) != len(names):
        missing = ", ".join(n for n in names if ranks[n] is None)
        raise InventoryError(
            f"{path}: unit {unit!r} sets {RANK_VAR} on some members, not on {missing}",
            host=given[0],
            fix=f"set {RANK_VAR} (0 for the head) on every member, or on none",
        )
    numbers: dict[str, int] = {}
    for n, r in ranks.items():
        if isinstance(r, bool) or not isinstance(r, int):
            raise InventoryError(f"{path}: {RANK_VAR} {r!r} is not a number", host=n,
                                 fix=f"set {RANK_VAR}: 0 for the head, 1.. for the workers")
        numbers[n] = r
    if sorted(numbers.values()) != list(range(len(names))):
        raise InventoryError(
            f"{path}: unit {unit!r} has ranks {sorted(numbers.values())}, not 0..{len(names) - 1}",
            host=names[0],
            fix=f"number the members 0 (the head) to {len(names) - 1}, each once",
        )
    return sorted(names, key=lambda n: numbers[n])


def _fabric(path: Path, unit: str, h: Host) -> Fabric:
    """A member's :class:`Fabric` from ``fleetctl_fabric`` (Spark names by default); an address is
    required."""
    raw = h.vars.get(FABRIC_VAR)
    example = (
        f"{FABRIC_VAR}: {{addresses: [192.168.177.11]}} in its host_vars (the address of "
        f"{SPARK_INTERFACES[0]} "
        f"on the QSFP link: ip -br addr show {SPARK_INTERFACES[0]})"
    )
    if raw is None:
        raise InventoryError(
            f"{path}: member of unit {unit!r} has no fabric address",
            host=h.name,
            fix=f"set {example}",
        )
    if not isinstance(raw, Mapping):
        raise InventoryError(
            f"{path}: {FABRIC_VAR} must be a mapping", host=h.name, fix=f"write {example}"
        )
    for key in raw:
        if key not in _FABRIC_KEYS:
            raise InventoryError(f"{path}: {FABRIC_VAR}.{key} is not a fabric field", host=h.name,
                                 fix=f"use {', '.join(_FABRIC_KEYS)}")

    def names(key: str, default: tuple[str, ...], pattern: re.Pattern[str]) -> tuple[str, ...]:
        value = raw.get(key, list(default))
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(x, str) and pattern.match(x) for x in value)
        ):
            raise InventoryError(
                f"{path}: {FABRIC_VAR}.{key} {value!r} is not a list of names",
                host=h.name,
                fix=f"e.g. {key}: [{', '.join(default)}] (a Spark's names; see `ibdev2netdev`)",
            )
        return tuple(value)

    interfaces = names("interfaces", SPARK_INTERFACES, _IFNAME)
    hcas = names("hcas", SPARK_HCAS, _HCA)
    addresses = _fabric_addresses(path, unit, h, raw.get("addresses"), interfaces, example)
    out: dict[str, int] = {}
    for key, default, low, high in (
        ("mtu", FABRIC_MTU, 1280, 9216),
        ("rate_gbps", SPARK_HCA_RATE_GBPS, 1, 800),
    ):
        v = raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise InventoryError(
                f"{path}: {FABRIC_VAR}.{key} {v!r} is not a number from {low} to {high}",
                host=h.name,
                fix=f"leave it out for a Spark's {default}",
            )
        out[key] = v
    return Fabric(interfaces, addresses, hcas, out["mtu"], out["rate_gbps"])


def _fabric_addresses(path: Path, unit: str, h: Host, addresses: Any, interfaces: tuple[str, ...],
                      example: str) -> tuple[str, ...]:
    """A member's addresses on the link: at most one per interface, none its management address."""
    if not addresses:
        raise InventoryError(
            f"{path}: member of unit {unit!r} has no fabric address ({FABRIC_VAR}.addresses)",
            host=h.name,
            fix=f"set {example}",
        )
    if not isinstance(addresses, list) or len(addresses) > len(interfaces):
        raise InventoryError(
            f"{path}: {FABRIC_VAR}.addresses must be a list of at most one address per interface "
            f"({', '.join(interfaces)})",
            host=h.name,
            fix=f"write {example}",
        )
    for a in addresses:
        try:
            ipaddress.ip_address(str(a))
        except ValueError:
            raise InventoryError(
                f"{path}: {FABRIC_VAR}.addresses: {a!r} is not an IP address",
                host=h.name,
                fix=f"write {example}",
            ) from None
    if h.address in {str(a) for a in addresses}:
        raise InventoryError(
            f"{path}: fabric address {h.address} is the host's management address (ansible_host): "
            "NCCL would run "
            f"over the management network at a tenth of the link's bandwidth",
            host=h.name,
            fix=f"give {FABRIC_VAR}.addresses the address of {interfaces[0]} on the QSFP link",
        )
    return tuple(str(a) for a in addresses)
