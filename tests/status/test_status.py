"""The status probe script run for real on this machine (with the lab's stand-in nvidia-smi), and
its parsing."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl import paths
from fleetctl.facts import probe_script
from fleetctl.inventory import Host
from fleetctl.status import parse_probe, serving_target
from tests.role_modules import load_role_file

STAND_IN = (
    paths.project_root() / "controller" / "fleetctl" / "lab" / "assets" / "node" / "nvidia-smi"
)


def _probe(tmp_path: Path, gpu: dict[str, object] | None, *args: str) -> str:
    """Run the probe as a host would (``python3 -`` fed on stdin), with the stand-in nvidia-smi
    when ``gpu``."""
    env = {k: v for k, v in os.environ.items() if k != "FLEETCTL_LAB_GPU_JSON"}
    if gpu is not None:
        bindir = tmp_path / "bin"
        bindir.mkdir(exist_ok=True)
        (bindir / "nvidia-smi").write_text(
            f"#!{sys.executable}\n" + STAND_IN.read_text().split("\n", 1)[1]
        )
        (bindir / "nvidia-smi").chmod(0o755)
        # The stand-in's -q template sits beside the real script.
        (bindir / "nvidia-smi-q.template").write_text(
            (STAND_IN.parent / "nvidia-smi-q.template").read_text()
        )
        (tmp_path / "gpu.json").write_text(json.dumps(gpu))
        env["FLEETCTL_LAB_GPU_JSON"] = str(tmp_path / "gpu.json")
        env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    p = subprocess.run(
        [sys.executable, "-", *args],
        input=probe_script(),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return p.stdout


def test_probe_reads_a_gb10_through_nvidia_smi(tmp_path: Path) -> None:
    out = _probe(tmp_path, {}, "--path", str(tmp_path / "not" / "yet"))
    st = parse_probe(Host("h1", "10.0.0.1"), out, 0.5, 8000)
    assert st.reachable and (st.gpu, st.driver, st.cuda, st.compute_cap) == (
        "NVIDIA GB10",
        "580.95.05",
        "13.0",
        "12.1",
    )
    assert "gpu" not in st.problems
    assert (
        st.disk_free_gb is not None and st.disk_free_gb > 0
    )  # measured on the nearest existing parent
    assert st.kernel == os.uname().release
    assert st.container is None and st.health is None  # without --serving nothing about serving


def test_probe_reports_a_wrong_gpu_and_old_driver_as_they_are(tmp_path: Path) -> None:
    out = _probe(
        tmp_path,
        {
            "name": "NVIDIA H100 80GB HBM3",
            "driver": "570.172.08",
            "compute_cap": "9.0",
            "memory_total_mib": 81559,
        },
    )
    st = parse_probe(Host("h1", "10.0.0.1"), out, 0.5, 8000)
    assert (st.gpu, st.driver, st.compute_cap) == ("NVIDIA H100 80GB HBM3", "570.172.08", "9.0")


def test_probe_without_nvidia_smi_names_the_problem(tmp_path: Path) -> None:
    if any((Path(d) / "nvidia-smi").exists() for d in os.environ.get("PATH", "").split(os.pathsep)):
        pytest.skip("this machine has a real nvidia-smi")
    out = _probe(tmp_path, None, "--serving", "--port", "1")
    st = parse_probe(Host("h1", "10.0.0.1"), out, 0.5, 1)
    assert st.gpu is None and "nvidia-smi" in st.problems["gpu"]
    # Nothing listens on port 1: /health is refused, not an exception.
    assert st.health is None and st.health_error


def test_parse_probe_rejects_garbage() -> None:
    from fleetctl.errors import FleetError

    with pytest.raises(FleetError, match="no JSON"):
        parse_probe(Host("h1", "10.0.0.1"), "Traceback (most recent call last):", 0.1, 8000)


def _container(image: str, labels: dict[str, str], digest: str | None = None) -> str:
    """The probe's answer with a serving container (its redacted ``docker inspect`` is read)."""
    inspect = {"Name": "/vllm", "State": {"Running": True, "Status": "running"},
               "Config": {"Image": image, "Labels": labels}}
    repo_digests = [f"10.78.6.1:5000/aeon-7/x@{digest}"] if digest else []
    probed = {"name": "vllm", "image": image, "tag": "from-probe", "running": True,
              "labels": labels, "inspect": inspect, "repo_digests": repo_digests}
    return json.dumps({"serving": {"container": probed}})


def test_tag_and_digest_come_from_the_rollouts_labels_not_the_digest_reference() -> None:
    digest = "sha256:" + "5" * 64
    by_digest = f"10.78.6.1:5000/aeon-7/aeon-vllm-ultimate@{digest}"
    labels = {
        "fleetctl.tag": "2026-07-01-v0.24.0",
        "fleetctl.digest": digest,
        "fleetctl.recipe": "r",
    }
    c = parse_probe(Host("h1", "10.0.0.1"), _container(by_digest, labels), 0.1, 8000).container
    assert c is not None and c.tag == "2026-07-01-v0.24.0" and c.digest == digest
    # started by digest outside fleetctl: no tag to show (never the digest's hex), digest from the
    # reference
    c = parse_probe(Host("h1", "10.0.0.1"), _container(by_digest, {}), 0.1, 8000).container
    assert c is not None and c.tag is None and c.digest == digest
    # a plain repo:tag (a registry port is not a tag); the probed RepoDigest is kept
    c = parse_probe(
        Host("h1", "10.0.0.1"), _container("10.78.6.1:5000/aeon-7/x:v1", {}, "sha256:ab"), 0.1, 8000
    ).container
    assert c is not None and c.tag == "v1" and c.digest == "sha256:ab"
    c = parse_probe(
        Host("h1", "10.0.0.1"), _container("10.78.6.1:5000/aeon-7/x", {}), 0.1, 8000
    ).container
    assert c is not None and c.tag is None


