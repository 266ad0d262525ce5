"""What a host's login may do, found once per host and process: sudo (with or without the
password) and docker (as a member of its group, or through sudo); one error naming what is
missing and the fix."""

from __future__ import annotations

import shlex
import threading
from dataclasses import dataclass

from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.ssh.connection import DEFAULT_CONNECT_TIMEOUT
from fleetctl.ssh.pool import Key, Pool
from fleetctl.ssh.session import exec_command


def sudo_command(host: Host, cmd: str, stdin: str | None, mode: str) -> tuple[str, str | None]:
    """The sudo command line for ``cmd`` and its stdin; the password only ever goes to stdin.

    ``-k`` makes sudo ask for the password even if it cached one, so the first line of stdin
    is always taken by sudo and never reaches the command.
    """
    user = shlex.quote(host.become.user)
    if mode == SUDO_NOPASSWD:
        return f"sudo -n -u {user} -- sh -c {shlex.quote(cmd)}", stdin
    assert host.become.password is not None  # mode is SUDO_PASSWORD only when one was given
    password = host.become.password.reveal()
    if "\n" in password:
        raise FleetError("ansible_become_password holds a line break, which sudo -S cannot take",
                         host=host.name, fix="give the admin user a password without line breaks")
    return f"sudo -k -S -p '' -u {user} -- sh -c {shlex.quote(cmd)}", password + "\n" + (
        stdin or ""
    )


SUDO_ROOT = "root"  #: logged in as the become user: no sudo needed


SUDO_NOPASSWD = "nopasswd"  #: ``sudo -n`` works


SUDO_PASSWORD = "password"  #: ``sudo -S`` with ansible_become_password works


SUDO_NEEDS_PASSWORD = "needs password"  #: sudo asks for a password and none is set


SUDO_WRONG_PASSWORD = "wrong password"  #: sudo refused ansible_become_password


SUDO_NONE = "not allowed"  #: the user may not use sudo (or it is not installed)


DOCKER_DIRECT = "direct"  #: root, or in the docker group


DOCKER_SUDO_DOCKER = "sudo docker"  #: ``sudo -n docker`` is allowed (only that, perhaps)


DOCKER_SUDO = "sudo"  #: through sudo for the whole command


DOCKER_NONE = "none"


@dataclass(frozen=True)
class Access:
    """What a host's login can do, found once per host and process (see :func:`check_access`)."""

    host: str
    user: str
    groups: tuple[str, ...]
    #: One of the ``SUDO_*`` values.
    sudo: str
    #: One of the ``DOCKER_*`` values.
    docker: str
    #: Where the login's PATH finds docker (for the sudoers line of a fix).
    docker_path: str = "/usr/bin/docker"

    def problems(
        self, host: Host, *, sudo: bool = True, docker: bool = True
    ) -> list[tuple[str, str]]:
        """(what is missing, its fix) for each of the asked rights the login lacks."""
        u, out = self.user, []
        allow = f"echo '{u} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/fleetctl"
        if sudo and self.sudo == SUDO_NEEDS_PASSWORD:
            out.append(
                (
                    f"sudo asks {u} for a password and ansible_become_password is not set "
                    f"(sudo asks also when {u} may not use it at all)",
                    f"set ansible_become_password (vault) for {host.name}, or on the host: {allow}",
                )
            )
        elif sudo and self.sudo == SUDO_WRONG_PASSWORD:
            out.append((f"sudo refused ansible_become_password for {u}",
                        f"correct ansible_become_password (vault) for {host.name}"))
        elif sudo and self.sudo == SUDO_NONE:
            out.append((f"{u} may not use sudo", f"on the host: {allow} (or log in as root)"))
        if docker and self.docker == DOCKER_NONE:
            out.append(
                (
                    f"{u} can run docker neither as a member of the docker group nor through sudo",
                    f"on the host: usermod -aG docker {u}, or echo '{u} ALL=(ALL) NOPASSWD: "
                    f"{self.docker_path}'"
                    " > /etc/sudoers.d/fleetctl",
                )
            )
        return out


