"""``fleetctl provision`` on the lab: fresh run, idempotence, faulty nodes, daemon.json merge,
check mode."""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from fleetctl import inventory as inv
from fleetctl import lab as fleetlab
from fleetctl import ssh
from fleetctl.ansible import PlaybookResult
from fleetctl.provision import host_facts, provision

pytestmark = pytest.mark.lab

DAEMON_JSON = "/etc/docker/daemon.json"


def _inventory(lab: fleetlab.LabStatus) -> inv.Inventory:
    return inv.load(lab.inventory)


def _sh(lab: fleetlab.LabStatus, host: str, command: str, timeout: float = 60) -> str:
    # What an admin does by hand on the node: as root, through the lab admin's sudo.
    return (
        ssh.run(_inventory(lab).host(host), command, timeout=timeout, become=True)
        .check(command)
        .stdout
    )


def _daemon_json(lab: fleetlab.LabStatus, host: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_sh(lab, host, f"cat {DAEMON_JSON}"))
    return data


@contextmanager
def _daemon_json_edited(
    lab: fleetlab.LabStatus, host: str, edit: Callable[[dict[str, Any]], None]
) -> Iterator[str]:
    """Edit the node's daemon.json for the block; its original text is written back afterwards."""
    original = _sh(lab, host, f"cat {DAEMON_JSON}")
    data = json.loads(original)
    edit(data)
    ssh.put_text(
        _inventory(lab).host(host), DAEMON_JSON, json.dumps(data, indent=4) + "\n", become=True
    )
    try:
        yield original
    finally:
        ssh.put_text(_inventory(lab).host(host), DAEMON_JSON, original, become=True)


def test_fresh_provision_succeeds_everywhere_and_gpus_work_in_containers(
        provisioned: PlaybookResult, lab: fleetlab.LabStatus) -> None:
    assert len(provisioned.hosts) >= 3
    assert provisioned.ok, {n: h.message for n, h in provisioned.hosts.items()}
    assert (provisioned.artifacts_dir / "ansible.cfg").is_file()
    assert list((provisioned.artifacts_dir / "job_events").glob("*.json"))
    image = _inventory(lab).vars["container_toolkit_verify_image"]
    for name, h in provisioned.hosts.items():
        facts = host_facts(h)
        assert (facts.gpu, facts.driver) == ("NVIDIA GB10", "580.95.05")
        assert facts.toolkit == "1.18.0-1"
        assert "NVIDIA GB10" in h.reports["container_toolkit"]["gpu_check"]
        # Independently of the playbook: the runtime is registered and a --gpus all container runs.
        runtimes = json.loads(_sh(lab, name, "docker info --format '{{json .Runtimes}}'"))
        assert "nvidia" in runtimes
        out = _sh(lab, name, f"docker run --rm --gpus all {shlex.quote(image)} nvidia-smi -L")
        assert out.startswith("GPU 0: NVIDIA GB10")


def test_second_run_changes_nothing(provisioned: PlaybookResult, lab: fleetlab.LabStatus) -> None:
    again = provision(_inventory(lab), limit=",".join(provisioned.hosts))
    assert again.ok
    assert {n: h.changed for n, h in again.hosts.items()} == {n: 0 for n in provisioned.hosts}
    assert again.run_id != provisioned.run_id


def test_daemon_json_keys_set_before_provisioning_survive(provisioned: PlaybookResult,
                                                          lab: fleetlab.LabStatus) -> None:
    for name in provisioned.hosts:
        data = _daemon_json(lab, name)
        # The node image's own keys, set before fleetctl ever ran.
        assert data["iptables"] is False and data["bridge"] == "none"
        assert "10.78.0.0/16" in data["insecure-registries"]
        assert "nvidia" in data["runtimes"]
    # An operator's key, with a registry setting the role must put back: merged, never overwritten.
    host = list(provisioned.hosts)[-1]
    registries = _inventory(lab).host(host).vars["docker_insecure_registries"]

    def edit(d: dict[str, Any]) -> None:
        d["log-opts"] = {"max-size": "10m"}
        d["insecure-registries"] = [r for r in d["insecure-registries"] if r not in registries]

    with _daemon_json_edited(lab, host, edit):
        r = provision(_inventory(lab), limit=host)
        assert r.ok and r.hosts[host].changed >= 1, r.hosts[host].message
        after = _daemon_json(lab, host)
        assert after["log-opts"] == {"max-size": "10m"}
        assert set(registries) <= set(after["insecure-registries"])
        assert after["iptables"] is False and "nvidia" in after["runtimes"]
        backups = _sh(lab, host, "ls /etc/docker/").split()
        assert any(b.startswith("daemon.json.") and b.endswith("~") for b in backups), backups


