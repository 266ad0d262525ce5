"""The ``lab`` session fixture: a simulated fleet, brought up once per test session, and node
faults.

Honours ``$FLEETCTL_LAB_DIR`` / ``$FLEETCTL_LAB_SUBNET`` (one private lab per
developer). A lab that was already up is reused and left as it was found; a lab
this session brought up is taken down at the end unless ``FLEETCTL_KEEP_LAB=1``.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from fleetctl import lab as fleetlab
from fleetctl import ssh
from fleetctl.lab import layout

LAB_NODES = 4


#: Test labs that may be set up at once on this machine (tests/conftest.py runs four labs).
SETUP_SLOTS = 2


@contextmanager
def setup_slot() -> Iterator[None]:
    """Hold one of the machine-wide slots (:data:`SETUP_SLOTS`) under which a test session's lab
    is brought up, provisioned, staged or first deployed. Three labs did all of it at once on two
    cores, beside the other tests: their nodes' sshd answered too late (banner exchanges timed out
    through the bastion) and a lab's staging failed on every node. What follows the setup mostly
    waits."""
    slots = [(Path(tempfile.gettempdir()) / f"fleetctl-test-lab-setup-{i}.lock").open("a")
             for i in range(SETUP_SLOTS)]
    try:
        while True:
            for f in slots:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield
                    return
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
            time.sleep(0.5)
    finally:
        for f in slots:
            f.close()


@pytest.fixture(scope="session")
def lab() -> Iterator[fleetlab.LabStatus]:
    """The lab with at least 4 nodes, up (brought up if needed, once per session)."""
    # The lab's inventory holds a vault-encrypted become password (spark-02's sudo asks for one):
    # every fleetctl call of the session decrypts it as an operator's would, from this variable.
    os.environ["ANSIBLE_VAULT_PASSWORD_FILE"] = str(layout.current().vault_password_file)
    before = fleetlab.status()
    started = False
    if not before.up or len(before.nodes) < LAB_NODES:
        with setup_slot():
            fleetlab.up(
                nodes=max(LAB_NODES, len(before.nodes)), units=len(before.units)
            )  # its units kept
        started = not before.up
    # A session killed inside a fault block leaves the fault behind: start healthy.
    for node in fleetlab.status().nodes:
        if node.faults:
            fleetlab.set_node(node.name, reset=True)
    yield fleetlab.status()
    ssh.close_all()
    if started and os.environ.get("FLEETCTL_KEEP_LAB") != "1":
        left = fleetlab.down()
        assert not left, f"lab down left things behind: {left}"


@pytest.fixture
def lab_fault(
    lab: fleetlab.LabStatus,
) -> Iterator[Callable[..., AbstractContextManager[fleetlab.LabNode]]]:
    """``with lab_fault("spark-02", gpu="NVIDIA H100 80GB HBM3") as node: ...``: the fault is
    always undone."""
    touched: dict[str, dict[str, Any]] = {}

    @contextmanager
    def fault(name: str, **settings: Any) -> Iterator[fleetlab.LabNode]:
        previous = dict(fleetlab.status().node(name).faults)
        touched.setdefault(name, previous)
        try:
            yield fleetlab.set_node(name, **settings)
        finally:
            _restore(name, previous)

    yield fault
    for name, previous in touched.items():  # also when a test failed inside the block
        if dict(fleetlab.status().node(name).faults) != previous:
            _restore(name, previous)


def _restore(name: str, previous: dict[str, Any]) -> None:
    fleetlab.set_node(name, reset=True, **previous)
    # Pooled SSH connections to a node that was paused or cut off are dead.
    ssh.close_all()
