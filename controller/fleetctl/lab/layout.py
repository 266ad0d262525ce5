"""Where everything of one lab lives (files under its directory, addresses on its subnet).

One :class:`Layout` per lab directory; several labs coexist on one machine as
long as their directories and subnets differ.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from fleetctl import paths
from fleetctl.errors import FleetError

DEFAULT_SUBNET = "10.78.0.0/24"
#: Every lab's daemons trust registries anywhere in here (each lab's is at <gw>:5000).
TRUSTED_REGISTRIES = "10.78.0.0/16"
REGISTRY_PORT = 5000
HTTP_PORT = 8080
#: Node i (1-based) gets host number FIRST_NODE_HOST + i - 1: spark-01 = .11.
FIRST_NODE_HOST = 11
#: The bastion, the one host of the lab the controller reaches on port 22 directly.
BASTION_HOST = 10
MAX_NODES = 40
#: A unix socket path must fit in sun_path (108 bytes, NUL included).
_MAX_SOCKET_PATH = 100


@dataclass(frozen=True)
class Layout:
    """Paths and addresses of one lab."""

    root: Path
    subnet: ipaddress.IPv4Network

    # --- addresses -------------------------------------------------------------
    @property
    def gateway(self) -> str:
        """The controller's address on the lab network (registry, HTTP server)."""
        return str(self.subnet.network_address + 1)

    @property
    def registry(self) -> str:
        """``host:port`` of the lab registry."""
        return f"{self.gateway}:{REGISTRY_PORT}"

    @property
    def http_base(self) -> str:
        """Base URL of the lab's HTTP server."""
        return f"http://{self.gateway}:{HTTP_PORT}"

    @property
    def bridge(self) -> str:
        """The host interface name of the lab network (unique per subnet, <= 15 chars)."""
        return "fl" + self.subnet.network_address.packed.hex()

    @property
    def network(self) -> str:
        """The Docker network name inside the lab's own engine."""
        return "sparknet"

    @property
    def bastion_name(self) -> str:
        """The bastion's container and host name (and its alias in the lab's ssh_config)."""
        return "bastion"

    @property
    def bastion_address(self) -> str:
        """The bastion's fixed address."""
        return str(self.subnet.network_address + BASTION_HOST)

    def node_name(self, index: int) -> str:
        """``spark-01`` for index 1."""
        return f"spark-{index:02d}"

    def node_address(self, index: int) -> str:
        """The fixed address of node ``index``."""
        return str(self.subnet.network_address + FIRST_NODE_HOST + index - 1)

    def node_index(self, name: str) -> int:
        """Inverse of :meth:`node_name`; a FleetError for a name that is not a lab node."""
        prefix = "spark-"
        if not name.startswith(prefix) or not name[len(prefix):].isdigit():
            raise FleetError(
                f"{name!r} is not a lab node name",
                fix="lab nodes are called spark-01, spark-02, ...",
            )
        return int(name[len(prefix):])

    # --- files ----------------------------------------------------------------
    @property
    def engine_dir(self) -> Path:
        """The lab's own Docker engine: data, exec root, socket, pid file."""
        return self.root / "engine"

    @property
    def docker_sock(self) -> Path:
        """The socket of the lab's dockerd."""
        return self.engine_dir / "docker.sock"

    @property
    def docker_host(self) -> str:
        """``DOCKER_HOST`` value for the lab's engine."""
        return f"unix://{self.docker_sock}"

    @property
    def exec_root(self) -> Path:
        """dockerd's exec root: in the lab dir, unless containerd's sockets below it would be too
        long.

        containerd puts ``containerd/containerd.sock.ttrpc`` under it; a deep lab
        directory (a pytest tmp dir) overflows sun_path, so such a lab keeps its
        exec root under /run instead (removed by ``down`` all the same).
        """
        inside = self.engine_dir / "exec"
        if len(str(inside / "containerd" / "containerd.sock.ttrpc")) <= _MAX_SOCKET_PATH:
            return inside
        key = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        return Path("/run/fleetctl-lab") / key

    @property
    def run_dir(self) -> Path:
        """Pid files of the processes the lab started."""
        return self.root / "run"

    @property
    def log_dir(self) -> Path:
        """Logs of the lab's processes."""
        return self.root / "logs"

    @property
    def registry_dir(self) -> Path:
        """The registry's config and storage."""
        return self.root / "registry"

    @property
    def www(self) -> Path:
        """What the HTTP server serves: ``apt/`` and ``weights/``."""
        return self.root / "www"

    @property
    def ssh_dir(self) -> Path:
        """The lab's SSH key and known_hosts."""
        return self.root / "ssh"

    @property
    def ssh_key(self) -> Path:
        """The private key authorised on every node."""
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """Host keys of the nodes, collected at start."""
        return self.ssh_dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        """The ssh_config the inventory passes with ``-F``: the bastion's alias, key and
        known_hosts."""
        return self.ssh_dir / "config"

    @property
    def become_password_file(self) -> Path:
        """The admin user's sudo password on the nodes that ask for one (plain text, mode 600)."""
        return self.ssh_dir / "become-password"

    @property
    def vault_password_file(self) -> Path:
        """The Ansible Vault password the inventory's ``ansible_become_password`` is encrypted
        with."""
        return self.ssh_dir / "vault-password"

    @property
    def inventory_dir(self) -> Path:
        """The generated Ansible inventory."""
        return self.root / "inventory"

    @property
    def inventory(self) -> Path:
        """``hosts.yml`` of the generated inventory."""
        return self.inventory_dir / "hosts.yml"

    @property
    def state_file(self) -> Path:
        """The lab's own record: node count and faults (versioned JSON)."""
        return self.root / "lab.json"

    @property
    def build_dir(self) -> Path:
        """Scratch space for image builds."""
        return self.root / "build"

    def check(self) -> None:
        """Refuse paths the kernel cannot use (a unix socket path longer than sun_path)."""
        if len(str(self.docker_sock)) > _MAX_SOCKET_PATH:
            raise FleetError(
                f"lab directory {self.root} is too long: its engine socket path exceeds "
                f"{_MAX_SOCKET_PATH} characters",
                fix="set FLEETCTL_LAB_DIR to a shorter path (e.g. /var/tmp/lab-NAME)",
            )


def current() -> Layout:
    """The lab selected by ``$FLEETCTL_LAB_DIR`` and ``$FLEETCTL_LAB_SUBNET``."""
    text = os.environ.get("FLEETCTL_LAB_SUBNET", DEFAULT_SUBNET)
    try:
        subnet = ipaddress.IPv4Network(text, strict=True)
    except ValueError as e:
        raise FleetError(f"FLEETCTL_LAB_SUBNET={text!r} is not an IPv4 network: {e}",
                         fix="use a /24 inside 10.78.0.0/16, e.g. 10.78.1.0/24") from None
    trusted = ipaddress.IPv4Network(TRUSTED_REGISTRIES)
    if not subnet.subnet_of(trusted) or subnet.prefixlen > 26:
        raise FleetError(
            f"FLEETCTL_LAB_SUBNET={text} must lie inside {TRUSTED_REGISTRIES} with room for the "
            "nodes (/26 or wider)",
            fix="use a /24 inside 10.78.0.0/16, e.g. 10.78.1.0/24",
        )
    return Layout(root=paths.lab_dir(), subnet=subnet)
