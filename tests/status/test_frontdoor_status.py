"""`fleetctl status` shows each host as the front door sees it (a real haproxy on loopback), and
which ones
a rollout holds out of rotation (from the ledger)."""

from __future__ import annotations

import dataclasses
import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from fleetctl import inventory, paths
from fleetctl.cli.status import render_status
from fleetctl.state import ledger as fleet_ledger
from fleetctl.status import HostStatus, front_door_view
from tests.frontdoor.servers import loopback_pool


def test_status_shows_the_doors_view_and_the_hosts_a_rollout_holds_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(state))
    with loopback_pool(tmp_path, ["spark-01", "spark-02", "spark-03", "spark-04"]) as pool:
        inv_dir = tmp_path / "inventory"
        shutil.copytree(paths.project_root() / "inventory" / "example", inv_dir)
        (inv_dir / "group_vars" / "all" / "frontdoor.yml").write_text(
            f"fleetctl_front_door: {{type: haproxy, socket: {pool.socket}, backend: vllm}}\n")
        inv = inventory.load(inv_dir / "hosts.yml")
        hosts = inv.select(None)
        pool.door.drain(inv.host("spark-02"))
        with fleet_ledger.open_for(inv, paths.state_dir(inv.path)) as led:
            led.mark_out("spark-02", "rollout-x", "rollout", {})
        view = front_door_view(inv, hosts)
    assert view is not None
    assert view["spark-02"]["admin"] == "drain" and view["spark-02"]["held_by"] == "rollout-x"
    assert view["spark-01"]["admin"] == "ready" and view["spark-01"]["held_by"] is None
    statuses = {
        n: dataclasses.replace(HostStatus(n, "10.0.0.1", True, 0.1), front_door=view[n])
        for n in view
    }
    buf = io.StringIO()
    render_status(statuses)(Console(file=buf, width=80, color_system=None))
    text = buf.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "drain*" in text and "out of rotation spark-02: drained by rollout-x" in text


def test_no_front_door_no_view(tmp_path: Path) -> None:
    assert (
        front_door_view(inventory.load(paths.project_root() / "inventory" / "example"), []) is None
    )
