"""How the lab is reached: the shape of a real Spark fleet, not a root login on every box.

DGX OS sets up an admin user with sudo, and root has no SSH key; many sites forbid
root logins and put the fleet behind a bastion. The lab does the same by default:

- every node and the bastion refuse root logins (``PermitRootLogin no``) and let
  :data:`ADMIN_USER` in with the lab's key;
- sudo asks that user for a password on one node (spark-02) and not on the others,
  and the user is in the ``docker`` group on some nodes (the odd ones) and not on the
  others, so every path fleetctl has to escalate (no sudo needed, ``sudo -n``, sudo
  with the vaulted password) runs on every test session;
- the nodes refuse SSH from the controller's own address: the controller reaches them
  only through the bastion, as ``ProxyJump`` in the generated inventory says. Nodes
  still reach each other (weights are copied between them) and the controller still
  reaches their HTTP ports (the soak), as on a flat management network behind a
  bastion.

The become password is random per lab, kept in the lab's ssh directory, and reaches
the inventory only vault-encrypted with a vault password kept beside it.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from fleetctl.lab.layout import Layout

#: The admin user a DGX Spark is set up with.
ADMIN_USER = "nvidia"
#: The node whose sudo asks for the password (when the lab has that many nodes).
PASSWORD_SUDO_NODE = 2


@dataclass(frozen=True)
class NodeAccess:
    """What the admin user may do on one node."""

    #: ``nopasswd``, ``password`` or ``none`` (no sudoers entry at all).
    sudo: str = "nopasswd"
    #: In the ``docker`` group: runs docker without sudo.
    docker_group: bool = True

    def env(self) -> dict[str, str]:
        """The settings the node's entry script reads."""
        return {
            "FLEETCTL_LAB_SUDO": self.sudo,
            "FLEETCTL_LAB_DOCKER_GROUP": "1" if self.docker_group else "0",
        }


def node_access(index: int) -> NodeAccess:
    """The default access of node ``index`` (1-based)."""
    return NodeAccess(sudo="password" if index == PASSWORD_SUDO_NODE else "nopasswd",
                      docker_group=index % 2 == 1)


def ensure_secrets(lay: Layout) -> None:
    """Make the lab's become and vault passwords (once; kept across ``up``)."""
    lay.ssh_dir.mkdir(parents=True, exist_ok=True)
    for path in (lay.become_password_file, lay.vault_password_file):
        if not path.exists():
            _write_private(path, secrets.token_urlsafe(18) + "\n")


def become_password(lay: Layout) -> str:
    """The admin user's sudo password on :data:`PASSWORD_SUDO_NODE`."""
    return lay.become_password_file.read_text().strip()


def vault_encrypt(lay: Layout, plaintext: str) -> str:
    """``plaintext`` encrypted with the lab's vault password, in the ``$ANSIBLE_VAULT;1.1`` text
    form."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    secret = VaultSecret(lay.vault_password_file.read_text().strip().encode())
    text: bytes = VaultLib([("default", secret)]).encrypt(plaintext)
    return text.decode()


def ssh_config_text(lay: Layout) -> str:
    """The lab's ssh_config: how to reach the bastion (its alias, user, key and known_hosts)."""
    return (
        f"# Written by `fleetctl lab up` for the lab in {lay.root}.\n"
        "# The inventory passes it with -F; the nodes are reached through the bastion "
        "(ProxyJump).\n"
        f"Host {lay.bastion_name}\n"
        f"  HostName {lay.bastion_address}\n"
        f"  User {ADMIN_USER}\n"
        f"  IdentityFile {lay.ssh_key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {lay.known_hosts}\n"
        "  StrictHostKeyChecking yes\n"
        "  ForwardAgent no\n"
    )


def ssh_common_args(lay: Layout) -> str:
    """``ansible_ssh_common_args`` of the lab's inventory, as an operator with a bastion writes
    it."""
    return (
        f"-F {lay.ssh_config} -o ProxyJump={lay.bastion_name} -o "
        f"UserKnownHostsFile={lay.known_hosts} "
        "-o StrictHostKeyChecking=yes -o ForwardAgent=no"
    )


def write_ssh_config(lay: Layout) -> None:
    """(Re)write the lab's ssh_config."""
    _write_private(lay.ssh_config, ssh_config_text(lay))


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)
