"""``fleetctl lab``: a simulated fleet of DGX Sparks on one machine.

Everything a lab creates lives under one directory (``$FLEETCTL_LAB_DIR``) and
one Docker engine of its own; its network is ``$FLEETCTL_LAB_SUBNET``, so that
several labs coexist. The core of fleetctl never imports this package: it sees
the lab only through the inventory the lab writes.

Public API (its parts beside this module: ``lab_state`` the lab's state file, ``bringup``,
``teardown``): :func:`up`, :func:`down`, :func:`status`, :func:`set_node`,
:func:`add_image`, :func:`node_exec`, and the :class:`LabStatus` /
:class:`LabNode` results.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.lab import fabric, images, nodes
from fleetctl.lab.bringup import up
from fleetctl.lab.dockerd import Dockerd
from fleetctl.lab.inventory import parse_recipe_options
from fleetctl.lab.lab_state import (
    LabNode,
    LabStatus,
    existing,
    locked,
    read_state,
    status,
    unit_peers,
    write_state,
)
from fleetctl.lab.nodes import Faults, InnerContainer
from fleetctl.lab.teardown import down
from fleetctl.progress import NULL, Event, Progress

__all__ = [
    "Faults",
    "InnerContainer",
    "LabNode",
    "LabStatus",
    "add_image",
    "direct_ssh",
    "down",
    "node_exec",
    "parse_recipe_options",
    "set_node",
    "status",
    "up",
]


# --- faults, images, back door
# ----------------------------------------------------------------------


def set_node(
    name: str,
    *,
    gpu: str | None = None,
    driver: str | None = None,
    disk_gb: int | None = None,
    paused: bool | None = None,
    disconnected: bool | None = None,
    next_kernel_without_nvidia: bool | None = None,
    revoked_access: bool | None = None,
    reset: bool = False,
    fabric_mtu: int | None = None,
    fabric_down: bool | None = None,
    fabric_via_mgmt: bool | None = None,
    kill_worker: bool = False,
    progress: Progress = NULL,
) -> LabNode:
    """Set faults on node ``name`` (None leaves a setting as it is; ``reset`` makes it healthy
    first).

    The fabric faults (``fabric_*``) and ``kill_worker`` (its serving containers killed, as a
    worker that
    dies mid-soak) are for a unit's member; ``kill_worker`` is an act, not a state kept."""
    lay = existing()
    with locked(lay, progress):
        state = read_state(lay)
        if name not in state.get("nodes", []):
            raise FleetError(
                f"no lab node {name!r}",
                fix="use one of: "
                    f"{', '.join(state.get('nodes', [])) or '(none: run `fleetctl lab up`)'}",
            )
        engine = Dockerd(lay)
        if engine.pid() is None:
            raise FleetError("the lab is down", fix="run `fleetctl lab up`")
        old = Faults.from_json(state.get("faults", {}).get(name, {}))
        new = Faults() if reset else old
        changes: dict[str, Any] = {
            k: v
            for k, v in {
                "gpu": gpu,
                "driver": driver,
                "disk_gb": disk_gb,
                "paused": paused,
                "disconnected": disconnected,
                "next_kernel_without_nvidia": next_kernel_without_nvidia,
                "revoked_access": revoked_access,
                "fabric_mtu": fabric_mtu,
                "fabric_down": fabric_down,
                "fabric_via_mgmt": fabric_via_mgmt,
            }.items()
            if v is not None
        }
        new = replace(new, **changes)
        peers = unit_peers(state, name)
        fabric_faults = (new.fabric_mtu, new.fabric_down, new.fabric_via_mgmt) != (
            old.fabric_mtu, old.fabric_down, old.fabric_via_mgmt)
        if (fabric_faults or kill_worker) and not peers:
            units = (
                ", ".join(f"{u} ({', '.join(ms)})" for u, ms in state.get("units", {}).items())
                or "none"
            )
            raise FleetError(
                f"{'--kill-worker' if kill_worker else 'a fabric fault'} is for a unit's member, "
                "and "
                f"the node is in no unit (units: {units})",
                host=name,
                fix="pick a member, or `fleetctl lab up --nodes N --units M` to make units",
            )
        progress(
            Event(
                "fault",
                ", ".join(f"{k}={v}" for k, v in new.active().items()) or "healthy",
                host=name,
            )
        )
        nodes.apply_faults(lay, engine, name, old, new)
        if new.fabric_mtu != old.fabric_mtu:
            fabric.set_mtu(engine, name, new.fabric_mtu)
        if new.fabric_down != old.fabric_down:
            fabric.set_half_down(engine, name, new.fabric_down)
        if new.fabric_via_mgmt != old.fabric_via_mgmt:
            fabric.set_via_mgmt(
                lay, engine, name, [lay.node_index(p) for p in peers], new.fabric_via_mgmt
            )
        if kill_worker:
            _kill_serving(engine, name, progress)
        state.setdefault("faults", {})[name] = new.active()
        write_state(lay, state)
    return status().node(name)


def _kill_serving(engine: Dockerd, name: str, progress: Progress) -> None:
    """SIGKILL every vLLM container on node ``name`` (the lab's images: AEON's and the stock
    vllm-openai),
    as a worker process that dies."""
    from fleetctl.lab.scenarios import AEON_REPOSITORY, STOCK_REPOSITORY

    vllm = [c.name for c in nodes.inner_containers(engine, name)
            if any(repo in c.image for repo in (AEON_REPOSITORY, STOCK_REPOSITORY))]
    if not vllm:
        raise FleetError("--kill-worker: no vLLM container runs on the node", host=name,
                         fix="kill a member while its unit serves (during a soak)")
    nodes.exec_(
        engine,
        name,
        ["docker", "kill", "--signal", "KILL", *vllm],
        what="killing the serving container",
    )
    progress(Event("killed", ", ".join(vllm), host=name))


def add_image(
    tag: str,
    settings: Mapping[str, str] | None = None,
    repository: str = images.VLLM_REPOSITORY,
    from_dir: str | os.PathLike[str] | None = None,
    cmd: list[str] | None = None,
    progress: Progress = NULL,
) -> str:
    """Build an image (the emulator with ``settings``, or ``from_dir`` running ``cmd``), push it;
    return its ref."""
    lay = existing()
    engine = Dockerd(lay)
    if engine.pid() is None:
        raise FleetError("the lab is down", fix="run `fleetctl lab up`")
    ref = f"{lay.registry}/{repository}:{tag}"
    images.build_tag(lay, engine, ref, dict(settings or {}), progress,
                     from_dir=Path(from_dir) if from_dir is not None else None, cmd=cmd)
    images.push(engine, ref, progress)
    with locked(lay, progress):
        state = read_state(lay)
        state["images"] = sorted(set(state.get("images", [])) | {ref})
        write_state(lay, state)
    return ref


@contextmanager
def direct_ssh() -> Iterator[None]:
    """Inside: every node's port 22 answers the controller too (not only the bastion); for
    benchmarks
    comparing a direct route with the bastion's. Closed again on the way out, also on an error."""
    lay = existing()
    engine = Dockerd(lay)
    names = list(read_state(lay).get("nodes", []))
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
    lay = existing()
    return nodes.exec_(Dockerd(lay), name, argv, input=input, timeout=timeout, check=False)


def docker_env() -> dict[str, str]:
    """Environment in which the ``docker`` CLI talks to the lab's engine."""
    return Dockerd(existing()).env()
