"""The lab against itself: nodes reachable with host-key checking, GPU stand-ins, faults, the toolkit, down.

Every test that changes a node puts it back (faults through ``lab_fault``,
the hand-installed toolkit purged and daemon.json restored), because the
session lab is shared with the provisioning, staging and rollout tests.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetctl import inventory, ssh
from fleetctl import lab as fleetlab
from fleetctl.cli.lab import lab_group
from fleetctl.errors import FleetError, HostUnreachable
from fleetctl.lab import procs
from fleetctl.lab.layout import Layout

pytestmark = pytest.mark.lab

H100 = "NVIDIA H100 80GB HBM3"
Fault = Callable[..., AbstractContextManager[fleetlab.LabNode]]
GPU_QUERY = "nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader"


def _host(st: fleetlab.LabStatus, name: str) -> inventory.Host:
    return inventory.load(st.inventory).host(name)


def _ssh_cli(st: fleetlab.LabStatus, address: str, command: str, known_hosts: Path | None = None,
             timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-i", str(st.ssh_key), "-o", f"UserKnownHostsFile={known_hosts or st.known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
         f"root@{address}", command],
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def test_every_node_answers_ssh_with_host_key_checking(lab: fleetlab.LabStatus, tmp_path: Path) -> None:
    inv = inventory.load(lab.inventory)
    assert list(inv.groups["sparks"]) == [n.name for n in lab.nodes]
    assert inv.groups["canary"] == ("spark-01",)
    results = ssh.fan_out(inv.select("sparks"), lambda h: ssh.run(h, "hostname; cat /etc/dgx-release", timeout=20))
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
    other = next(line for line in lab.known_hosts.read_text().splitlines() if line.startswith(lab.nodes[1].address))
    swapped = tmp_path / "swapped"
    swapped.write_text(other.replace(f"{lab.nodes[1].address},{lab.nodes[1].name}", node.address) + "\n")
    assert _ssh_cli(lab, node.address, "true", known_hosts=swapped).returncode == 255


def test_nodes_look_like_sparks(lab: fleetlab.LabStatus) -> None:
    host = _host(lab, "spark-01")
    r = ssh.run(host, f"{GPU_QUERY}; nvidia-smi -L; docker version --format '{{{{.Server.Version}}}}'; "
                      "python3 --version; rsync --version | head -1; cat /etc/docker/daemon.json; "
                      "df -h --output=fstype,size /opt | tail -1; ls /boot /lib/modules/*/kernel/nvidia-580; "
                      "command -v nvidia-ctk || echo no-toolkit", timeout=30)
    assert r.ok, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "NVIDIA GB10, 580.95.05, [N/A], 12.1"
    assert lines[1].startswith("GPU 0: NVIDIA GB10 (UUID: GPU-")
    assert int(lines[2].split(".")[0]) >= 25  # a Spark runs Docker >= 25
    assert lines[3].startswith("Python 3.")
    assert json.loads(r.stdout[r.stdout.index("{"): r.stdout.index("}") + 1]) == {
        "iptables": False, "bridge": "none", "insecure-registries": ["10.78.0.0/16"]}
    assert "tmpfs   64G" in r.stdout
    assert "vmlinuz-6.11.0-1016-nvidia" in r.stdout and "nvidia.ko" in r.stdout
    assert lines[-1] == "no-toolkit"


def test_status_json(lab: fleetlab.LabStatus) -> None:
    out = CliRunner().invoke(lab_group, ["status", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["up"] is True
    assert data["registry"] == f"{lab.gateway}:5000"
    assert data["apt_url"] == f"http://{lab.gateway}:8080/apt"
    assert [n["name"] for n in data["nodes"]][:4] == ["spark-01", "spark-02", "spark-03", "spark-04"]
    for n in data["nodes"]:
        assert {"address", "ssh_user", "key_path", "known_hosts", "state", "containers", "faults"} <= set(n)
        assert n["state"] == "running"
    lab_vars = inventory.load(lab.inventory).vars
    assert lab_vars["fleetctl_registry_mirrors"]["ghcr.io"] == lab.registry
    assert lab_vars["container_toolkit_repo_url"] == lab.apt_url


def test_wrong_gpu_old_driver_and_kernel_faults(lab: fleetlab.LabStatus, lab_fault: Fault) -> None:
    host = _host(lab, "spark-03")
    with lab_fault("spark-03", gpu=H100, driver="535.183.01", next_kernel_without_nvidia=True) as node:
        assert node.faults == {"gpu": H100, "driver": "535.183.01", "next_kernel_without_nvidia": True}
        r = ssh.run(host, f"{GPU_QUERY}; nvidia-smi --version | tail -1; "
                          "cat $(python3 -c 'import json; print(json.load(open(\"/etc/fleetctl-lab/gpu.json\"))[\"proc_version_path\"])'); "
                          "ls /boot; test -d /lib/modules/6.11.0-1018-nvidia && echo modules-dir; "
                          "find /lib/modules -name 'nvidia*.ko'", timeout=20)
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
    ssh.run(host, "mkdir -p /opt/keep && echo data > /opt/keep/file", timeout=20).check("writing /opt")
    try:
        with lab_fault("spark-03", disk_gb=2):
            r = ssh.run(host, "df -B1G --output=size /opt | tail -1; cat /opt/keep/file; "
                              "fallocate -l 3G /opt/big || echo full", timeout=30)
            assert r.stdout.split() == ["2", "data", "full"] or r.stdout.split()[:2] == ["2", "data"]
            assert "full" in r.stdout
        r = ssh.run(host, "df -B1G --output=size /opt | tail -1", timeout=20)
        assert r.stdout.strip() == "64"
    finally:
        ssh.run(host, "rm -rf /opt/keep /opt/big", timeout=20)


@pytest.mark.parametrize("fault", ["paused", "disconnected"])
def test_node_that_stops_answering_comes_back(lab: fleetlab.LabStatus, lab_fault: Fault, fault: str) -> None:
    host = _host(lab, "spark-04")
    with lab_fault("spark-04", **{fault: True}) as node:
        assert node.state == fault
        ssh.close_all()
        with pytest.raises(HostUnreachable):
            ssh.run(host, "true", timeout=5, connect_timeout=3)
        others = ssh.fan_out([_host(lab, "spark-01"), host], lambda h: ssh.run(h, "true", timeout=5, connect_timeout=3),
                             timeout=15)
        assert others["spark-01"].ok and not others["spark-04"].ok
    assert fleetlab.status().node("spark-04").state == "running"
    assert ssh.run(host, "hostname", timeout=20).stdout.strip() == "spark-04"


def test_unknown_node_is_a_clear_error(lab: fleetlab.LabStatus) -> None:
    with pytest.raises(FleetError, match="no lab node 'spark-99'"):
        fleetlab.set_node("spark-99", gpu=H100)


def _http_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_toolkit_by_hand_then_gpu_container_serves(lab: fleetlab.LabStatus) -> None:
    """What provisioning automates, done by hand: then the vLLM stand-in runs with --gpus all."""
    host = _host(lab, "spark-02")
    cuda = f"{lab.registry}/nvidia/cuda:13.0.0-base-ubuntu24.04"
    image = f"{lab.registry}/aeon-7/aeon-vllm-ultimate:latest"
    keyring = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
    before = ssh.run(host, "cat /etc/docker/daemon.json", timeout=20).check("reading daemon.json").stdout
    try:
        # Without the toolkit there is no GPU device driver in docker, as on a fresh Spark.
        r = ssh.run(host, f"docker pull -q {cuda} && docker run --rm --gpus all {cuda} nvidia-smi -L", timeout=120)
        assert r.rc != 0 and "could not select device driver" in r.stderr
        install = (
            f"set -e; curl -fsSL {lab.apt_key_url} | gpg --batch --yes --dearmor -o {keyring}; "
            f"echo 'deb [signed-by={keyring}] {lab.apt_url} /' > /etc/apt/sources.list.d/nvidia-container-toolkit.list; "
            "apt-get update -q; DEBIAN_FRONTEND=noninteractive apt-get install -y -q nvidia-container-toolkit=1.18.0-1; "
            "nvidia-ctk runtime configure --runtime=docker; service docker restart; "
            "for i in $(seq 100); do docker info >/dev/null 2>&1 && break; sleep 0.2; done; "
            "nvidia-ctk --version | head -1; nvidia-container-cli --version | head -1"
        )
        r = ssh.run(host, install, timeout=180)
        assert r.ok, r.stdout + r.stderr
        assert "NVIDIA Container Toolkit CLI version 1.18.0" in r.stdout
        assert "Wrote updated config to /etc/docker/daemon.json" in r.stderr
        merged = json.loads(ssh.run(host, "cat /etc/docker/daemon.json", timeout=20).stdout)
        assert merged == {**json.loads(before), "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
        r = ssh.run(host, f"docker run --rm --gpus all {cuda} nvidia-smi -L && "
                          f"docker run --rm --runtime nvidia {cuda} true && echo runtime-ok", timeout=60)
        assert r.ok, r.stderr
        assert r.stdout.startswith("GPU 0: NVIDIA GB10") and "runtime-ok" in r.stdout
        # A tiny model from the lab's weights mirror, then the emulator with --gpus all.
        mirror = str(inventory.load(lab.inventory).vars["fleetctl_weights_mirror"])
        repo = "Qwen/Qwen3.5-35B-A3B/main"
        fetch = (
            f"set -e; B={mirror}/{repo}; D=/opt/lab-test/model; rm -rf $D; mkdir -p $D; "
            "for f in $(curl -fsS $B/manifest.json | python3 -c 'import json,sys; print(\" \".join(x[\"path\"] for x in json.load(sys.stdin)[\"files\"]))'); "
            "do mkdir -p $D/$(dirname $f); curl -fsS -o $D/$f $B/$f; done; "
            f"docker pull -q {image}; "
            f"docker run -d --name lab-test-vllm --gpus all --network host -v $D:/models/m:ro {image} "
            "serve /models/m --served-model-name lab-test --host 0.0.0.0 --port 8000"
        )
        ssh.run(host, fetch, timeout=180).check("starting the vLLM stand-in")
        base = f"http://{host.address}:8000"
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=3) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, ssh.run(host, "docker logs lab-test-vllm 2>&1 | tail -5").stdout
            time.sleep(0.5)
        models = _http_json(f"{base}/v1/models")
        assert isinstance(models, dict) and [m["id"] for m in models["data"]] == ["lab-test"]
        assert _http_json(f"{base}/version") == {"version": "0.24.0"}
        st = fleetlab.status().node("spark-02")
        assert [(c.name, c.image) for c in st.containers] == [("lab-test-vllm", image)]
    finally:
        ssh.run(host, (
            "docker rm -f lab-test-vllm >/dev/null 2>&1; rm -rf /opt/lab-test; "
            "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q nvidia-container-toolkit >/dev/null 2>&1; "
            f"rm -f /etc/apt/sources.list.d/nvidia-container-toolkit.list {keyring}; "
            "rm -rf /var/lib/apt/lists/*; docker image prune -af >/dev/null"), timeout=120)
        ssh.put_text(host, "/etc/docker/daemon.json", before)
        ssh.run(host, "service docker restart; for i in $(seq 100); do docker info >/dev/null 2>&1 && break; "
                      "sleep 0.2; done", timeout=60)


def _free_subnet() -> str:
    for k in range(200, 255):
        net = f"10.78.{k}.0/24"
        if not Path(f"/sys/class/net/{Layout(Path('/'), ipaddress.IPv4Network(net)).bridge}").exists():
            return net
    raise AssertionError("no free 10.78.200-254.0/24 subnet for a second lab")


def test_second_lab_coexists_and_down_leaves_nothing(lab: fleetlab.LabStatus, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "lab2"
    monkeypatch.setenv("FLEETCTL_LAB_DIR", str(root))
    monkeypatch.setenv("FLEETCTL_LAB_SUBNET", _free_subnet())
    try:
        second = fleetlab.up(nodes=1)
        assert second.up and second.gateway != lab.gateway
        node = second.nodes[0]
        assert _ssh_cli(second, node.address, "hostname").stdout.strip() == "spark-01"
        # The first lab is untouched and answers at the same time.
        assert _ssh_cli(lab, lab.nodes[0].address, "hostname").stdout.strip() == "spark-01"
        r = _ssh_cli(second, node.address, f"docker pull -q {second.registry}/aeon-7/aeon-vllm-ultimate:latest")
        assert r.returncode == 0, r.stderr
    finally:
        left = fleetlab.down()
    assert left == []
    assert not root.exists()
    assert procs.processes_under(str(root)) == []
    assert str(root) not in Path("/proc/mounts").read_text()
    # And nothing of the first lab went with it.
    monkeypatch.undo()
    assert fleetlab.status().up
