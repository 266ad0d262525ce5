"""Issue 32, finding 12: report paths are checked before any traffic, not after the whole soak.

Before: ``--html DIR``, ``--json-report /proc/version`` or ``--junit dir/`` were found unwritable
only when the soak had finished: it ended as an internal error (exit 70, a traceback saved) and its
verdict's exit code was lost; ``watch --duration 8h`` would have failed the same way after 8 hours.
Now: exit 2 within seconds, one message naming the option, no request sent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.cli.main import main

from .fakevllm import FakeVLLM, serve

Run = Callable[..., tuple[int, str, float]]


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.delenv("VLLM_API_KEY", raising=False)

    def go(*argv: str) -> tuple[int, str, float]:
        capsys.readouterr()
        t0 = time.monotonic()
        code = main(list(argv))
        took = time.monotonic() - t0
        out, err = capsys.readouterr()
        return code, (out + err).replace("\n", " "), took

    return go


def _counting() -> tuple[FakeVLLM, list[int]]:
    seen: list[int] = []

    def health(_f: FakeVLLM) -> int:
        seen.append(1)
        return 200

    return FakeVLLM(health=health), seen


@pytest.mark.parametrize(("option", "where", "says"), [
    ("--html", "DIR", "is a directory"),
    ("--junit", "DIR/", "is a directory"),
    ("--json-report", "/proc/version", "cannot be written"),
    ("--json-report", "FILE/report.json", "is not a directory"),
])
def test_soak_refuses_an_unwritable_report_before_any_request(
        run: Run, tmp_path: Path, option: str, where: str, says: str) -> None:
    (tmp_path / "DIR").mkdir()
    (tmp_path / "FILE").write_text("x")
    target = where.replace("DIR", str(tmp_path / "DIR")).replace("FILE", str(tmp_path / "FILE"))
    fake, seen = _counting()
    with serve(fake) as f:
        code, out, took = run("soak", "--endpoint", f.url, "--smoke-only", "--ready-timeout", "10",
                              option, target)
    assert code == 2, out
    assert f"{option} {target}" in out and says in out, out
    assert not seen and took < 10, (len(seen), took)


def test_a_writable_report_in_a_new_directory_is_still_written(run: Run, tmp_path: Path) -> None:
    fake, seen = _counting()
    dest = tmp_path / "new" / "sub" / "r.json"
    with serve(fake) as f:
        _, out, _ = run("soak", "--endpoint", f.url, "--smoke-only", "--ready-timeout", "10",
                        "--json-report", str(dest))
    assert dest.is_file() and seen, out
    assert not list(dest.parent.glob("*.probe")), "the writability probe is removed"


def test_an_8h_watch_refuses_a_directory_report_at_once(tmp_path: Path) -> None:
    """In a child process with a 60 s timeout: before the fix it would have probed for 8 hours."""
    fake, seen = _counting()
    with serve(fake) as f:
        t0 = time.monotonic()
        try:
            r = subprocess.run(
                [sys.executable, "-c",
                 "import sys; from fleetctl.cli.main import main; sys.exit(main())",
                 "watch", "--endpoint", f.url, "--duration", "8h", "--interval", "60s",
                 "--html", str(tmp_path)],
                capture_output=True, text=True, timeout=60,
                env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                     "FLEETCTL_STATE_DIR": str(tmp_path / "s"), "COLUMNS": "1000",
                     "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
        except subprocess.TimeoutExpired:
            pytest.fail("watch --duration 8h was still running after 60 s")
        took = time.monotonic() - t0
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "--html" in r.stderr and "is a directory" in r.stderr, r.stderr
    assert not seen and took < 30, (len(seen), took)
