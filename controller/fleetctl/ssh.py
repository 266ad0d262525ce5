"""Direct SSH to hosts (Fabric over paramiko), with host keys verified, in parallel with bounded waits.

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
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import fabric
import paramiko

from fleetctl.access import Hop
from fleetctl.errors import FleetError, HostUnreachable
from fleetctl.inventory import Host

T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class CommandResult:
    """What one command on one host returned."""

    host: str
    command: str
    rc: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.rc == 0

    def check(self, what: str, fix: str | None = None) -> CommandResult:
        """Return self, or raise a FleetError naming the host, ``what`` failed and its stderr."""
        if self.rc != 0:
            detail = (self.stderr.strip() or self.stdout.strip()).splitlines()
            tail = detail[-1] if detail else f"exit code {self.rc}"
            raise FleetError(f"{what} failed: {tail}", host=self.host, fix=fix, exit_code=None)
        return self


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One host's result in a fan-out: a value, or the error that stopped it."""

    host: str
    value: T | None = None
    error: FleetError | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the host produced a value."""
        return self.error is None


#: Idle SSH connections kept open for the next command, at most. Each one holds a socket and a
#: paramiko transport thread that wakes every 0.1 s even when idle; a fleet of hundreds kept one
#: per host for the whole command (see docs/decisions/0003-bounded-fan-out.md for the cost). Connections in
#: use are never closed, so at most this many plus the commands running at once are open. Jump
#: hosts are not counted: one connection to a bastion carries every host behind it.
MAX_POOLED = 64

_Key = tuple[Hop, tuple[Hop, ...], str | None]


class _Pool:
    """Live SSH connections reused across calls (thread-safe); the least recently used idle ones
    are closed beyond :data:`MAX_POOLED`. Connections to jump hosts are shared by every pooled
    connection behind them and closed with the last one."""

    def __init__(self) -> None:
        # Insertion order is recency: a connection is moved to the end each time it is handed out.
        self._clients: dict[_Key, fabric.Connection] = {}
        self._users: dict[_Key, int] = {}
        self._lock = threading.Lock()
        self._host_locks: dict[_Key, threading.Lock] = {}
        self._gateways: dict[tuple[Hop, ...], fabric.Connection] = {}
        self._gateway_refs: dict[tuple[Hop, ...], int] = {}
        self._gateway_locks: dict[tuple[Hop, ...], threading.Lock] = {}

    @staticmethod
    def _key(host: Host) -> _Key:
        return (host.hop(), host.jumps, host.proxy_command)

    def client(self, host: Host, timeout: float) -> fabric.Connection:
        """The host's connection (opened if needed), counted in use until :meth:`done`."""
        if host.route_error is not None:
            raise host.route_error
        key = self._key(host)
        with self._lock:
            hl = self._host_locks.setdefault(key, threading.Lock())
            self._users[key] = self._users.get(key, 0) + 1
        try:
            with hl:
                with self._lock:
                    c = self._clients.pop(key, None)
                    if c is not None:
                        self._clients[key] = c
                if c is not None:
                    if _alive(c):
                        return c
                    self.drop(host)
                gateway: fabric.Connection | str | None = self._gateway(host, timeout) if host.jumps else None
                if host.proxy_command and not host.jumps:
                    gateway = host.proxy_command
                try:
                    c = _connect(host, host.hop(), gateway, timeout)
                except BaseException:
                    self._release_gateway(host.jumps)
                    raise
                with self._lock:
                    self._clients[key] = c
                return c
        except BaseException:
            self.done(host)
            raise

    def _gateway(self, host: Host, timeout: float) -> fabric.Connection:
        """The open connection to the host's last jump (through the ones before it), counted once more."""
        chain = host.jumps
        with self._lock:
            gl = self._gateway_locks.setdefault(chain, threading.Lock())
            self._gateway_refs[chain] = self._gateway_refs.get(chain, 0) + 1
        try:
            with gl:
                with self._lock:
                    g = self._gateways.get(chain)
                if g is not None and _alive(g):
                    return g
                if g is not None:
                    _close_bounded([_ChainClose(g)])
                g = None
                try:
                    for hop in chain:
                        g = _connect(host, hop, g, timeout)
                except BaseException:
                    if g is not None:  # the hops already open in front of the one that failed
                        _close_bounded([_ChainClose(g)])
                    raise
                assert g is not None
                with self._lock:
                    self._gateways[chain] = g
                return g
        except BaseException:
            self._release_gateway(chain)
            raise

    def _release_gateway(self, chain: tuple[Hop, ...]) -> None:
        """One pooled connection through ``chain`` is gone; close the chain after the last one."""
        if not chain:
            return
        with self._lock:
            n = self._gateway_refs.get(chain, 0) - 1
            if n > 0:
                self._gateway_refs[chain] = n
                return
            self._gateway_refs.pop(chain, None)
            g = self._gateways.pop(chain, None)
        if g is not None:
            _close_bounded([_ChainClose(g)])

    def done(self, host: Host) -> None:
        """One user of the host's connection finished; close idle connections beyond the bound."""
        key = self._key(host)
        with self._lock:
            n = self._users.get(key, 0) - 1
            if n > 0:
                self._users[key] = n
            else:
                self._users.pop(key, None)
            extra = len(self._clients) - MAX_POOLED
            evict = [k for k in self._clients if k not in self._users][:max(0, extra)]
            closing = [(k, self._clients.pop(k)) for k in evict]
        self._close(closing)

    def _close(self, closing: list[tuple[_Key, fabric.Connection]]) -> None:
        if closing:
            _close_bounded([c for _, c in closing])
            for (_, chain, _), _c in closing:
                self._release_gateway(chain)

    def size(self) -> int:
        """Connections open in the pool now (jump hosts not counted)."""
        with self._lock:
            return len(self._clients)

    def gateways(self) -> int:
        """Connections to jump hosts open now."""
        with self._lock:
            return len(self._gateways)

    def drop(self, host: Host) -> None:
        key = self._key(host)
        with self._lock:
            c = self._clients.pop(key, None)
        if c is not None:
            self._close([(key, c)])

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
            gateways, self._gateways = list(self._gateways.values()), {}
            self._gateway_refs.clear()
        _close_bounded(clients)
        _close_bounded([_ChainClose(g) for g in gateways])


