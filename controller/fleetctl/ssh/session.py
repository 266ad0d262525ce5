"""A command on a host's pooled connection, bounded in time: its session channel (retried once on
a fresh connection), its output, and its result."""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Callable
from dataclasses import dataclass

import paramiko

from fleetctl.errors import FleetError, HostUnreachable
from fleetctl.inventory import Host
from fleetctl.ssh.pool import POOL


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


def exec_command(host: Host, shown: str, cmd: str, stdin: str | None, timeout: float,
          connect_timeout: float, on_line: Callable[[str], None] | None = None) -> CommandResult:
    """Run ``cmd`` on the host's pooled connection; the result names ``shown`` (the caller's
    command).
    ``on_line``: see :func:`run` (an error it raises is its own affair: the command goes on)."""
    t0 = time.monotonic()
    try:
        chan = _open_session(host, connect_timeout, timeout)
    except (TimeoutError, paramiko.SSHException, OSError, EOFError) as e:
        POOL.drop(host)
        raise HostUnreachable(f"SSH session to {host.address} broke: {e}", host=host.name,
                              fix="check that the host is up and on the network") from None
    try:
        chan.settimeout(timeout)
        chan.exec_command(cmd)
        if stdin is not None:
            chan_in = chan.makefile_stdin("wb")
            chan_in.write(stdin)
            chan_in.channel.shutdown_write()
        out_b, err_b = _read_both(chan, timeout, on_line)
        out, err = out_b.decode(errors="replace"), err_b.decode(errors="replace")
        rc = chan.recv_exit_status()
    except _TooMuch as e:
        POOL.drop(host)  # the host may still be sending: its connection is not reused
        raise FleetError(
            f"`{_short(shown)}` sent more than {MAX_OUTPUT >> 20} MiB on {e.stream}; fleetctl "
            "stopped reading and closed the connection",
            host=host.name,
            fix="run the command on the host by hand to see what it prints (a broken or "
                "compromised host can send without end)",
        ) from None
    except TimeoutError:
        POOL.drop(host)
        raise HostUnreachable(
            f"`{_short(shown)}` did not finish within {timeout:.0f}s",
            host=host.name,
            fix="check the host's load and network; raise the timeout if the step is legitimately "
                "slow",
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as e:
        POOL.drop(host)
        raise HostUnreachable(f"SSH session to {host.address} broke: {e}", host=host.name,
                              fix="check that the host is up and on the network") from None
    finally:
        chan.close()
        POOL.done(host)
    return CommandResult(host.name, shown, rc, out, err, time.monotonic() - t0)


#: Bytes a command's stdout, and its stderr, may send: a host sending without end (1.5 GB took
#: ``status`` to 3.15 GB) is cut off here. The largest legitimate output (a container's log tail,
#: ``docker inspect``, a pull's progress) is far below; a fan-out of 32 hosts holds at most
#: 32 x 2 x this.
MAX_OUTPUT = 4 << 20

#: How much of a stream is read at once.
_CHUNK = 64 << 10


class _TooMuch(Exception):
    """A command's stream went past :data:`MAX_OUTPUT`."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.stream = stream


def _read_both(chan: paramiko.Channel, timeout: float, on_line: Callable[[str], None] | None
               ) -> tuple[bytes, bytes]:
    """The command's stdout and stderr, read as they come (a host flooding one while the other is
    awaited would fill the channel's window and stall), each at most :data:`MAX_OUTPUT`; each line
    of stdout handed to ``on_line``. TimeoutError after ``timeout`` s without a byte."""
    out: list[bytes] = []
    err: list[bytes] = []
    sizes = {"stdout": 0, "stderr": 0}
    partial = b""
    # poll, not select: with hundreds of pooled connections the pipe's fd may pass FD_SETSIZE
    poller = select.poll()
    poller.register(chan.fileno(), select.POLLIN)
    while True:
        if chan.recv_ready():
            name, chunk, into = "stdout", chan.recv(_CHUNK), out
        elif chan.recv_stderr_ready():
            name, chunk, into = "stderr", chan.recv_stderr(_CHUNK), err
        elif chan.eof_received or chan.closed:
            break
        else:
            # the channel's pipe is readable on data for either stream, and at its end
            if not poller.poll(timeout * 1000):
                raise TimeoutError
            continue
        if not chunk:
            continue
        sizes[name] += len(chunk)
        if sizes[name] > MAX_OUTPUT:
            raise _TooMuch(name)
        into.append(chunk)
        if on_line is not None and name == "stdout":
            partial = _hand_lines(partial + chunk, on_line)
    if on_line is not None and partial:
        _hand_lines(partial + b"\n", on_line)
    return b"".join(out), b"".join(err)


def _hand_lines(data: bytes, on_line: Callable[[str], None]) -> bytes:
    """Each complete line of ``data`` to ``on_line``; returns the incomplete rest."""
    *lines, rest = data.split(b"\n")
    for line in lines:
        with contextlib.suppress(Exception):  # a display's error never stops the command it watches
            on_line(line.decode(errors="replace").rstrip("\r"))
    return rest


#: How long a pooled connection may take to open a channel before it is judged dead.
CHANNEL_OPEN_TIMEOUT = 10.0


def _open_session(host: Host, connect_timeout: float, timeout: float) -> paramiko.Channel:
    """A session channel on the host's pooled connection, or on a fresh one if that is dead.

    A pooled transport can look active while the peer no longer answers (a node that
    was loaded or restarted its sshd): opening a channel then times out. Nothing has
    run on the host yet, so one retry on a new connection is safe.
    Returns with the host's connection counted in use (the caller calls ``POOL.done``);
    raises with nothing held.
    """
    transport: paramiko.Transport | None = POOL.client(host, connect_timeout).transport
    try:
        if transport is None:
            raise paramiko.SSHException("connection closed")
        return transport.open_session(timeout=min(timeout, CHANNEL_OPEN_TIMEOUT))
    except (paramiko.SSHException, OSError, EOFError):
        POOL.done(host)
        POOL.drop(host)
    transport = POOL.client(host, connect_timeout).transport
    try:
        if transport is None:
            raise paramiko.SSHException("connection closed right after it was opened")
        return transport.open_session(timeout=timeout)
    except BaseException:
        POOL.done(host)
        raise


def _short(cmd: str, n: int = 60) -> str:
    return cmd if len(cmd) <= n else cmd[: n - 1] + "…"
