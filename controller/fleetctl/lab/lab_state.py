"""The lab's own state file (its nodes, faults, units, images, subnet) and the lab as it stands:
:func:`status`, with a :class:`LabNode` per simulated Spark."""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.lab import access, nodes
from fleetctl.lab import inventory as lab_inventory
from fleetctl.lab.dockerd import Dockerd
from fleetctl.lab.frontdoor import LabFrontDoor
from fleetctl.lab.layout import Layout, current
from fleetctl.lab.nodes import Faults, InnerContainer
from fleetctl.lab.rootfs import file_lock
from fleetctl.lab.services import Registry, WebServer
from fleetctl.progress import NULL, Progress

_STATE_VERSION = 1


@dataclass(frozen=True)
class LabNode:
    """One simulated Spark: how to reach it, what state it is in, what runs on it."""

    name: str
    address: str
    ssh_user: str
    key_path: Path
    known_hosts: Path
    #: running | paused | disconnected | stopped | missing
    state: str
    gpu: str
    driver: str
    faults: Mapping[str, Any] = field(default_factory=dict)
    containers: tuple[InnerContainer, ...] = ()


@dataclass(frozen=True)
class LabStatus:
    """The whole lab: its directory, engine, services and nodes."""

    directory: Path
    subnet: str
    gateway: str
    #: True when the engine, the registry, the HTTP server and every node run.
    up: bool
    docker_host: str
    registry: str
    http_url: str
    apt_url: str
    apt_key_url: str
    weights_url: str
    inventory: Path
    ssh_key: Path
    known_hosts: Path
    #: The bastion every node is reached through (``user@address``), and the ssh_config naming it.
    bastion: str = ""
    ssh_config: Path | None = None
    #: The Ansible Vault password file the inventory's become password is encrypted with.
    vault_password_file: Path | None = None
    services: Mapping[str, bool] = field(default_factory=dict)
    nodes: tuple[LabNode, ...] = ()
    images: tuple[str, ...] = ()
    #: The lab's two-node units (``lab up --units``): name -> members, head first.
    units: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Nodes serving a recipe of their own (host_vars/NODE/recipe.yml, ``lab up --recipe``): node
    #: -> recipe; the others serve the inventory's default.
    recipes: Mapping[str, str] = field(default_factory=dict)

    def node(self, name: str) -> LabNode:
        """The node called ``name``."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise FleetError(
            f"no lab node {name!r}",
            fix="use one of: "
                f"{', '.join(n.name for n in self.nodes) or '(none: run `fleetctl lab up`)'}",
        )


def read_state(lay: Layout) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(lay.state_file.read_text())
    except FileNotFoundError:
        return {"version": _STATE_VERSION, "nodes": [], "faults": {}, "images": []}
    except ValueError as e:
        raise FleetError(
            f"{lay.state_file} is not valid JSON: {e}", fix="`fleetctl lab down` and up again"
        ) from None
    if int(data.get("version", 0)) > _STATE_VERSION:
        raise FleetError(
            f"{lay.state_file} was written by a newer fleetctl (version {data.get('version')})",
            fix="use that fleetctl, or `fleetctl lab down` with it first",
        )
    return data


def write_state(lay: Layout, data: dict[str, Any]) -> None:
    data["version"] = _STATE_VERSION
    tmp = lay.state_file.with_name(lay.state_file.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(lay.state_file)


def existing() -> Layout:
    """The selected lab, on the subnet it was made on (whatever $FLEETCTL_LAB_SUBNET says now).

    ``down`` and ``status`` must act on the interface and addresses the lab really
    has; only ``up`` insists that the two agree.
    """
    lay = current()
    try:
        recorded = json.loads(lay.state_file.read_text()).get("subnet")
    except (OSError, ValueError):
        return lay
    if recorded and recorded != str(lay.subnet):
        return replace(lay, subnet=ipaddress.IPv4Network(recorded))
    return lay


@contextmanager
def locked(lay: Layout, progress: Progress = NULL) -> Iterator[None]:
    # In the shared cache, not in the lab dir: `down` removes the directory while holding the lock.
    key = hashlib.sha256(str(lay.root).encode()).hexdigest()[:16]
    lock = paths.cache_dir() / "locks" / f"lab-{key}.lock"
    with file_lock(lock, f"lab {lay.root}", progress):
        yield


def status() -> LabStatus:
    """What the lab looks like now (a lab that is down has no nodes and ``up`` False)."""
    lay = existing()
    state = read_state(lay) if lay.root.exists() else {"nodes": [], "faults": {}, "images": []}
    engine = Dockerd(lay)
    engine_up = engine.pid() is not None and engine.answering()
    services = {
        "engine": engine_up,
        "registry": Registry(lay).running(),
        "http": WebServer(lay).running(),
        "frontdoor": LabFrontDoor(lay).running(),
    }
    names: list[str] = list(state.get("nodes", []))

    def one(name: str) -> LabNode:
        f = Faults.from_json(state.get("faults", {}).get(name, {}))
        st = nodes.container_state(engine, name) if engine_up else None
        containers: tuple[InnerContainer, ...] = ()
        if st is None:
            s = "missing"
        elif st["State"]["Paused"]:
            s = "paused"
        elif not st["State"]["Running"]:
            s = "stopped"
        elif f.disconnected:
            s = "disconnected"
        else:
            s = "running"
        if st is not None and st["State"]["Running"] and not st["State"]["Paused"]:
            containers = nodes.inner_containers(engine, name)
        return LabNode(
            name=name, address=lay.node_address(lay.node_index(name)), ssh_user=access.ADMIN_USER,
            key_path=lay.ssh_key, known_hosts=lay.known_hosts, state=s, gpu=f.gpu, driver=f.driver,
            faults=f.active(), containers=containers,
        )

    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        node_list = tuple(pool.map(one, names))
    return LabStatus(
        directory=lay.root,
        subnet=str(lay.subnet),
        gateway=lay.gateway,
        up=all(services.values())
        and bool(node_list)
        and all(n.state != "missing" for n in node_list),
        docker_host=lay.docker_host,
        registry=lay.registry,
        http_url=lay.http_base,
        apt_url=f"{lay.http_base}/apt",
        apt_key_url=f"{lay.http_base}/apt/gpgkey",
        weights_url=f"{lay.http_base}/weights",
        inventory=lay.inventory,
        ssh_key=lay.ssh_key,
        known_hosts=lay.known_hosts,
        bastion=f"{access.ADMIN_USER}@{lay.bastion_address}",
        ssh_config=lay.ssh_config,
        vault_password_file=lay.vault_password_file,
        services=services,
        nodes=node_list,
        images=tuple(state.get("images", [])),
        units={u: tuple(ms) for u, ms in state.get("units", {}).items()},
        recipes={n: r for n, r in lab_inventory.node_recipes(lay).items() if n in names},
    )


def unit_peers(state: dict[str, Any], name: str) -> list[str]:
    """The other members of ``name``'s unit (empty when it is in none)."""
    for ms in state.get("units", {}).values():
        if name in ms:
            return [m for m in ms if m != name]
    return []
