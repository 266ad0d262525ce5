"""The fleet model: hosts, groups and their variables, read by ansible-core from any inventory source.

fleetctl reads the same inventory Ansible does (``hosts.yml`` plus ``group_vars/``
and ``host_vars/`` beside it), so that the roles stay usable with plain
``ansible-playbook``. ansible-core parses it (every source it accepts: INI,
YAML, a directory, a dynamic script); fleetctl validates what it needs on top,
with errors naming the file, the host and the fix.

Serving units (a pair or ring of Sparks linked through their QSFP ports, serving one model) are
part of the fleet model and live here too: which hosts form a unit, in which rank order, and
each member's fabric (:class:`Unit`, :class:`Fabric`, ``fleetctl_unit``/``fleetctl_fabric``);
docs/units.md. Why one file of ~800 lines: ansible-core's view of the inventory and the checks
fleetctl adds on top read the same groups and variables.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from fleetctl import paths
from fleetctl.access import (
    Become,
    Hop,
    Route,
    Secret,
    ansible_var,
    become_from_vars,
    local_user,
    resolve_route,
)
from fleetctl.errors import FleetError, InventoryError

_FIX_FORMAT = (
    "see Ansible's inventory formats (YAML: all: hosts: / children: / vars:; INI: [group] host var=value)"
)


#: Variables holding passwords: kept out of :attr:`Host.vars` (the become one goes to :attr:`Host.become`).
_PASSWORD_VARS = ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass",
                  "ansible_password", "ansible_ssh_pass")


@dataclass(frozen=True)
class Host:
    """One Spark: how to reach it and its merged variables (all < groups < host).

    ``address``, ``port``, ``user`` and the keys are resolved as Ansible's ssh would
    (``ansible_*`` variables, then the ssh options, then ~/.ssh/config): see
    :mod:`fleetctl.access`.
    """

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    #: known_hosts file used to verify the host key (``fleetctl_known_hosts``, else UserKnownHostsFile).
    known_hosts: str | None = None
    groups: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    #: Every private key to offer (``key_file`` first, then -i/IdentityFile); empty: just ``key_file``.
    key_files: tuple[str, ...] = ()
    #: Jump hosts in front of the host (ProxyJump), first hop first.
    jumps: tuple[Hop, ...] = ()
    #: IdentitiesOnly: offer the key files alone, not the agent's keys.
    identities_only: bool = False
    #: ProxyCommand carrying the connection (``%h``/``%p``/``%r`` expanded), run through /bin/sh.
    proxy_command: str | None = None
    #: The serving unit the host is a member of (``fleetctl_unit``), None for a single host.
    unit: str | None = None
    #: The host's rank in its unit (0: the head), None for a single host.
    unit_rank: int | None = None
    #: How commands that need root run (``ansible_become*``); its password never shows.
    become: Become = field(default_factory=Become, compare=False)
    #: Why fleetctl's direct SSH cannot reach the host as the inventory says (an ssh option it
    #: cannot honour): raised by the first direct step, while playbooks still run.
    route_error: InventoryError | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        """``name (address)`` for messages."""
        return f"{self.name} ({self.address})"

    def hop(self) -> Hop:
        """The last hop of the route: this host itself."""
        keys = self.key_files or ((self.key_file,) if self.key_file else ())
        return Hop(self.address, self.port, self.user, keys, self.known_hosts, self.identities_only)


@dataclass(frozen=True)
class Inventory:
    """The parsed inventory: hosts in file order, groups, and the file it came from."""

    path: Path
    hosts: Mapping[str, Host]
    groups: Mapping[str, tuple[str, ...]]
    #: Variables of the ``all`` group (merged with group_vars/all).
    vars: Mapping[str, Any]
    #: ansible-core's InventoryManager, which resolves ``--limit`` patterns.
    _ansible: Any = field(default=None, compare=False, repr=False)
    #: Serving units by name, in inventory order (see :func:`units_of`).
    units: Mapping[str, Unit] = field(default_factory=dict)

    def unit_of(self, host: str) -> Unit | None:
        """The unit ``host`` is a member of, or None for a single host."""
        name = self.hosts[host].unit if host in self.hosts else None
        return self.units.get(name) if name else None

    def host(self, name: str) -> Host:
        """The host called ``name``, or an InventoryError naming the known ones."""
        try:
            return self.hosts[name]
        except KeyError:
            raise InventoryError(
                f"no host {name!r} in {self.path}",
                fix=f"use one of: {', '.join(self.hosts) or '(none)'}",
            ) from None

    def _names(self, most: int = 12) -> str:
        """The hosts and groups, for a message (cut on a large fleet)."""
        def cut(names: list[str]) -> str:
            more = f" and {len(names) - most} more" if len(names) > most else ""
            return ", ".join(names[:most]) + more if names else "(none)"
        return f"hosts: {cut(list(self.hosts))}; groups: {cut(list(self.groups))}"

    def select(self, limit: str | None = None) -> list[Host]:
        """The hosts matching an Ansible ``--limit`` pattern, in inventory order.

        The pattern is resolved by ansible-core itself (``a:b``, ``a,b``,
        ``!x``, ``&g``, globs, ``~regex``, ``g[0:2]``), so fleetctl selects exactly
        what ``ansible-playbook --limit`` would. On top of Ansible, a positive
        pattern that matches nothing is an error, because a typo must never
        silently select fewer hosts.
        """
        if not self.hosts:
            raise InventoryError(f"{self.path} has no hosts", fix="list your Sparks under a group in the inventory "
                                 "(see inventory/example/hosts.yml), or bring the lab up: fleetctl lab up")
        if limit is None:
            return list(self.hosts.values())
        if self._ansible is None:
            raise InventoryError(f"{self.path}: this inventory was not loaded by inventory.load()",
                                 fix="build Inventory objects with fleetctl.inventory.load()")
        from ansible.inventory.manager import split_host_pattern

        patterns = split_host_pattern(limit) if limit.strip() else []
        if not [p for p in patterns if p.strip("!&")]:
            # Ansible reads an empty pattern as "all": for a rollout that is the whole fleet.
            raise InventoryError(f"--limit {limit!r} is empty", fix=f"name hosts or groups: {self._names()}")
        if limit.count("[") != limit.count("]"):
            # Ansible reads "[" as the start of a subscript and drops what it cannot parse
            # ("~spark-[" becomes "~spark-"): a typo would select other hosts than written.
            raise InventoryError(f"--limit {limit!r} is not a valid pattern (unbalanced brackets)",
                                 fix="close the bracket: a subscript is g[0], g[0:2] or g[1:]")
        for pat in patterns:
            body = pat.lstrip("!&")
            if body.startswith("~"):
                try:
                    re.compile(body[1:])
                except re.error as e:
                    # Ansible would otherwise match such a pattern as a plain name, or fail inside.
                    raise InventoryError(f"--limit {pat!r} is not a valid regular expression ({e})",
                                         fix="write a Python regex after ~, e.g. --limit '~spark-0[1-3]'") from None
        with _ansible_warnings():  # "could not match": reported below as an error
            for pat in patterns:
                if pat[:1] in ("!", "&"):
                    continue
                if not any(h.name in self.hosts for h in self._ansible.get_hosts(pat)):
                    raise InventoryError(f"--limit {pat!r} matches no host or group in {self.path}",
                                         fix=self._names())
            chosen = {h.name for h in self._ansible.get_hosts(limit)}
        if not chosen.intersection(self.hosts):
            raise InventoryError(f"--limit {limit!r} selects no host in {self.path} (its exclusions remove "
                                 "every host its patterns match)", fix=self._names())
        return [h for name, h in self.hosts.items() if name in chosen]


def default_inventory_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``--inventory``, else ``$FLEETCTL_INVENTORY``, else the lab's inventory."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("FLEETCTL_INVENTORY")
    if env:
        return Path(env)
    return paths.lab_inventory()


def load(path: str | os.PathLike[str] | None = None, *,
         vault_password_file: str | os.PathLike[str] | None = None) -> Inventory:
    """Read any inventory source Ansible reads, through ansible-core itself.

    INI, YAML (nested children), a directory of sources or an executable
    dynamic-inventory script; group_vars/ and host_vars/ beside it are applied
    with Ansible's own precedence, so fleetctl and ``ansible-playbook`` can never
    disagree about a host's variables. A directory holding ``hosts.yml`` keeps
    naming that file, as before, so existing state directories stay put.

    Vault-encrypted values are decrypted as ``ansible-playbook`` does, with
    ``vault_password_file`` or else ``$ANSIBLE_VAULT_PASSWORD_FILE`` (or ansible.cfg's
    ``vault_password_file``); without one, a vaulted become password fails only when
    a command needs it, with a message saying so.
    """
    p = default_inventory_path(path)
    if p.is_dir() and (p / "hosts.yml").is_file():
        p = p / "hosts.yml"
    if not p.exists():
        fix = (
            "run `fleetctl lab up` to create the lab's inventory"
            if p == paths.lab_inventory()
            else "pass --inventory PATH or set FLEETCTL_INVENTORY"
        )
        raise InventoryError(f"inventory {p} does not exist", fix=fix)
    if p.is_file() and p.suffix in (".yml", ".yaml"):
        # a syntax error gets its line and column here, not a generic "failed to parse"
        _check_yaml_file(p, mapping=False)
    _check_var_files(p)
    if p.is_file() and os.access(p, os.X_OK):
        _check_script_answers(p)
    manager, variables, vault = _ansible_load(p, vault_password_file)
    all_group = manager.groups["all"]
    hosts_out: dict[str, Host] = {}
    internal = _internal_vars()
    memo: dict[int, tuple[Any, Any]] = {}
    for h in manager.get_hosts("all"):
        raw = dict(variables.get_vars(host=h, include_hostvars=False, stage="all"))
        password = _become_password(h.name, raw, vault, variables._loader)
        rendered, render_error = _render_connection_vars(raw, variables._loader)
        # the magic variables go first: `groups` alone lists every host, for every host
        for name in _secret_names(raw) | internal:
            raw.pop(name, None)
        merged = {**_plain_vars(raw, vault, memo), **rendered}
        groups = tuple(g.name for g in h.get_groups() if g.name not in ("all", "ungrouped"))
        hosts_out[h.name] = _make_host(p, h.name, merged, groups, password, render_error)
    groups_out = {
        name: tuple(x.name for x in g.get_hosts()) for name, g in manager.groups.items() if name != "ungrouped"
    }
    # each group's own fleetctl_unit, read only for groups holding a unit member (no cost without units)
    members = {n for n, h in hosts_out.items() if h.vars.get(UNIT_VAR)}
    declared = {name: v for name, g in manager.groups.items() if members and name not in ("all", "ungrouped")
                and members.intersection(x.name for x in g.get_hosts())
                and (v := _group_vars(manager, g, vault).get(UNIT_VAR)) is not None}
    units = units_of(p, hosts_out, groups_out, declared)
    hosts_out = {n: replace(h, unit=u.name, unit_rank=u.members.index(n)) if (u := _unit_named(units, h)) else h
                 for n, h in hosts_out.items()}
    return Inventory(path=p, hosts=hosts_out, groups=groups_out, vars=_group_vars(manager, all_group, vault),
                     _ansible=manager, units=units)


# ---- serving units (docs/units.md) --------------------------------------------------------------

#: The variable naming a host's unit (usually a group var of one group per unit).
UNIT_VAR = "fleetctl_unit"
#: A member's rank in its unit (0: the head); unset on every member: the inventory's order.
RANK_VAR = "fleetctl_unit_rank"
#: A member's fabric: ``{addresses: [...], interfaces: [...], hcas: [...], mtu: 9000, rate_gbps: 200}``.
FABRIC_VAR = "fleetctl_fabric"
#: The NCCL all_reduce bus bandwidth a unit must reach (GB/s), set for the unit's members.
FLOOR_VAR = "fleetctl_fabric_floor_gbs"
#: A Spark's QSFP cable port is two PCIe x4 halves, each an Ethernet netdev and a RoCE HCA
#: (docs/domain.md#the-fabric). The defaults: the outer port (the one a single cable uses), both halves.
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
        """The member's address on the fabric (``VLLM_HOST_IP``, the head's is the master address)."""
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


def _unit_named(units: Mapping[str, Unit], h: Host) -> Unit | None:
    return next((u for u in units.values() if h.name in u.members), None)


def units_of(path: Path, hosts: Mapping[str, Host], groups: Mapping[str, tuple[str, ...]],
             declared: Mapping[str, Any]) -> dict[str, Unit]:
    """The serving units of an inventory, checked: each refusal names the host, the file and the fix.

    ``declared`` is each group's own ``fleetctl_unit`` (without Ansible's precedence), so that a host
    placed in two units through two groups is refused, where Ansible would keep one silently.
    """
    members: dict[str, list[str]] = {}
    for name, h in hosts.items():
        value = h.vars.get(UNIT_VAR)
        if value is None or value == "":
            continue
        if not isinstance(value, str) or not _UNIT_NAME.match(value):
            raise InventoryError(f"{path}: {UNIT_VAR} {value!r} is not a unit name", host=name,
                                 fix="name the unit with letters, digits and . _ -, e.g. fleetctl_unit: pair-a")
        members.setdefault(value, []).append(name)
    for group, value in declared.items():
        for name in groups.get(group, ()):
            mine = hosts[name].vars.get(UNIT_VAR) if name in hosts else None
            if mine != value:
                others = [g for g, v in declared.items() if v == mine and name in groups.get(g, ())]
                where = f"group {others[0]}" if others else "its host vars"
                raise InventoryError(
                    f"{path}: the host is in two units: {value!r} (group {group}) and {mine!r} ({where})", host=name,
                    fix="a host serves in one unit: remove it from one of the groups, or drop the other fleetctl_unit")
    out: dict[str, Unit] = {}
    for unit, names in members.items():
        if len(names) < 2:
            raise InventoryError(f"{path}: unit {unit!r} has one member", host=names[0],
                                 fix=f"add its other members to the unit, or remove {UNIT_VAR} from this host")
        names = _ranked(path, unit, names, hosts)
        fabric = {n: _fabric(path, unit, hosts[n]) for n in names}
        seen: dict[str, str] = {}
        for n, f in fabric.items():
            for a in f.addresses:
                if a in seen:
                    raise InventoryError(f"{path}: fabric address {a} of unit {unit!r} is also {seen[a]}'s", host=n,
                                         fix=f"give each member its own address on the link ({FABRIC_VAR}.addresses)")
                seen[a] = n
        floor = hosts[names[0]].vars.get(FLOOR_VAR, SPARK_PAIR_BUSBW_FLOOR_GBS)
        if isinstance(floor, bool) or not isinstance(floor, int | float) or floor <= 0:
            raise InventoryError(f"{path}: {FLOOR_VAR} {floor!r} is not a bandwidth in GB/s", host=names[0],
                                 fix=f"e.g. {FLOOR_VAR}: {SPARK_PAIR_BUSBW_FLOOR_GBS} (a Spark pair measures ~23.7)")
        out[unit] = Unit(unit, tuple(names), fabric, float(floor))
    return out


def _ranked(path: Path, unit: str, names: list[str], hosts: Mapping[str, Host]) -> list[str]:
    """The members in rank order: ``fleetctl_unit_rank`` when set on every member, else inventory order."""
    ranks = {n: hosts[n].vars.get(RANK_VAR) for n in names}
    given = [n for n, r in ranks.items() if r is not None]
    if not given:
        return names
    if len(given) != len(names):
        missing = ", ".join(n for n in names if ranks[n] is None)
        raise InventoryError(f"{path}: unit {unit!r} sets {RANK_VAR} on some members, not on {missing}",
                             host=given[0], fix=f"set {RANK_VAR} (0 for the head) on every member, or on none")
    numbers: dict[str, int] = {}
    for n, r in ranks.items():
        if isinstance(r, bool) or not isinstance(r, int):
            raise InventoryError(f"{path}: {RANK_VAR} {r!r} is not a number", host=n,
                                 fix=f"set {RANK_VAR}: 0 for the head, 1.. for the workers")
        numbers[n] = r
    if sorted(numbers.values()) != list(range(len(names))):
        raise InventoryError(f"{path}: unit {unit!r} has ranks {sorted(numbers.values())}, not 0..{len(names) - 1}",
                             host=names[0], fix=f"number the members 0 (the head) to {len(names) - 1}, each once")
    return sorted(names, key=lambda n: numbers[n])


def _fabric(path: Path, unit: str, h: Host) -> Fabric:
    """A member's :class:`Fabric` from ``fleetctl_fabric`` (Spark names by default); an address is required."""
    raw = h.vars.get(FABRIC_VAR)
    example = f"{FABRIC_VAR}: {{addresses: [192.168.177.11]}} in its host_vars (the address of {SPARK_INTERFACES[0]} " \
              f"on the QSFP link: ip -br addr show {SPARK_INTERFACES[0]})"
    if raw is None:
        raise InventoryError(f"{path}: member of unit {unit!r} has no fabric address", host=h.name, fix=f"set {example}")
    if not isinstance(raw, Mapping):
        raise InventoryError(f"{path}: {FABRIC_VAR} must be a mapping", host=h.name, fix=f"write {example}")
    for key in raw:
        if key not in _FABRIC_KEYS:
            raise InventoryError(f"{path}: {FABRIC_VAR}.{key} is not a fabric field", host=h.name,
                                 fix=f"use {', '.join(_FABRIC_KEYS)}")

    def names(key: str, default: tuple[str, ...], pattern: re.Pattern[str]) -> tuple[str, ...]:
        value = raw.get(key, list(default))
        if not isinstance(value, list) or not value or not all(isinstance(x, str) and pattern.match(x) for x in value):
            raise InventoryError(f"{path}: {FABRIC_VAR}.{key} {value!r} is not a list of names", host=h.name,
                                 fix=f"e.g. {key}: [{', '.join(default)}] (a Spark's names; see `ibdev2netdev`)")
        return tuple(value)

    interfaces = names("interfaces", SPARK_INTERFACES, _IFNAME)
    hcas = names("hcas", SPARK_HCAS, _HCA)
    addresses = raw.get("addresses")
    if not addresses:
        raise InventoryError(f"{path}: member of unit {unit!r} has no fabric address ({FABRIC_VAR}.addresses)",
                             host=h.name, fix=f"set {example}")
    if not isinstance(addresses, list) or len(addresses) > len(interfaces):
        raise InventoryError(f"{path}: {FABRIC_VAR}.addresses must be a list of at most one address per interface "
                             f"({', '.join(interfaces)})", host=h.name, fix=f"write {example}")
    for a in addresses:
        try:
            ipaddress.ip_address(str(a))
        except ValueError:
            raise InventoryError(f"{path}: {FABRIC_VAR}.addresses: {a!r} is not an IP address", host=h.name,
                                 fix=f"write {example}") from None
    if h.address in {str(a) for a in addresses}:
        raise InventoryError(
            f"{path}: fabric address {h.address} is the host's management address (ansible_host): NCCL would run "
            f"over the management network at a tenth of the link's bandwidth", host=h.name,
            fix=f"give {FABRIC_VAR}.addresses the address of {interfaces[0]} on the QSFP link")
    out: dict[str, int] = {}
    for key, default, low, high in (("mtu", FABRIC_MTU, 1280, 9216), ("rate_gbps", SPARK_HCA_RATE_GBPS, 1, 800)):
        v = raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise InventoryError(f"{path}: {FABRIC_VAR}.{key} {v!r} is not a number from {low} to {high}",
                                 host=h.name, fix=f"leave it out for a Spark's {default}")
        out[key] = v
    return Fabric(interfaces, tuple(str(a) for a in addresses), hcas, out["mtu"], out["rate_gbps"])


