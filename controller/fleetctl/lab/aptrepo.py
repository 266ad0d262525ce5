"""The lab's signed apt repository holding the stand-in nvidia-container-toolkit.

A flat repository (``deb [signed-by=...] http://<gw>:8080/apt /``) laid out as
NVIDIA's is used: packages plus ``Packages``, ``Release``, ``InRelease`` and
``Release.gpg`` signed by a lab key, and the armored public key at
``/apt/gpgkey``. The key is generated once into the cache and shared by all labs.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from email.utils import formatdate
from importlib import resources
from pathlib import Path

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.lab.rootfs import file_lock
from fleetctl.progress import NULL, Event, Progress

PACKAGE = "nvidia-container-toolkit"
#: The newest first: the current release and the one before it, so that a pinned
#: downgrade or upgrade can be tested.
VERSIONS = ("1.18.0-1", "1.17.8-1")
KEY_UID = "fleetctl lab apt repository <lab@fleetctl.invalid>"
_BINARIES = ("nvidia-ctk", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-cli")


@dataclass(frozen=True)
class AptRepo:
    """Where the repository was written and how a node refers to it."""

    directory: Path
    packages: tuple[str, ...]


def _gpg(home: Path, *args: str, input: bytes | None = None) -> bytes:
    proc = subprocess.run(["gpg", "--batch", "--quiet", "--homedir", str(home), *args],
                          input=input, capture_output=True, check=False)
    if proc.returncode != 0:
        raise FleetError(f"gpg {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}",
                         fix=f"check {home} (delete it to regenerate the lab's apt key)")
    return proc.stdout


def signing_home(progress: Progress = NULL) -> Path:
    """The GnuPG home holding the lab's signing key (made once, shared by every lab)."""
    if shutil.which("gpg") is None:
        raise FleetError("gpg is not installed", fix="run scripts/bootstrap.sh (apt-get install gnupg)")
    home = paths.cache_dir() / "apt-key"
    with file_lock(paths.cache_dir() / "apt-key.lock", "the lab's apt signing key", progress):
        if (home / "ready").exists():
            return home
        if home.exists():
            shutil.rmtree(home)
        home.mkdir(mode=0o700, parents=True)
        progress(Event("building", "apt signing key (ed25519)"))
        try:
            _gpg(home, "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
        finally:
            subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)
        (home / "ready").write_text("")
    return home


def key_fingerprint() -> str | None:
    """The lab signing key's fingerprint (what the lab inventory pins), None before the key exists."""
    home = paths.cache_dir() / "apt-key"
    if not (home / "ready").exists():
        return None
    try:
        out = _gpg(home, "--with-colons", "--list-keys").decode()
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)
    fprs = [ln.split(":")[9] for ln in out.splitlines() if ln.startswith("fpr:")]
    return fprs[0] if fprs else None


def _asset_dir() -> Path:
    return Path(str(resources.files("fleetctl.lab") / "assets" / "toolkit"))


