"""From nothing: two more private one-node labs beside the session lab, brought up at once, used,
then removed.

The session lab is shared with the provisioning, staging and rollout fixtures,
so its nodes may already carry the toolkit or serve vLLM. What must be seen on
a pristine Spark (no toolkit, ``--gpus all`` refused, the toolkit installed by
hand from the signed repository, then the emulator answering on
``<node>:8000``), and that ``lab down`` leaves nothing behind, is checked here
on a lab of its own, on another subnet, while the session lab keeps answering.

Two labs on one machine (one per user, or the tests' two workers) must come up at
the same moment without meeting in anything they share: the two fresh labs are
brought up at once by two ``fleetctl lab up`` processes on a cache of their own,
first cold (no signing key yet: one makes it while the other waits, then both
sign their apt repositories), then warm (their repositories removed, both up
again at once: both re-sign with the key the cold round made, as two labs on a
machine whose cache exists). Only the rootfs tarballs are taken from the session's
cache (linked): a debootstrap needs Debian's mirror and minutes, and its build is
under a lock of its own.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fleetctl import inventory, paths, ssh
from fleetctl import lab as fleetlab
from fleetctl.lab import procs
from fleetctl.lab.layout import Layout, current

pytestmark = pytest.mark.lab

CUDA = "nvidia/cuda:13.0.0-base-ubuntu24.04"
KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"


def _free_subnet(taken: tuple[str, ...] = ()) -> str:
    for k in range(200, 255):
        net = f"10.78.{k}.0/24"
        if (
            net not in taken
            and not Path(
                f"/sys/class/net/{Layout(Path('/'), ipaddress.IPv4Network(net)).bridge}"
            ).exists()
        ):
            return net
    raise AssertionError("no free 10.78.200-254.0/24 subnet for a second lab")


class Fresh:
    """The private lab: its directory and subnet, and a way to act on it."""

    def __init__(self, root: Path, subnet: str, cache: Path) -> None:
        self.root = root
        self.subnet = subnet
        self.cache = cache
        self.status: fleetlab.LabStatus | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"FLEETCTL_LAB_DIR": str(self.root), "FLEETCTL_LAB_SUBNET": self.subnet,
                "FLEETCTL_CACHE_DIR": str(self.cache)}

    @contextmanager
    def selected(self) -> Iterator[None]:
        """Point fleetctl.lab at this lab for the duration of the block."""
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    @property
    def st(self) -> fleetlab.LabStatus:
        assert self.status is not None
        return self.status

    def host(self) -> inventory.Host:
        return inventory.load(self.st.inventory).host("spark-01")


def _up_at_once(labs: list[Fresh]) -> None:
    """``fleetctl lab up --nodes 1`` of every lab in ``labs``, in processes of their own started at
    once."""
    fleetctl = Path(sys.executable).with_name("fleetctl")
    procs_ = [
        subprocess.Popen(
            [str(fleetctl), "lab", "up", "--nodes", "1"],
            env={**os.environ, **f.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for f in labs
    ]
    outs = [p.communicate(timeout=900)[0] for p in procs_]
    for f, p, out in zip(labs, procs_, outs, strict=True):
        assert p.returncode == 0, f"lab up of {f.root} failed:\n{out[-3000:]}"


def _cold_cache(d: Path) -> Path:
    """A cache of its own: nothing in it but links to the session cache's rootfs tarballs."""
    (d / "rootfs").mkdir(parents=True)
    for tar in (paths.cache_dir() / "rootfs").glob("*.tar"):
        (d / "rootfs" / tar.name).symlink_to(tar)
    return d


@pytest.fixture(scope="module")
def fresh_labs(
    lab: fleetlab.LabStatus, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Fresh, Fresh]]:
    """Two one-node labs beside the session lab (up first: they must coexist), brought up at once
    from a cold cache,
    then up again at once from the warm one."""
    del lab
    base = tmp_path_factory.mktemp("fresh")
    cache = _cold_cache(base / "cache")
    first = _free_subnet()
    # Neither directory a prefix of the other's: what is left of one is looked for by its path.
    labs = [
        Fresh(base / "lab-a", first, cache),
        Fresh(base / "lab-b", _free_subnet((first,)), cache),
    ]
    try:
        _up_at_once(labs)  # cold: the apt key is made once, by one of them
        assert (cache / "apt-key" / "ready").exists()
        for f in labs:
            (f.root / "www" / "apt" / "InRelease").unlink()
        _up_at_once(labs)  # warm: both sign again, at once
        for f in labs:
            with f.selected():
                f.status = fleetlab.status()
        yield labs[0], labs[1]
    finally:
        ssh.close_all()
        for f in labs:
            with f.selected():
                if f.root.exists():
                    fleetlab.down()