_NO_VAULT_FIX = "pass --vault-password-file FILE or set ANSIBLE_VAULT_PASSWORD_FILE, as for ansible-playbook"


def _become_password(name: str, v: Mapping[str, Any], vault: str | None, loader: Any) -> Secret | None:
    """``ansible_become_password`` as a :class:`Secret`; one that cannot be opened fails on use.

    The value may be vaulted, or (Ansible's usual indirection) a template naming a vaulted
    variable, ``"{{ vault_become_password }}"``: rendered as Ansible would, with the host's vars.
    """
    raw = next((v[k] for k in ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass")
                if v.get(k) is not None), None)
    if raw is None:
        return None
    templated = isinstance(raw, str) and ("{{" in raw or "{%" in raw)
    if not templated and not _is_vaulted(raw):
        return Secret(str(raw))
    try:
        if templated:
            from ansible.template import Templar

            return Secret(str(Templar(loader=loader, variables=v).template(raw)))
        return Secret(format(raw, ""))
    except Exception:  # not quoted: ansible's errors may quote the template or the ciphertext's origin
        if vault is None:
            return Secret(None, FleetError("ansible_become_password is vault-encrypted and no vault password was given",
                                           host=name, fix=_NO_VAULT_FIX))
        return Secret(None, FleetError(
            f"ansible_become_password cannot be {'rendered' if templated else 'decrypted'} "
            f"with the vault password in {vault}", host=name,
            fix="give the vault password file the value was encrypted with, and check the variable it names"))


