"""Soak artifacts, JSON output and replaced symlinks are private too (issue 11 item 9;
test_private_state.py has the rest)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fleetctl import paths
from fleetctl.soak import report
from fleetctl.soak.artifacts import Artifacts


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture(autouse=True)
def _loose_umask() -> object:
    # the permissions must hold whatever the operator's umask is
    old = os.umask(0o022)
    yield
    os.umask(old)




def test_write_private_replaces_a_symlink_not_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "report.json"
    link.symlink_to(victim)
    paths.write_private(link, "x")
    assert victim.read_text() == "keep" and not link.is_symlink() and mode(link) == 0o600




def test_soak_artifacts_and_reports_are_private(tmp_path: Path) -> None:
    art = Artifacts(tmp_path / "runs" / "r1")
    art.scrape("before", 1.0, "vllm_x 1\n")
    art.write_json("verdict.json", {"a": 1})
    art.close()
    root = tmp_path / "runs" / "r1"
    assert mode(root) == 0o700 and mode(root / "scrapes") == 0o700
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files and all(mode(p) == 0o600 for p in files), {str(p): oct(mode(p)) for p in files}
    report._write(tmp_path / "out" / "r.html", "<html/>")
    assert mode(tmp_path / "out" / "r.html") == 0o600


