"""One SSH connection to one hop (Fabric over paramiko), its host key checked against its
known_hosts file, errors naming the hop; and closing connections with a bounded wait."""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import fabric
import paramiko

from fleetctl.access import Hop
from fleetctl.errors import FleetError, HostUnreachable
from fleetctl.inventory import Host

DEFAULT_CONNECT_TIMEOUT = 5.0



#: How long closing connections may take before they are abandoned.
CLOSE_TIMEOUT = 5.0


class _Closable(Protocol):
    def close(self) -> None: ...


def close_bounded(clients: Sequence[_Closable], timeout: float = CLOSE_TIMEOUT) -> None:
    """Close connections in daemon threads, waiting at most ``timeout`` seconds for all of them.

    paramiko's ``Transport.close`` can deadlock (seen in ``Channel._unlink``) while
    another thread still reads a channel of that transport, e.g. a fan-out worker
    left behind by a timed-out host. A stuck close must never hang the controller:
    it is abandoned to its daemon thread, which dies with the process.
    """
    threads = [
        threading.Thread(target=c.close, daemon=True, name="fleetctl-ssh-close") for c in clients
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def chain(c: fabric.Connection) -> list[fabric.Connection]:
    """A jump host's connection and those in front of it (Fabric's close closes only the first)."""
    out = []
    while c:
        out.append(c)
        c = c.gateway
    return out


class ChainClose:
    """Closes a jump chain innermost first, in one thread: an inner close still sends on the
    transport in front of it, which must not be closing at the same time."""

    def __init__(self, gateway: fabric.Connection) -> None:
        self.hops = chain(gateway)

    def close(self) -> None:
        for c in self.hops:
            c.close()


def alive(c: fabric.Connection) -> bool:
    t = c.transport
    return t is not None and t.is_active()


#: Fabric's defaults only: no ssh_config lookup (fleetctl.access resolved the route with Ansible's
#: precedence, which Fabric's would not apply) and no /etc/fabric.yaml or ~/.fabric.yaml (lazy),
#: whose connect_kwargs would add keys behind the inventory's back.
_FABRIC_CONFIG = fabric.Config(ssh_config=paramiko.SSHConfig(), lazy=True)


class _Connection(fabric.Connection):  # type: ignore[misc]
    """Fabric's connection whose ProxyJump channel open is bounded (Fabric waits paramiko's hour)
    and whose ProxyCommand is taken as given (Fabric re-expands it with port 22 and the local
    user)."""

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


def _key_files(host: Host, hop: Hop, login: str) -> list[str]:
    """The hop's key files that exist. The inventory's own key (``ansible_ssh_private_key_file``)
    missing is an error naming it; a missing IdentityFile of ssh_config or -i is passed over, as
    ssh does (a generic ``Host *`` block often lists keys a machine does not have)."""
    out = []
    for k in hop.key_files:
        if Path(k).expanduser().is_file():
            out.append(str(Path(k).expanduser()))
        elif k == host.key_file:
            raise FleetError(
                f"SSH key file {k} (ansible_ssh_private_key_file) does not exist, so {login} "
                "cannot be logged in to",
                host=host.name,
                fix="set ansible_ssh_private_key_file to the private key authorised on the host, "
                    "or remove it to use ~/.ssh's keys and ssh-agent",
            )
    return out


def connect(host: Host, hop: Hop, gateway: fabric.Connection | str | None,
            timeout: float) -> fabric.Connection:
    """An open connection to ``hop`` (through ``gateway``), its host key verified; errors name the
    hop."""
    target = hop == host.hop()
    what = f"{hop.address}:{hop.port}" if target else f"jump host {hop.label}"
    via = (f" via ProxyCommand {gateway!r}" if isinstance(gateway, str) else
           f" via {gateway.user}@{gateway.host}:{gateway.port}" if gateway is not None else "")
    login = f"{hop.user}@{what}" if target else what
    known = hop.known_hosts_path()
    if not known.exists():
        raise FleetError(
            f"known_hosts file {known} does not exist, so the host key of {what} cannot be "
            "verified",
            host=host.name,
            fix="set fleetctl_known_hosts for the host (the lab writes one) or ssh-keyscan it "
                "after checking the fingerprint",
        )
    keys = _key_files(host, hop, login)
    c = _Connection(
        hop.address,
        user=hop.user,
        port=hop.port,
        config=_FABRIC_CONFIG,
        gateway=gateway if gateway is not None else False,
        connect_kwargs={
            # Fabric extends its own list with this: None (no key file) was a TypeError
            **({"key_filename": keys} if keys else {}),
            "timeout": timeout,
            "banner_timeout": timeout,
            "auth_timeout": timeout,
            "look_for_keys": not keys,
            # as ssh: the agent's keys after the files (an encrypted key file
            # unlocked in the agent), unless IdentitiesOnly
            "allow_agent": not (keys and hop.identities_only),
        },
    )
    c.open_timeout = timeout
    # Fabric's client adds unknown host keys (AutoAddPolicy) and loads none: every hop, jump
    # hosts included, is checked against its known_hosts file and an unknown key refused.
    c.client.load_host_keys(str(known))
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        _open(c)
    except paramiko.BadHostKeyException:
        raise FleetError(
            f"host key of {what} does not match {known}",
            host=host.name,
            fix="if the host was reinstalled, verify its new fingerprint and update known_hosts",
        ) from None
    except paramiko.ChannelException as e:
        raise HostUnreachable(
            f"{getattr(gateway, 'host', 'the jump host')} cannot reach {what} ({e})",
            host=host.name,
            fix="check that the host is up and reachable from the jump host",
        ) from None
    except paramiko.SSHException as e:
        if "No existing session" in str(e) or "Error reading SSH protocol banner" in str(e):
            # not dropped (_open raised it again): the server is too slow, not closing
            raise HostUnreachable(
                f"SSH to {login}{via}: no SSH banner and key exchange within {timeout:g}s",
                host=host.name,
                fix="check the host's load and its sshd (an sshd that answers this late is "
                    "starved), or that an SSH server listens on that port",
            ) from None
        if "No authentication methods available" in str(e):
            raise FleetError(
                f"no SSH key to log in as {login}{via}: the inventory names no key file, "
                "~/.ssh holds no id_* key and no ssh-agent offers one",
                host=host.name,
                fix="set ansible_ssh_private_key_file (for the host or its group) to the private "
                    "key authorised on the host, or add that key to ssh-agent",
            ) from None
        if "not found in known_hosts" in str(e):
            raise FleetError(
                f"host key of {what} is not in {known}",
                host=host.name,
                fix="add the host's verified key to that known_hosts file",
            ) from None
        raise HostUnreachable(
            f"SSH to {login}{via} failed: {e}",
            host=host.name,
            fix="check that sshd runs and the key is authorised",
        ) from None
    except (EOFError, ConnectionResetError):
        raise _dropped(host.name, f"{what}{via}", gateway is not None) from None
    except (TimeoutError, OSError) as e:
        raise HostUnreachable(
            f"cannot reach {what}{via} over SSH ({str(e) or type(e).__name__})",
            host=host.name,
            fix="check that the host is up and on the network, or leave it out with --limit "
                "'!NAME'",
        ) from None
    return c


#: Tries of a connection that the server drops before its handshake ends, and the pause before
#: the next (times the try's number).
HANDSHAKE_TRIES, HANDSHAKE_PAUSE = 3, 0.5


def _open(c: fabric.Connection) -> None:
    """Open ``c``; a connection dropped in its handshake is tried again (:data:`HANDSHAKE_TRIES`
    in all). An sshd over its MaxStartups, as a bastion in front of a busy fleet is, drops new
    connections before or during the key exchange at random: that says nothing about the host.
    A refused or timed-out connect, a host key or a login refused is not tried again."""
    for n in range(1, HANDSHAKE_TRIES + 1):
        try:
            c.open()
            return
        except BaseException as e:
            dropped = _dropped_in_handshake(e, c.client.get_transport())
            # paramiko leaves the transport of a refused connect running (e.g. after a bad host key)
            c.client.close()
            if not dropped:
                raise
            if n == HANDSHAKE_TRIES:
                raise EOFError(str(e)) from e
        time.sleep(HANDSHAKE_PAUSE * n)


def _dropped_in_handshake(e: BaseException, transport: paramiko.Transport | None) -> bool:
    """The server closed the connection before the handshake ended (no timeout, no refusal).

    paramiko words a banner that timed out and one the server never sent alike ("Error reading
    SSH protocol banner": its socket.timeout has no text), and says "No existing session" both
    when the server closed the connection and when the handshake outlived the connect timeout:
    the exception paramiko's own was raised from, or the one its transport thread ended on,
    tells them apart (a transport still running is still waiting: a timeout)."""
    if isinstance(e, EOFError | ConnectionResetError):
        return True
    if not isinstance(e, paramiko.SSHException) or isinstance(
            e, paramiko.BadHostKeyException | paramiko.AuthenticationException):
        return False
    text = str(e)
    if "No existing session" in text:
        if transport is None or transport.is_active():
            return False
        e = transport.saved_exception or e
        if isinstance(e, EOFError | ConnectionResetError):
            return True
        text = str(e)
    if "Error reading SSH protocol banner" in text:
        return isinstance(e.__context__, EOFError | ConnectionResetError)
    return False


def _dropped(host: str, what: str, via_jump: bool) -> HostUnreachable:
    """The error for a host whose sshd closed every try in its handshake.

    Two causes, both of a healthy sshd: new connections over its MaxStartups, and (OpenSSH 9.8 and
    later) PerSourcePenalties, which refuses an address for a while after it made connections that
    never authenticated ("Not allowed at this time"). Through a jump host every connection to a
    host comes from the jump host's one address, so the connections that timed out or were cut
    while a host was paused or overloaded are counted against the whole fleet's route to it."""
    src = "the jump host's address" if via_jump else "this controller's address"
    return HostUnreachable(
        f"{what} closed every SSH connection in its handshake ({HANDSHAKE_TRIES} tries): its "
        f"sshd refuses {src} for now (PerSourcePenalties, OpenSSH 9.8+) or is over its "
        "MaxStartups",
        host=host,
        fix=f"exempt {src} on the host ('PerSourcePenaltyExemptList ADDRESS' in sshd_config; "
            "its sshd log says 'penalty:' when this is the cause), or raise MaxStartups; check "
            "that an SSH server listens on that port",
    )
