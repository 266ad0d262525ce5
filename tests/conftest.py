"""Test configuration: the shared lab fixtures are plugins, one module per state they build.

scripts/test.sh runs the suite in five pytest-xdist workers (``--dist loadgroup``). Every test that
shares one machine-wide thing is put in that thing's group here, and a group runs on one worker, in
file order, as in a serial run:

- ``lab-1`` to ``lab-4``: the tests that use a lab (its ``lab`` marker, or any fixture built on the
  ``lab`` fixture: provisioned, staged, serving, lab_fault, ...), in four parts of about equal time
  (``LAB_PARTS`` lists the modules of the last three; every other lab module is ``lab-1``). Each
  worker has a lab of its own (:func:`worker_lab`): the first worker the one
  ``$FLEETCTL_LAB_DIR``/``$FLEETCTL_LAB_SUBNET`` select, the others beside it, each brought up,
  provisioned and staged by the first test that needs it. A part runs on one worker in file order,
  as in a serial run with the other parts' modules left out, so its tests see each other's state (a
  rollout's tag, a staged set) as they were written to; were two parts put on one worker, they run
  one after the other on its lab. The unit's modules (``UNIT_MODULES``) run last, on one unit made
  for them and removed after them (tests/plugins/units.py).
- ``machine``: tests that change this machine itself (they add and remove a real Unix user).
- ``vllm``: the real vLLM conformance test (it needs both cores for itself for a while), handed
  out after everything else.

The lab parts are handed out first, one to each of the first four workers (:class:`LabsFirst`);
the fifth starts on everything else at once, and xdist gives a lab worker more only when its part
is nearly done. The labs mostly wait (on loads, soaks, SSH), the rest mostly computes, so the five
share the machine's two cores; the labs' setups (up, provisioned, staged, first deployed), which
compute, go two at a time (``setup_slot`` in tests/plugins/lab.py). A part's time is the sum
of its modules' in a whole run (``--durations=0``, or each test's setup, call and teardown), less
the first test's lab setup; rebalance ``LAB_PARTS`` when one part ends well after the others.
Only what needs real SSH,
Docker and sshd is a lab test; the engine's logic runs on the simulated fleet
(tests/rollout/sim.py) or on loopback. The groups are set when each test is collected
(``pytest_itemcollected``), before xdist reads them to place the tests.
``FLEETCTL_TEST_WORKERS=0`` runs everything in one process, on one lab.
"""

from __future__ import annotations

import ipaddress
import os
from collections import OrderedDict
from typing import Any

import pytest

from tests.plugins.units import UNIT_MODULES

pytest_plugins = [
    "tests.plugins.lab",
    "tests.plugins.provision",
    "tests.plugins.stage",
    "tests.plugins.serving",
    "tests.plugins.postgres",
    "tests.plugins.emulator",
    "tests.plugins.webhook",
    "tests.plugins.units",
]

#: The lab test modules of each lab part after the first (``lab-1`` has every other one), parts
#: of about equal time: each module's setup, calls and teardown in a whole run, without the lab's
#: own setup (tests/conftest.py's docstring says how to measure them).
LAB_PARTS: dict[str, tuple[str, ...]] = {
    # the front door, the live view and the soak on the lab: 1,010 s
    "lab-2": (
        "tests/cli/test_live_lab.py",
        "tests/rollout/test_frontdoor_lab.py",
        "tests/soak/test_lab.py",
    ),
    # watch --remediate, the known-good gate and the multi-model fleet, each of which sets up the
    # state it needs on a fresh lab as on one used before: 930 s
    "lab-3": (
        "tests/remediate/test_remediate_lab.py",
        "tests/remediate/test_metrics_lab.py",
        "tests/rollout/test_known_good_lab.py",
        "tests/rollout/test_multi_recipe_lab.py",
    ),
    # the rollout's own lab cases, then the units (last: tests/plugins/units.py): 1,040 s
    "lab-4": (
        "tests/rollout/test_rollout_lab.py",
        "tests/lab/test_units_lab.py",
        "tests/rollout/test_unit_rollout_lab.py",
    ),
}


#: Test modules that change the machine itself (real users, sudoers): one group, never beside each
#: other.
MACHINE_WIDE = ("tests/test_ssh_access.py",)


def group_of(item: pytest.Item) -> str | None:
    """The xdist group ``item`` must run in (None: anywhere)."""
    if item.get_closest_marker("lab") is not None or "lab" in getattr(item, "fixturenames", ()):
        module = item.nodeid.split("::")[0]
        return next((part for part, mods in LAB_PARTS.items() if module in mods), "lab-1")
    if item.get_closest_marker("vllm") is not None:
        return "vllm"
    if item.nodeid.split("::")[0] in MACHINE_WIDE:
        return "machine"
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    group = group_of(item)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The unit's modules last (in file order among themselves); every worker orders its collection
    # alike.
    last = [i for i in items if i.nodeid.split("::")[0] in UNIT_MODULES]
    if last:
        items[:] = [i for i in items if i.nodeid.split("::")[0] not in UNIT_MODULES] + last


#: The groups that each need a worker of their own from the start.
LAB_GROUPS = ("lab-1", *LAB_PARTS)
#: The groups handed out after every other unit: the real vLLM needs both cores for a while, which
#: the labs' setups (one after another, tests/plugins/lab.py) need at the start.
LATE_GROUPS = ("vllm",)


class LabsFirst(OrderedDict[str, Any]):
    """xdist's queue of work units, handing out the lab parts before anything else and the late
    groups after everything else: the first unit each of the first four workers gets is one
    part, so the parts run beside each other, never one after another on one worker (xdist orders
    units by size, and a worker that drains early takes the next)."""

    def popitem(self, last: bool = True) -> tuple[str, Any]:
        if not last:
            for group in LAB_GROUPS:
                if group in self:
                    return group, self.pop(group)
            for key in self:  # the late groups after everything else
                if key not in LATE_GROUPS:
                    return key, self.pop(key)
        return super().popitem(last)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the lab halves handed out first (:class:`LabsFirst`)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    scheduler = LoadGroupScheduling(config, log)
    scheduler.workqueue = LabsFirst()
    return scheduler


def worker_lab(worker: str, environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The lab settings of xdist worker ``worker`` (``gw0``, ``gw1``, ...): none for the first (the
    lab the environment selects), and for worker k a directory beside it and a subnet 48 * k /24s
    away (the default's are 10.78.48, .96, .144 and .192: the fresh-lab test takes 10.78.200-254,
    helpers' labs count up from 10.78.1)."""
    k = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    if k == 0:
        return {}
    from fleetctl import paths
    from fleetctl.lab.layout import DEFAULT_SUBNET

    base = ipaddress.IPv4Network(environ.get("FLEETCTL_LAB_SUBNET", DEFAULT_SUBNET))
    octets = str(base.network_address).split(".")
    octets[2] = str((int(octets[2]) + 48 * k) % 256)
    return {"FLEETCTL_LAB_DIR": f"{paths.lab_dir()}-{worker}",
            "FLEETCTL_LAB_SUBNET": f"{'.'.join(octets)}/{base.prefixlen}"}


def pytest_configure(config: pytest.Config) -> None:
    # In an xdist worker: its own lab, set before any fixture asks for one.
    os.environ.update(worker_lab(os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ))
