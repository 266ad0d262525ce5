"""State on the controller is the operator's: directories 0700, files 0600, no predictable temp
names."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from fleetctl import paths
from fleetctl.cli import main as cli_main
from fleetctl.state import ledger as fleet_ledger


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_the_state_dir_is_private_and_an_old_open_one_is_tightened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEETCTL_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    inv = tmp_path / "inv" / "hosts.yml"
    d = paths.state_dir(inv)
    assert _mode(d) == 0o700 and _mode(tmp_path / "state" / "fleetctl") == 0o700
    d.chmod(0o755)  # as an older fleetctl left it
    assert paths.state_dir(inv) == d and _mode(d) == 0o700


def test_the_ledger_and_its_wal_are_0600(tmp_path: Path) -> None:
    with fleet_ledger.open_ledger(tmp_path) as led:
        led.create(
            "ro-1",
            kind="rollout",
            recipe="r",
            requested="v1",
            tag="v1",
            digest="sha256:" + "0" * 64,
            image="img",
            options={},
            command="fleetctl rollout",
            waves=[["h1"]],
            hosts=[{"host": "h1", "wave": 0, "step": 0}],
        )
        files = [p for p in tmp_path.iterdir() if p.name.startswith(fleet_ledger.LEDGER_NAME)]
        assert len(files) >= 2, files  # the database and its write-ahead log
        assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}


def test_a_crash_traceback_is_0600_in_a_private_dir_under_an_unpredictable_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        assert sys.exc_info()[0] is RuntimeError
        first = cli_main._save_traceback()
        second = cli_main._save_traceback()
    assert first != second, "two crashes in one second keep both tracebacks"
    assert "RuntimeError: boom" in first.read_text()
    assert _mode(first) == 0o600 and _mode(first.parent) == 0o700
