"""The lab's HTTP server on loopback: whole files, byte ranges (resumable weight downloads),
errors."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

BLOB = bytes(range(256)) * 40  # 10240 bytes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    root = tmp_path_factory.mktemp("www")
    (root / "weights" / "repo").mkdir(parents=True)
    (root / "weights" / "repo" / "model.safetensors").write_bytes(BLOB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl.lab.webserver", "--bind", "127.0.0.1",
                             "--port", str(port), "--root", str(root)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "web server did not start"
            time.sleep(0.1)
    yield "127.0.0.1", port
    proc.terminate()
    proc.wait(timeout=10)


def get(
    server: tuple[str, int], path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*server, timeout=10)
    conn.request("GET", path, headers=headers or {})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


def test_whole_file(server: tuple[str, int]) -> None:
    status, headers, body = get(server, "/weights/repo/model.safetensors")
    assert status == 200 and body == BLOB
    assert headers["content-length"] == str(len(BLOB)) and headers["accept-ranges"] == "bytes"


@pytest.mark.parametrize(
    ("spec", "start", "end"),
    [
        ("bytes=0-99", 0, 99),
        ("bytes=10000-", 10000, 10239),
        ("bytes=-40", 10200, 10239),
        ("bytes=10230-99999", 10230, 10239),
    ],
)
def test_ranges(server: tuple[str, int], spec: str, start: int, end: int) -> None:
    status, headers, body = get(server, "/weights/repo/model.safetensors", {"Range": spec})
    assert status == 206
    assert body == BLOB[start: end + 1]
    assert headers["content-range"] == f"bytes {start}-{end}/{len(BLOB)}"


def test_unsatisfiable_range_and_missing_file(server: tuple[str, int]) -> None:
    status, headers, _ = get(server, "/weights/repo/model.safetensors", {"Range": "bytes=20000-"})
    assert status == 416 and headers["content-range"] == f"bytes */{len(BLOB)}"
    assert get(server, "/weights/repo/missing.bin")[0] == 404


def test_keeps_serving_after_a_range(server: tuple[str, int]) -> None:
    # HTTP/1.1 keep-alive: a range then a full answer on one connection.
    conn = http.client.HTTPConnection(*server, timeout=10)
    conn.request("GET", "/weights/repo/model.safetensors", headers={"Range": "bytes=5-9"})
    assert conn.getresponse().read() == BLOB[5:10]
    conn.request("GET", "/weights/repo/model.safetensors")
    assert conn.getresponse().read() == BLOB
    conn.close()


def test_directory_listing_is_served(server: tuple[str, int]) -> None:
    status, _, body = get(server, "/weights/repo/")
    assert status == 200 and b"model.safetensors" in body
