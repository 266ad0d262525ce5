"""The fleet model: hosts, groups and their variables, read by ansible-core from any inventory
source.

fleetctl reads the same inventory Ansible does (``hosts.yml`` plus ``group_vars/``
and ``host_vars/`` beside it), so that the roles stay usable with plain
``ansible-playbook``. ansible-core parses it (every source it accepts: INI,
YAML, a directory, a dynamic script); fleetctl validates what it needs on top,
with errors naming the file, the host and the fix.

The concept's parts live beside this module: ``host`` (one Spark), ``units`` (serving units and
their fabric, docs/units.md), ``sources`` (reading a source through ansible-core) and ``files``
(the checks on the inventory's files before it is read). Their public names stay reachable here
(``inventory.Host``, ``inventory.Unit``, ``inventory.UNIT_VAR``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.errors import InventoryError
from fleetctl.inventory.files import (
    MAX_FILE_BYTES,
    MAX_YAML_VALUES,
    SCRIPT_TIMEOUT,
    check_source,
    check_var_files,
)
from fleetctl.inventory.host import Host
from fleetctl.inventory.sources import (
    ansible_load,
    ansible_warnings,
    declared_units,
    group_vars,
    read_hosts,
)
from fleetctl.inventory.units import (
    FABRIC_MTU,
    FABRIC_VAR,
    FLOOR_VAR,
    RANK_VAR,
    SPARK_HCA_RATE_GBPS,
    SPARK_HCAS,
    SPARK_INTERFACES,
    SPARK_PAIR_BUSBW_FLOOR_GBS,
    UNIT_VAR,
    Fabric,
    Unit,
    placed,
    units_of,
)

# The parts' public names, reachable as inventory.NAME as when they were all in one module.
__all__ = [
    "FABRIC_MTU",
    "FABRIC_VAR",
    "FLOOR_VAR",
    "MAX_FILE_BYTES",
    "MAX_YAML_VALUES",
    "RANK_VAR",
    "SCRIPT_TIMEOUT",
    "SPARK_HCAS",
    "SPARK_HCA_RATE_GBPS",
    "SPARK_INTERFACES",
    "SPARK_PAIR_BUSBW_FLOOR_GBS",
    "UNIT_VAR",
    "Fabric",
    "Host",
    "Inventory",
    "Unit",
    "check_source",
    "check_var_files",
    "default_inventory_path",
    "load",
    "placed",
    "units_of",
]


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
    #: The vault password file its vaulted values were opened with (None: none was found); the
    #: playbooks fleetctl runs on it are given the same.
    vault_password_file: str | None = None

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

    def _check_limit(self, limit: str, patterns: list[str]) -> None:
        """Refuse a ``--limit`` that Ansible would read otherwise than written."""
        if not [p for p in patterns if p.strip("!&")]:
            # Ansible reads an empty pattern as "all": for a rollout that is the whole fleet.
            raise InventoryError(
                f"--limit {limit!r} is empty", fix=f"name hosts or groups: {self._names()}"
            )
        if limit.count("[") != limit.count("]"):
            # Ansible reads "[" as the start of a subscript and drops what it cannot parse
            # ("~spark-[" becomes "~spark-"): a typo would select other hosts than written.
            raise InventoryError(f"--limit {limit!r} is not a valid pattern (unbalanced brackets)",
                                 fix="close the bracket: a subscript is g[0], g[0:2] or g[1:]")
        for pat in patterns:
            body = pat.lstrip("!&")
            if body.startswith("~"):
                try:
                    regex = re.compile(body[1:])
                except re.error as e:
                    # Ansible would otherwise match such a pattern as a plain name, or fail inside.
                    raise InventoryError(
                        f"--limit {pat!r} is not a valid regular expression ({e})",
                        fix="write a Python regex after ~, e.g. --limit '~spark-0[1-3]'",
                    ) from None
                if regex.match(""):
                    # "~", "~|", "~x*": matches every name, as the empty pattern does.
                    raise InventoryError(
                        f"--limit {pat!r} matches every host: its regular expression "
                        f"{body[1:]!r} matches an empty name",
                        fix="write --limit all to mean the whole fleet; else a regex that needs "
                            f"a character of the name, e.g. '~spark-0[1-3]' ({self._names()})",
                    )

    def _ansible_hosts(self, pattern: str) -> set[str]:
        """The names ansible-core selects for ``pattern``; its errors as one InventoryError."""
        from ansible.errors import AnsibleError

        try:
            return {h.name for h in self._ansible.get_hosts(pattern)}
        except AnsibleError as e:
            cause = " ".join(str(e).split())[:200]
            group = re.match(r"([^\[]+)\[", pattern)
            size = len(self.groups.get(group.group(1), ())) if group else 0
            fix = (f"group {group.group(1)!r} has {size} host(s): subscripts 0 to {size - 1}"
                   if group and size else self._names())
            raise InventoryError(f"--limit {pattern!r}: {cause}", fix=fix) from None

    def select(self, limit: str | None = None) -> list[Host]:
        """The hosts matching an Ansible ``--limit`` pattern, in inventory order.

        The pattern is resolved by ansible-core itself (``a:b``, ``a,b``,
        ``!x``, ``&g``, globs, ``~regex``, ``g[0:2]``), so fleetctl selects exactly
        what ``ansible-playbook --limit`` would. On top of Ansible, a positive
        pattern that matches nothing is an error, because a typo must never
        silently select fewer hosts.
        """
        if not self.hosts:
            raise InventoryError(
                f"{self.path} has no hosts",
                fix="list your Sparks under a group in the inventory "
                "(see inventory/example/hosts.yml), or bring the lab up: fleetctl lab up",
            )
        if limit is None:
            return list(self.hosts.values())
        if self._ansible is None:
            raise InventoryError(f"{self.path}: this inventory was not loaded by inventory.load()",
                                 fix="build Inventory objects with fleetctl.inventory.load()")
        from ansible.inventory.manager import split_host_pattern

        patterns = split_host_pattern(limit) if limit.strip() else []
        self._check_limit(limit, patterns)
        with ansible_warnings():  # "could not match": reported below as an error
            for pat in patterns:
                matched = self._ansible_hosts(pat.lstrip("!&"))  # an error names this pattern
                if pat[:1] in ("!", "&"):
                    continue
                if not matched.intersection(self.hosts):
                    raise InventoryError(f"--limit {pat!r} matches no host or group in {self.path}",
                                         fix=self._names())
            chosen = self._ansible_hosts(limit)
        if not chosen.intersection(self.hosts):
            raise InventoryError(
                f"--limit {limit!r} selects no host in {self.path} (its exclusions remove "
                "every host its patterns match)",
                fix=self._names(),
            )
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
    ``vault_password_file`` or else ``$ANSIBLE_VAULT_PASSWORD_FILE``, else the
    ``vault_password_file`` of an ``ansible.cfg`` beside the inventory (the lab keeps one), else
    Ansible's own configuration's; without one, a vaulted become password fails only when
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
    check_source(p)
    manager, variables, vault = ansible_load(p, vault_password_file)
    hosts = read_hosts(p, manager, variables, vault)
    groups = {name: tuple(x.name for x in g.get_hosts()) for name, g in manager.groups.items()
              if name != "ungrouped"}
    units = units_of(p, hosts, groups, declared_units(manager, hosts, vault))
    return Inventory(
        path=p,
        hosts=placed(hosts, units),
        groups=groups,
        vars=group_vars(manager, manager.groups["all"], vault),
        _ansible=manager,
        units=units,
        vault_password_file=vault,
    )
