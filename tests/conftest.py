"""Test configuration: the shared lab fixtures are plugins, one module per state they build.

scripts/test.sh runs the suite in two pytest-xdist workers (``--dist loadgroup``). Every test that
shares one machine-wide thing is put in that thing's group here, and a group runs on one worker, in
file order, as in a serial run:

- ``lab``: every test that uses the lab (its ``lab`` marker, or any fixture built on the ``lab``
  fixture: provisioned, staged, serving, lab_fault, ...). The lab is brought up once, and its tests
  see each other's state (a rollout's tag, a staged set) as they were written to.
- ``machine``: tests that change this machine itself (they add and remove a real Unix user).
- ``vllm``: the real vLLM conformance test (it needs both cores for itself for a while).

Everything else is spread over both workers. The groups are set when each test is collected
(``pytest_itemcollected``), before xdist reads them to place the tests. ``FLEETCTL_TEST_WORKERS=0``
runs everything in one process.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.plugins.lab", "tests.plugins.provision", "tests.plugins.stage", "tests.plugins.serving",
                  "tests.plugins.postgres", "tests.plugins.emulator", "tests.plugins.webhook"]

#: Test modules that change the machine itself (real users, sudoers): one group, never beside each other.
MACHINE_WIDE = ("tests/test_ssh_access.py",)


def group_of(item: pytest.Item) -> str | None:
    """The xdist group ``item`` must run in (None: anywhere)."""
    if item.get_closest_marker("lab") is not None or "lab" in getattr(item, "fixturenames", ()):
        return "lab"
    if item.get_closest_marker("vllm") is not None:
        return "vllm"
    if item.nodeid.split("::")[0] in MACHINE_WIDE:
        return "machine"
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    group = group_of(item)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))
