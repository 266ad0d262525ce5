"""Issue 32, finding 2: the weights mirror's manifest.json is read with a size cap and an overall
deadline.

Before: ``r.read()`` of whatever came (a 1.5 GB answer took 3.2 GB of memory) with only the socket's
5 s idle timeout (one byte every 2 s held ``stage`` for as long as the server liked, silently). The
servers are loopback threads; the huge answer is read in a child process whose peak RSS is the
figure.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, cast

import pytest

from fleetctl import stage
from fleetctl.errors import FleetError

#: What the hostile mirror offers in the memory test (the child must not hold it).
HUGE = 400 << 20
#: Peak RSS the child may reach while refusing it (the interpreter and fleetctl: ~60-90 MB).
RSS_LIMIT_MB = 200


@contextmanager
def _mirror(serve: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback HTTP server answering every connection with ``serve`` (at most 4, in threads)."""
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        for _ in range(4):
            while not stop.is_set():
                try:
                    conn, _ = lsock.accept()
                    break
                except TimeoutError:
                    continue
            else:
                return
            conn.settimeout(5)
            conn.recv(65536)
            threading.Thread(target=_guard, args=(serve, conn), daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{lsock.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        lsock.close()


def _guard(serve: Callable[[socket.socket], None], conn: socket.socket) -> None:
    try:
        serve(conn)
    except OSError:
        pass
    finally:
        conn.close()


def _huge(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"
                 b'{"files": [], "pad": "')
    block = b"a" * (1 << 20)
    for _ in range(HUGE // len(block)):
        conn.sendall(block)


def _drip(conn: socket.socket) -> None:
    """One byte every 0.5 s for at most 40 s: never idle long enough for the socket timeout."""
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n")
    end = time.monotonic() + 40
    while time.monotonic() < end:
        conn.sendall(b" ")
        time.sleep(0.5)


def _good(conn: socket.socket) -> None:
    body = json.dumps({"files": [{"path": "a", "size": 7}, {"path": "b", "size": 5}]}).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)


def _fakes(mirror: str) -> tuple[Any, Any]:
    w = SimpleNamespace(role="model", size_gb=1.0, repo="org/model", revision="0" * 40)
    return SimpleNamespace(weights=[w]), SimpleNamespace(vars={"fleetctl_weights_mirror": mirror})


def test_a_sane_manifest_still_gives_the_totals() -> None:
    with _mirror(_good) as url:
        recipe, inv = _fakes(url)
        assert stage.expected_bytes(cast(Any, recipe), cast(Any, inv), "mirror") == {"model": 12}


CHILD = textwrap.dedent("""
    import sys
    from types import SimpleNamespace
    from fleetctl import stage
    from fleetctl.errors import FleetError
    w = SimpleNamespace(role="model", size_gb=1.0, repo="org/model", revision="0" * 40)
    try:
        stage.expected_bytes(SimpleNamespace(weights=[w]),
                             SimpleNamespace(vars={"fleetctl_weights_mirror": sys.argv[1]}),
                             "mirror")
        print("no error")
    except FleetError as e:
        print(e.message())
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over exec, so the child would
    # report the peak of the pytest worker it was forked from.
    hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
    print("PEAK_RSS_MB", int(hwm.split()[1]) // 1024)
""")


def test_a_huge_manifest_is_refused_within_a_bounded_memory() -> None:
    with _mirror(_huge) as url:
        r = subprocess.run([sys.executable, "-c", CHILD, url], capture_output=True, text=True,
                           timeout=120)
    peak = int(r.stdout.rsplit("PEAK_RSS_MB", 1)[1])
    assert peak < RSS_LIMIT_MB, (peak, r.stdout, r.stderr)
    assert f"the weights mirror {url}" in r.stdout and "more than 16 MiB" in r.stdout, r.stdout
    assert "fleetctl_weights_mirror" in r.stdout  # the fix


def test_a_dripping_manifest_gives_up_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage, "MANIFEST_DEADLINE", 3.0, raising=False)
    with _mirror(_drip) as url:
        recipe, inv = _fakes(url)
        t0 = time.monotonic()
        with pytest.raises(FleetError) as e:
            stage.expected_bytes(cast(Any, recipe), cast(Any, inv), "mirror")
        took = time.monotonic() - t0
    assert took < 10, took  # a 3 s deadline; the drip would go on for 40 s
    msg = e.value.message()
    assert f"the weights mirror {url}" in msg and "within 3s" in msg
    assert "fleetctl_weights_mirror" in msg


def _header_drip(conn: socket.socket) -> None:
    """Issue 39, medium 4: the status line, then headers a byte every 0.05 s for at most 40 s
    (http.client takes 100 headers of 64 KiB: the body's deadline never started)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    end = time.monotonic() + 40
    i = 0
    while time.monotonic() < end:
        conn.sendall(b"X-Pad-%d: " % i if i % 50 == 0 else b"a")
        i += 1
        time.sleep(0.05)


def test_a_header_drip_ends_at_the_deadline_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage, "MANIFEST_DEADLINE", 2.0, raising=False)
    out: list[BaseException | None] = [None]
    with _mirror(_header_drip) as url:
        recipe, inv = _fakes(url)

        def run() -> None:
            try:
                stage.expected_bytes(cast(Any, recipe), cast(Any, inv), "mirror")
            except BaseException as e:
                out[0] = e

        t0 = time.monotonic()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(15)
        took = time.monotonic() - t0
    assert not t.is_alive(), "still waiting for the headers after 15 s"
    assert took < 6, took
    assert isinstance(out[0], FleetError) and "within 2s" in out[0].message(), out[0]


def test_json_nested_too_deep_is_one_error() -> None:
    """Issue 39, low 6: "internal error: RecursionError" (exit 70) before."""

    def deep(conn: socket.socket) -> None:
        body = b'{"files": ' + b"[" * 200_000
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)

    with _mirror(deep) as url:
        recipe, inv = _fakes(url)
        with pytest.raises(FleetError, match="nested too deep") as e:
            stage.expected_bytes(cast(Any, recipe), cast(Any, inv), "mirror")
    assert "fleetctl_weights_mirror" in (e.value.fix or "")
