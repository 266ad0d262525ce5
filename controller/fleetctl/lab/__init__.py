"""``fleetctl lab``: a simulated fleet of DGX Sparks on one machine.

Everything a lab creates lives under one directory (``$FLEETCTL_LAB_DIR``) and
one Docker engine of its own; its network is ``$FLEETCTL_LAB_SUBNET``, so that
several labs coexist. The core of fleetctl never imports this package: it sees
the lab only through the inventory the lab writes.

Public API: :func:`up`, :func:`down`, :func:`status`, :func:`set_node`,
:func:`add_image`, :func:`node_exec`, and the :class:`LabStatus` /
:class:`LabNode` results.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.lab import access, aptrepo, fabric, images, inventory, nodes, procs
from fleetctl.lab.dockerd import Dockerd
from fleetctl.lab.frontdoor import LabFrontDoor
from fleetctl.lab.layout import MAX_NODES, Layout, current
from fleetctl.lab.nodes import Faults, InnerContainer
from fleetctl.lab.rootfs import file_lock
from fleetctl.lab.services import Registry, WebServer
from fleetctl.progress import NULL, Event, Progress

__all__ = [
    "Faults", "InnerContainer", "LabNode", "LabStatus", "add_image", "direct_ssh", "down", "node_exec", "set_node",
    "status", "up",
]

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

    def node(self, name: str) -> LabNode:
        """The node called ``name``."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise FleetError(f"no lab node {name!r}", fix=f"use one of: {', '.join(n.name for n in self.nodes) or '(none: run `fleetctl lab up`)'}")


# --- the lab's own state file ------------------------------------------------------------------

def _read_state(lay: Layout) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(lay.state_file.read_text())
    except FileNotFoundError:
        return {"version": _STATE_VERSION, "nodes": [], "faults": {}, "images": []}
    except ValueError as e:
        raise FleetError(f"{lay.state_file} is not valid JSON: {e}", fix="`fleetctl lab down` and up again") from None
    if int(data.get("version", 0)) > _STATE_VERSION:
        raise FleetError(f"{lay.state_file} was written by a newer fleetctl (version {data.get('version')})",
                         fix="use that fleetctl, or `fleetctl lab down` with it first")
    return data


