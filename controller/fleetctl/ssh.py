"""Direct SSH to hosts (paramiko), with host keys verified, in parallel with bounded waits.

Used where a playbook would be too slow or too coarse: status probes, the
rollout's per-host steps, soak's look at a container. Host keys are checked
against the host's ``fleetctl_known_hosts`` (or ``~/.ssh/known_hosts``); an
unknown or changed key is refused, never added.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import paramiko

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
#: use are never closed, so at most this many plus the commands running at once are open.
MAX_POOLED = 64


class _Pool:
    """Live SSH connections reused across calls (thread-safe); the least recently used idle ones
    are closed beyond :data:`MAX_POOLED`."""

    def __init__(self) -> None:
        # Insertion order is recency: a connection is moved to the end each time it is handed out.
        self._clients: dict[tuple[str, int, str], paramiko.SSHClient] = {}
        self._users: dict[tuple[str, int, str], int] = {}
        self._lock = threading.Lock()
        self._host_locks: dict[tuple[str, int, str], threading.Lock] = {}

    @staticmethod
    def _key(host: Host) -> tuple[str, int, str]:
        return (host.address, host.port, host.user)

    def client(self, host: Host, timeout: float) -> paramiko.SSHClient:
        """The host's connection (opened if needed), counted in use until :meth:`done`."""
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
                    t = c.get_transport()
                    if t is not None and t.is_active():
                        return c
                    with self._lock:
                        if self._clients.get(key) is c:
                            del self._clients[key]
                    _close_bounded([c])
                c = _connect(host, timeout)
                with self._lock:
                    self._clients[key] = c
                return c
        except BaseException:
            self.done(host)
            raise

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
            closing = [self._clients.pop(k) for k in evict]
        if closing:
            _close_bounded(closing)

    def size(self) -> int:
        """Connections open in the pool now."""
        with self._lock:
            return len(self._clients)

    def drop(self, host: Host) -> None:
        key = self._key(host)
        with self._lock:
            c = self._clients.pop(key, None)
        if c is not None:
            _close_bounded([c])

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        _close_bounded(clients)


_POOL = _Pool()

#: How long closing connections may take before they are abandoned.
CLOSE_TIMEOUT = 5.0


def _close_bounded(clients: list[paramiko.SSHClient], timeout: float = CLOSE_TIMEOUT) -> None:
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


def _connect(host: Host, timeout: float) -> paramiko.SSHClient:
    c = paramiko.SSHClient()
    known = Path(host.known_hosts).expanduser() if host.known_hosts else Path("~/.ssh/known_hosts").expanduser()
    if not known.exists():
        raise FleetError(
            f"known_hosts file {known} does not exist, so the host key cannot be verified",
            host=host.name,
            fix="set fleetctl_known_hosts for the host (the lab writes one) or ssh-keyscan it after checking the fingerprint",
        )
    c.load_host_keys(str(known))
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        c.connect(
            host.address,
            port=host.port,
            username=host.user,
            key_filename=host.key_file,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            allow_agent=host.key_file is None,
            look_for_keys=host.key_file is None,
        )
    except paramiko.BadHostKeyException:
        raise FleetError(
            f"host key of {host.address} does not match {known}",
            host=host.name,
            fix="if the host was reinstalled, verify its new fingerprint and update known_hosts",
        ) from None
    except paramiko.SSHException as e:
        if "not found in known_hosts" in str(e):
            raise FleetError(
                f"host key of {host.address} is not in {known}",
                host=host.name,
                fix="add the host's verified key to that known_hosts file",
            ) from None
        raise HostUnreachable(f"SSH to {host.address}:{host.port} failed: {e}", host=host.name,
                              fix="check that sshd runs and the key is authorised") from None
    except (TimeoutError, OSError, EOFError) as e:
        raise HostUnreachable(
            f"cannot reach {host.address}:{host.port} over SSH ({e or type(e).__name__})",
            host=host.name,
            fix="check that the host is up and on the network, or leave it out with --limit '!NAME'",
        ) from None
    return c


def run(host: Host, command: str | list[str], timeout: float = 60.0,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, stdin: str | None = None) -> CommandResult:
    """Run ``command`` on ``host`` (a list is shell-quoted), waiting at most ``timeout`` seconds."""
    cmd = command if isinstance(command, str) else shlex.join(command)
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
        out = chan_out.read().decode(errors="replace")
        err = chan_err.read().decode(errors="replace")
        rc = chan_out.channel.recv_exit_status()
    except TimeoutError:
        _POOL.drop(host)
        raise HostUnreachable(
            f"`{_short(cmd)}` did not finish within {timeout:.0f}s", host=host.name,
            fix="check the host's load and network; raise the timeout if the step is legitimately slow",
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as e:
        _POOL.drop(host)
        raise HostUnreachable(f"SSH session to {host.address} broke: {e}", host=host.name,
                              fix="check that the host is up and on the network") from None
    finally:
        chan.close()
        _POOL.done(host)
    return CommandResult(host.name, cmd, rc, out, err, time.monotonic() - t0)


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
    client = _POOL.client(host, connect_timeout)
    transport = client.get_transport()
    try:
        if transport is None:
            raise paramiko.SSHException("connection closed")
        return transport.open_session(timeout=min(timeout, CHANNEL_OPEN_TIMEOUT))
    except (paramiko.SSHException, OSError, EOFError):
        _POOL.done(host)
        _POOL.drop(host)
    transport = _POOL.client(host, connect_timeout).get_transport()
    try:
        if transport is None:
            raise paramiko.SSHException("connection closed right after it was opened")
        return transport.open_session(timeout=timeout)
    except BaseException:
        _POOL.done(host)
        raise


def put_text(host: Host, path: str, text: str, mode: int = 0o644, timeout: float = 30.0) -> None:
    """Write ``text`` to ``path`` on ``host`` atomically (temp file + rename)."""
    tmp = f"{path}.fleetctl-tmp"
    run(host, f"umask 077; cat > {shlex.quote(tmp)} && chmod {mode:o} {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}",
        timeout=timeout, stdin=text).check(f"writing {path}")


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
    """Close every pooled connection (end of a command, or between tests)."""
    _POOL.close()


def _short(cmd: str, n: int = 60) -> str:
    return cmd if len(cmd) <= n else cmd[: n - 1] + "…"