_ACCESS: dict[Key, Access] = {}


_ACCESS_LOCK = threading.Lock()


# Each answer on its own tagged line: a login shell's rc file may print lines of its own.
_PROBE = r"""
echo "fleetctl-user=$(id -un)"; echo "fleetctl-groups=$(id -nG)"
echo "fleetctl-docker-path=$(command -v docker || echo /usr/bin/docker)"
{stop}
if ! command -v sudo >/dev/null 2>&1; then echo fleetctl-sudo=none; exit 0; fi
if err=$(sudo -n -u {user} -- sh -c true 2>&1); then echo fleetctl-sudo=nopasswd
else case $err in *password*) echo fleetctl-sudo=password;; *) echo fleetctl-sudo=none;; esac; fi
if sudo -n -- docker --version >/dev/null 2>&1; then echo fleetctl-sudo-docker=yes; fi
"""


def check_access(host: Host, *, sudo: bool = True, docker: bool = True,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Access:
    """The host's access, checked once (login, sudo with or without the password, docker), or ONE
    FleetError naming the host, the user, what is missing and the fix.

    ``sudo``/``docker`` say which rights the caller needs; a root login has both.
    """
    key = Pool.key(host)
    with _ACCESS_LOCK:
        found = _ACCESS.get(key)
    if found is None:
        found = _probe(host, connect_timeout)
        with _ACCESS_LOCK:
            _ACCESS[key] = found
    problems = found.problems(host, sudo=sudo, docker=docker)
    if problems:
        raise FleetError("; and ".join(p for p, _ in problems) + f" (logged in as {found.user})",
                         host=host.name, fix="; ".join(f for _, f in problems))
    return found



def forget_access() -> None:
    """Forget what each host's login may do (it is probed again on next use)."""
    with _ACCESS_LOCK:
        _ACCESS.clear()

def _probe(host: Host, connect_timeout: float) -> Access:
    become = host.become.user
    if host.user != become:
        host.become.check_method(host.name)
    # logged in as the become user, only who it is matters: the rest of the probe stops there
    script = _PROBE.format(user=shlex.quote(become), stop="exit 0" if host.user == become else ":")
    r = exec_command(host, "access probe", script, None, 30.0, connect_timeout).check(
        "checking the login's sudo and docker rights")
    said = dict(line.removeprefix("fleetctl-").partition("=")[::2] for line in r.stdout.splitlines()
                if line.startswith("fleetctl-"))
    user, groups, sudo = (
        said.get("user", host.user),
        tuple(said.get("groups", "").split()),
        said.get("sudo", "none"),
    )
    sudo_docker, docker_path = (
        said.get("sudo-docker") == "yes",
        said.get("docker-path") or "/usr/bin/docker",
    )
    if host.user == become:
        sudo = SUDO_ROOT
    elif sudo == "password":
        if host.become.password is None:
            sudo = SUDO_NEEDS_PASSWORD
        else:
            wrapped, feed = sudo_command(host, "true", None, SUDO_PASSWORD)
            tried = exec_command(host, "sudo check", wrapped, feed, 30.0, connect_timeout)
            # sudo asks for the password before it says the user may not use it at all
            refused = "sudoers" in tried.stderr or "may not run" in tried.stderr
            sudo = SUDO_PASSWORD if tried.ok else SUDO_NONE if refused else SUDO_WRONG_PASSWORD
    elif sudo == "nopasswd":
        sudo = SUDO_NOPASSWD
    else:
        sudo = SUDO_NONE
    if user == "root" or "docker" in groups:
        how = DOCKER_DIRECT
    elif sudo in (SUDO_NOPASSWD, SUDO_PASSWORD):
        how = (
            DOCKER_SUDO  # the whole command as root: `exec docker` and exported variables work too
        )
    elif sudo_docker:
        how = DOCKER_SUDO_DOCKER
    else:
        how = DOCKER_NONE
    return Access(host.name, user, groups, sudo, how, docker_path)
