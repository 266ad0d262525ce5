"""The ``provisioned`` session fixture: the lab's healthy nodes provisioned once
(playbooks/provision.yml).

Returns the :class:`~fleetctl.ansible.PlaybookResult` of that first run, so that
tests assert on it instead of provisioning again.
"""

from __future__ import annotations

import pytest

from fleetctl import inventory as inv
from fleetctl import lab as fleetlab
from fleetctl.ansible import PlaybookResult
from fleetctl.provision import provision
from tests.plugins.lab import setup_slot


@pytest.fixture(scope="session")
def provisioned(lab: fleetlab.LabStatus) -> PlaybookResult:
    """Every running node without faults provisioned; fails the dependent tests with each host's
    message."""
    healthy = [n.name for n in lab.nodes if n.state == "running" and not n.faults]
    if not healthy:
        pytest.fail(
            "no healthy lab node to provision: "
            f"{[(n.name, n.state, dict(n.faults)) for n in lab.nodes]}"
        )
    with setup_slot():
        result = provision(inv.load(lab.inventory), limit=",".join(healthy))
    if not result.ok:
        problems = "; ".join(
            f"{n}: {h.status}: {h.message}" for n, h in result.hosts.items() if not h.succeeded
        )
        pytest.fail(
            f"provisioning the lab failed ({result.artifacts_dir}): {problems or result.status}"
        )
    return result
