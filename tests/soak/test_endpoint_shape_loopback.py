"""Issue 32, findings 8 and 17: ``soak --endpoint`` with a query, a ``.../v1`` base or a hung
/health.

Before: ``--endpoint 'http://h:p/?api_key=...'`` was accepted (the key in progress, the event log
and the run directory's name) and the soak polled ``/?api_key=.../health`` until the readiness
deadline; a ``.../v1`` base URL waited out the deadline on 404s; a /health that accepts and never
answers waited out the deadline too (600 s by default), called "timeout" like a server still
loading. Here the deadline is 60 s and each case must end well before it, in this process, on
loopback.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fleetctl.cli.main import main
from fleetctl.soak import readiness

from .fakevllm import FakeVLLM, serve

SECRET = "sk-query-token-5e1d0c"
Run = Callable[..., tuple[int, str, float]]


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """``fleetctl ARGV...`` in this process: exit code, stdout + stderr on one line, seconds."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY_FILE", raising=False)

    def go(*argv: str) -> tuple[int, str, float]:
        capsys.readouterr()
        t0 = time.monotonic()
        code = main(list(argv))
        took = time.monotonic() - t0
        out, err = capsys.readouterr()
        return code, (out + err).replace("\n", " "), took

    return go


def _files_text(root: Path) -> str:
    """Every path and file under ``root`` as one text (names included)."""
    if not root.exists():
        return ""
    parts = []
    for p in root.rglob("*"):
        parts.append(str(p))
        if p.is_file():
            parts.append(p.read_text(errors="replace"))
    return "\n".join(parts)


@pytest.mark.parametrize("tail", [f"/?api_key={SECRET}", f"?token={SECRET}", f"/#{SECRET}"])
def test_an_endpoint_with_a_query_or_fragment_is_refused_before_any_request(
        run: Run, tmp_path: Path, tail: str) -> None:
    with serve(FakeVLLM()) as fake:
        code, out, took = run("soak", "--endpoint", fake.url + tail, "--smoke-only",
                              "--ready-timeout", "60")
    assert code == 2, out
    assert "carries a query or fragment" in out and "give the server's root" in out, out
    assert SECRET not in out and SECRET not in _files_text(tmp_path / "state")
    assert took < 10, took


def test_a_v1_base_url_fails_at_once_with_the_fix(run: Run) -> None:
    with serve(FakeVLLM()) as fake:
        code, out, took = run("soak", "--endpoint", fake.url + "/v1", "--smoke-only",
                              "--ready-timeout", "60")
    assert code != 0, out
    assert "/v1/health answered HTTP 404" in out and "not .../v1" in out, out
    assert took < 15, took  # the deadline is 60 s: a 404 is no server still loading


@contextmanager
def _hung_server() -> Iterator[str]:
    """Accepts connections (at most 32) and never answers; holds them until the test ends."""
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set() and len(held) < 32:
            try:
                held.append(lsock.accept()[0])
            except TimeoutError:
                continue

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{lsock.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        lsock.close()


def test_a_hung_health_is_told_from_a_server_still_loading(run: Run,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # 60 s in use; the probe itself waits up to 8 s.
    monkeypatch.setattr(readiness, "HUNG_SECONDS", 4.0, raising=False)
    with _hung_server() as url:
        code, out, took = run("soak", "--endpoint", url, "--smoke-only", "--ready-timeout", "60")
    assert code != 0, out
    assert "/health hangs" in out and "never answered" in out, out
    assert "still loading refuses" in out, out
    assert took < 25, took  # gave up well within the 60 s deadline


def test_a_refused_connection_is_still_waited_for_and_called_loading(run: Run) -> None:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens: a vLLM still loading
    code, out, took = run("soak", "--endpoint", f"http://127.0.0.1:{port}", "--smoke-only",
                          "--ready-timeout", "3")
    assert code != 0 and "endpoint down" in out and "not listening yet" in out, out
    assert 1.5 < took < 20, took  # waited (polls every 2 s until the 3 s deadline)