#: The variables that say how to reach a host: rendered when they are templates, as a play would.
_CONNECTION_VARS = ("ansible_host", "ansible_ssh_host", "ansible_port", "ansible_ssh_port", "ansible_user",
                    "ansible_ssh_user", "ansible_ssh_private_key_file", "ansible_private_key_file",
                    "ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_become", "ansible_become_user",
                    "ansible_become_method", "fleetctl_known_hosts")


def _render_connection_vars(v: Mapping[str, Any], loader: Any) -> tuple[dict[str, str], str | None]:
    """The connection variables that are templates (``"{{ inventory_hostname }}.lan"``, ``-J {{ bastion }}``),
    rendered with the host's variables; or why one cannot be."""
    out: dict[str, str] = {}
    templar = None
    for k in _CONNECTION_VARS:
        value = v.get(k)
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            from ansible.template import Templar

            templar = templar or Templar(loader=loader, variables=v)
            try:
                out[k] = str(templar.template(value))
            except Exception as e:  # undefined variable, vaulted value without the vault password...
                return out, f"{k} {str(value)!r} cannot be rendered: {' '.join(str(e).split())[:200]}"
    return out, None


def _secret_names(v: Mapping[str, Any]) -> set[str]:
    """The password variables, and those their templates name (``vault_become_password``)."""
    names = set(_PASSWORD_VARS)
    for k in _PASSWORD_VARS:
        if isinstance(v.get(k), str):
            names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", " ".join(re.findall(r"{{(.*?)}}", v[k]))))
    return names


