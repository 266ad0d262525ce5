"""The fleet model: hosts, groups and their variables, read from an Ansible YAML inventory.

fleetctl reads the same inventory Ansible does (``hosts.yml`` plus ``group_vars/``
and ``host_vars/`` beside it), so that the roles stay usable with plain
``ansible-playbook``. Only the YAML inventory format is read here; errors name
the file and the entry at fault.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetctl import paths
from fleetctl.errors import InventoryError

_FIX_FORMAT = "see the YAML inventory format in README.md (all: hosts: / children: / vars:)"


@dataclass(frozen=True)
class Host:
    """One Spark: how to reach it and its merged variables (all < groups < host)."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    #: known_hosts file used to verify the host key (``fleetctl_known_hosts``).
    known_hosts: str | None = None
    groups: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def label(self) -> str:
        """``name (address)`` for messages."""
        return f"{self.name} ({self.address})"


@dataclass(frozen=True)
class Inventory:
    """The parsed inventory: hosts in file order, groups, and the file it came from."""

    path: Path
    hosts: Mapping[str, Host]
    groups: Mapping[str, tuple[str, ...]]
    #: Variables of the ``all`` group (merged with group_vars/all).
    vars: Mapping[str, Any]

    def host(self, name: str) -> Host:
        """The host called ``name``, or an InventoryError naming the known ones."""
        try:
            return self.hosts[name]
        except KeyError:
            raise InventoryError(
                f"no host {name!r} in {self.path}",
                fix=f"use one of: {', '.join(self.hosts) or '(none)'}",
            ) from None

    def select(self, limit: str | None = None) -> list[Host]:
        """The hosts matching an Ansible-style ``--limit`` pattern, in inventory order.

        Patterns are separated by ``,`` or ``:``; each is a host name, a group
        name or a glob; ``!pattern`` excludes and ``&pattern`` intersects.
        With no limit, every host. A pattern that matches nothing is an error,
        because a typo must never silently select fewer hosts.
        """
        if not limit:
            return list(self.hosts.values())
        chosen: list[str] = []
        parts = [p.strip() for p in limit.replace(":", ",").split(",") if p.strip()]
        include = [p for p in parts if p[0] not in "!&"]
        for pat in include:
            matched = self._match(pat)
            if not matched:
                raise InventoryError(
                    f"--limit {pat!r} matches no host or group in {self.path}",
                    fix=f"hosts: {', '.join(self.hosts)}; groups: {', '.join(self.groups)}",
                )
            chosen.extend(h for h in matched if h not in chosen)
        if not include:
            chosen = list(self.hosts)
        for pat in parts:
            if pat.startswith("&"):
                keep = set(self._match(pat[1:]))
                chosen = [h for h in chosen if h in keep]
            elif pat.startswith("!"):
                drop = set(self._match(pat[1:]))
                chosen = [h for h in chosen if h not in drop]
        order = list(self.hosts)
        return [self.hosts[h] for h in sorted(chosen, key=order.index)]

    def _match(self, pattern: str) -> list[str]:
        if pattern in ("all", "*"):
            return list(self.hosts)
        if pattern in self.groups:
            return list(self.groups[pattern])
        if pattern in self.hosts:
            return [pattern]
        return [h for h in self.hosts if fnmatch.fnmatchcase(h, pattern)]


def default_inventory_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``--inventory``, else ``$FLEETCTL_INVENTORY``, else the lab's inventory."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("FLEETCTL_INVENTORY")
    if env:
        return Path(env)
    return paths.lab_inventory()