def test_serving_target_follows_the_host_recipe() -> None:
    recipes = {"qwen": {"port": 8001}, "gemma": {}}
    assert serving_target(
        Host("h", "a", vars={"fleetctl_recipe": "qwen", "fleetctl_recipes": recipes})
    ) == ("qwen", 8001)
    assert serving_target(
        Host("h", "a", vars={"fleetctl_recipe": "gemma", "fleetctl_recipes": recipes})
    ) == ("gemma", 8000)
    assert serving_target(Host("h", "a")) == (None, 8000)


def _crc24(data: bytes) -> int:
    crc = 0xB704CE
    for b in data:
        crc ^= b << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def test_dearmor_gives_back_the_binary_key() -> None:
    mod = load_role_file("container_toolkit", "library/apt_signed_repo.py")
    binary = bytes(range(256)) * 3
    b64 = base64.b64encode(binary).decode()
    crc = base64.b64encode(_crc24(binary).to_bytes(3, "big")).decode()
    body = "\n".join(b64[i:i + 64] for i in range(0, len(b64), 64))
    armored = (f"-----BEGIN PGP PUBLIC KEY BLOCK-----\nComment: test\n\n{body}\n={crc}\n"
               "-----END PGP PUBLIC KEY BLOCK-----\n")
    assert mod.dearmor(armored) == binary
    assert mod.dearmor(armored.replace("Comment: test\n", "")) == binary
    with pytest.raises(ValueError):
        mod.dearmor("not a key")
    # An already binary key (first packet byte has the high bit set) is kept as it is.
    assert mod.to_keyring(b"\x99\x01\x0d" + binary) == b"\x99\x01\x0d" + binary
    with pytest.raises(ValueError):
        mod.to_keyring(b"<html>404</html>")


def test_probe_reports_who_holds_the_host_and_its_last_known_good(tmp_path: Path) -> None:
    from fleetctl.state import hoststate

    state = tmp_path / "state.json"
    holder = hoststate.Owner(
        "ro-20260701-120000-3f9a", "rollout", "laptop", "alice", 4242, "1", 1.0, 1.0
    )
    good = hoststate.Version("2026-06-18-v0.23.0", "sha256:" + "ab" * 32, "ro-1", 1.0)
    state.write_text(hoststate.HostState(lock=holder, last_known_good=good).to_json())
    st = parse_probe(
        Host("h1", "10.0.0.1"), _probe(tmp_path, {}, "--state-file", str(state)), 0.5, 8000
    )
    assert st.lock is not None and st.lock.startswith(
        "rollout ro-20260701-120000-3f9a by alice@laptop (pid 4242)"
    )
    assert st.last_known_good == "2026-06-18-v0.23.0"
    # No file: a host fleetctl never touched. A damaged one: named as a problem, not a crash.
    st = parse_probe(
        Host("h1", "10.0.0.1"),
        _probe(tmp_path, {}, "--state-file", str(tmp_path / "no")),
        0.5,
        8000,
    )
    assert (st.lock, st.last_known_good) == (None, None) and "fleetctl_state" not in st.problems
    state.write_text("{not json")
    st = parse_probe(
        Host("h1", "10.0.0.1"), _probe(tmp_path, {}, "--state-file", str(state)), 0.5, 8000
    )
    assert st.lock is None and "damaged" in st.problems["fleetctl_state"]


def test_the_apt_key_is_trusted_only_with_its_pinned_fingerprint(tmp_path: Path) -> None:
    from fleetctl.lab import aptrepo

    mod = load_role_file("container_toolkit", "library/apt_signed_repo.py")
    home = aptrepo.signing_home()
    armored = subprocess.run(["gpg", "--batch", "--homedir", str(home), "--armor", "--export"],
                             capture_output=True, check=True).stdout.decode()
    pinned = aptrepo.key_fingerprint()
    assert pinned is not None
    # Computed from the packets as gpg computes it.
    assert mod.primary_fingerprints(mod.to_keyring(armored.encode())) == [pinned]
    spaced = " ".join(pinned[i:i + 4] for i in range(0, 40, 4)).lower()
    assert mod.check_pinned(mod.to_keyring(armored.encode()), [spaced]) is None
    assert "not the pinned" in mod.check_pinned(mod.to_keyring(armored.encode()), ["0" * 40])
    assert "no fingerprint is pinned" in mod.check_pinned(mod.to_keyring(armored.encode()), [])
    # A file that adds another key beside the pinned one is refused: apt would trust both.
    other = tmp_path / "gpg"
    other.mkdir(mode=0o700)
    gpg = ["gpg", "--batch", "--quiet", "--homedir", str(other)]
    subprocess.run(
        [
            *gpg,
            "--passphrase",
            "",
            "--quick-gen-key",
            "intruder@example",
            "ed25519",
            "sign",
            "never",
        ],
        check=True,
        capture_output=True,
    )
    extra = subprocess.run(
        [*gpg, "--armor", "--export"], capture_output=True, check=True
    ).stdout.decode()
    subprocess.run(
        ["gpgconf", "--homedir", str(other), "--kill", "gpg-agent"],
        capture_output=True,
        check=False,
    )
    why = mod.check_pinned(mod.to_keyring((armored + extra).encode()), [pinned])
    assert (
        why is not None and "holds key(s)" in why and pinned not in why.split("not the pinned")[0]
    )