def _is_vaulted(value: Any) -> bool:
    from ansible.parsing.vault import EncryptedString

    return isinstance(value, EncryptedString)


def _unvault(value: Any, vault: str | None) -> Any:
    """Vault-encrypted values decrypted (as Ansible gives them to a play), or marked when they cannot be."""
    if isinstance(value, Mapping):
        return {k: _unvault(x, vault) for k, x in value.items()}
    if isinstance(value, list | tuple):
        return [_unvault(x, vault) for x in value]
    if _is_vaulted(value):
        if vault is None:
            return "<vault-encrypted: no vault password given>"
        try:
            return format(value, "")
        except Exception:
            return f"<vault-encrypted: cannot be decrypted with {vault}>"
    return value


def _internal_vars() -> frozenset[str]:
    from ansible import constants as C

    # the magic variables Ansible adds per host (groups, omit, playbook_dir...) are
    # dropped exactly as `ansible-inventory --list` drops them
    return frozenset(C.INTERNAL_STATIC_VARS) | {"groups", "group_names", "inventory_hostname",
                                                  "inventory_hostname_short", "omit", "inventory_file",
                                                  "inventory_dir", "playbook_dir", "ansible_playbook_python",
                                                  "ansible_config_file", "ansible_version", "ansible_facts",
                                                  "ansible_check_mode", "ansible_diff_mode", "ansible_forks",
                                                  "ansible_inventory_sources", "ansible_skip_tags",
                                                  "ansible_run_tags", "ansible_verbosity", "ansible_limit",
                                                  "ansible_play_hosts", "ansible_play_batch",
                                                  "ansible_play_hosts_all", "ansible_search_path",
                                                  "ansible_collection_name", "ansible_role_names",
                                                  "ansible_play_role_names", "ansible_dependent_role_names",
                                                  "ansible_play_name", "environment", "vars", "hostvars"}


