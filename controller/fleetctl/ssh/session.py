"""A command on a host's pooled connection, bounded in time: its session channel (retried once on
a fresh connection), its output, and its result."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
        chan_in, chan_out, chan_err = (
            chan.makefile_stdin("wb"),
            chan.makefile("r"),
            chan.makefile_stderr("r"),
        )
        if stdin is not None:
            chan_in.write(stdin)
            chan_in.channel.shutdown_write()
        out = (
            chan_out.read().decode(errors="replace")
            if on_line is None
            else _read_lines(chan_out, on_line)
        )
        err = chan_err.read().decode(errors="replace")
        rc = chan_out.channel.recv_exit_status()
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