@pytest.fixture(scope="module")
def fresh(fresh_labs: tuple[Fresh, Fresh]) -> Fresh:
    return fresh_labs[0]


def test_two_labs_brought_up_at_once_from_a_cold_and_a_warm_cache_both_serve(
        fresh_labs: tuple[Fresh, Fresh], tmp_path: Path) -> None:
    for f in fresh_labs:
        st = f.st
        assert st.up, st.services
        assert (
            ssh.run(f.host(), "hostname", timeout=30).check("reaching the node").stdout.strip()
            == "spark-01"
        )
        catalog = json.loads(_wait_http(f"http://{st.registry}/v2/_catalog", 10))
        assert "aeon-7/aeon-vllm-ultimate" in catalog["repositories"]
        # The repository each lab re-signed in the warm round verifies with the key its inventory
        # pins.
        key = _wait_http(st.apt_key_url, 10)
        keyring = tmp_path / f"{f.root.name}.gpg"
        subprocess.run(
            [
                "gpg",
                "--batch",
                "--yes",
                "--homedir",
                str(tmp_path),
                "--dearmor",
                "-o",
                str(keyring),
            ],
            input=key,
            check=True,
            capture_output=True,
        )
        (tmp_path / "InRelease").write_bytes(_wait_http(f"{st.apt_url}/InRelease", 10))
        ok = subprocess.run(
            ["gpgv", "--keyring", str(keyring), str(tmp_path / "InRelease")],
            capture_output=True,
            check=False,
        )
        assert ok.returncode == 0, ok.stderr
        pinned = inventory.load(st.inventory).vars["container_toolkit_repo_key_fingerprints"]
        assert pinned == [(f.cache / "apt-key" / "fingerprint").read_text().strip()]
    # One key for the cache, no GnuPG agent or home left behind by either lab's signing.
    assert not list((fresh_labs[0].cache / "apt-key").glob("S.gpg-agent*"))
    agents = subprocess.run(
        ["pgrep", "-af", "gpg-agent"], capture_output=True, text=True, check=False
    ).stdout
    assert str(fresh_labs[0].cache) not in agents and "fleetctl-gpg-" not in agents


def test_pristine_node(fresh: Fresh) -> None:
    r = ssh.run(
        fresh.host(),
        "cat /etc/docker/daemon.json; command -v nvidia-ctk || echo no-toolkit; "
        "ls /etc/apt/sources.list.d; cat /etc/apt/sources.list",
        timeout=30,
    )
    assert r.ok, r.stderr
    end = r.stdout.index("}") + 1
    assert json.loads(r.stdout[:end]) == {
        "iptables": False,
        "bridge": "none",
        "insecure-registries": ["10.78.0.0/16"],
    }
    # No toolkit, and no apt source a lab node could not reach.
    assert r.stdout[end:].split() == ["no-toolkit"]