_POOL = _Pool()

#: How long closing connections may take before they are abandoned.
CLOSE_TIMEOUT = 5.0


class _Closable(Protocol):
    def close(self) -> None: ...


def _close_bounded(clients: Sequence[_Closable], timeout: float = CLOSE_TIMEOUT) -> None:
    """Close connections in daemon threads, waiting at most ``timeout`` seconds for all of them.

    paramiko's ``Transport.close`` can deadlock (seen in ``Channel._unlink``) while
    another thread still reads a channel of that transport, e.g. a fan-out worker
    left behind by a timed-out host. A stuck close must never hang the controller:
    it is abandoned to its daemon thread, which dies with the process.
    """
    threads = [threading.Thread(target=c.close, daemon=True, name="fleetctl-ssh-close") for c in clients]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def _chain(c: fabric.Connection) -> list[fabric.Connection]:
    """A jump host's connection and those in front of it (Fabric's close closes only the first)."""
    out = []
    while c:
        out.append(c)
        c = c.gateway
    return out


class _ChainClose:
    """Closes a jump chain innermost first, in one thread: an inner close still sends on the
    transport in front of it, which must not be closing at the same time."""

    def __init__(self, gateway: fabric.Connection) -> None:
        self.hops = _chain(gateway)

    def close(self) -> None:
        for c in self.hops:
            c.close()


def _alive(c: fabric.Connection) -> bool:
    t = c.transport
    return t is not None and t.is_active()


