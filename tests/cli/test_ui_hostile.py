"""Issue 32, finding 7: ``fleetctl ui`` (and ``--ui PORT``) against idle, dripping and rebound
clients.

Before: 8 idle connections froze the page for good (no per-connection timeout); 9 kept a finished
``soak --ui`` from exiting (``shutdown()`` waited on the accept loop, blocked on a handler slot) and
then printed BrokenPipe tracebacks; any Host header was answered (a DNS-rebinding page could read
``/api/*``); ``--bind ''`` listened on every interface silently and ``--bind ::`` failed with "pick
another port". All servers here are on loopback (127.0.0.1 or ::1); "every interface" is checked
without binding it.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from fleetctl import inventory
from fleetctl.cli import ui
from fleetctl.errors import FleetError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_INVENTORY = ROOT / "inventory" / "example" / "hosts.yml"


def _fleet(tmp_path: Path) -> ui.Fleet:
    return ui.Fleet(inventory.load(str(EXAMPLE_INVENTORY)), tmp_path)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ui.BoundedServer]:
    s = ui.serve(_fleet(tmp_path), "127.0.0.1", 0)
    t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        yield s
    finally:
        s.shutdown()
        s.server_close()


def _idle(port: int, n: int, family: int = socket.AF_INET,
          host: str = "127.0.0.1") -> list[socket.socket]:
    """``n`` connections that send nothing."""
    out = []
    for _ in range(n):
        c = socket.socket(family)
        c.connect((host, port))
        out.append(c)
    return out


def _get(port: int, path: str, host_header: str | None = None, timeout: float = 30,
         host: str = "127.0.0.1") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {"Host": host_header} if host_header is not None else {}
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_idle_connections_do_not_freeze_the_page(server: ui.BoundedServer) -> None:
    port = server.server_address[1]
    held = _idle(port, ui.MAX_HANDLERS + 1)
    try:
        t0 = time.monotonic()
        status, _ = _get(port, "/api/history", timeout=30)
        took = time.monotonic() - t0
    finally:
        for c in held:
            c.close()
    assert status == 200
    assert took < 15, took  # an idle connection is dropped after 5 s; before: never answered


def test_a_dripping_request_is_cut_at_the_connection_deadline(server: ui.BoundedServer) -> None:
    c = socket.create_connection(("127.0.0.1", server.server_address[1]))
    c.settimeout(1.0)
    t0 = time.monotonic()
    closed = None
    try:
        while time.monotonic() - t0 < 40:
            try:
                # A header line that never ends, a byte a second (under the idle timeout).
                c.sendall(b"X")
                if c.recv(1024) == b"":
                    closed = time.monotonic() - t0
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = time.monotonic() - t0
                break
    finally:
        c.close()
    assert closed is not None and closed < ui.CONNECTION_DEADLINE + 5, closed  # 15 s deadline


def test_shutdown_with_idle_and_reset_connections_is_prompt_and_quiet(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    s = ui.serve(_fleet(tmp_path), "127.0.0.1", 0)
    port = s.server_address[1]
    t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    for _ in range(5):  # clients that send a request and reset the connection at once
        c = socket.create_connection(("127.0.0.1", port))
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        c.sendall(b"GET /api/history HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        c.close()
    held = _idle(port, ui.MAX_HANDLERS + 1)
    time.sleep(0.5)
    try:
        t0 = time.monotonic()
        stopper = threading.Thread(target=s.shutdown, daemon=True)
        stopper.start()
        stopper.join(30)
        took = time.monotonic() - t0
        s.server_close()
    finally:
        for c in held:
            c.close()
    assert not stopper.is_alive() and took < 10, took  # before: as long as the clients kept them
    time.sleep(0.5)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize(("host", "status"), [
    ("rebind.attacker.example", 421), ("rebind.attacker.example:8765", 421),
    ("127.0.0.1.nip.io", 421), ("", 421), ("127.0.0.1:8765", 200), ("localhost:8765", 200),
    ("[::1]:8765", 200), ("10.0.0.5", 200),
])
def test_only_this_servers_names_are_answered(server: ui.BoundedServer, host: str,
                                              status: int) -> None:
    for path in ("/api/hosts", "/api/live", "/"):
        got, body = _get(server.server_address[1], path, host_header=host)
        assert got == status, (host, path, got, body[:200])
        if status == 421:
            assert b"--allow-host" in body


def test_allow_host_adds_a_name(tmp_path: Path) -> None:
    s = ui.serve(_fleet(tmp_path), "127.0.0.1", 0, frozenset({"fleet-ui.lan"}))
    t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        assert _get(s.server_address[1], "/api/hosts", host_header="fleet-ui.lan:8765")[0] == 200
        assert _get(s.server_address[1], "/api/hosts", host_header="other.lan:8765")[0] == 421
    finally:
        s.shutdown()
        s.server_close()


def test_an_empty_bind_is_refused_and_ipv6_binds(tmp_path: Path) -> None:
    with pytest.raises(FleetError) as e:
        ui.serve(_fleet(tmp_path), "", 0)
    assert "every interface" in e.value.message() and "0.0.0.0" in e.value.message()
    s = ui.serve(_fleet(tmp_path), "::1", 0)
    t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        assert ui.url_of(s) == f"http://[::1]:{s.server_address[1]}/" and ui.exposure(s) is None
        assert _get(s.server_address[1], "/api/hosts", host="::1")[0] == 200
    finally:
        s.shutdown()
        s.server_close()


def test_an_address_of_no_interface_says_so_not_pick_another_port(tmp_path: Path) -> None:
    with pytest.raises(FleetError) as e:
        ui.serve(_fleet(tmp_path), "192.0.2.1", 0)  # TEST-NET-1: no interface of this machine
    assert "--bind" in (e.value.fix or "") and "--port" not in (e.value.fix or "")


@pytest.mark.parametrize(("address", "says"), [
    ("0.0.0.0", "every interface"), ("::", "every interface"),
    ("10.1.2.3", "reachable from other machines"),
    ("127.0.0.1", None), ("::1", None),
])
def test_every_interface_is_warned_about(address: str, says: str | None) -> None:
    fake: Any = SimpleNamespace(server_address=(address, 8765))
    warning = ui.exposure(cast(ui.BoundedServer, fake))
    assert (warning is None) if says is None else (warning is not None and says in warning), warning