def _write_state(lay: Layout, data: dict[str, Any]) -> None:
    data["version"] = _STATE_VERSION
    tmp = lay.state_file.with_name(lay.state_file.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(lay.state_file)


def _existing() -> Layout:
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
def _locked(lay: Layout, progress: Progress = NULL) -> Iterator[None]:
    # In the shared cache, not in the lab dir: `down` removes the directory while holding the lock.
    key = hashlib.sha256(str(lay.root).encode()).hexdigest()[:16]
    lock = paths.cache_dir() / "locks" / f"lab-{key}.lock"
    with file_lock(lock, f"lab {lay.root}", progress):
        yield


# --- up -------------------------------------------------------------------------------------------

def up(nodes: int = 4, units: int = 0, progress: Progress = NULL) -> LabStatus:
    """Bring the lab up with ``nodes`` Sparks (idempotent: what exists and runs is kept), the last ``2 * units``
    of them ``units`` two-node units joined by the lab's fabric (MTU 9000)."""
    if not 1 <= nodes <= MAX_NODES:
        raise FleetError(f"--nodes {nodes} is out of range", fix=f"pass 1 to {MAX_NODES}")
    lay = current()
    inventory.units([lay.node_name(i) for i in range(1, nodes + 1)], units)  # refused before anything is made
    lay.check()
    t0 = time.monotonic()
    with _locked(lay, progress):
        for d in (lay.root, lay.run_dir, lay.log_dir, lay.build_dir):
            d.mkdir(parents=True, exist_ok=True)
        state = _read_state(lay)
        if state.get("subnet") and state["subnet"] != str(lay.subnet):
            raise FleetError(
                f"lab {lay.root} was made on subnet {state['subnet']}, not {lay.subnet}",
                fix=f"set FLEETCTL_LAB_SUBNET={state['subnet']} or `fleetctl lab down` first",
            )
        state["subnet"] = str(lay.subnet)
        _write_state(lay, state)
        _ssh_key(lay)
        # Written first: the weights mirror is filled from the recipes it links in.
        inventory.write(lay, [lay.node_name(i) for i in range(1, nodes + 1)], units)
        engine = Dockerd(lay)
        engine.start(progress)
        engine.ensure_network()
        with ThreadPoolExecutor(max_workers=4) as pool:
            # Independent of the node image: the services, and the vLLM base rootfs
            # (a first build spends much of its time downloading, so overlapping pays).
            reg = pool.submit(Registry(lay).start, progress)
            www = pool.submit(_www, lay, progress)
            py = pool.submit(images.python_base, engine, progress)
            image = images.node_image(lay, engine, progress)
            reg.result()
            py.result()
            # The vLLM images are built and pushed while the nodes boot.
            push = pool.submit(_push_images, lay, engine, progress)
            _nodes(lay, engine, state, nodes, image, progress)
            www.result()
            pushed = push.result()
        state["units"] = {u: list(m) for u, m in inventory.units(state["nodes"], units).items()}
        _fabric(lay, engine, state, progress)
        state["images"] = sorted(set(state.get("images", [])) | set(pushed))
        _write_state(lay, state)
        inventory.write(lay, state["nodes"], units)
        LabFrontDoor(lay).start(state["nodes"], progress)
        progress(Event("ready", f"lab up with {nodes} node(s) in {time.monotonic() - t0:.0f}s"))
    return status()


def _fabric(lay: Layout, engine: Dockerd, state: dict[str, Any], progress: Progress) -> None:
    """Join each unit's members by the fabric networks (MTU 9000, a Spark's netdev names) and give them the
    stand-in RDMA tools; a node attached already is left as it is (its fabric faults too)."""
    members = [m for ms in state.get("units", {}).values() for m in ms]
    if not members:
        return
    fabric.ensure_networks(lay, engine)
    for name in members:
        fabric.attach(lay, engine, lay.node_index(name))
        fabric.install_tools(engine, name)
        addrs = ", ".join(fabric.member_addresses(lay, lay.node_index(name)))
        progress(Event("fabric", f"{addrs} (MTU 9000)", host=name))


def _peers(state: dict[str, Any], name: str) -> list[str]:
    """The other members of ``name``'s unit (empty when it is in none)."""
    for ms in state.get("units", {}).values():
        if name in ms:
            return [m for m in ms if m != name]
    return []


def _ssh_key(lay: Layout) -> None:
    lay.ssh_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(lay.ssh_dir, 0o700)
    if not lay.ssh_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fleetctl-lab@{lay.root}",
                        "-f", str(lay.ssh_key)], check=True)


def _www(lay: Layout, progress: Progress) -> None:
    apt = lay.www / "apt"
    if not (apt / "InRelease").exists():
        aptrepo.build(apt, progress)
    weights = lay.www / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    _populate_weights(lay, weights, progress)
    WebServer(lay).start(progress)


def _populate_weights(lay: Layout, weights: Path, progress: Progress) -> None:
    from fleetctl import inventory as inventory_mod
    from fleetctl.lab import models

    recipes = inventory_mod.load(lay.inventory).vars.get("fleetctl_recipes") or {}
    progress(Event("building", f"weights mirror for {len(recipes)} recipe(s)"))
    # Idempotent: revisions already written (with their manifest) are kept.
    models.populate_mirror(weights, recipes)


def _nodes(lay: Layout, engine: Dockerd, state: dict[str, Any], count: int, image: str, progress: Progress) -> None:
    wanted = [lay.node_name(i) for i in range(1, count + 1)]
    faults: dict[str, Any] = state.setdefault("faults", {})
    for name in list(state.get("nodes", [])):
        if name not in wanted:
            progress(Event("removing", "surplus node", host=name))
            engine.docker("rm", "-f", "-v", name, check=False, timeout=120)
            engine.docker("volume", "rm", "-f", f"{name}-docker", check=False)
            faults.pop(name, None)
    started: list[tuple[str, str, bool]] = []
    if _ensure_running(engine, lay.bastion_name, image, progress,
                       lambda: nodes.create_bastion(lay, engine, image)):
        started.append((lay.bastion_name, lay.bastion_address, True))
    for i, name in enumerate(wanted, start=1):
        st = nodes.container_state(engine, name)
        if st is None:
            progress(Event("starting", f"container {lay.node_address(i)}", host=name))
            nodes.create(lay, engine, i, image)
            faults.pop(name, None)
            started.append((name, lay.node_address(i), False))
            continue
        if st["Config"]["Image"] != image:
            # Recreating it would throw away what was provisioned on it: say so, keep it.
            progress(Event("outdated", f"runs {st['Config']['Image']}, not {image}: "
                                       "`fleetctl lab down` then `up` to rebuild", host=name))
        if not st["State"]["Running"]:
            progress(Event("starting", "existing container", host=name))
            engine.docker("start", name, what=f"starting node {name}")
            started.append((name, lay.node_address(i), False))
        # A paused node is a fault the user set: it is kept as it is.
    state["nodes"] = wanted
    with ThreadPoolExecutor(max_workers=max(1, min(len(started), 8))) as pool:
        list(pool.map(lambda s: nodes.wait_ready(lay, engine, s[0], s[1], bastion=s[2], progress=progress), started))
    for name, address, _ in started:
        progress(Event("ready", address, host=name))
    _known_hosts(lay, engine, wanted, state)