def _ansible_load(p: Path, vault_password_file: str | os.PathLike[str] | None = None) -> tuple[Any, Any, str | None]:
    """ansible-core's InventoryManager and VariableManager over ``p``, and the vault password file used."""
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    # an unparsable source must fail loudly; Ansible's default only warns and
    # leaves an empty inventory, which would silently select no host
    C.INVENTORY_ANY_UNPARSED_IS_FAILED = True
    C.INVENTORY_UNPARSED_IS_FAILED = True
    from ansible.plugins.vars import host_group_vars

    # the group_vars/host_vars plugin caches which files exist per directory for
    # the life of the process (right for one ansible-playbook run); a long-lived
    # controller must see a vars file added or removed since the last load
    host_group_vars.FOUND.clear()
    loader = DataLoader()
    vault = _vault_secrets(loader, vault_password_file)
    with _ansible_warnings() as warnings:
        try:
            manager = InventoryManager(loader=loader, sources=[str(p)])
            variables = VariableManager(loader=loader, inventory=manager)
        except AnsibleError as e:
            warnings.append(str(e))
    if warnings:
        # every plugin reports why it refused the file; the one for its format says the real cause
        likely = "'yaml' plugin" if p.suffix in (".yml", ".yaml") else "'ini' plugin"
        cause = next((w for w in warnings if likely in w), warnings[0])
        raise InventoryError(
            f"{p}: ansible-core cannot read this inventory: {' '.join(cause.split())}",
            fix=f"check it with `ansible-inventory -i {p} --list`; {_FIX_FORMAT}",
        )
    return manager, variables, vault


