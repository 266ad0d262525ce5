"""``fleetctl lab down``: every node, service and mount of the lab removed, and what a lab left
behind found (:func:`leftover`)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from fleetctl.errors import FleetError
from fleetctl.lab import fabric, procs
from fleetctl.lab.dockerd import Dockerd
from fleetctl.lab.frontdoor import LabFrontDoor
from fleetctl.lab.lab_state import existing, locked
from fleetctl.lab.layout import Layout
from fleetctl.lab.services import Registry, WebServer
from fleetctl.progress import NULL, Event, Progress


def down(progress: Progress = NULL) -> list[str]:
    """Remove everything the lab created (processes, containers, network, mounts, its directory).

    Returns what was left behind that could not be removed (empty on success);
    the shared cache (rootfs tarballs, apt key) is kept.
    """
    lay = existing()
    leftovers: list[str] = []
    with locked(lay, progress):
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
    """What of the lab still exists: processes, mounts, its interface, its directory (empty when
    clean)."""
    lay = lay or existing()
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
