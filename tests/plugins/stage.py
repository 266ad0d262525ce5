"""The ``staged`` session fixture: the default recipe's weights staged on every running lab node,
once."""

from __future__ import annotations

import contextlib

import pytest

from fleetctl import inventory, ssh
from fleetctl import lab as fleetlab
from fleetctl.stage import StageResult, stage
from tests.plugins.lab import setup_slot


@pytest.fixture(scope="session")
def staged(request: pytest.FixtureRequest, lab: fleetlab.LabStatus) -> StageResult:
    """The result of staging the inventory's default recipe to every running node (after
    provisioning, if any)."""
    # Provision first when this checkout has the fixture; weights alone do not need Docker.
    with contextlib.suppress(pytest.FixtureLookupError):
        request.getfixturevalue("provisioned")
    running = [n.name for n in fleetlab.status().nodes if n.state == "running"]
    assert running, "no running lab node to stage weights on"
    with setup_slot():
        result = stage(inventory.load(lab.inventory), limit=",".join(running))
    ssh.close_all()
    assert result.ok, "; ".join(f"{h.name}: {h.message}" for h in result.hosts.values() if not h.ok)
    return result