def _wait_http(url: str, seconds: float) -> bytes:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                return bytes(resp.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_toolkit_by_hand_then_the_emulator_serves_with_gpus(fresh: Fresh) -> None:
    st = fresh.st
    host = fresh.host()
    cuda = f"{st.registry}/{CUDA}"
    image = f"{st.registry}/aeon-7/aeon-vllm-ultimate:latest"
    # Without the toolkit docker has no GPU device driver, as on a fresh Spark.
    r = ssh.docker(
        host,
        f"docker pull -q {cuda} >/dev/null && docker run --rm --gpus all {cuda} nvidia-smi -L",
        timeout=180,
    )
    assert r.rc != 0 and "could not select device driver" in r.stderr
    install = (
        f"set -e; curl -fsSL {st.apt_key_url} | gpg --dearmor -o {KEYRING}; "
        f"echo 'deb [signed-by={KEYRING}] {st.apt_url} /' > "
        "/etc/apt/sources.list.d/nvidia-container-toolkit.list; "
        "apt-get update -q; DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
        "nvidia-container-toolkit=1.17.8-1; "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q nvidia-container-toolkit; "
        "nvidia-ctk runtime configure --runtime=docker; service docker restart; "
        "for i in $(seq 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done; "
        "nvidia-ctk --version | head -1; dpkg-query -W nvidia-container-toolkit"
    )
    # An admin's hand work on a fresh Spark: as root, through sudo.
    r = ssh.run(host, install, timeout=240, become=True)
    assert r.ok, r.stdout + r.stderr
    # The pinned older version, then the upgrade to the newest, both from the signed repo.
    assert "Setting up nvidia-container-toolkit (1.17.8-1)" in r.stdout
    assert "Setting up nvidia-container-toolkit (1.18.0-1)" in r.stdout
    assert r.stdout.splitlines()[-2:] == [
        "NVIDIA Container Toolkit CLI version 1.18.0",
        "nvidia-container-toolkit\t1.18.0-1",
    ]
    merged = json.loads(ssh.run(host, "cat /etc/docker/daemon.json", timeout=20).stdout)
    assert merged == {"iptables": False, "bridge": "none", "insecure-registries": ["10.78.0.0/16"],
                      "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    r = ssh.docker(
        host,
        f"docker run --rm --gpus all {cuda} nvidia-smi --query-gpu=name,driver_version "
        "--format=csv,noheader"
        f" && docker run --rm --runtime nvidia {cuda} true && echo runtime-ok",
        timeout=120,
    )
    assert r.ok, r.stderr
    assert r.stdout.splitlines() == ["NVIDIA GB10, 580.95.05", "runtime-ok"]
    # A tiny model from the lab's weights mirror, then the emulator with --gpus all on :8000.
    mirror = str(inventory.load(st.inventory).vars["fleetctl_weights_mirror"])
    fetch = (
        f"set -e; B={mirror}/Qwen/Qwen3.5-35B-A3B/main; D=/opt/models/qwen; mkdir -p $D; "
        "for f in $(curl -fsS $B/manifest.json | python3 -c "
        '\'import json,sys; print(" ".join(x["path"] for x in json.load(sys.stdin)["files"]))\'); '
        "do mkdir -p $D/$(dirname $f); curl -fsS -o $D/$f $B/$f; done; "
        f"docker pull -q {image} >/dev/null; "
        f"docker run -d --name vllm --gpus all --network host -v $D:/models/qwen:ro {image} "
        "serve /models/qwen --served-model-name qwen --host 0.0.0.0 --port 8000"
    )
    ssh.run(host, fetch, timeout=240, become=True).check("starting the vLLM stand-in")
    base = f"http://{host.address}:8000"
    assert _wait_http(f"{base}/health", 90) == b""
    models = json.loads(_wait_http(f"{base}/v1/models", 10))
    assert [m["id"] for m in models["data"]] == ["qwen"]
    assert json.loads(_wait_http(f"{base}/version", 10)) == {"version": "0.24.0"}
    with fresh.selected():
        node = fleetlab.status().node("spark-01")
    assert [(c.name, c.image) for c in node.containers] == [("vllm", image)]


def test_three_labs_answer_at_once(
    fresh_labs: tuple[Fresh, Fresh], lab: fleetlab.LabStatus
) -> None:
    assert len({fresh_labs[0].st.gateway, fresh_labs[1].st.gateway, lab.gateway}) == 3
    # Every node is called spark-01: one per lab, on its own subnet, with its own key.
    keys = [
        ssh.run(h, "cat /etc/fleetctl-lab/authorized_keys", timeout=20)
        .check("reading the key")
        .stdout
        for h in (
            fresh_labs[0].host(),
            fresh_labs[1].host(),
            inventory.load(lab.inventory).host("spark-01"),
        )
    ]
    assert len(set(keys)) == 3


def test_down_leaves_nothing_behind(
    fresh_labs: tuple[Fresh, Fresh], lab: fleetlab.LabStatus
) -> None:
    ssh.close_all()
    for fresh in fresh_labs:
        with fresh.selected():
            layout = current()
            assert fleetlab.down() == []
        assert not fresh.root.exists() and not layout.exec_root.exists()
        assert procs.processes_under(str(fresh.root)) == []
        assert str(fresh.root) not in Path("/proc/mounts").read_text()
        assert not Path(f"/sys/class/net/{layout.bridge}").exists()
        engine_ps = subprocess.run(
            ["pgrep", "-f", str(fresh.root)], capture_output=True, text=True, check=False
        )
        assert engine_ps.stdout == ""
    # The session lab is untouched.
    assert fleetlab.status().up
    assert (
        ssh.run(
            inventory.load(lab.inventory).host("spark-01"), "hostname", timeout=20
        ).stdout.strip()
        == "spark-01"
    )