def load(path: str | os.PathLike[str] | None = None) -> Inventory:
    """Read an inventory file (or directory holding ``hosts.yml``) with its group_vars/host_vars."""
    p = default_inventory_path(path)
    if p.is_dir():
        p = p / "hosts.yml"
    if not p.exists():
        fix = (
            "run `fleetctl lab up` to create the lab's inventory"
            if p == paths.lab_inventory()
            else "pass --inventory PATH or set FLEETCTL_INVENTORY"
        )
        raise InventoryError(f"inventory {p} does not exist", fix=fix)
    data = _read_yaml(p)
    if not isinstance(data, dict) or "all" not in data or not isinstance(data["all"], dict | None):
        raise InventoryError(f"{p}: the top level must be a mapping with an 'all' group", fix=_FIX_FORMAT)

    host_vars: dict[str, dict[str, Any]] = {}
    host_groups: dict[str, list[str]] = {}
    groups: dict[str, list[str]] = {}
    group_vars: dict[str, dict[str, Any]] = {}
    group_parents: dict[str, list[str]] = {}

    def walk(name: str, node: Any, parent: str | None) -> None:
        if node is None:
            node = {}
        if not isinstance(node, dict):
            raise InventoryError(f"{p}: group {name!r} must be a mapping", fix=_FIX_FORMAT)
        unknown = set(node) - {"hosts", "children", "vars"}
        if unknown:
            raise InventoryError(
                f"{p}: group {name!r} has unknown key(s) {', '.join(sorted(unknown))}", fix=_FIX_FORMAT
            )
        groups.setdefault(name, [])
        if parent:
            group_parents.setdefault(name, []).append(parent)
        gv = node.get("vars") or {}
        if not isinstance(gv, dict):
            raise InventoryError(f"{p}: vars of group {name!r} must be a mapping", fix=_FIX_FORMAT)
        group_vars.setdefault(name, {}).update(gv)
        hosts = node.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise InventoryError(f"{p}: hosts of group {name!r} must be a mapping of name: vars", fix=_FIX_FORMAT)
        for hname, hv in hosts.items():
            if hv is not None and not isinstance(hv, dict):
                raise InventoryError(f"{p}: host {hname!r} must map to its variables", host=str(hname), fix=_FIX_FORMAT)
            host_vars.setdefault(str(hname), {}).update(hv or {})
            host_groups.setdefault(str(hname), [])
            if name not in host_groups[str(hname)]:
                host_groups[str(hname)].append(name)
            if str(hname) not in groups[name]:
                groups[name].append(str(hname))
        children = node.get("children") or {}
        if not isinstance(children, dict):
            raise InventoryError(f"{p}: children of group {name!r} must be a mapping", fix=_FIX_FORMAT)
        for cname, cnode in children.items():
            walk(str(cname), cnode, name)

    walk("all", data["all"], None)

    # Members of a child group are members of its ancestors too.
    def ancestors(g: str) -> list[str]:
        out: list[str] = []
        for par in group_parents.get(g, []):
            out += [par, *ancestors(par)]
        return out

    for g in list(groups):
        for anc in ancestors(g):
            for h in groups[g]:
                if h not in groups[anc]:
                    groups[anc].append(h)
                if anc not in host_groups[h]:
                    host_groups[h].append(anc)
    groups["all"] = list(host_vars)

    base = p.parent
    for g in groups:
        group_vars.setdefault(g, {})
        group_vars[g] = {**_read_vars_dir(base / "group_vars", g), **group_vars[g]}

    def depth(g: str) -> int:
        return 0 if g == "all" else 1 + max((depth(x) for x in group_parents.get(g, ["all"])), default=0)

    hosts_out: dict[str, Host] = {}
    for hname in host_vars:
        merged: dict[str, Any] = {}
        for g in sorted(set(host_groups[hname]) | {"all"}, key=lambda g: (depth(g), g)):
            merged.update(group_vars.get(g, {}))
        merged.update(_read_vars_dir(base / "host_vars", hname))
        merged.update(host_vars[hname])
        hosts_out[hname] = _make_host(p, hname, merged, tuple(g for g in host_groups[hname] if g != "all"))
    return Inventory(
        path=p,
        hosts=hosts_out,
        groups={g: tuple(m) for g, m in groups.items()},
        vars=dict(group_vars.get("all", {})),
    )


def _make_host(path: Path, name: str, v: Mapping[str, Any], groups: tuple[str, ...]) -> Host:
    address = v.get("ansible_host", name)
    try:
        port = int(v.get("ansible_port", 22))
    except (TypeError, ValueError):
        raise InventoryError(
            f"{path}: ansible_port {v.get('ansible_port')!r} is not a number", host=name, fix="set ansible_port: 22"
        ) from None
    key = v.get("ansible_ssh_private_key_file")
    known = v.get("fleetctl_known_hosts")
    return Host(
        name=name,
        address=str(address),
        port=port,
        user=str(v.get("ansible_user", "root")),
        key_file=str(key) if key else None,
        known_hosts=str(known) if known else None,
        groups=groups,
        vars=dict(v),
    )


def _read_yaml(path: Path) -> Any:
    try:
        with path.open() as f:
            return yaml.safe_load(f)
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
