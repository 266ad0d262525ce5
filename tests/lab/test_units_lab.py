"""Units on the lab: `lab up --units` wiring, and each fabric fault refused at a rollout's
preflight.

The faults act on a member's real network state (its fabric netdev's MTU, its second half down, its
peers routed over the management network); the refusal is read from `fleetctl rollout --json` as an
operator would, and must name the member, the figure measured, the expected one and the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, ssh
from fleetctl import lab as fleetlab
from fleetctl.errors import FleetError

pytestmark = pytest.mark.lab

FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
#: The lab registry's tag of the pair recipe's image (vllm/vllm-openai, the emulator in multi-node
#: mode).
PAIR_TAG = "cu130-nightly"


@pytest.fixture(scope="module")
def unit(lab_unit: tuple[str, tuple[str, ...]]) -> tuple[str, tuple[str, ...]]:
    """The lab's unit (name, members), provisioned: the session's (tests/plugins/units.py)."""
    return lab_unit


def fleetctl(*argv: str) -> tuple[int, Any]:
    r = subprocess.run(
        [FLEETCTL, *argv, "--json"], capture_output=True, text=True, timeout=600, env=os.environ
    )
    return r.returncode, json.loads(r.stdout) if r.stdout.strip() else None


def test_the_unit_is_in_the_inventory_and_status(unit: tuple[str, tuple[str, ...]]) -> None:
    name, members = unit
    inv = inventory.load(None)
    u = inv.units[name]
    assert u.members == members and u.head == members[0]
    assert {m: inv.hosts[m].vars.get("fleetctl_recipe") for m in members} == dict.fromkeys(members,
                                                                                          "qwen35-35b-bf16-pair")
    code, doc = fleetctl("status", "--limit", ",".join(members) + f",{inv.select(None)[0].name}")
    assert code == 0, doc
    for host, st in doc.items():
        assert st["unit"] == (name if host in members else None), st
    for m in members:
        fabric_checks = [
            f for f in doc[m]["fabric"]["findings"] if not f["check"].startswith("parity")
        ]
        assert doc[m]["fabric"]["error"] is None and fabric_checks == [], doc[m]["fabric"]


#: fault setting -> (what the refusal says about the member, the fix's words)
FAULTS: dict[str, tuple[dict[str, Any], str, str]] = {
    "mtu": (
        {"fabric_mtu": 1500},
        "enp1s0f1np1 MTU 1500, expected 9000",
        "set mtu 9000 in its netplan",
    ),
    "half down": (
        {"fabric_down": True},
        "enP2p1s0f1np1 is DOWN, expected UP",
        "check the QSFP cable",
    ),
    "via mgmt": (
        {"fabric_via_mgmt": True},
        "leaves through eth0 (the management network), not enp1s0f1np1",
        "remove the route through eth0",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fabric_fault_is_refused_at_preflight(
        unit: tuple[str, tuple[str, ...]], fault: str,
        lab_fault: Callable[..., AbstractContextManager[fleetlab.LabNode]]) -> None:
    _name, members = unit
    worker = members[1]
    settings, what, fix = FAULTS[fault]
    before = {m: _container(m) for m in members}
    with lab_fault(worker, **settings):
        # the head alone is selected: its unit's every member is probed all the same
        code, doc = fleetctl("rollout", "--tag", PAIR_TAG, "--recipe", "qwen35-35b-bf16-pair",
                             "--limit", members[0], "--yes")
        assert code == 2, doc
        cause = doc["error"]["cause"]
        assert cause.startswith("preflight refused the rollout before any change"), cause
        line = next(
            (
                x.strip()
                for x in cause.splitlines()
                if x.strip().startswith(f"{worker}: ") and what in x
            ),
            None,
        )
        assert line is not None, cause
        assert fix in line, line
        if fault == "via mgmt":
            # measured, not only read from the route: the bandwidth probe over the shaped
            # management path
            floor = inventory.load(None).units[_name].busbw_floor_gbs
            line = next(
                (x.strip() for x in cause.splitlines() if "all_reduce bus bandwidth" in x), None
            )
            assert line is not None, cause
            assert line.startswith(f"{worker}: all_reduce bus bandwidth "), line
            assert (
                f"expected at least {floor}" in line
                and f"the slowest link {worker} -> {members[0]}" in line
            )
            assert "not the management network" in line, line
            code, doc = fleetctl("status", "--limit", ",".join(members))
            bw = doc[worker]["fabric"]["bandwidth"]
            assert bw["ok"] is False and bw["busbw_gbs"] < floor and bw["method"] == "tcp", bw
    assert {m: _container(m) for m in members} == before  # nothing was changed on either member


def test_a_healthy_unit_passes_preflight_and_is_planned_as_one(
    unit: tuple[str, tuple[str, ...]],
) -> None:
    _name, members = unit
    code, doc = fleetctl("rollout", "--tag", PAIR_TAG, "--recipe", "qwen35-35b-bf16-pair",
                         "--limit", members[1], "--dry-run")
    if code == 2:  # a lab not provisioned or staged: preflight names that, never the fabric
        cause = doc["error"]["cause"]
        assert "MTU" not in cause and "management network" not in cause and "DOWN" not in cause, (
            cause
        )
        return
    assert code == 0, doc
    rows = {h["host"]: h for h in doc["hosts"]}
    assert set(rows) == set(members)  # one member selected: the unit
    code, doc = fleetctl("status", "--limit", ",".join(members))
    bw = doc[members[0]]["fabric"]["bandwidth"]  # measured by that preflight, above the lab's floor
    assert bw["ok"] is True and bw["busbw_gbs"] >= bw["floor_gbs"] and bw["links"], bw
    assert len({(rows[m]["wave"], rows[m].get("step")) for m in members}) == 1, rows


def test_fabric_faults_and_kill_worker_are_for_members_only(
    unit: tuple[str, tuple[str, ...]],
) -> None:
    _name, members = unit
    single = next(
        n
        for n in inventory.load(None).hosts
        if n not in members and inventory.load(None).unit_of(n) is None
    )
    for kw in ({"fabric_mtu": 1500}, {"kill_worker": True}):
        with pytest.raises(FleetError) as e:
            fleetlab.set_node(single, **kw)
        assert e.value.host == single and "the node is in no unit" in e.value.cause, (
            e.value.message()
        )
    with pytest.raises(FleetError) as e:
        fleetlab.set_node(members[1], fabric_mtu=80)
    assert "--fabric-mtu 80 is not an MTU" in e.value.cause


def _container(host: str) -> str | None:
    """The id of ``vllm`` on ``host`` (None when there is none), read over SSH."""
    h = inventory.load(None).host(host)
    r = ssh.docker(h, "docker inspect vllm --format '{{.Id}} {{.State.StartedAt}}'", timeout=30)
    return r.stdout.strip() if r.rc == 0 else None
