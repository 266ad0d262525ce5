"""The pool of live SSH connections, reused across calls: one per host, jump hosts shared by the
connections behind them, the least recently used idle ones closed beyond a bound."""

from __future__ import annotations

import threading

import fabric

from fleetctl.access import Hop
from fleetctl.inventory import Host
from fleetctl.ssh.connection import ChainClose, alive, close_bounded, connect

#: Idle SSH connections kept open for the next command, at most. Each one holds a socket and a
#: paramiko transport thread that wakes every 0.1 s even when idle; a fleet of hundreds kept one
#: per host for the whole command (see docs/decisions/0003-bounded-fan-out.md for the cost).
#: Connections in use are never closed, so at most this many plus the commands running at once are
#: open. Jump hosts are not counted: one connection to a bastion carries every host behind it.
MAX_POOLED = 64


Key = tuple[Hop, tuple[Hop, ...], str | None]


class Pool:
    """Live SSH connections reused across calls (thread-safe); the least recently used idle ones
    are closed beyond :data:`MAX_POOLED`. Connections to jump hosts are shared by every pooled
    connection behind them and closed with the last one."""

    def __init__(self) -> None:
        # Insertion order is recency: a connection is moved to the end each time it is handed out.
        self._clients: dict[Key, fabric.Connection] = {}
        self._users: dict[Key, int] = {}
        self._lock = threading.Lock()
        self._host_locks: dict[Key, threading.Lock] = {}
        self._gateways: dict[tuple[Hop, ...], fabric.Connection] = {}
        self._gateway_refs: dict[tuple[Hop, ...], int] = {}
        self._gateway_locks: dict[tuple[Hop, ...], threading.Lock] = {}

    @staticmethod
    def key(host: Host) -> Key:
        return (host.hop(), host.jumps, host.proxy_command)

    def client(self, host: Host, timeout: float) -> fabric.Connection:
        """The host's connection (opened if needed), counted in use until :meth:`done`."""
        if host.route_error is not None:
            raise host.route_error
        key = self.key(host)
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
                    if alive(c):
                        return c
                    self.drop(host)
                gateway: fabric.Connection | str | None = (
                    self._gateway(host, timeout) if host.jumps else None
                )
                if host.proxy_command and not host.jumps:
                    gateway = host.proxy_command
                try:
                    c = connect(host, host.hop(), gateway, timeout)
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
        """The open connection to the host's last jump (through the ones before it), counted once
        more."""
        chain = host.jumps
        with self._lock:
            gl = self._gateway_locks.setdefault(chain, threading.Lock())
            self._gateway_refs[chain] = self._gateway_refs.get(chain, 0) + 1
        try:
            with gl:
                with self._lock:
                    g = self._gateways.get(chain)
                if g is not None and alive(g):
                    return g
                if g is not None:
                    close_bounded([ChainClose(g)])
                g = None
                try:
                    for hop in chain:
                        g = connect(host, hop, g, timeout)
                except BaseException:
                    if g is not None:  # the hops already open in front of the one that failed
                        close_bounded([ChainClose(g)])
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
            close_bounded([ChainClose(g)])

    def done(self, host: Host) -> None:
        """One user of the host's connection finished; close idle connections beyond the bound."""
        key = self.key(host)
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

    def _close(self, closing: list[tuple[Key, fabric.Connection]]) -> None:
        if closing:
            close_bounded([c for _, c in closing])
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
        key = self.key(host)
        with self._lock:
            c = self._clients.pop(key, None)
        if c is not None:
            self._close([(key, c)])

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
            gateways, self._gateways = list(self._gateways.values()), {}
            self._gateway_refs.clear()
        close_bounded(clients)
        close_bounded([ChainClose(g) for g in gateways])


POOL = Pool()
