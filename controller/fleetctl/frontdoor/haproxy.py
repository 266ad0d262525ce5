"""HAProxy as the front door, through its runtime API (the ``stats socket ... level admin`` of
haproxy.cfg).

Commands used (HAProxy 2.x management guide, "Unix Socket commands"):

- ``set server <backend>/<server> state ready|drain|maint``: in rotation / no new sessions / out;
- ``show servers state <backend>``: ``srv_op_state`` (2 = running, as the health check sees it) and
  ``srv_admin_state`` (a bit field: 0x08 forced drain, 0x01 forced maintenance; see
  docs/frontdoor.md);
- ``show stat <backend> 4 -1`` (servers only, CSV): ``scur`` (sessions open to the server) and
  ``qcur`` (requests queued for it): their sum is the door's in-flight count.

The socket is a unix socket (``socket: /run/haproxy/admin.sock``) or TCP (``address:
10.0.0.2:9999``). One connection per command (HAProxy's non-interactive mode answers and closes),
each bounded by ``timeout`` seconds.
"""

from __future__ import annotations

import csv
import socket
from collections.abc import Mapping, Sequence

from fleetctl.frontdoor import DRAIN, MAINT, READY, DoorState, Drained, FrontDoorError, Settings
from fleetctl.inventory import Host
from fleetctl.urls import host_port

#: srv_admin_state bits (HAProxy's SRV_ADMF_*): maintenance forced / inherited / from config / from
#: DNS / from health.
ADMIN_MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
#: srv_admin_state bits: drain forced / inherited.
ADMIN_DRAIN_BITS = 0x08 | 0x10
#: srv_op_state values (HAProxy's SRV_ST_*).
OP_STATES = {0: "stopped", 1: "starting", 2: "running", 3: "stopping"}


