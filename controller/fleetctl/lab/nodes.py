"""Lab nodes: Docker-in-Docker containers that look like DGX Sparks, and their faults.

A node is not --privileged (the sandbox lacks CAP_SYS_RESOURCE, so runc
cannot apply the full capability set): it gets every other capability, no
seccomp/AppArmor confinement and access to all devices, which is what an inner
dockerd needs.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.lab import access, gpus
from fleetctl.lab.dockerd import Dockerd
from fleetctl.lab.images import NEWER_KERNEL
from fleetctl.lab.layout import Layout
from fleetctl.progress import NULL, Event, Progress

#: /opt's tmpfs cap (GiB; a tmpfs takes memory only for what is written, and the mirror's files
#: are small): a Spark's NVMe holds every seed recipe's min_free_gb (qwen35-35b-bf16: 90 GB).
OPT_SIZE_GB = 128
LABEL = "fleetctl.lab"


@dataclass(frozen=True)
class Faults:
    """The faults a node can carry; the defaults are a healthy Spark."""

    gpu: str = gpus.DEFAULT_GPU
    driver: str = gpus.DEFAULT_DRIVER
    disk_gb: int = OPT_SIZE_GB
    paused: bool = False
    disconnected: bool = False
    next_kernel_without_nvidia: bool = False
    #: The admin user has neither sudo nor the docker group (what a half-set-up host looks like).
    revoked_access: bool = False
    #: The fabric faults of a unit member (``fleetctl.lab.fabric``): its first netdev's MTU, its
    #: second half down, its peers routed over the management network.
    fabric_mtu: int = 9000
    fabric_down: bool = False
    fabric_via_mgmt: bool = False

    def active(self) -> dict[str, Any]:
        """Only the settings that differ from a healthy node."""
        healthy = Faults()
        return {k: v for k, v in self.__dict__.items() if getattr(healthy, k) != v}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Faults:
        """Faults from their JSON form (unknown keys ignored, missing ones healthy)."""
        known = set(Faults.__dataclass_fields__)
        return Faults(**{k: v for k, v in data.items() if k in known})


def container_state(engine: Dockerd, name: str) -> dict[str, Any] | None:
    """``docker inspect`` of the node's container, or None if it does not exist."""
    r = engine.docker("inspect", "--type", "container", name, check=False, timeout=30)
    if r.returncode != 0:
        return None
    data: list[dict[str, Any]] = json.loads(r.stdout)
    return data[0] if data else None


