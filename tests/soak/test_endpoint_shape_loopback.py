"""Issue 32, finding 8: ``soak --endpoint`` with a query or a ``.../v1`` base URL.

Before: ``--endpoint 'http://h:p/?api_key=...'`` was accepted (the key in progress, the event log and
the run directory's name) and the soak polled ``/?api_key=.../health`` until the readiness deadline;
a ``.../v1`` base URL waited out the deadline on 404s (600 s by default).
Here the deadline is 60 s and each case must end well before it, in this process, on loopback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.cli.main import main

from .fakevllm import FakeVLLM, serve

SECRET = "sk-query-token-5e1d0c"
Run = Callable[..., tuple[int, str, float]]


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """``fleetctl ARGV...`` in this process: exit code, stdout + stderr on one line, seconds taken."""
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
        code, out, took = run("soak", "--endpoint", fake.url + tail, "--smoke-only", "--ready-timeout", "60")
    assert code == 2, out
    assert "carries a query or fragment" in out and "give the server's root" in out, out
    assert SECRET not in out and SECRET not in _files_text(tmp_path / "state")
    assert took < 10, took


def test_a_v1_base_url_fails_at_once_with_the_fix(run: Run) -> None:
    with serve(FakeVLLM()) as fake:
        code, out, took = run("soak", "--endpoint", fake.url + "/v1", "--smoke-only", "--ready-timeout", "60")
    assert code != 0, out
    assert "/v1/health answered HTTP 404" in out and "not .../v1" in out, out
    assert took < 15, took  # the deadline is 60 s: a 404 is no server still loading