class HAProxy:
    """One HAProxy backend whose servers are the fleet's hosts."""

    kind = "haproxy"

    def __init__(
        self,
        backend: str,
        socket_path: str | None = None,
        address: tuple[str, int] | None = None,
        servers: Mapping[str, str] | None = None,
        timeout: float = 5.0,
    ) -> None:
        if (socket_path is None) == (address is None):
            raise FrontDoorError("the haproxy front door needs exactly one of socket and address",
                                 fix="give socket: /run/haproxy/admin.sock or address: HOST:PORT")
        self.backend, self.socket_path, self.address = backend, socket_path, address
        self.servers = dict(servers or {})
        self.timeout = timeout

    def where(self) -> str:
        if self.socket_path is not None:
            return self.socket_path
        assert self.address is not None
        return host_port(*self.address)

    def server(self, host: Host) -> str:
        """The host's server name in the backend: ``servers[host]``, else the host's inventory
        name."""
        return self.servers.get(host.name, host.name)

    def command(self, line: str) -> str:
        """Send one runtime-API command and return HAProxy's whole answer."""
        try:
            if self.socket_path is not None:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(self.timeout)
                s.connect(self.socket_path)
            else:
                assert self.address is not None
                s = socket.create_connection(self.address, timeout=self.timeout)
        except OSError as e:
            raise FrontDoorError(
                f"HAProxy's runtime API at {self.where()} does not answer: {e}",
                fix="check that haproxy runs and its global section has "
                "`stats socket PATH mode 600 level admin` (or a TCP `stats socket ipv4@ADDR:PORT "
                "level admin`), and that fleetctl may open it",
            ) from None
        with s:
            try:
                s.sendall(line.encode() + b"\n")
                chunks = []
                while True:
                    data = s.recv(65536)
                    if not data:
                        break
                    chunks.append(data)
            except OSError as e:
                raise FrontDoorError(
                    f"HAProxy at {self.where()} did not answer `{line}` within "
                    f"{self.timeout:.0f}s: {e}",
                    fix="check haproxy's load and its stats socket",
                ) from None
        return b"".join(chunks).decode(errors="replace")

    def _set(self, host: Host, state: str) -> None:
        answer = self.command(
            f"set server {self.backend}/{self.server(host)} state {state}"
        ).strip()
        if answer:
            # HAProxy answers nothing on success; anything else is its refusal ("No such server.",
            # "Permission denied").
            raise FrontDoorError(
                f"HAProxy refused `set server {self.backend}/{self.server(host)} state {state}`: "
                f"{answer}",
                host=host.name,
                fix=f"check that backend {self.backend} has a server {self.server(host)} (or map "
                    "the "
                "host with fleetctl_front_door.servers) and that the socket is `level admin`",
            )

    def drain(self, host: Host) -> Drained:
        self._set(host, DRAIN)
        return Drained(host.name)

    def readmit(self, host: Host, drained: Drained | None = None) -> None:
        self._set(host, READY)

    def maint(self, host: Host) -> None:
        self._set(host, MAINT)

    def servers_state(self) -> dict[str, dict[str, str]]:
        """``show servers state <backend>`` as {server name: {column: value}}."""
        answer = self.command(f"show servers state {self.backend}")
        lines = [ln for ln in answer.splitlines() if ln.strip()]
        header = next((ln[1:].split() for ln in lines if ln.startswith("#")), None)
        if header is None:
            raise FrontDoorError(
                f"HAProxy at {self.where()} answered `show servers state {self.backend}` with "
                f"{answer.strip()[:200]!r}",
                fix=f"check that haproxy.cfg has a backend named {self.backend}",
            )
        out: dict[str, dict[str, str]] = {}
        for ln in lines:
            if ln.startswith("#") or len(ln.split()) < len(header) // 2:
                continue
            row = dict(zip(header, ln.split(), strict=False))
            if row.get("be_name") == self.backend and "srv_name" in row:
                out[row["srv_name"]] = row
        return out

    def stats(self) -> dict[str, dict[str, str]]:
        """``show stat`` of the backend's servers as {server name: {column: value}}."""
        answer = self.command(f"show stat {self.backend} 4 -1")
        lines = [ln for ln in answer.splitlines() if ln.strip()]
        if not lines or not lines[0].startswith("# "):
            raise FrontDoorError(
                f"HAProxy at {self.where()} answered `show stat` with {answer.strip()[:200]!r}",
                fix="check the stats socket's level (admin or operator)",
            )
        rows = csv.DictReader([lines[0][2:], *lines[1:]])
        return {r["svname"]: r for r in rows if r.get("pxname") == self.backend}

    def in_flight(self, host: Host) -> int | None:
        row = self.stats().get(self.server(host))
        if row is None:
            raise self._absent(host)
        return int(row.get("scur") or 0) + int(row.get("qcur") or 0)

    def _absent(self, host: Host) -> FrontDoorError:
        return FrontDoorError(
            f"HAProxy's backend {self.backend} has no server {self.server(host)}",
            host=host.name,
            fix="add the host to the backend in haproxy.cfg, or map it with "
            "fleetctl_front_door.servers: {HOST: SERVER}",
        )

    def state(self, host: Host) -> DoorState:
        return self.states([host])[host.name]

    def states(self, hosts: Sequence[Host]) -> dict[str, DoorState]:
        """Every host of ``hosts`` as HAProxy sees it, from one ``show servers state`` and one
        ``show stat``
        (a pool of hundreds is read in two commands, not two per host)."""
        rows, stats = self.servers_state(), self.stats()
        return {
            h.name: self._state_of(h, rows.get(self.server(h)), stats.get(self.server(h), {}))
            for h in hosts
        }

    def _state_of(
        self, host: Host, row: Mapping[str, str] | None, stat: Mapping[str, str]
    ) -> DoorState:
        if row is None:
            return DoorState(
                host.name, "absent", None, None, f"no server {self.server(host)} in {self.backend}"
            )
        admin_bits = int(row.get("srv_admin_state") or 0)
        op = int(row.get("srv_op_state") or 0)
        admin = (
            MAINT
            if admin_bits & ADMIN_MAINT_BITS
            else DRAIN
            if admin_bits & ADMIN_DRAIN_BITS
            else READY
        )
        flight = int(stat.get("scur") or 0) + int(stat.get("qcur") or 0)
        return DoorState(
            host.name,
            admin,
            op == 2,
            flight,
            f"{stat.get('status', '?')} (op {OP_STATES.get(op, op)}, admin {admin_bits:#x})",
        )


def from_settings(s: Settings) -> HAProxy:
    backend = s.text("backend", "vllm")
    assert backend is not None
    sock = s.text("socket", "/run/haproxy/admin.sock", required=False)
    addr = s.text("address", "10.0.0.2:9999", required=False)
    if (sock is None) == (addr is None):
        raise FrontDoorError(
            f"{s.where}: the haproxy front door needs exactly one of socket and address",
            fix="give socket: /run/haproxy/admin.sock (a unix stats socket) or address: HOST:PORT "
            "(a TCP one), both `level admin` in haproxy.cfg",
        )
    address = None
    if addr is not None:
        hostpart, _, port = addr.rpartition(":")
        if not hostpart or not port.isdigit() or not 0 < int(port) < 65536:
            raise FrontDoorError(f"{s.where}: address is {addr!r}, not HOST:PORT",
                                 fix="set fleetctl_front_door.address, e.g. address: 10.0.0.2:9999")
        address = (hostpart.strip("[]"), int(port))
    return HAProxy(backend, sock, address, s.mapping("servers", "{spark-01: s1}"),
                   s.number("timeout", 5.0, "5"))