#: Fabric's defaults only: no ssh_config lookup (fleetctl.access resolved the route with Ansible's
#: precedence, which Fabric's would not apply) and no /etc/fabric.yaml or ~/.fabric.yaml (lazy),
#: whose connect_kwargs would add keys behind the inventory's back.
_FABRIC_CONFIG = fabric.Config(ssh_config=paramiko.SSHConfig(), lazy=True)


class _Connection(fabric.Connection):  # type: ignore[misc]
    """Fabric's connection whose ProxyJump channel open is bounded (Fabric waits paramiko's hour)
    and whose ProxyCommand is taken as given (Fabric re-expands it with port 22 and the local user)."""

    open_timeout: float = DEFAULT_CONNECT_TIMEOUT

    def open_gateway(self) -> paramiko.Channel | paramiko.ProxyCommand:
        if isinstance(self.gateway, str):
            # through a shell, as ssh runs it (pipes, quoting, ~ in paths)
            return paramiko.ProxyCommand(shlex.join(["/bin/sh", "-c", "exec " + self.gateway]))
        self.gateway.open()
        transport: paramiko.Transport = self.gateway.transport
        return transport.open_channel(
            kind="direct-tcpip", dest_addr=(self.host, int(self.port)), src_addr=("", 0),
            timeout=self.open_timeout)


def _connect(host: Host, hop: Hop, gateway: fabric.Connection | str | None, timeout: float) -> fabric.Connection:
    """An open connection to ``hop`` (through ``gateway``), its host key verified; errors name the hop."""
    target = hop == host.hop()
    what = f"{hop.address}:{hop.port}" if target else f"jump host {hop.label}"
    via = (f" via ProxyCommand {gateway!r}" if isinstance(gateway, str) else
           f" via {gateway.user}@{gateway.host}:{gateway.port}" if gateway is not None else "")
    login = f"{hop.user}@{what}" if target else what
    known = hop.known_hosts_path()
    if not known.exists():
        raise FleetError(
            f"known_hosts file {known} does not exist, so the host key of {what} cannot be verified",
            host=host.name,
            fix="set fleetctl_known_hosts for the host (the lab writes one) or ssh-keyscan it after checking the fingerprint",
        )
    keys = list(hop.key_files)
    c = _Connection(hop.address, user=hop.user, port=hop.port, config=_FABRIC_CONFIG,
                    gateway=gateway if gateway is not None else False,
                    connect_kwargs={"key_filename": keys or None, "timeout": timeout, "banner_timeout": timeout,
                                    "auth_timeout": timeout, "look_for_keys": not keys,
                                    # as ssh: the agent's keys after the files (an encrypted key file
                                    # unlocked in the agent), unless IdentitiesOnly
                                    "allow_agent": not (keys and hop.identities_only)})
    c.open_timeout = timeout
    # Fabric's client adds unknown host keys (AutoAddPolicy) and loads none: every hop, jump
    # hosts included, is checked against its known_hosts file and an unknown key refused.
    c.client.load_host_keys(str(known))
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        try:
            c.open()
        except BaseException:
            # paramiko leaves the transport of a refused connect running (e.g. after a bad host key)
            c.client.close()
            raise
    except paramiko.BadHostKeyException:
        raise FleetError(
            f"host key of {what} does not match {known}",
            host=host.name,
            fix="if the host was reinstalled, verify its new fingerprint and update known_hosts",
        ) from None
    except paramiko.ChannelException as e:
        raise HostUnreachable(f"{getattr(gateway, 'host', 'the jump host')} cannot reach {what} ({e})",
                              host=host.name, fix="check that the host is up and reachable from the jump host") from None
    except paramiko.SSHException as e:
        if "not found in known_hosts" in str(e):
            raise FleetError(
                f"host key of {what} is not in {known}",
                host=host.name,
                fix="add the host's verified key to that known_hosts file",
            ) from None
        raise HostUnreachable(f"SSH to {login}{via} failed: {e}", host=host.name,
                              fix="check that sshd runs and the key is authorised") from None
    except (TimeoutError, OSError, EOFError) as e:
        raise HostUnreachable(
            f"cannot reach {what}{via} over SSH ({e or type(e).__name__})",
            host=host.name,
            fix="check that the host is up and on the network, or leave it out with --limit '!NAME'",
        ) from None
    return c


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
        return _exec(host, cmd, cmd, stdin, timeout, connect_timeout, on_line)
    mode = check_access(host, docker=False, connect_timeout=connect_timeout).sudo
    wrapped, feed = _sudo(host, cmd, stdin, mode)
    return _exec(host, cmd, wrapped, feed, timeout, connect_timeout, on_line)