def _ensure_running(engine: Dockerd, name: str, image: str, progress: Progress, create: Any) -> bool:
    """Create or start container ``name`` if needed; True when it was (re)started."""
    st = nodes.container_state(engine, name)
    if st is None:
        progress(Event("starting", "container", host=name))
        create()
        return True
    if st["Config"]["Image"] != image:
        progress(Event("outdated", f"runs {st['Config']['Image']}, not {image}: "
                                   "`fleetctl lab down` then `up` to rebuild", host=name))
    if not st["State"]["Running"]:
        progress(Event("starting", "existing container", host=name))
        engine.docker("start", name, what=f"starting {name}")
        return True
    return False


def _known_hosts(lay: Layout, engine: Dockerd, names: list[str], state: dict[str, Any]) -> None:
    lines = []
    cached: dict[str, list[str]] = state.setdefault("host_keys", {})
    every = [(lay.bastion_name, lay.bastion_address)] + [(n, lay.node_address(lay.node_index(n))) for n in names]
    for name, addr in every:
        st = nodes.container_state(engine, name)
        if st is not None and st["State"]["Running"] and not st["State"]["Paused"]:
            cached[name] = nodes.host_keys(engine, name)
        lines += [f"{addr},{name} {key}" for key in cached.get(name, [])]
    for name in list(cached):
        if name not in dict(every):
            cached.pop(name)
    tmp = lay.known_hosts.with_name("known_hosts.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(lay.known_hosts)


def _push_images(lay: Layout, engine: Dockerd, progress: Progress) -> list[str]:
    pushed = []
    cuda = f"{lay.registry}/{images.CUDA_IMAGE}"
    images.cuda_image(lay, engine, cuda, progress)
    images.push(engine, cuda, progress)
    pushed.append(cuda)
    relay = f"{lay.registry}/{images.RELAY_IMAGE}"
    images.relay_image(lay, engine, relay, progress)
    images.push(engine, relay, progress)
    pushed.append(relay)
    try:
        for spec in images.default_tags():
            ref = images.build_tag(lay, engine, f"{lay.registry}/{spec.ref}", spec.env, progress,
                                   cmd=list(spec.entrypoint))
            images.push(engine, ref, progress)
            pushed.append(ref)
    except FleetError as e:
        # Without the emulator's images the nodes still work (provisioning needs no vLLM image).
        progress(Event("skipped", f"vLLM images: {e.cause}"))
    return pushed


# --- down -----------------------------------------------------------------------------------------

def down(progress: Progress = NULL) -> list[str]:
    """Remove everything the lab created (processes, containers, network, mounts, its directory).

    Returns what was left behind that could not be removed (empty on success);
    the shared cache (rootfs tarballs, apt key) is kept.
    """
    lay = _existing()
    leftovers: list[str] = []
    with _locked(lay, progress):
        engine = Dockerd(lay)
        if engine.pid() is None and (lay.engine_dir / "data").is_dir():
            # The engine died (a crash, a reboot, a kill) and its containers may still run
            # under their shims: start it again so that it can remove them properly.
            progress(Event("starting", "the lab's dockerd again, to remove what it left running"))
            with contextlib.suppress(FleetError):
                engine.start(progress)
        if engine.pid() is not None:
            progress(Event("stopping", "nodes and the lab's dockerd"))
            engine.stop()
        progress(Event("stopping", "registry and HTTP server"))
        Registry(lay).stop()
        WebServer(lay).stop()
        LabFrontDoor(lay).stop()
        _unmount_under(lay.root)
        _unmount_under(lay.exec_root)
        # the fabric's bridges outlive the engine (as the lab network's does): removed by name
        for bridge in [lay.bridge, *(h.bridge for h in fabric.halves(lay))]:
            if Path(f"/sys/class/net/{bridge}").exists():
                subprocess.run(["ip", "link", "delete", bridge], check=False, capture_output=True)
        if lay.exec_root.exists() and not lay.exec_root.is_relative_to(lay.root):
            subprocess.run(["rm", "-rf", "--one-file-system", str(lay.exec_root)], check=False)
            with contextlib.suppress(OSError):  # shared by other deep-path labs: only if empty
                lay.exec_root.parent.rmdir()
        if lay.root.exists():
            progress(Event("removing", str(lay.root)))
            subprocess.run(["rm", "-rf", "--one-file-system", str(lay.root)], check=False)
        leftovers = leftover(lay)
    return leftovers


def _unmount_under(root: Path) -> None:
    prefix = str(root.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], check=False, capture_output=True)


