"""fleetctl.stage before any host is touched: the fleet lock, and which recipe a run stages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl import inventory, paths
from fleetctl.errors import ExitCode, FleetError, LockedError
from fleetctl.stage import stage
from fleetctl.state.ledger import open_ledger

HOLD = """
import sys, time
from pathlib import Path
from fleetctl.state.ledger import open_ledger
led = open_ledger(Path(sys.argv[1]))
led.acquire("rollout-held-by-test")
print("held", flush=True)
time.sleep(60)
"""


def test_stage_is_refused_while_another_process_holds_the_fleet_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(state))
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    seed = paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"
    (tmp_path / "group_vars" / "all" / "recipes.yml").write_text(seed.read_text())
    # An address nobody answers on: the lock must refuse before any connection is tried.
    (tmp_path / "hosts.yml").write_text("all:\n  vars: {fleetctl_allow_unpinned_revisions: true}\n"
                                        "  hosts:\n    spark-01: {ansible_host: 192.0.2.1}\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(state)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LockedError) as e:
            stage(inventory.load(tmp_path / "hosts.yml"))
        assert e.value.exit_code == ExitCode.LOCKED
        assert "rollout-held-by-test" in e.value.message()
    finally:
        holder.kill()
        holder.wait()
    # Once the holder is gone, its lock is stale: stage takes it over (and only then meets the dead
    # address).
    with open_ledger(state) as led:
        held = led.holder()
        assert held is not None and not held.alive


def test_hosts_with_different_default_recipes_need_an_explicit_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    inv = inventory.load(paths.project_root() / "inventory" / "example" / "hosts.yml")
    with pytest.raises(FleetError) as e:
        stage(inv)
    msg = e.value.message()
    assert (
        "gemma4-26b-a4b: spark-04" in msg
        and "qwen36-35b-heretic: spark-01, spark-02, spark-03" in msg
    )
    assert "--recipe" in msg


def test_a_weight_set_on_a_branch_is_refused_before_any_host_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    seed = paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"
    (tmp_path / "group_vars" / "all" / "recipes.yml").write_text(seed.read_text())
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    spark-01: {ansible_host: 192.0.2.1}\n")
    with pytest.raises(FleetError) as e:
        stage(inventory.load(tmp_path / "hosts.yml"))
    msg = e.value.message()
    assert "revision 'main', a name the hub can move" in msg and "commit sha" in msg
    assert not (tmp_path / "state" / "runs").exists(), "no playbook ran"


def test_a_plain_http_mirror_needs_pinned_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    seed = paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"
    (tmp_path / "group_vars" / "all" / "recipes.yml").write_text(seed.read_text())
    (tmp_path / "hosts.yml").write_text(
        "all:\n  vars: {fleetctl_allow_unpinned_revisions: true, fleetctl_weights_mirror: 'http://192.0.2.9/w'}\n"
        "  hosts:\n    spark-01: {ansible_host: 192.0.2.1}\n")
    with pytest.raises(FleetError) as e:
        stage(inventory.load(tmp_path / "hosts.yml"), source="mirror")
    assert "plain http" in e.value.message() and "manifest_sha256" in e.value.message()
    assert not (tmp_path / "state" / "runs").exists(), "no playbook ran"
