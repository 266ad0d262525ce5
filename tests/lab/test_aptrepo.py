"""The stand-in toolkit repository: signed like NVIDIA's, packages built right, nvidia-ctk merging
like the real one."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

import pytest

from fleetctl.errors import FleetError
from fleetctl.lab import aptrepo


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> aptrepo.AptRepo:
    return aptrepo.build(tmp_path_factory.mktemp("apt"))


def test_release_is_signed_by_the_published_key(repo: aptrepo.AptRepo, tmp_path: Path) -> None:
    d = repo.directory
    key = (d / "gpgkey").read_text()
    assert key.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    keyring = tmp_path / "keyring.gpg"
    # What a node does with NVIDIA's instructions: dearmor the key, then verify with it.
    subprocess.run(
        ["gpg", "--batch", "--yes", "--homedir", str(tmp_path), "--dearmor", "-o", str(keyring)],
        input=key.encode(),
        check=True,
        capture_output=True,
    )
    ok = subprocess.run(
        ["gpgv", "--keyring", str(keyring), str(d / "InRelease")], capture_output=True, check=False
    )
    assert ok.returncode == 0, ok.stderr
    ok = subprocess.run(
        ["gpgv", "--keyring", str(keyring), str(d / "Release.gpg"), str(d / "Release")],
        capture_output=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    # A tampered Release fails verification.
    bad = tmp_path / "Release"
    bad.write_text((d / "Release").read_text().replace("fleetctl lab", "someone else"))
    assert subprocess.run(["gpgv", "--keyring", str(keyring), str(d / "Release.gpg"), str(bad)],
                          capture_output=True, check=False).returncode != 0


def test_release_hashes_match_the_indexes(repo: aptrepo.AptRepo) -> None:
    d = repo.directory
    release = (d / "Release").read_text()
    sha256 = release.split("SHA256:\n")[1].split("SHA512:")[0].strip().splitlines()
    listed = {line.split()[2]: (line.split()[0], int(line.split()[1])) for line in sha256}
    for name in ("Packages", "Packages.gz"):
        data = (d / name).read_bytes()
        assert listed[name] == (hashlib.sha256(data).hexdigest(), len(data))
    assert gzip.decompress((d / "Packages.gz").read_bytes()) == (d / "Packages").read_bytes()


def test_packages_lists_both_versions_with_their_files(repo: aptrepo.AptRepo) -> None:
    stanzas = (repo.directory / "Packages").read_text().strip().split("\n\n")
    versions = []
    for stanza in stanzas:
        fields = dict(
            line.split(": ", 1)
            for line in stanza.splitlines()
            if ": " in line and not line.startswith(" ")
        )
        assert fields["Package"] == "nvidia-container-toolkit"
        deb = repo.directory / fields["Filename"]
        assert hashlib.sha256(deb.read_bytes()).hexdigest() == fields["SHA256"]
        assert int(fields["Size"]) == deb.stat().st_size
        versions.append(fields["Version"])
        files = subprocess.run(
            ["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True
        ).stdout
        for binary in (
            "nvidia-ctk",
            "nvidia-container-runtime",
            "nvidia-container-runtime-hook",
            "nvidia-container-cli",
        ):
            assert f"./usr/bin/{binary}" in files
    assert versions == ["1.18.0-1", "1.17.8-1"]


def _ctk(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(str(resources.files("fleetctl.lab") / "assets" / "toolkit" / "nvidia-ctk"))
    text = script.read_text().replace("@VERSION@", "1.18.0")
    return subprocess.run(
        [sys.executable, "-c", text, *args], capture_output=True, text=True, check=False
    )


def test_nvidia_ctk_merges_into_daemon_json_keeping_every_key(tmp_path: Path) -> None:
    cfg = tmp_path / "daemon.json"
    original = {
        "iptables": False,
        "bridge": "none",
        "insecure-registries": ["10.78.0.0/16"],
        "registry-mirrors": ["http://10.78.1.1:5000"],
        "runtimes": {"crun": {"path": "/usr/bin/crun"}},
    }
    cfg.write_text(json.dumps(original))
    r = _ctk("runtime", "configure", "--runtime=docker", f"--config={cfg}")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"INFO[0000] Loading config from {cfg}",
        f"INFO[0000] Wrote updated config to {cfg}",
        "INFO[0000] It is recommended that docker daemon be restarted.",
    ]
    merged = json.loads(cfg.read_text())
    expected = dict(original)
    expected["runtimes"] = {
        "crun": {"path": "/usr/bin/crun"},
        "nvidia": {"args": [], "path": "nvidia-container-runtime"},
    }
    assert merged == expected
    # Idempotent: a second run changes nothing.
    before = cfg.read_text()
    assert _ctk("runtime", "configure", "--runtime", "docker", "--config", str(cfg)).returncode == 0
    assert cfg.read_text() == before


def test_nvidia_ctk_creates_a_missing_config_and_refuses_bad_input(tmp_path: Path) -> None:
    cfg = tmp_path / "sub" / "daemon.json"
    assert (
        _ctk(
            "runtime", "configure", "--runtime=docker", f"--config={cfg}", "--set-as-default"
        ).returncode
        == 0
    )
    assert json.loads(cfg.read_text()) == {
        "default-runtime": "nvidia",
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    }
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    r = _ctk("runtime", "configure", "--runtime=docker", f"--config={broken}")
    assert r.returncode == 1 and "unable to parse" in r.stderr
    assert broken.read_text() == "{not json"
    assert _ctk("runtime", "configure", "--runtime=podman").returncode == 1
    assert _ctk("--version").stdout.splitlines()[0] == "NVIDIA Container Toolkit CLI version 1.18.0"


def test_signing_key_is_made_once(repo: aptrepo.AptRepo) -> None:
    home = aptrepo.signing_home()
    assert aptrepo.signing_home() == home
    # The published key is the cache's key, read (as gpg exports it) in a private home, never in
    # the cache's own.
    with aptrepo.private_home() as private:
        assert private != home
        exported = subprocess.run(
            ["gpg", "--batch", "--homedir", str(private), "--armor", "--export"],
            capture_output=True,
            check=True,
            env={**os.environ},
        ).stdout
        listed = subprocess.run(
            ["gpg", "--batch", "--homedir", str(private), "--with-colons", "--list-keys"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    assert not private.exists()
    assert (repo.directory / "gpgkey").read_bytes() == exported == aptrepo.public_key()
    assert aptrepo.key_fingerprint() == next(
        ln.split(":")[9] for ln in listed.splitlines() if ln.startswith("fpr:")
    )


def _build_at_once(n: int, out: Path) -> list[str]:
    """``n`` repositories built at the same moment (as n labs brought up at once sign theirs):
    their errors."""
    start = threading.Barrier(n)

    def one(i: int) -> str:
        start.wait()
        try:
            aptrepo.build(out / f"repo{i}")
        except FleetError as e:
            return str(e)
        return ""

    with ThreadPoolExecutor(n) as pool:
        return [e for e in pool.map(one, range(n)) if e]


def test_labs_signing_at_once_share_no_gpg_home_or_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cold cache (the key is made by one of them, the others wait), then the warm one, several
    # rounds: once every build signed in the cache's home with its agent, and one's `gpgconf
    # --kill` broke another's signing (CI's whole second lab errored: `gpg --digest-algo failed:
    # gpg: keydb_search failed: Broken pipe`).
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    assert aptrepo.key_fingerprint() is None
    for rnd in range(4):
        assert _build_at_once(4, tmp_path / f"round{rnd}") == []
    fpr = aptrepo.key_fingerprint()
    assert fpr is not None
    for d in (tmp_path / "round3").iterdir():
        assert (d / "gpgkey").read_bytes() == aptrepo.public_key()
        assert (d / "InRelease").read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----")
    # Nothing of a private home is left, nor an agent in the cache's.
    assert (
        sorted(
            p.name for p in (tmp_path / "cache" / "apt-key").iterdir() if p.name.startswith("S.")
        )
        == []
    )
