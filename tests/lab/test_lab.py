"""The lab against itself: nodes reachable with host-key checking, GPU stand-ins, faults, the
toolkit, down.

Every test that changes a node puts it back (faults through ``lab_fault``,
the hand-installed toolkit purged and daemon.json restored), because the
session lab is shared with the provisioning, staging and rollout tests.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetctl import inventory, ssh
from fleetctl import lab as fleetlab
from fleetctl.cli.lab import lab_group
from fleetctl.errors import FleetError, HostUnreachable
from fleetctl.lab.nodes import OPT_SIZE_GB

pytestmark = pytest.mark.lab

H100 = "NVIDIA H100 80GB HBM3"
Fault = Callable[..., AbstractContextManager[fleetlab.LabNode]]
GPU_QUERY = (
    "nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader"
)


def _host(st: fleetlab.LabStatus, name: str) -> inventory.Host:
    return inventory.load(st.inventory).host(name)


def _ssh_cli(st: fleetlab.LabStatus, address: str, command: str, known_hosts: Path | None = None,
             timeout: float = 30, user: str = "nvidia") -> subprocess.CompletedProcess[str]:
    # As an operator reaches a Spark behind a bastion: the admin user, ProxyJump, the lab's
    # ssh_config.
    return subprocess.run(
        ["ssh", "-F", str(st.ssh_config), "-J", "bastion", "-i", str(st.ssh_key),
         "-o", f"UserKnownHostsFile={known_hosts or st.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
         f"{user}@{address}", command],
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def test_every_node_answers_ssh_with_host_key_checking(
    lab: fleetlab.LabStatus, tmp_path: Path
) -> None:
    inv = inventory.load(lab.inventory)
    assert list(inv.groups["sparks"]) == [n.name for n in lab.nodes]
    assert inv.groups["canary"] == ("spark-01",)
    results = ssh.fan_out(
        inv.select("sparks"), lambda h: ssh.run(h, "hostname; cat /etc/dgx-release", timeout=20)
    )
    for name, outcome in results.items():
        assert outcome.ok, outcome.error
        assert outcome.value is not None
        assert outcome.value.stdout.splitlines()[0] == name
        assert 'DGX_NAME="DGX Spark"' in outcome.value.stdout
    node = lab.nodes[0]
    assert _ssh_cli(lab, node.address, "true").returncode == 0
    # The check is real: with no known key (or another node's key) the connection is refused.
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    refused = _ssh_cli(lab, node.address, "true", known_hosts=empty)
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
    other = next(
        line
        for line in lab.known_hosts.read_text().splitlines()
        if line.startswith(lab.nodes[1].address)
    )
    swapped = tmp_path / "swapped"
    swapped.write_text(
        other.replace(f"{lab.nodes[1].address},{lab.nodes[1].name}", node.address) + "\n"
    )
    assert _ssh_cli(lab, node.address, "true", known_hosts=swapped).returncode == 255


def test_nodes_look_like_sparks(lab: fleetlab.LabStatus) -> None:
    host = _host(lab, "spark-01")
    r = ssh.run(
        host,
        f"{GPU_QUERY}; nvidia-smi -L; docker version --format '{{{{.Server.Version}}}}'; "
        "python3 --version; rsync --version | head -1; "
        "df -h --output=fstype,size /opt | tail -1; ls /boot /lib/modules/*/kernel/nvidia-580",
        timeout=30,
    )
    assert r.ok, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "NVIDIA GB10, 580.95.05, [N/A], 12.1"
    assert lines[1].startswith("GPU 0: NVIDIA GB10 (UUID: GPU-")
    assert int(lines[2].split(".")[0]) >= 25  # a Spark runs Docker >= 25
    assert lines[3].startswith("Python 3.")
    # Provisioning (another test's session state) may have merged more into daemon.json;
    # what the lab wrote must still be there. A pristine node is checked in test_fresh_lab.
    daemon = json.loads(ssh.run(host, "cat /etc/docker/daemon.json", timeout=20).stdout)
    assert daemon["iptables"] is False and daemon["bridge"] == "none"
    assert "10.78.0.0/16" in daemon["insecure-registries"]
    assert re.search(rf"tmpfs +{OPT_SIZE_GB}G", r.stdout), r.stdout
    assert "vmlinuz-6.11.0-1016-nvidia" in r.stdout and "nvidia.ko" in r.stdout


def test_status_json(lab: fleetlab.LabStatus) -> None:
    out = CliRunner().invoke(lab_group, ["status", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["up"] is True
    assert data["registry"] == f"{lab.gateway}:5000"
    assert data["apt_url"] == f"http://{lab.gateway}:8080/apt"
    assert [n["name"] for n in data["nodes"]][:4] == [
        "spark-01",
        "spark-02",
        "spark-03",
        "spark-04",
    ]
    for n in data["nodes"]:
        assert {
            "address",
            "ssh_user",
            "key_path",
            "known_hosts",
            "state",
            "containers",
            "faults",
        } <= set(n)
        assert n["state"] == "running"
    lab_vars = inventory.load(lab.inventory).vars
    assert lab_vars["fleetctl_registry_mirrors"]["ghcr.io"] == lab.registry
    assert lab_vars["container_toolkit_repo_url"] == lab.apt_url


def test_wrong_gpu_old_driver_and_kernel_faults(lab: fleetlab.LabStatus, lab_fault: Fault) -> None:
    host = _host(lab, "spark-03")
    with lab_fault(
        "spark-03", gpu=H100, driver="535.183.01", next_kernel_without_nvidia=True
    ) as node:
        assert node.faults == {
            "gpu": H100,
            "driver": "535.183.01",
            "next_kernel_without_nvidia": True,
        }
        r = ssh.run(
            host,
            f"{GPU_QUERY}; nvidia-smi --version | tail -1; "
            'cat $(python3 -c \'import json; '
            'print(json.load(open("/etc/fleetctl-lab/gpu.json"))["proc_version_path"])\'); '
            "ls /boot; test -d /lib/modules/6.11.0-1018-nvidia && echo modules-dir; "
            "find /lib/modules -name 'nvidia*.ko'",
            timeout=20,
        )
        assert r.stdout.splitlines()[0] == "NVIDIA H100 80GB HBM3, 535.183.01, 81559 MiB, 9.0"
        assert "CUDA Version        : 12.2" in r.stdout
        assert "  535.183.01  Release Build" in r.stdout
        assert "vmlinuz-6.11.0-1018-nvidia" in r.stdout and "modules-dir" in r.stdout
        # The newer kernel has no NVIDIA module: only the running one does.
        assert [line for line in r.stdout.splitlines() if line.endswith(".ko")] == [
            "/lib/modules/6.11.0-1016-nvidia/kernel/nvidia-580/nvidia.ko"]
    r = ssh.run(host, f"{GPU_QUERY}; ls /boot", timeout=20)
    assert r.stdout.splitlines()[0] == "NVIDIA GB10, 580.95.05, [N/A], 12.1"
    assert "1018" not in r.stdout


def test_small_disk_keeps_contents(lab: fleetlab.LabStatus, lab_fault: Fault) -> None:
    host = _host(lab, "spark-03")
    ssh.run(
        host, "mkdir -p /opt/keep && echo data > /opt/keep/file", timeout=20, become=True
    ).check("writing /opt")
    try:
        with lab_fault("spark-03", disk_gb=2):
            r = ssh.run(host, "df -B1G --output=size /opt | tail -1; cat /opt/keep/file; "
                              "fallocate -l 3G /opt/big || echo full", timeout=30, become=True)
            assert r.stdout.split() == ["2", "data", "full"] or r.stdout.split()[:2] == [
                "2",
                "data",
            ]
            assert "full" in r.stdout
        r = ssh.run(host, "df -B1G --output=size /opt | tail -1", timeout=20)
        assert r.stdout.strip() == str(OPT_SIZE_GB)
    finally:
        ssh.run(host, "rm -rf /opt/keep /opt/big", timeout=20, become=True)


@pytest.mark.parametrize("fault", ["paused", "disconnected"])
def test_node_that_stops_answering_comes_back(
    lab: fleetlab.LabStatus, lab_fault: Fault, fault: str
) -> None:
    host = _host(lab, "spark-04")
    with lab_fault("spark-04", **{fault: True}) as node:
        assert node.state == fault
        ssh.close_all()
        with pytest.raises(HostUnreachable):
            ssh.run(host, "true", timeout=5, connect_timeout=3)
        others = ssh.fan_out(
            [_host(lab, "spark-01"), host],
            lambda h: ssh.run(h, "true", timeout=5, connect_timeout=3),
            timeout=15,
        )
        assert others["spark-01"].ok and not others["spark-04"].ok
    assert fleetlab.status().node("spark-04").state == "running"
    assert ssh.run(host, "hostname", timeout=20).stdout.strip() == "spark-04"


def test_unknown_node_is_a_clear_error(lab: fleetlab.LabStatus) -> None:
    with pytest.raises(FleetError, match="no lab node 'spark-99'"):
        fleetlab.set_node("spark-99", gpu=H100)


def test_image_tags_share_layers_and_any_directory_can_be_an_image(
    lab: fleetlab.LabStatus, tmp_path: Path
) -> None:
    a = fleetlab.add_image("lab-test-a", {"EMU_CRASH_AT_CONCURRENCY": "8"})
    b = fleetlab.add_image("lab-test-b", {"EMU_GARBAGE": "1"})
    env = fleetlab.docker_env()

    def inspect(ref: str) -> dict[str, object]:
        out = subprocess.run(
            ["docker", "image", "inspect", ref], env=env, capture_output=True, text=True, check=True
        )
        data: dict[str, object] = json.loads(out.stdout)[0]
        return data

    ia, ib = inspect(a), inspect(b)
    assert ia["RootFS"] == ib["RootFS"]  # only the ENV differs: nothing new to pull
    assert "EMU_CRASH_AT_CONCURRENCY=8" in ia["Config"]["Env"]  # type: ignore[index]
    app = tmp_path / "app"
    app.mkdir()
    (app / "hello.py").write_text("import os\nprint('hello from', os.environ['GREETING'])\n")
    out = CliRunner().invoke(
        lab_group,
        [
            "image",
            "--tag",
            "hello",
            "--repository",
            "lab-test/hello",
            "--from-dir",
            str(app),
            "--cmd",
            "python3 /app/hello.py",
            "--set",
            "GREETING=the lab",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    ref = json.loads(out.stdout)["ref"]
    assert ref == f"{lab.registry}/lab-test/hello:hello"
    host = _host(lab, "spark-01")
    r = ssh.docker(host, f"docker run --rm {ref}; docker rmi -f {ref} >/dev/null", timeout=120)
    assert r.stdout.strip() == "hello from the lab", r.stderr
    bad = CliRunner().invoke(lab_group, ["image", "--tag", "x", "--set", "NOEQUALS"])
    assert bad.exit_code != 0


def test_node_command_sets_and_resets_faults(lab: fleetlab.LabStatus) -> None:
    try:
        out = CliRunner().invoke(
            lab_group, ["node", "spark-03", "--driver", "535.183.01", "--disk-gb", "8", "--json"]
        )
        assert out.exit_code == 0, out.output
        node = json.loads(out.stdout)
        assert (
            node["faults"] == {"driver": "535.183.01", "disk_gb": 8}
            and node["driver"] == "535.183.01"
        )
        r = ssh.run(
            _host(lab, "spark-03"),
            "nvidia-smi --query-gpu=driver_version --format=csv,noheader; "
            "df -B1G --output=size /opt | tail -1",
            timeout=20,
        )
        assert r.stdout.split() == ["535.183.01", "8"]
        bad = CliRunner().invoke(lab_group, ["node", "spark-03", "--disk-gb", "0"])
        assert bad.exit_code != 0
    finally:
        out = CliRunner().invoke(lab_group, ["node", "spark-03", "--reset", "--json"])
    assert out.exit_code == 0 and json.loads(out.stdout)["faults"] == {}


def test_status_through_an_ini_inventory_of_the_lab(
    lab: fleetlab.LabStatus, tmp_path: Path
) -> None:
    """Any source ansible-core reads is a fleet: the lab as INI, its access in ``[sparks:vars]``.

    The admin user, become and the bastion (ProxyJump) come from the group's vars, the vaulted
    become password from host_vars beside it; fleetctl and ``ansible-inventory --list`` agree on
    every host's address, user, port and become, and fleetctl reaches every host through the
    bastion.
    """
    yml = inventory.load(lab.inventory)
    common = (
        "ansible_user",
        "ansible_become",
        "ansible_ssh_private_key_file",
        "fleetctl_known_hosts",
        "ansible_ssh_common_args",
        "ansible_python_interpreter",
    )
    lines = ["[sparks]", *(f"{h.name} ansible_host={h.address}" for h in yml.hosts.values()),
             "", "[canary]", *yml.groups["canary"], "", "[sparks:vars]",
             *(f"{k}='{yml.vars[k]}'" for k in common)]
    ini = tmp_path / "hosts.ini"
    ini.write_text("\n".join(lines) + "\n")
    for sub in ("group_vars", "host_vars"):
        (tmp_path / sub).symlink_to(Path(lab.inventory).parent / sub)
    bin_dir = Path(sys.executable).parent
    out = subprocess.run([str(bin_dir / "fleetctl"), "-i", str(ini), "status", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert sorted(data) == sorted(yml.hosts)
    assert all(h["reachable"] and h["address"] == yml.host(n).address for n, h in data.items())
    ini_inv = inventory.load(ini)
    assert ini_inv.host("spark-01").vars == {**yml.host("spark-01").vars, "ansible_become": "True"}
    listed = subprocess.run([str(bin_dir / "ansible-inventory"), "-i", str(ini), "--list"],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"]
    assert sorted(hostvars) == sorted(ini_inv.hosts)
    for name, v in hostvars.items():
        h = ini_inv.host(name)
        assert (h.address, h.user, h.port) == (
            v["ansible_host"],
            v["ansible_user"],
            int(v.get("ansible_port", 22)),
        )
        assert h.become.enabled == (str(v["ansible_become"]).lower() == "true")
        assert h.jumps and h.jumps[0].address == lab.bastion.partition("@")[2]
        assert h.vars["ansible_ssh_common_args"] == v["ansible_ssh_common_args"]
        assert ("ansible_become_password" in v) == (h.become.password is not None)
    assert ini_inv.host("spark-02").become.password is not None


def test_nodes_refuse_root_logins_and_the_controller_reaches_them_only_through_the_bastion(
        lab: fleetlab.LabStatus) -> None:
    """A real fleet's shape: no root login anywhere, nodes' port 22 closed to the controller."""
    node = lab.nodes[0]
    root = _ssh_cli(lab, node.address, "true", user="root")
    assert root.returncode == 255 and "Permission denied" in root.stderr, root.stderr
    direct = subprocess.run(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(lab.ssh_key),
            "-o",
            f"UserKnownHostsFile={lab.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            f"nvidia@{node.address}",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert direct.returncode == 255 and "Connection refused" in direct.stderr, direct.stderr
    # while its HTTP side (the vLLM port, here any other port) is not filtered, and the bastion
    # answers
    bastion = lab.bastion.partition("@")[2]
    with socket.create_connection((bastion, 22), timeout=5) as s:
        assert s.recv(64).startswith(b"SSH-2.0-")
    who = _ssh_cli(lab, node.address, "id -un; id -nG; sudo -n true && echo sudo-ok")
    assert who.stdout.split("\n")[0] == "nvidia" and "sudo-ok" in who.stdout