def test_check_mode_reports_but_changes_nothing(
    provisioned: PlaybookResult, lab: fleetlab.LabStatus
) -> None:
    host = next(iter(provisioned.hosts))
    registries = _inventory(lab).host(host).vars["docker_insecure_registries"]

    def edit(d: dict[str, Any]) -> None:
        d["insecure-registries"] = [r for r in d["insecure-registries"] if r not in registries]

    with _daemon_json_edited(lab, host, edit):
        before = _sh(lab, host, f"cat {DAEMON_JSON}; ls -l --time-style=+%s /etc/docker")
        r = provision(_inventory(lab), limit=host, check=True, diff=True)
        assert r.check and r.ok
        h = r.hosts[host]
        assert h.changed >= 1
        assert any(registries[0] in d.diff and "+" in d.diff for d in h.diffs), h.diffs
        assert _sh(lab, host, f"cat {DAEMON_JSON}; ls -l --time-style=+%s /etc/docker") == before
    # On a provisioned host there is nothing to report at all.
    r = provision(_inventory(lab), limit=host, check=True)
    assert r.ok and r.hosts[host].changed == 0


FAULTS: list[tuple[dict[str, Any], str]] = [
    ({"gpu": "NVIDIA H100 80GB HBM3"},
     "the GPU is NVIDIA H100 80GB HBM3 (compute capability 9.0), not NVIDIA GB10"),
    ({"driver": "570.172.08"}, "NVIDIA driver 570.172.08 is outside the 580 branch"),
    ({"disk_gb": 20}, "GB free under /opt"),
]


def test_faulty_nodes_fail_with_their_own_message_while_others_succeed(
        provisioned: PlaybookResult, lab: fleetlab.LabStatus,
        lab_fault: Callable[..., AbstractContextManager[fleetlab.LabNode]]) -> None:
    names = list(provisioned.hosts)
    # At least one node stays healthy in every run; with 4 nodes all three faults run at once.
    per_run = max(1, len(names) - 1)
    for start in range(0, len(FAULTS), per_run):
        batch = FAULTS[start:start + per_run]
        faulty = names[1:1 + len(batch)]
        with contextlib.ExitStack() as stack:
            for name, (settings, _) in zip(faulty, batch, strict=True):
                stack.enter_context(lab_fault(name, **settings))
            r = provision(_inventory(lab), limit=",".join([names[0], *faulty]))
        assert not r.ok and sorted(r.failed_hosts) == sorted(faulty)
        assert r.hosts[names[0]].succeeded and r.hosts[names[0]].changed == 0
        for name, (_, message) in zip(faulty, batch, strict=True):
            h = r.hosts[name]
            assert h.failed == 1 and h.unreachable == 0
            assert message in h.message, h.message
            # The preflight stops the host before anything is changed on it.
            assert h.changed == 0


def test_next_kernel_without_nvidia_module_warns_and_fails_under_strict(
        provisioned: PlaybookResult, lab: fleetlab.LabStatus,
        lab_fault: Callable[..., AbstractContextManager[fleetlab.LabNode]]) -> None:
    host = next(iter(provisioned.hosts))
    with lab_fault(host, next_kernel_without_nvidia=True):
        loose = provision(_inventory(lab), limit=host, tags=("preflight",))
        strict = provision(_inventory(lab), limit=host, tags=("preflight",), strict=True)
    facts = host_facts(loose.hosts[host])
    assert facts.next_kernel and facts.kernel and facts.next_kernel != facts.kernel
    assert loose.ok
    [warning] = loose.hosts[host].warnings
    assert (
        facts.next_kernel in warning and facts.kernel in warning and "no nvidia module" in warning
    )
    assert not strict.ok
    assert (
        "no nvidia module" in strict.hosts[host].message
        and facts.next_kernel in strict.hosts[host].message
    )


def test_a_removed_toolkit_is_reported_by_check_mode_and_reinstalled(
    provisioned: PlaybookResult, lab: fleetlab.LabStatus
) -> None:
    host = list(provisioned.hosts)[-1]
    # Undo provisioning on the node: package removed (not purged), source, keyring and runtime gone.
    _sh(
        lab,
        host,
        "dpkg -r nvidia-container-toolkit >/dev/null && rm -f "
        "/etc/apt/sources.list.d/nvidia-container-toolkit.list "
        "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg",
        timeout=120,
    )
    data = _daemon_json(lab, host)
    data.pop("runtimes", None)
    ssh.put_text(
        _inventory(lab).host(host), DAEMON_JSON, json.dumps(data, indent=4) + "\n", become=True
    )

    checked = provision(_inventory(lab), limit=host, check=True)
    h = checked.hosts[host]
    assert checked.ok and h.changed >= 2
    assert "1.18.0-1" not in _sh(
        lab, host, "dpkg-query -W -f='${db:Status-Status}' nvidia-container-toolkit || true"
    )
    assert "nvidia" not in _daemon_json(lab, host).get("runtimes", {})

    fixed = provision(_inventory(lab), limit=host)
    assert fixed.ok and fixed.hosts[host].changed >= 3, fixed.hosts[host].message
    assert host_facts(fixed.hosts[host]).toolkit == "1.18.0-1"
    assert fixed.hosts[host].reports["container_toolkit"]["previous_version"] == ""
    assert "nvidia" in _daemon_json(lab, host)["runtimes"]
    again = provision(_inventory(lab), limit=host)
    assert again.ok and again.hosts[host].changed == 0
