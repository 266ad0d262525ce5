"""One Spark as fleetctl reaches it: its address, its route and keys, its merged variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetctl.access import (
    Become,
    Hop,
)
from fleetctl.errors import InventoryError

#: Variables holding passwords: kept out of :attr:`Host.vars` (the become one goes to
#: :attr:`Host.become`).
_PASSWORD_VARS = ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass",
                  "ansible_password", "ansible_ssh_pass")


@dataclass(frozen=True)
class Host:
    """One Spark: how to reach it and its merged variables (all < groups < host).

    ``address``, ``port``, ``user`` and the keys are resolved as Ansible's ssh would
    (``ansible_*`` variables, then the ssh options, then ~/.ssh/config): see
    :mod:`fleetctl.access`.
    """

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    #: known_hosts file used to verify the host key (``fleetctl_known_hosts``, else
    #: UserKnownHostsFile).
    known_hosts: str | None = None
    groups: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    #: Every private key to offer (``key_file`` first, then -i/IdentityFile); empty: just
    #: ``key_file``.
    key_files: tuple[str, ...] = ()
    #: Jump hosts in front of the host (ProxyJump), first hop first.
    jumps: tuple[Hop, ...] = ()
    #: IdentitiesOnly: offer the key files alone, not the agent's keys.
    identities_only: bool = False
    #: ProxyCommand carrying the connection (``%h``/``%p``/``%r`` expanded), run through /bin/sh.
    proxy_command: str | None = None
    #: The serving unit the host is a member of (``fleetctl_unit``), None for a single host.
    unit: str | None = None
    #: The host's rank in its unit (0: the head), None for a single host.
    unit_rank: int | None = None
    #: How commands that need root run (``ansible_become*``); its password never shows.
    become: Become = field(default_factory=Become, compare=False)
    #: Why fleetctl's direct SSH cannot reach the host as the inventory says (an ssh option it
    #: cannot honour): raised by the first direct step, while playbooks still run.
    route_error: InventoryError | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        """``name (address)`` for messages."""
        return f"{self.name} ({self.address})"

    def hop(self) -> Hop:
        """The last hop of the route: this host itself."""
        keys = self.key_files or ((self.key_file,) if self.key_file else ())
        return Hop(self.address, self.port, self.user, keys, self.known_hosts, self.identities_only)
