"""``fleetctl lab up``: the lab's engine, services, node image and nodes, its units' fabric, its
vLLM images pushed, its inventory written (idempotent: what exists and runs is kept)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.lab import aptrepo, fabric, images, inventory, models, nodes
from fleetctl.lab.dockerd import Dockerd
from fleetctl.lab.frontdoor import LabFrontDoor
from fleetctl.lab.lab_state import LabStatus, locked, read_state, status, write_state
from fleetctl.lab.layout import MAX_NODES, Layout, current
from fleetctl.lab.services import Registry, WebServer
from fleetctl.progress import NULL, Event, Progress


def up(nodes: int = 4, units: int = 0, progress: Progress = NULL,
       recipes: Mapping[str, str] | None = None) -> LabStatus:
    """Bring the lab up with ``nodes`` Sparks (idempotent: what exists and runs is kept), the last
    ``2 * units`` of them ``units`` two-node units joined by the lab's fabric (MTU 9000), and each
    node of ``recipes`` (node -> recipe) serving its own recipe (its host_vars; the others the
    inventory's default): rewritten at every up, as the units are."""
    if not 1 <= nodes <= MAX_NODES:
        raise FleetError(f"--nodes {nodes} is out of range", fix=f"pass 1 to {MAX_NODES}")
    lay = current()
    names = [lay.node_name(i) for i in range(1, nodes + 1)]
    # Refused before anything is made.
    made = inventory.units(names, units)
    recipes = dict(recipes or {})
    inventory.check_recipes(recipes, names, made, models.repo_recipes())
    inventory.check_recipe_files(lay, recipes)
    lay.check()
    t0 = time.monotonic()
    with locked(lay, progress):
        for d in (lay.root, lay.run_dir, lay.log_dir, lay.build_dir):
            d.mkdir(parents=True, exist_ok=True)
        state = read_state(lay)
        if state.get("subnet") and state["subnet"] != str(lay.subnet):
            raise FleetError(
                f"lab {lay.root} was made on subnet {state['subnet']}, not {lay.subnet}",
                fix=f"set FLEETCTL_LAB_SUBNET={state['subnet']} or `fleetctl lab down` first",
            )
        state["subnet"] = str(lay.subnet)
        write_state(lay, state)
        _ssh_key(lay)
        # Written first: the weights mirror is filled from the recipes it links in.
        inventory.write(lay, names, units, recipes)
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
        write_state(lay, state)
        inventory.write(lay, state["nodes"], units, recipes)
        LabFrontDoor(lay).start(state["nodes"], progress)
        progress(Event("ready", f"lab up with {nodes} node(s) in {time.monotonic() - t0:.0f}s"))
    return status()


def _fabric(lay: Layout, engine: Dockerd, state: dict[str, Any], progress: Progress) -> None:
    """Join each unit's members by the fabric networks (MTU 9000, a Spark's netdev names) and give
    them the
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


def _ssh_key(lay: Layout) -> None:
    lay.ssh_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(lay.ssh_dir, 0o700)
    if not lay.ssh_key.exists():
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"fleetctl-lab@{lay.root}",
                "-f",
                str(lay.ssh_key),
            ],
            check=True,
        )


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


def _nodes(
    lay: Layout, engine: Dockerd, state: dict[str, Any], count: int, image: str, progress: Progress
) -> None:
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
        list(
            pool.map(
                lambda s: nodes.wait_ready(
                    lay, engine, s[0], s[1], bastion=s[2], progress=progress
                ),
                started,
            )
        )
    for name, address, _ in started:
        progress(Event("ready", address, host=name))
    _known_hosts(lay, engine, wanted, state)


def _ensure_running(
    engine: Dockerd, name: str, image: str, progress: Progress, create: Any
) -> bool:
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
    every = [(lay.bastion_name, lay.bastion_address)] + [
        (n, lay.node_address(lay.node_index(n))) for n in names
    ]
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
