"""The ``lab_unit`` session fixture: a two-node unit on the lab, made and provisioned once for
every unit test.

The lab's first unit; on a lab without one, two more nodes made one (``lab up --units 1``) and
provisioned, kept until the session ends, then removed (so that a lab reused by a later session has
the fleet of single hosts it had). The unit's test modules run last in their group
(tests/conftest.py, ``UNIT_MODULES``), so no
test that expects only single hosts runs while it exists; they used to make and remove a unit each.
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


@pytest.fixture(scope="session")
def lab_unit(lab: fleetlab.LabStatus, provisioned: Any) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(name, members, head first) of a provisioned lab unit (the bandwidth probe runs with --gpus
    all)."""
    del provisioned
    now = fleetlab.status()
    if now.units:
        yield next(iter(now.units.items()))
        return
    nodes = len(now.nodes)
    st = fleetlab.up(nodes=nodes + 2, units=1)
    try:
        name, members = next(iter(st.units.items()))
        r = subprocess.run(
            [FLEETCTL, "provision", "--limit", ",".join(members), "--json"],
            capture_output=True,
            text=True,
            timeout=900,
            env=os.environ,
        )
        assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
        json.loads(r.stdout)
        yield name, members
    finally:
        ssh.close_all()
        fleetlab.up(nodes=nodes, units=0)