def exec_(
    engine: Dockerd,
    name: str,
    argv: list[str],
    input: bytes | None = None,
    timeout: float = 60,
    check: bool = True,
    what: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside node ``name`` (as root, no SSH)."""
    args = ["exec", "-i", name, *argv] if input is not None else ["exec", name, *argv]
    r = engine.docker(*args, check=False, input=input, timeout=timeout)
    if check and r.returncode != 0:
        detail = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise FleetError(
            f"{what or shlex.join(argv)} failed: {detail[-1] if detail else r.returncode}",
            host=name,
            fix="see `fleetctl lab status` and the node's /var/log",
        )
    return r


def write_file(engine: Dockerd, name: str, path: str, text: str) -> None:
    """Write ``text`` to ``path`` inside the node (parent directories created, atomic rename)."""
    q = shlex.quote(path)
    exec_(
        engine,
        name,
        ["sh", "-c", f'mkdir -p "$(dirname {q})" && cat > {q}.tmp && mv -f {q}.tmp {q}'],
        input=text.encode(),
        what=f"writing {path}",
    )


def create(layout: Layout, engine: Dockerd, index: int, image: str) -> None:
    """Create and start node ``index`` from ``image``, reached as the admin user through the
    bastion."""
    name = layout.node_name(index)
    acc = access.node_access(index)
    extra = []
    if acc.sudo == "password":
        extra += ["-v", f"{layout.become_password_file}:/etc/fleetctl-lab/sudo-password:ro"]
    for k, v in {
        **acc.env(),
        "FLEETCTL_LAB_ROLE": "node",
        "FLEETCTL_LAB_DENY_SSH_FROM": layout.gateway,
        "FLEETCTL_LAB_SSH_ROUTE": layout.bastion_address,
    }.items():
        extra += ["-e", f"{k}={v}"]
    _run(layout, engine, name, layout.node_address(index), image, [
        "--tmpfs", f"/opt:rw,exec,mode=755,size={OPT_SIZE_GB}g",
        "-v", f"{name}-docker:/var/lib/docker",
        *extra,
    ])


def create_bastion(layout: Layout, engine: Dockerd, image: str) -> None:
    """Create and start the bastion: sshd and the admin user, nothing else."""
    _run(
        layout,
        engine,
        layout.bastion_name,
        layout.bastion_address,
        image,
        ["-e", "FLEETCTL_LAB_ROLE=bastion", "-e", f"FLEETCTL_LAB_SSH_ROUTE={layout.gateway}"],
    )


def _run(
    layout: Layout, engine: Dockerd, name: str, address: str, image: str, extra: list[str]
) -> None:
    pub = layout.ssh_key.with_suffix(".pub")
    engine.docker(
        "run", "-d", "--name", name, "--hostname", name,
        "--network", layout.network, "--ip", address,
        "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--device-cgroup-rule", "a *:* rwm",
        "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "--tmpfs", "/run:rw,exec,mode=755",
        "-v", f"{pub}:/etc/fleetctl-lab/authorized_keys:ro",
        "-e", f"FLEETCTL_LAB_ADMIN={access.ADMIN_USER}",
        *extra,
        "--label", f"{LABEL}={layout.root}", "--label", f"{LABEL}.node={name}",
        "--stop-timeout", "20",
        image,
        what=f"starting {name}",
    )


def wait_ready(layout: Layout, engine: Dockerd, name: str, address: str, *, bastion: bool = False,
               timeout: float = 120, progress: Progress = NULL) -> None:
    """Wait until the entry script is done and sshd listens (and, on a node, its dockerd answers).

    A node's port 22 refuses the controller (it is reached through the bastion), so sshd is
    checked from inside; the bastion's is checked from here, as the controller will use it.
    """
    deadline = time.monotonic() + timeout
    progress(Event("waiting", "sshd" if bastion else "sshd and dockerd", host=name))
    while True:
        st = container_state(engine, name)
        if st is None or not st["State"]["Running"]:
            logs = engine.docker("logs", "--tail", "5", name, check=False).stderr.strip()
            raise FleetError(
                f"node container exited: {logs or (st and st['State'].get('Error'))}",
                host=name,
                fix=f"see `docker -H {layout.docker_host} logs {name}`",
            )
        ready = exec_(
            engine,
            name,
            ["sh", "-c", "test -e /run/fleetctl-lab-ready && test -s /run/sshd.pid"],
            check=False,
            timeout=10,
        )
        if ready.returncode == 0 and (not bastion or _port_open(address, 22)):
            if bastion:
                return
            info = exec_(
                engine,
                name,
                ["docker", "info", "--format", "{{.ServerVersion}}"],
                check=False,
                timeout=20,
            )
            if info.returncode == 0:
                return
        if time.monotonic() > deadline:
            tail = exec_(
                engine, name, ["tail", "-n", "3", "/var/log/docker.log"], check=False
            ).stdout.strip()
            raise FleetError(
                f"node not ready after {timeout:.0f}s (inner dockerd: {tail or 'no log'})",
                host=name,
                fix=f"see /var/log/docker.log on the node (`docker -H {layout.docker_host} exec "
                    f"{name} ...`)",
            )
        time.sleep(0.5)


def _port_open(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=1):
            return True
    except OSError:
        return False


def host_keys(engine: Dockerd, name: str) -> list[str]:
    """The node's public host keys (``type base64``), read from inside it."""
    r = exec_(
        engine, name, ["sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub"], what="reading the host keys"
    )
    return [" ".join(line.split()[:2]) for line in r.stdout.splitlines() if line.strip()]


def apply_faults(layout: Layout, engine: Dockerd, name: str, old: Faults, new: Faults) -> None:
    """Bring node ``name`` from ``old`` to ``new`` faults (only what changed)."""
    index = layout.node_index(name)
    was_paused = old.paused
    inside_changes = (
        old.gpu,
        old.driver,
        old.disk_gb,
        old.next_kernel_without_nvidia,
        old.revoked_access,
    ) != (new.gpu, new.driver, new.disk_gb, new.next_kernel_without_nvidia, new.revoked_access)
    if was_paused and inside_changes:
        engine.docker("unpause", name, what=f"unpausing {name}")
        was_paused = False
    if (old.gpu, old.driver) != (new.gpu, new.driver):
        for path, text in gpus.files(gpus.config(new.gpu, new.driver)).items():
            write_file(engine, name, path, text)
    if old.disk_gb != new.disk_gb:
        if new.disk_gb < 1:
            raise FleetError(f"disk_gb={new.disk_gb} is too small", host=name, fix="pass 1 or more")
        exec_(engine, name, ["mount", "-o", f"remount,size={new.disk_gb}g", "/opt"],
              what=f"resizing /opt to {new.disk_gb} GB (it may hold more than that already)")
    if old.next_kernel_without_nvidia != new.next_kernel_without_nvidia:
        if new.next_kernel_without_nvidia:
            # A kernel update landed, but DKMS did not build the NVIDIA module for it.
            exec_(
                engine,
                name,
                [
                    "sh",
                    "-c",
                    "printf 'fleetctl lab stand-in kernel image\\n' > "
                    f"/boot/vmlinuz-{NEWER_KERNEL} && "
                    f"mkdir -p /lib/modules/{NEWER_KERNEL}/kernel/drivers",
                ],
            )
        else:
            exec_(
                engine,
                name,
                ["rm", "-rf", f"/boot/vmlinuz-{NEWER_KERNEL}", f"/lib/modules/{NEWER_KERNEL}"],
            )
    if old.revoked_access != new.revoked_access:
        _set_rights(
            engine,
            name,
            access.NodeAccess(sudo="none", docker_group=False)
            if new.revoked_access
            else access.node_access(index),
        )
    if old.disconnected != new.disconnected:
        if new.disconnected:
            engine.docker(
                "network", "disconnect", layout.network, name, what=f"disconnecting {name}"
            )
        else:
            engine.docker(
                "network",
                "connect",
                "--ip",
                layout.node_address(index),
                layout.network,
                name,
                what=f"reconnecting {name}",
            )
    if new.paused and not was_paused:
        engine.docker("pause", name, what=f"pausing {name}")
    elif not new.paused and was_paused:
        engine.docker("unpause", name, what=f"unpausing {name}")


def set_direct_ssh(layout: Layout, engine: Dockerd, name: str, allowed: bool) -> None:
    """Let the controller reach node ``name``'s port 22 directly, or refuse it again (the
    default)."""
    rule = [
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        "22",
        "-s",
        layout.gateway,
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    ]
    has = exec_(engine, name, ["iptables", "-C", *rule], check=False).returncode == 0
    if allowed and has:
        exec_(engine, name, ["iptables", "-D", *rule], what="opening port 22 to the controller")
    elif not allowed and not has:
        exec_(engine, name, ["iptables", "-I", *rule], what="closing port 22 to the controller")


def _set_rights(engine: Dockerd, name: str, rights: access.NodeAccess) -> None:
    """Give the admin user of node ``name`` exactly ``rights`` (sudo, docker group), as its entry
    script does."""
    user = access.ADMIN_USER
    sudoers = {
        "nopasswd": f"{user} ALL=(ALL:ALL) NOPASSWD: ALL",
        "password": f"{user} ALL=(ALL:ALL) ALL",
    }
    line = sudoers.get(rights.sudo)
    script = "rm -f /etc/sudoers.d/90-fleetctl-lab; "
    if line:
        script += (f"echo {shlex.quote(line)} > /etc/sudoers.d/90-fleetctl-lab && chmod 440 "
                   "/etc/sudoers.d/90-fleetctl-lab; ")
    script += (
        f"usermod -aG docker {user}"
        if rights.docker_group
        else f"gpasswd -d {user} docker >/dev/null 2>&1 || true"
    )
    exec_(engine, name, ["sh", "-c", script], what=f"setting the rights of {user}")


@dataclass(frozen=True)
class InnerContainer:
    """A container running inside a node (what the node's own ``docker ps`` shows)."""

    name: str
    image: str
    status: str


def inner_containers(engine: Dockerd, name: str) -> tuple[InnerContainer, ...]:
    """The containers running inside node ``name`` (empty when the node's dockerd does not
    answer)."""
    r = exec_(engine, name, ["docker", "ps", "--format", "{{json .}}"], check=False, timeout=20)
    if r.returncode != 0:
        return ()
    out = []
    for line in r.stdout.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        out.append(InnerContainer(name=str(d.get("Names", "")), image=str(d.get("Image", "")),
                                  status=str(d.get("Status", ""))))
    return tuple(out)
