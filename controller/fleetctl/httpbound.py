"""One HTTP exchange with a server that may be hostile, bounded in time and in size as a whole.

A socket timeout bounds one wait, not a request: a server that drips its status line and a
hundred 64 KiB headers a byte at a time holds ``urllib`` for hours. :func:`exchange` arms a
watchdog when the request starts that shuts the connection's socket at the deadline, whatever
``http.client`` is doing then (connecting, sending, reading headers or the body), as the web UI's
connection deadline does (``cli/ui.py``), and reads the body with a size cap. Only http and https
are spoken: the opener has no file, ftp or data handler (a ``file:///dev/stdin`` URL named by a
server is "unknown url type", not a read of the controller's stdin).

Standard library only: the registry, the weights mirror and the webhooks each make a handful of
requests, and the watchdog needs the socket ``http.client`` opens, which its connection classes
give to a subclass.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import FleetError


class Expired(Exception):
    """The exchange ran past its deadline (the watchdog shut its socket)."""


class TooLarge(Exception):
    """The answer's body is larger than the cap."""


@dataclass
class _Watchdog:
    """Shuts every socket of one exchange at its deadline."""

    deadline: float
    fired: bool = False
    socks: list[socket.socket] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, sock: socket.socket) -> None:
        with self.lock:
            self.socks.append(sock)
            if self.fired:
                _shut(sock)

    def fire(self) -> None:
        with self.lock:
            self.fired = True
            for s in self.socks:
                _shut(s)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Conn(http.client.HTTPConnection):
    """A connection whose socket the watchdog shuts at the deadline, from the moment it exists."""

    def __init__(self, *args: Any, watchdog: _Watchdog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watchdog = watchdog

    def connect(self) -> None:
        super().connect()
        self._watchdog.add(self.sock)


class _TLSConn(_Conn, http.client.HTTPSConnection):
    """The same over TLS (``super().connect()`` is HTTPSConnection's: the wrapped socket)."""


class _Handler(urllib.request.HTTPSHandler):
    """http and https through watched connections (certificates verified as urllib's own)."""

    http_request = urllib.request.AbstractHTTPHandler.do_request_

    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_Conn, watchdog=self._watchdog), req)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        conn = functools.partial(_TLSConn, watchdog=self._watchdog)
        return self.do_open(conn, req, context=self._context)  # type: ignore[attr-defined]


def opener(watchdog: _Watchdog,
           *handlers: urllib.request.BaseHandler) -> urllib.request.OpenerDirector:
    """An opener of http and https only (no file, ftp or data handler), its sockets watched,
    with ``handlers`` (a redirect policy) added."""
    o = urllib.request.OpenerDirector()
    for h in (urllib.request.ProxyHandler(), _Handler(watchdog),
              urllib.request.UnknownHandler(),
              urllib.request.HTTPDefaultErrorHandler(), urllib.request.HTTPErrorProcessor(),
              *handlers):
        o.add_handler(h)
    if not any(isinstance(h, urllib.request.HTTPRedirectHandler) for h in handlers):
        o.add_handler(_NoRedirect())
    return o


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are answers, not followed (the caller says what a 3xx means)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        return None


@contextlib.contextmanager
def _armed(deadline: float) -> Iterator[_Watchdog]:
    dog = _Watchdog(deadline)
    timer = threading.Timer(deadline, dog.fire)
    timer.daemon = True
    timer.start()
    try:
        yield dog
    finally:
        timer.cancel()


@dataclass(frozen=True)
class Answer:
    """A server's answer: status, headers (names lower-cased) and the body."""

    status: int
    headers: dict[str, str]
    body: bytes


def exchange(req: urllib.request.Request, *, timeout: float, deadline: float, max_bytes: int,
             handlers: tuple[urllib.request.BaseHandler, ...] = ()) -> Answer:
    """``req`` sent and its whole answer read within ``deadline`` seconds (``timeout``: one wait),
    at most ``max_bytes`` of body (0: the body is not read, only the status and headers). An HTTP
    error status is an answer too.

    Raises :class:`Expired` past the deadline, :class:`TooLarge` past the cap, and what urllib
    raises for a server that cannot be reached (``URLError``, ``OSError``,
    ``http.client.HTTPException``)."""
    end = time.monotonic() + deadline
    with _armed(deadline) as dog:
        try:
            try:
                resp = opener(dog, *handlers).open(req, timeout=timeout)
            except urllib.error.HTTPError as e:
                resp = e
            with resp:
                headers = {str(k).lower(): str(v) for k, v in resp.headers.items()}
                body = _read(resp, end, max_bytes) if max_bytes else b""
            if dog.fired:  # a socket shut by the watchdog reads as the end of a short body
                raise Expired()
            return Answer(resp.status or 0, headers, body)
        except (OSError, http.client.HTTPException, ValueError):
            if dog.fired or time.monotonic() > end:
                raise Expired() from None
            raise


def _read(resp: Any, end: float, max_bytes: int) -> bytes:
    parts: list[bytes] = []
    n = 0
    # read1 returns what has arrived: read(n) would wait for all n bytes of a dripping answer.
    read = getattr(resp, "read1", resp.read)
    while True:
        if time.monotonic() > end:
            raise Expired()
        chunk = read(min(65536, max_bytes + 1 - n))
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        n += len(chunk)
        if n > max_bytes:
            raise TooLarge()


def loads(body: bytes, where: str, fix: str) -> Any:
    """``body`` as JSON; else one FleetError naming ``where``. JSON nested past the parser's
    recursion limit (a few thousand ``[``) is such an error too, never a RecursionError's
    traceback (the C parser checks its depth and unwinds cleanly)."""
    try:
        return json.loads(body)
    except RecursionError:
        raise FleetError(f"{where} answered with JSON nested too deep to be a real answer",
                         fix=fix) from None
    except ValueError:
        raise FleetError(f"{where} answered with something that is not JSON", fix=fix) from None