def _vault_secrets(loader: Any, explicit: str | os.PathLike[str] | None) -> str | None:
    """Give ansible-core the vault password ``ansible-playbook`` would use; returns its file, or None."""
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultSecretsContext, get_file_vault_secret

    path = explicit or os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE") or C.DEFAULT_VAULT_PASSWORD_FILE
    secrets: list[tuple[str, Any]] = []
    if path:
        path = str(Path(path).expanduser())
        try:
            secret = get_file_vault_secret(filename=path, vault_id=C.DEFAULT_VAULT_IDENTITY, loader=loader)
            secret.load()
        except AnsibleError as e:
            raise InventoryError(f"vault password file {path}: {' '.join(str(e).split())}",
                                 fix="give a readable file holding the vault password (or an executable printing it)") from None
        secrets.append((C.DEFAULT_VAULT_IDENTITY, secret))
    loader.set_vault_secrets(secrets)
    # ansible-core reads the secrets of an encrypted value from one process-wide context, set once
    # per ansible-playbook run; a long-lived controller may load again with another file
    ctx = VaultSecretsContext.current(optional=True)
    if ctx is None:
        VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    else:
        ctx.secrets = secrets
    return path or None


@contextlib.contextmanager
def _ansible_warnings() -> Iterator[list[str]]:
    """Collect what ansible-core would print as warnings, instead of printing it.

    Ansible skips a malformed group or host with a warning on stderr and goes on;
    for a fleet that is a silently smaller fleet, so the caller turns them into
    one error (and the core never prints).
    """
    from ansible.utils.display import Display

    display = Display()
    warnings: list[str] = []

    def collect(msg: str, *_: Any, **kw: Any) -> None:
        exc = kw.get("exception")
        warnings.append(f"{msg} {exc}".strip() if exc else msg)

    saved = display.__dict__.get("warning"), display.__dict__.get("error_as_warning")
    display.warning = collect
    display.error_as_warning = collect
    try:
        yield warnings
    finally:
        for name, was in zip(("warning", "error_as_warning"), saved, strict=True):
            if was is None:
                display.__dict__.pop(name, None)
            else:
                setattr(display, name, was)