def build_deb(version: str, out_dir: Path) -> Path:
    """Build the stand-in ``nvidia-container-toolkit_<version>_all.deb`` into ``out_dir``."""
    upstream = version.split("-", 1)[0]
    with tempfile.TemporaryDirectory(prefix="fleetctl-deb-") as tmp:
        root = Path(tmp) / "pkg"
        bindir = root / "usr" / "bin"
        bindir.mkdir(parents=True)
        for name in _BINARIES:
            text = (_asset_dir() / name).read_text().replace("@VERSION@", upstream)
            (bindir / name).write_text(text)
            (bindir / name).chmod(0o755)
        conf = root / "etc" / "nvidia-container-runtime"
        conf.mkdir(parents=True)
        (conf / "config.toml").write_text(
            '#accept-nvidia-visible-devices-as-volume-mounts = false\n'
            'disable-require = false\n\n[nvidia-container-runtime]\nlog-level = "info"\nmode = "auto"\n'
            'runtimes = ["runc", "crun"]\n'
        )
        size_kb = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) // 1024 + 1
        debian = root / "DEBIAN"
        debian.mkdir()
        (debian / "control").write_text(
            f"Package: {PACKAGE}\nVersion: {version}\nArchitecture: all\n"
            "Maintainer: fleetctl lab <lab@fleetctl.invalid>\n"
            f"Installed-Size: {size_kb}\nDepends: python3\n"
            "Provides: nvidia-container-toolkit-base, nvidia-container-runtime, libnvidia-container-tools\n"
            "Section: utils\nPriority: optional\nHomepage: https://github.com/NVIDIA/nvidia-container-toolkit\n"
            "Description: NVIDIA Container toolkit (fleetctl lab stand-in)\n"
            " Provides nvidia-ctk, nvidia-container-runtime and the runtime hook so that\n"
            " `docker run --gpus all` works on a simulated DGX Spark.\n"
        )
        (debian / "conffiles").write_text("/etc/nvidia-container-runtime/config.toml\n")
        out = out_dir / f"{PACKAGE}_{version}_all.deb"
        proc = subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
                              capture_output=True, check=False)
        if proc.returncode != 0:
            raise FleetError(f"dpkg-deb failed: {proc.stderr.decode(errors='replace').strip()}",
                             fix="run scripts/bootstrap.sh (dpkg-dev)")
    return out


def _hashes(data: bytes) -> dict[str, str]:
    return {"MD5Sum": hashlib.md5(data).hexdigest(), "SHA1": hashlib.sha1(data).hexdigest(),
            "SHA256": hashlib.sha256(data).hexdigest(), "SHA512": hashlib.sha512(data).hexdigest()}


def _control(deb: Path) -> str:
    proc = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True)
    return proc.stdout.rstrip("\n")


def build(directory: Path, progress: Progress = NULL) -> AptRepo:
    """Write the packages, indexes and signatures of the repository into ``directory``."""
    home = signing_home(progress)
    try:
        return _build(directory, home, progress)
    finally:
        # gpg leaves an agent daemon behind; the lab must not leave processes behind.
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)


def _build(directory: Path, home: Path, progress: Progress) -> AptRepo:
    progress(Event("building", f"apt repository with {PACKAGE} {', '.join(VERSIONS)}"))
    directory.mkdir(parents=True, exist_ok=True)
    stanzas = []
    names = []
    for version in VERSIONS:
        deb = build_deb(version, directory)
        data = deb.read_bytes()
        h = _hashes(data)
        stanzas.append(
            f"{_control(deb)}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"MD5sum: {h['MD5Sum']}\nSHA1: {h['SHA1']}\nSHA256: {h['SHA256']}\nSHA512: {h['SHA512']}\n"
        )
        names.append(deb.name)
    packages = "\n".join(stanzas).encode()
    (directory / "Packages").write_bytes(packages)
    packages_gz = gzip.compress(packages, mtime=0)
    (directory / "Packages.gz").write_bytes(packages_gz)
    lines = [
        "Origin: fleetctl lab", "Label: nvidia-container-toolkit (lab stand-in)",
        f"Date: {formatdate(usegmt=True)}", "Architectures: amd64 arm64 all",
        "Description: fleetctl lab stand-in of NVIDIA's libnvidia-container repository",
    ]
    for field in ("MD5Sum", "SHA1", "SHA256", "SHA512"):
        lines.append(f"{field}:")
        for name, blob in (("Packages", packages), ("Packages.gz", packages_gz)):
            lines.append(f" {_hashes(blob)[field]} {len(blob):>8} {name}")
    release = ("\n".join(lines) + "\n").encode()
    (directory / "Release").write_bytes(release)
    (directory / "InRelease").write_bytes(
        _gpg(home, "--digest-algo", "SHA512", "--clearsign", "--output", "-", input=release))
    (directory / "Release.gpg").write_bytes(
        _gpg(home, "--digest-algo", "SHA512", "--armor", "--detach-sign", "--output", "-", input=release))
    (directory / "gpgkey").write_bytes(_gpg(home, "--armor", "--export"))
    os.chmod(directory, 0o755)
    return AptRepo(directory=directory, packages=tuple(names))