def leftover(lay: Layout | None = None) -> list[str]:
    """What of the lab still exists: processes, mounts, its interface, its directory (empty when clean)."""
    lay = lay or _existing()
    out: list[str] = []
    for d in {lay.root, lay.exec_root}:
        prefix = str(d) + "/"
        out += [f"process {pid}: {cmd}" for pid, cmd in procs.processes_under(prefix)]
        out += [f"mount {line.split()[1]}" for line in Path("/proc/mounts").read_text().splitlines()
                if line.split()[1].startswith(prefix)]
    for bridge in [lay.bridge, *(h.bridge for h in fabric.halves(lay))]:
        if Path(f"/sys/class/net/{bridge}").exists():
            out.append(f"network interface {bridge}")
    for d in {lay.root, lay.exec_root}:
        if d.exists():
            out.append(f"directory {d}")
    return out


# --- status ---------------------------------------------------------------------------------------

def status() -> LabStatus:
    """What the lab looks like now (a lab that is down has no nodes and ``up`` False)."""
    lay = _existing()
    state = _read_state(lay) if lay.root.exists() else {"nodes": [], "faults": {}, "images": []}
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
        directory=lay.root, subnet=str(lay.subnet), gateway=lay.gateway,
        up=all(services.values()) and bool(node_list) and all(n.state != "missing" for n in node_list),
        docker_host=lay.docker_host, registry=lay.registry, http_url=lay.http_base,
        apt_url=f"{lay.http_base}/apt", apt_key_url=f"{lay.http_base}/apt/gpgkey",
        weights_url=f"{lay.http_base}/weights", inventory=lay.inventory, ssh_key=lay.ssh_key,
        known_hosts=lay.known_hosts, bastion=f"{access.ADMIN_USER}@{lay.bastion_address}",
        ssh_config=lay.ssh_config, vault_password_file=lay.vault_password_file, services=services, nodes=node_list,
        images=tuple(state.get("images", [])),
        units={u: tuple(ms) for u, ms in state.get("units", {}).items()},
    )


# --- faults, images, back door ----------------------------------------------------------------------