def _group_vars(manager: Any, group: Any, vault: str | None) -> dict[str, Any]:
    from ansible.utils.vars import combine_vars
    from ansible.vars.plugins import get_vars_from_inventory_sources

    raw = combine_vars(group.get_vars(),
                       get_vars_from_inventory_sources(manager._loader, manager._sources, [group], "all"))
    secret = _secret_names(raw)
    raw = {k: x for k, x in raw.items() if k not in secret}
    out: dict[str, Any] = _plain(_unvault(raw, vault))
    return out


def _plain(value: Any) -> Any:
    """Ansible 2.19's trust-tagged str/int/dict subclasses as plain Python values."""
    return json.loads(json.dumps(value, default=str))


def _plain_vars(raw: Mapping[str, Any], vault: str | None, memo: dict[int, tuple[Any, Any]]) -> dict[str, Any]:
    """:func:`_plain` of :func:`_unvault` of each variable, each shared value converted once per load.

    Ansible gives every host of a group the same objects for the group's variables (the recipes
    of group_vars/all are one dict for 10,000 hosts): converting them once, not once per host, is
    most of the time an inventory of thousands of hosts takes to load. Host.vars are read-only,
    so hosts may share the converted values. The memo holds the originals, so an id is never reused.
    """
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if isinstance(v, Mapping | list | tuple):
            hit = memo.get(id(v))
            if hit is None or hit[0] is not v:
                hit = memo[id(v)] = (v, _plain(_unvault(v, vault)))
            out[k] = hit[1]
        else:
            out[k] = _plain(_unvault(v, vault))
    return out


def _make_host(path: Path, name: str, v: Mapping[str, Any], groups: tuple[str, ...],
               password: Secret | None = None, render_error: str | None = None) -> Host:
    try:
        if render_error:
            raise InventoryError(render_error, host=name, fix="define the variables it names for this host")
        route = resolve_route(name, v)
        route_error = None
    except InventoryError as e:
        # only fleetctl's direct SSH needs the route: playbooks (ssh itself) still run, and
        # the first direct step on this host raises this
        route_error = InventoryError(f"{path}: {e.cause}", host=name, fix=e.fix)
        try:
            port = int(ansible_var(v, "port") or 22)
        except (TypeError, ValueError):
            raise InventoryError(f"{path}: ansible_port {ansible_var(v, 'port')!r} is not a number", host=name,
                                 fix="set ansible_port: 22") from None
        route = Route(Hop(str(ansible_var(v, "host") or name), port, str(ansible_var(v, "user") or local_user())))
    t = route.target
    if not 1 <= t.port <= 65535:
        # paramiko would wrap 99999 into another port (34463) and call -5 "Servname not supported".
        raise InventoryError(f"{path}: ansible_port {t.port} is not a TCP port (1-65535)", host=name,
                             fix="set ansible_port to the host's SSH port, usually 22")
    return Host(
        name=name,
        address=t.address,
        port=t.port,
        user=t.user,
        key_file=t.key_files[0] if t.key_files else None,
        known_hosts=t.known_hosts,
        groups=groups,
        vars=dict(v),
        key_files=t.key_files,
        jumps=route.jumps,
        identities_only=t.identities_only,
        proxy_command=route.proxy_command,
        become=become_from_vars(v, password),
        route_error=route_error,
    )


#: Bounds on every inventory file read before ansible-core parses it: its size, and the number of
#: values it expands to (a few hundred bytes of nested YAML aliases expand to gigabytes).
MAX_FILE_BYTES = 16 << 20
MAX_YAML_VALUES = 2_000_000
#: Extensions Ansible reads in group_vars/ and host_vars/ (a file without one included).
_VAR_SUFFIXES = ("", ".yml", ".yaml", ".json")


#: Seconds a dynamic inventory script may take to list the fleet ($FLEETCTL_INVENTORY_TIMEOUT).
SCRIPT_TIMEOUT = 60.0


