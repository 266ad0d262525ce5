"""The test suite's own placement (tests/conftest.py): each xdist worker's lab, and the lab tests'
groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import worker_lab


def test_the_first_worker_keeps_the_selected_lab_and_the_others_get_theirs_beside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_LAB_DIR", str(tmp_path / "lab"))
    env = {"FLEETCTL_LAB_SUBNET": "10.78.35.0/24"}
    assert worker_lab("gw0", env) == {} and worker_lab("", env) == {}
    assert worker_lab("gw1", env) == {"FLEETCTL_LAB_DIR": f"{tmp_path}/lab-gw1",
                                      "FLEETCTL_LAB_SUBNET": "10.78.83.0/24"}
    assert worker_lab("gw2", env)["FLEETCTL_LAB_SUBNET"] == "10.78.131.0/24"
    # the default subnet: every worker's lab clear of helpers' labs (10.78.1 up) and the fresh-lab
    # test's (200 up)
    assert [worker_lab(f"gw{k}", {})["FLEETCTL_LAB_SUBNET"] for k in (1, 2, 3, 4)] == [
        "10.78.48.0/24", "10.78.96.0/24", "10.78.144.0/24", "10.78.192.0/24"]


def test_the_other_labs_modules_exist_and_are_lab_tests() -> None:
    """A renamed module would silently move to the first lab: each one named is there, in one part
    only, and each is a lab test (a module that is not would run anywhere, its placement lost)."""
    from fleetctl import paths
    from tests.conftest import LAB_PARTS

    named = [m for mods in LAB_PARTS.values() for m in mods]
    assert len(named) == len(set(named)), named
    for m in named:
        path = paths.project_root() / m
        assert path.is_file(), m
        assert "pytestmark = pytest.mark.lab" in path.read_text(), m


def test_the_unit_modules_exist_and_run_last() -> None:
    """A renamed unit module would run among the tests that expect only single hosts: each one
    named is there."""
    from fleetctl import paths
    from tests.conftest import UNIT_MODULES

    assert all((paths.project_root() / m).is_file() for m in UNIT_MODULES), UNIT_MODULES


def test_the_lab_parts_are_handed_out_first_whatever_their_size() -> None:
    """xdist orders its units by size and gives each worker the next: the four parts go first, so
    four workers start one each, never one worker two; the real vLLM's test goes last."""
    from tests.conftest import LabsFirst

    queue = LabsFirst()
    for scope in ("tests/a.py::big", "vllm", "lab-2", "machine", "lab-4", "lab-3", "lab-1",
                  "tests/b.py::small"):
        queue[scope] = {scope: False}
    handed = [queue.popitem(last=False)[0] for _ in range(len(queue))]
    assert handed == ["lab-1", "lab-2", "lab-3", "lab-4", "tests/a.py::big", "machine",
                      "tests/b.py::small", "vllm"]