def set_node(name: str, *, gpu: str | None = None, driver: str | None = None, disk_gb: int | None = None,
             paused: bool | None = None, disconnected: bool | None = None,
             next_kernel_without_nvidia: bool | None = None, revoked_access: bool | None = None, reset: bool = False,
             fabric_mtu: int | None = None, fabric_down: bool | None = None, fabric_via_mgmt: bool | None = None,
             kill_worker: bool = False, progress: Progress = NULL) -> LabNode:
    """Set faults on node ``name`` (None leaves a setting as it is; ``reset`` makes it healthy first).

    The fabric faults (``fabric_*``) and ``kill_worker`` (its serving containers killed, as a worker that
    dies mid-soak) are for a unit's member; ``kill_worker`` is an act, not a state kept."""
    lay = _existing()
    with _locked(lay, progress):
        state = _read_state(lay)
        if name not in state.get("nodes", []):
            raise FleetError(f"no lab node {name!r}",
                             fix=f"use one of: {', '.join(state.get('nodes', [])) or '(none: run `fleetctl lab up`)'}")
        engine = Dockerd(lay)
        if engine.pid() is None:
            raise FleetError("the lab is down", fix="run `fleetctl lab up`")
        old = Faults.from_json(state.get("faults", {}).get(name, {}))
        new = Faults() if reset else old
        changes: dict[str, Any] = {k: v for k, v in {
            "gpu": gpu, "driver": driver, "disk_gb": disk_gb, "paused": paused, "disconnected": disconnected,
            "next_kernel_without_nvidia": next_kernel_without_nvidia,
            "revoked_access": revoked_access, "fabric_mtu": fabric_mtu, "fabric_down": fabric_down,
            "fabric_via_mgmt": fabric_via_mgmt}.items() if v is not None}
        new = replace(new, **changes)
        peers = _peers(state, name)
        fabric_faults = (new.fabric_mtu, new.fabric_down, new.fabric_via_mgmt) != (
            old.fabric_mtu, old.fabric_down, old.fabric_via_mgmt)
        if (fabric_faults or kill_worker) and not peers:
            units = ", ".join(f"{u} ({', '.join(ms)})" for u, ms in state.get("units", {}).items()) or "none"
            raise FleetError(f"{'--kill-worker' if kill_worker else 'a fabric fault'} is for a unit's member, and "
                             f"the node is in no unit (units: {units})", host=name,
                             fix="pick a member, or `fleetctl lab up --nodes N --units M` to make units")
        progress(Event("fault", ", ".join(f"{k}={v}" for k, v in new.active().items()) or "healthy", host=name))
        nodes.apply_faults(lay, engine, name, old, new)
        if new.fabric_mtu != old.fabric_mtu:
            fabric.set_mtu(engine, name, new.fabric_mtu)
        if new.fabric_down != old.fabric_down:
            fabric.set_half_down(engine, name, new.fabric_down)
        if new.fabric_via_mgmt != old.fabric_via_mgmt:
            fabric.set_via_mgmt(lay, engine, name, [lay.node_index(p) for p in peers], new.fabric_via_mgmt)
        if kill_worker:
            _kill_serving(engine, name, progress)
        state.setdefault("faults", {})[name] = new.active()
        _write_state(lay, state)
    return status().node(name)


def _kill_serving(engine: Dockerd, name: str, progress: Progress) -> None:
    """SIGKILL every vLLM container on node ``name`` (the lab's images: AEON's and the stock vllm-openai),
    as a worker process that dies."""
    from fleetctl.lab.scenarios import AEON_REPOSITORY, STOCK_REPOSITORY

    vllm = [c.name for c in nodes.inner_containers(engine, name)
            if any(repo in c.image for repo in (AEON_REPOSITORY, STOCK_REPOSITORY))]
    if not vllm:
        raise FleetError("--kill-worker: no vLLM container runs on the node", host=name,
                         fix="kill a member while its unit serves (during a soak)")
    nodes.exec_(engine, name, ["docker", "kill", "--signal", "KILL", *vllm], what="killing the serving container")
    progress(Event("killed", ", ".join(vllm), host=name))


def add_image(tag: str, settings: Mapping[str, str] | None = None, repository: str = images.VLLM_REPOSITORY,
              from_dir: str | os.PathLike[str] | None = None, cmd: list[str] | None = None,
              progress: Progress = NULL) -> str:
    """Build an image (the emulator with ``settings``, or ``from_dir`` running ``cmd``), push it; return its ref."""
    lay = _existing()
    engine = Dockerd(lay)
    if engine.pid() is None:
        raise FleetError("the lab is down", fix="run `fleetctl lab up`")
    ref = f"{lay.registry}/{repository}:{tag}"
    images.build_tag(lay, engine, ref, dict(settings or {}), progress,
                     from_dir=Path(from_dir) if from_dir is not None else None, cmd=cmd)
    images.push(engine, ref, progress)
    with _locked(lay, progress):
        state = _read_state(lay)
        state["images"] = sorted(set(state.get("images", [])) | {ref})
        _write_state(lay, state)
    return ref


@contextmanager
def direct_ssh() -> Iterator[None]:
    """Inside: every node's port 22 answers the controller too (not only the bastion); for benchmarks
    comparing a direct route with the bastion's. Closed again on the way out, also on an error."""
    lay = _existing()
    engine = Dockerd(lay)
    names = list(_read_state(lay).get("nodes", []))
    try:
        for name in names:
            nodes.set_direct_ssh(lay, engine, name, True)
        yield
    finally:
        for name in names:
            nodes.set_direct_ssh(lay, engine, name, False)


def node_exec(name: str, argv: list[str], input: bytes | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as root inside node ``name`` without SSH (a back door for tests only)."""
    lay = _existing()
    return nodes.exec_(Dockerd(lay), name, argv, input=input, timeout=timeout, check=False)


def docker_env() -> dict[str, str]:
    """Environment in which the ``docker`` CLI talks to the lab's engine."""
    return Dockerd(_existing()).env()