def _check_script_answers(script: Path) -> None:
    """Run a dynamic inventory script's ``--list`` once, bounded: ansible-core would wait for ever.

    The script runs a second time inside ansible-core; a script that answers once within the
    bound is trusted to answer again.
    """
    import subprocess

    timeout = float(os.environ.get("FLEETCTL_INVENTORY_TIMEOUT") or SCRIPT_TIMEOUT)
    try:
        r = subprocess.run([str(script), "--list"], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InventoryError(f"{script}: the dynamic inventory script did not answer --list within {timeout:.0f} s",
                             fix="check the script (what it calls may hang), or raise FLEETCTL_INVENTORY_TIMEOUT") from None
    except OSError as e:
        raise InventoryError(f"{script}: cannot run the inventory script: {e.strerror}",
                             fix="check its #! line and permissions") from None
    if r.returncode != 0:
        tail = (r.stderr.decode(errors="replace").strip().splitlines() or [f"exit code {r.returncode}"])[-1]
        raise InventoryError(f"{script}: the dynamic inventory script failed: {tail[:200]}",
                             fix="run it by hand with --list to see why")


def _check_var_files(source: Path) -> None:
    """Every file of ``group_vars/`` and ``host_vars/`` beside ``source``: bounded, valid YAML, a mapping.

    ansible-core reports these as a traceback without file or line (or, for an alias bomb, runs out of
    memory); each is one InventoryError here, naming the file, line and column.
    """
    base = source if source.is_dir() else source.parent
    for sub in ("group_vars", "host_vars"):
        root = base / sub
        if not root.is_dir():
            continue
        for f in sorted(root.rglob("*")):
            if f.is_file() and f.suffix in _VAR_SUFFIXES and not f.name.startswith("."):
                _check_yaml_file(f, mapping=True)


def _check_yaml_file(path: Path, mapping: bool) -> None:
    """Refuse a file that is too large, not text, not YAML, expands without bound, or (``mapping``) not a mapping."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InventoryError(f"{path}: {size} bytes, more than an inventory file may hold ({MAX_FILE_BYTES})",
                                 fix="split it, or check that this is the file you meant")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InventoryError(f"{path}: not UTF-8 text (byte {e.start}): a binary file?",
                             fix="point the inventory at its YAML or INI file") from None
    except OSError as e:
        raise InventoryError(f"{path}: cannot read: {e.strerror}", fix="check the path and permissions") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)  # nodes only: no value is built, tags (!vault) kept
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InventoryError(f"{path}: not valid YAML{where}: {problem}", fix="correct the YAML syntax") from None
    if node is None:
        return
    if _expanded_size(node) > MAX_YAML_VALUES:
        raise InventoryError(f"{path}: expands to more than {MAX_YAML_VALUES} values through YAML aliases",
                             fix="write the values out, or use fewer nested aliases (&anchor / *alias)")
    if mapping and not isinstance(node, yaml.MappingNode):
        raise InventoryError(f"{path}: line {node.start_mark.line + 1}: variables must be a mapping "
                             f"(name: value), not a {type(node).__name__.removesuffix('Node').lower()}",
                             fix="write the variables as `name: value` lines")


def _expanded_size(root: yaml.Node) -> int:
    """How many values ``root`` stands for once every alias is expanded (each node counted once per use)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # iterative post-order: deep nesting must not overflow Python's stack
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done or not children:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[id(node)] > MAX_YAML_VALUES:
                return sizes[id(node)]
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


class _TagTolerantLoader(yaml.SafeLoader):
    """SafeLoader that accepts Ansible's tags (``!vault``, ``!unsafe``): ansible-core gives them meaning."""


_TagTolerantLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _read_yaml(path: Path) -> Any:
    try:
        with path.open() as f:
            return yaml.load(f, Loader=_TagTolerantLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InventoryError(f"{path}: not valid YAML{where}: {problem}", fix="correct the YAML syntax") from None
    except OSError as e:
        raise InventoryError(f"{path}: cannot read: {e.strerror}", fix="check the path and permissions") from None


def _read_vars_dir(base: Path, name: str) -> dict[str, Any]:
    """Variables from ``base/name.yml`` or every ``*.yml`` in ``base/name/`` (sorted)."""
    out: dict[str, Any] = {}
    files: Iterable[Path] = []
    if (base / name).is_dir():
        files = sorted(q for q in (base / name).iterdir() if q.suffix in (".yml", ".yaml"))
    else:
        files = [q for q in (base / f"{name}.yml", base / f"{name}.yaml") if q.exists()]
    for f in files:
        data = _read_yaml(f)
        if data is None:
            continue
        if not isinstance(data, dict):
            raise InventoryError(f"{f}: must be a mapping of variable: value", fix="wrap the values in name: value pairs")
        out.update(data)
    return out
