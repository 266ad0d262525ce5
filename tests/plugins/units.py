"""The ``lab_unit`` fixture: a two-node unit on the lab, made and provisioned once for the unit's
test modules, and removed as soon as the last of them is done.

On a lab without a unit, two more nodes made one (``lab up --units 1``) and provisioned. The unit's
test modules (``UNIT_MODULES``) run one after the other, after every other test of their worker
(tests/conftest.py); the unit is kept from the first to the last of them and removed when the next
test to run is not one of theirs, or none is left. A worker may run both lab halves, the unit's half
first: the other half then starts on the fleet of single hosts it was written for, never beside a
unit whose hosts serve another recipe. A unit that was on the lab before the session is left as it
was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl import lab as fleetlab
from fleetctl import ssh

FLEETCTL = str(Path(sys.executable).parent / "fleetctl")

#: The lab test modules that use the unit: run after every other test of their worker
#: (tests/conftest.py), so that no test expecting only single hosts sees it.
UNIT_MODULES = ("tests/lab/test_units_lab.py", "tests/rollout/test_unit_rollout_lab.py")

#: The unit this session made (name, members) and the lab's node count before it; empty when none.
_MADE: dict[str, Any] = {}
#: The test that runs after the one being torn down (None: the last one).
_NEXT: dict[str, pytest.Item | None] = {"item": None}


def is_unit_test(item: pytest.Item | None) -> bool:
    """Whether ``item`` belongs to one of the unit's test modules."""
    return item is not None and item.nodeid.split("::")[0] in UNIT_MODULES


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Remember which test comes next, before this one's fixtures are finalised."""
    del item
    _NEXT["item"] = nextitem


def _make_unit() -> tuple[str, tuple[str, ...]]:
    now = fleetlab.status()
    nodes = len(now.nodes)
    st = fleetlab.up(nodes=nodes + 2, units=1)
    name, members = next(iter(st.units.items()))
    _MADE.update(name=name, members=tuple(members), nodes=nodes)
    r = subprocess.run(
        [FLEETCTL, "provision", "--limit", ",".join(members), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        env=os.environ,
    )
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    json.loads(r.stdout)
    return name, tuple(members)


def _remove_unit() -> None:
    nodes = _MADE.pop("nodes")
    _MADE.clear()
    ssh.close_all()
    fleetlab.up(nodes=nodes, units=0)


@pytest.fixture(scope="module")
def lab_unit(lab: fleetlab.LabStatus, provisioned: Any) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(name, members, head first) of a provisioned lab unit (the bandwidth probe runs with --gpus
    all)."""
    del lab, provisioned
    if _MADE:
        unit = (_MADE["name"], _MADE["members"])
    else:
        now = fleetlab.status()
        if now.units:
            name, members = next(iter(now.units.items()))
            unit = (name, tuple(members))
        else:
            try:
                unit = _make_unit()
            except BaseException:
                if _MADE:
                    _remove_unit()
                raise
    try:
        yield unit
    finally:
        ssh.close_all()
        if _MADE and not is_unit_test(_NEXT["item"]):
            _remove_unit()