def _sudo(host: Host, cmd: str, stdin: str | None, mode: str) -> tuple[str, str | None]:
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
    return f"sudo -k -S -p '' -u {user} -- sh -c {shlex.quote(cmd)}", password + "\n" + (stdin or "")


def _exec(host: Host, shown: str, cmd: str, stdin: str | None, timeout: float,
          connect_timeout: float, on_line: Callable[[str], None] | None = None) -> CommandResult:
    """Run ``cmd`` on the host's pooled connection; the result names ``shown`` (the caller's command).
    ``on_line``: see :func:`run` (an error it raises is its own affair: the command goes on)."""
    t0 = time.monotonic()
    try:
        chan = _open_session(host, connect_timeout, timeout)
    except (TimeoutError, paramiko.SSHException, OSError, EOFError) as e:
        _POOL.drop(host)
        raise HostUnreachable(f"SSH session to {host.address} broke: {e}", host=host.name,
                              fix="check that the host is up and on the network") from None
    try:
        chan.settimeout(timeout)
        chan.exec_command(cmd)
        chan_in, chan_out, chan_err = chan.makefile_stdin("wb"), chan.makefile("r"), chan.makefile_stderr("r")
        if stdin is not None:
            chan_in.write(stdin)
            chan_in.channel.shutdown_write()
        out = chan_out.read().decode(errors="replace") if on_line is None else _read_lines(chan_out, on_line)
        err = chan_err.read().decode(errors="replace")
        rc = chan_out.channel.recv_exit_status()
    except TimeoutError:
        _POOL.drop(host)
        raise HostUnreachable(
            f"`{_short(shown)}` did not finish within {timeout:.0f}s", host=host.name,
            fix="check the host's load and network; raise the timeout if the step is legitimately slow",
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as e:
        _POOL.drop(host)
        raise HostUnreachable(f"SSH session to {host.address} broke: {e}", host=host.name,
                              fix="check that the host is up and on the network") from None
    finally:
        chan.close()
        _POOL.done(host)
    return CommandResult(host.name, shown, rc, out, err, time.monotonic() - t0)


def _read_lines(stream: Any, on_line: Callable[[str], None]) -> str:
    """All of ``stream`` (a channel's stdout), handing each line to ``on_line`` as it comes."""
    parts: list[str] = []
    for raw in stream:
        line = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        parts.append(line)
        with contextlib.suppress(Exception):  # a display's error never stops the command it watches
            on_line(line.rstrip("\r\n"))
    return "".join(parts)


#: How long a pooled connection may take to open a channel before it is judged dead.
CHANNEL_OPEN_TIMEOUT = 10.0


def _open_session(host: Host, connect_timeout: float, timeout: float) -> paramiko.Channel:
    """A session channel on the host's pooled connection, or on a fresh one if that is dead.

    A pooled transport can look active while the peer no longer answers (a node that
    was loaded or restarted its sshd): opening a channel then times out. Nothing has
    run on the host yet, so one retry on a new connection is safe.
    Returns with the host's connection counted in use (the caller calls ``_POOL.done``);
    raises with nothing held.
    """
    transport: paramiko.Transport | None = _POOL.client(host, connect_timeout).transport
    try:
        if transport is None:
            raise paramiko.SSHException("connection closed")
        return transport.open_session(timeout=min(timeout, CHANNEL_OPEN_TIMEOUT))
    except (paramiko.SSHException, OSError, EOFError):
        _POOL.done(host)
        _POOL.drop(host)
    transport = _POOL.client(host, connect_timeout).transport
    try:
        if transport is None:
            raise paramiko.SSHException("connection closed right after it was opened")
        return transport.open_session(timeout=timeout)
    except BaseException:
        _POOL.done(host)
        raise


def put_text(host: Host, path: str, text: str, mode: int = 0o644, timeout: float = 30.0,
             become: bool = False) -> None:
    """Write ``text`` to ``path`` on ``host`` atomically (temp file + rename), as root with ``become``."""
    tmp = f"{path}.fleetctl-tmp"
    run(host, f"umask 077; cat > {shlex.quote(tmp)} && chmod {mode:o} {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}",
        timeout=timeout, stdin=text, become=become).check(f"writing {path}")


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
        return _exec(host, cmd, cmd, stdin, timeout, connect_timeout, on_line)
    how = check_access(host, sudo=False, connect_timeout=connect_timeout).docker
    if how == DOCKER_DIRECT:
        return _exec(host, cmd, cmd, stdin, timeout, connect_timeout, on_line)
    if how == DOCKER_SUDO_DOCKER:
        # a shell function stands in for the binary in every `docker` of the script
        return _exec(host, cmd, f'docker() {{ sudo -n -- docker "$@"; }}\n{cmd}', stdin, timeout, connect_timeout,
                     on_line)
    return run(host, cmd, timeout=timeout, connect_timeout=connect_timeout, stdin=stdin, become=True,
               on_line=on_line)


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

    def problems(self, host: Host, *, sudo: bool = True, docker: bool = True) -> list[tuple[str, str]]:
        """(what is missing, its fix) for each of the asked rights the login lacks."""
        u, out = self.user, []
        allow = f"echo '{u} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/fleetctl"
        if sudo and self.sudo == SUDO_NEEDS_PASSWORD:
            out.append((f"sudo asks {u} for a password and ansible_become_password is not set "
                        f"(sudo asks also when {u} may not use it at all)",
                        f"set ansible_become_password (vault) for {host.name}, or on the host: {allow}"))
        elif sudo and self.sudo == SUDO_WRONG_PASSWORD:
            out.append((f"sudo refused ansible_become_password for {u}",
                        f"correct ansible_become_password (vault) for {host.name}"))
        elif sudo and self.sudo == SUDO_NONE:
            out.append((f"{u} may not use sudo", f"on the host: {allow} (or log in as root)"))
        if docker and self.docker == DOCKER_NONE:
            out.append((f"{u} can run docker neither as a member of the docker group nor through sudo",
                        f"on the host: usermod -aG docker {u}, or echo '{u} ALL=(ALL) NOPASSWD: {self.docker_path}'"
                        " > /etc/sudoers.d/fleetctl"))
        return out


_ACCESS: dict[_Key, Access] = {}
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
    key = _POOL._key(host)
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


def _probe(host: Host, connect_timeout: float) -> Access:
    become = host.become.user
    if host.user != become:
        host.become.check_method(host.name)
    # logged in as the become user, only who it is matters: the rest of the probe stops there
    script = _PROBE.format(user=shlex.quote(become), stop="exit 0" if host.user == become else ":")
    r = _exec(host, "access probe", script, None, 30.0, connect_timeout).check(
        "checking the login's sudo and docker rights")
    said = dict(line.removeprefix("fleetctl-").partition("=")[::2] for line in r.stdout.splitlines()
                if line.startswith("fleetctl-"))
    user, groups, sudo = said.get("user", host.user), tuple(said.get("groups", "").split()), said.get("sudo", "none")
    sudo_docker, docker_path = said.get("sudo-docker") == "yes", said.get("docker-path") or "/usr/bin/docker"
    if host.user == become:
        sudo = SUDO_ROOT
    elif sudo == "password":
        if host.become.password is None:
            sudo = SUDO_NEEDS_PASSWORD
        else:
            wrapped, feed = _sudo(host, "true", None, SUDO_PASSWORD)
            tried = _exec(host, "sudo check", wrapped, feed, 30.0, connect_timeout)
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
        how = DOCKER_SUDO  # the whole command as root: `exec docker` and exported variables work too
    elif sudo_docker:
        how = DOCKER_SUDO_DOCKER
    else:
        how = DOCKER_NONE
    return Access(host.name, user, groups, sudo, how, docker_path)


#: Hosts a fan-out talks to at once by default: each is a thread and an SSH session (a few ms of
#: controller CPU per command); 32 keeps 2 cores busy without queueing the GIL behind hundreds.
FAN_OUT_WORKERS = 32


def fan_out(hosts: Iterable[Host], fn: Callable[[Host], T], timeout: float | None = None,
            max_workers: int = FAN_OUT_WORKERS) -> dict[str, Outcome[T]]:
    """Call ``fn(host)`` for every host, ``max_workers`` at once; failures are data, not exceptions.

    Each host has ``timeout`` seconds from its own start (a host queued behind busy
    workers has used none of it, so a fleet larger than the pool is not cut short). A
    host still running after its ``timeout`` is reported as unreachable and never
    delays the others' results; hosts that cannot start because every worker is held
    by such a host are reported as not started.
    """
    hosts = list(hosts)
    out: dict[str, Outcome[T]] = {}
    if not hosts:
        return out
    workers = min(max_workers, len(hosts))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleetctl-ssh")
    starts: dict[str, float] = {}

    def call(h: Host) -> T:
        starts[h.name] = time.monotonic()
        return fn(h)

    futures = {pool.submit(call, h): h for h in hosts}
    waiting = set(futures)
    late: set[Future[T]] = set()
    while waiting:
        if timeout is None:
            wait(waiting)
            waiting = set()
            break
        now = time.monotonic()
        for f in waiting:
            s = starts.get(futures[f].name)
            if s is not None and now - s >= timeout and not f.done():
                late.add(f)
        waiting -= late
        if not waiting or sum(1 for f in late if not f.done()) >= workers:
            break  # every worker is held by a host that did not answer: the rest cannot start
        deadlines = [s + timeout for f in waiting if (s := starts.get(futures[f].name)) is not None]
        nap = max(0.01, min(deadlines) - now) if deadlines else timeout
        done, _ = wait(waiting, timeout=nap, return_when=FIRST_COMPLETED)
        waiting -= done
    for f, h in futures.items():
        took = time.monotonic() - starts.get(h.name, time.monotonic())
        if f in late:
            out[h.name] = Outcome(h.name, error=HostUnreachable(
                f"no answer within {timeout:.0f}s", host=h.name,
                fix="check the host; it is reported as unreachable and left as it is"), seconds=took)
            continue
        if f in waiting:
            out[h.name] = Outcome(h.name, error=HostUnreachable(
                f"not started: all {workers} workers were held by hosts that did not answer within {timeout:.0f}s",
                host=h.name, fix="retry without the hosts reported unreachable (--limit '!NAME')"))
            continue
        exc = f.exception()
        if exc is None:
            out[h.name] = Outcome(h.name, value=f.result(), seconds=took)
        elif isinstance(exc, FleetError):
            out[h.name] = Outcome(h.name, error=exc, seconds=took)
        else:
            out[h.name] = Outcome(h.name, error=FleetError(f"{type(exc).__name__}: {exc}", host=h.name), seconds=took)
    pool.shutdown(wait=False, cancel_futures=True)
    return {h.name: out[h.name] for h in hosts}


def close_all() -> None:
    """Close every pooled connection and forget what each host's login may do (end of a command, or between tests)."""
    _POOL.close()
    with _ACCESS_LOCK:
        _ACCESS.clear()


def _short(cmd: str, n: int = 60) -> str:
    return cmd if len(cmd) <= n else cmd[: n - 1] + "…"
