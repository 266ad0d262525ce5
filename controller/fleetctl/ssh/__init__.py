"""Direct SSH to hosts (Fabric over paramiko), with host keys verified, in parallel with bounded
waits.

Used where a playbook would be too slow or too coarse: status probes, the
rollout's per-host steps, soak's look at a container. A host is reached along the
route :mod:`fleetctl.access` resolved from the inventory (user, keys, ProxyJump
hops, ~/.ssh/config), each hop a Fabric ``Connection`` through the one before.
Every hop's key is checked against its known_hosts file (``fleetctl_known_hosts``,
UserKnownHostsFile, or ``~/.ssh/known_hosts``); an unknown or changed key is
refused, never added.

Commands run as the login user; a caller that needs root asks for it
(``run(..., become=True)``, :func:`docker`) and gets sudo as the inventory's
``ansible_become*`` says, with the password on stdin, never in a command line.

The parts live beside this module: ``connection`` (one hop, its host key checked), ``pool``
(connections reused), ``session`` (a command on a pooled connection), ``access_probe`` (what the
login may do) and ``fan_out`` (hosts in parallel). Their public names stay reachable here
(``ssh.run``, ``ssh.fan_out``, ``ssh.Outcome``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from fleetctl.inventory import Host
from fleetctl.ssh.access_probe import (
    DOCKER_DIRECT,
    DOCKER_NONE,
    DOCKER_SUDO,
    DOCKER_SUDO_DOCKER,
    SUDO_NEEDS_PASSWORD,
    SUDO_NONE,
    SUDO_NOPASSWD,
    SUDO_PASSWORD,
    SUDO_ROOT,
    SUDO_WRONG_PASSWORD,
    Access,
    check_access,
    forget_access,
    sudo_command,
)
from fleetctl.ssh.connection import CLOSE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT
from fleetctl.ssh.fan_out import FAN_OUT_WORKERS, Outcome, fan_out
from fleetctl.ssh.pool import MAX_POOLED, POOL
from fleetctl.ssh.session import CHANNEL_OPEN_TIMEOUT, CommandResult, exec_command

# The parts' public names, reachable as ssh.NAME as when they were all in one module.
__all__ = [
    "CHANNEL_OPEN_TIMEOUT",
    "CLOSE_TIMEOUT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DOCKER_DIRECT",
    "DOCKER_NONE",
    "DOCKER_SUDO",
    "DOCKER_SUDO_DOCKER",
    "FAN_OUT_WORKERS",
    "MAX_POOLED",
    "SUDO_NEEDS_PASSWORD",
    "SUDO_NONE",
    "SUDO_NOPASSWD",
    "SUDO_PASSWORD",
    "SUDO_ROOT",
    "SUDO_WRONG_PASSWORD",
    "Access",
    "CommandResult",
    "Outcome",
    "check_access",
    "close_all",
    "docker",
    "fan_out",
    "put_text",
    "run",
]


def run(host: Host, command: str | list[str], timeout: float = 60.0,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, stdin: str | None = None,
        become: bool = False, on_line: Callable[[str], None] | None = None) -> CommandResult:
    """Run ``command`` on ``host`` (a list is shell-quoted), waiting at most ``timeout`` seconds.

    ``become=True`` runs it as the become user (root unless ``ansible_become_user`` says
    otherwise) through sudo when the login user is someone else: ``sudo -n`` where sudo
    needs no password, else ``sudo -S`` with ``ansible_become_password`` on stdin. A
    host whose login cannot do that raises the :func:`check_access` error.
    ``on_line`` gets each line of stdout as it arrives (a long command's progress); the
    result still holds all of it.
    """
    cmd = command if isinstance(command, str) else shlex.join(command)
    if not become or host.user == host.become.user:
        return exec_command(host, cmd, cmd, stdin, timeout, connect_timeout, on_line)
    mode = check_access(host, docker=False, connect_timeout=connect_timeout).sudo
    wrapped, feed = sudo_command(host, cmd, stdin, mode)
    return exec_command(host, cmd, wrapped, feed, timeout, connect_timeout, on_line)


def put_text(host: Host, path: str, text: str, mode: int = 0o644, timeout: float = 30.0,
             become: bool = False) -> None:
    """Write ``text`` to ``path`` on ``host`` atomically (temp file + rename), as root with
    ``become``."""
    tmp = f"{path}.fleetctl-tmp"
    run(
        host,
        f"umask 077; cat > {shlex.quote(tmp)} && chmod {mode:o} {shlex.quote(tmp)} && mv -f "
        f"{shlex.quote(tmp)} {shlex.quote(path)}",
        timeout=timeout,
        stdin=text,
        become=become,
    ).check(f"writing {path}")


def docker(host: Host, command: str | list[str], timeout: float = 60.0,
           connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, stdin: str | None = None,
           on_line: Callable[[str], None] | None = None) -> CommandResult:
    """Run a command that calls ``docker`` (argv or a shell script), with the right to use it.

    As the login user when it is root or in the docker group; else the whole command
    through sudo (:func:`run` with ``become``) when the login may use sudo; else, where
    sudo allows just docker without a password (``NOPASSWD: /usr/bin/docker``), every
    ``docker`` of the script is a shell function calling ``sudo -n docker``: there, an
    ``exec docker`` and variables exported for docker do not pass (sudo resets the
    environment), so such a command needs sudo for the whole. Found once per host.
    ``on_line``: see :func:`run`.
    """
    cmd = command if isinstance(command, str) else shlex.join(command)
    if host.user == "root":
        return exec_command(host, cmd, cmd, stdin, timeout, connect_timeout, on_line)
    how = check_access(host, sudo=False, connect_timeout=connect_timeout).docker
    if how == DOCKER_DIRECT:
        return exec_command(host, cmd, cmd, stdin, timeout, connect_timeout, on_line)
    if how == DOCKER_SUDO_DOCKER:
        # a shell function stands in for the binary in every `docker` of the script
        return exec_command(
            host,
            cmd,
            f'docker() {{ sudo -n -- docker "$@"; }}\n{cmd}',
            stdin,
            timeout,
            connect_timeout,
            on_line,
        )
    return run(
        host,
        cmd,
        timeout=timeout,
        connect_timeout=connect_timeout,
        stdin=stdin,
        become=True,
        on_line=on_line,
    )


def close_all() -> None:
    """Close every pooled connection and forget what each host's login may do (end of a command, or
    between tests)."""
    POOL.close()
    forget_access()


