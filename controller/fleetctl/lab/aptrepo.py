"""The lab's signed apt repository holding the stand-in nvidia-container-toolkit.

A flat repository (``deb [signed-by=...] http://<gw>:8080/apt /``) laid out as
NVIDIA's is used: packages plus ``Packages``, ``Release``, ``InRelease`` and
``Release.gpg`` signed by a lab key, and the armored public key at
``/apt/gpgkey``. The key is generated once into the cache and shared by all labs.

No two gpg processes ever share a GnuPG home or agent: the cache's home (the key's
master copy) is touched only under its file lock (made once, its fingerprint and
public key written beside it as files), and each build signs in a private home of
its own, a copy of the key made under that lock, with an agent of its own that is
stopped and removed with it. Two labs brought up at once (the tests' two workers,
two users) sign at the same moment without meeting: they once shared the cache's
home and agent, and one's ``gpgconf --kill`` broke the other's signing
(``keydb_search failed: Broken pipe``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
_BINARIES = (
    "nvidia-ctk",
    "nvidia-container-runtime",
    "nvidia-container-runtime-hook",
    "nvidia-container-cli",
)


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


def _kill_agent(home: Path) -> None:
    subprocess.run(
        ["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False
    )


def _cache_home() -> Path:
    return paths.cache_dir() / "apt-key"


def _cache_lock() -> Path:
    return paths.cache_dir() / "apt-key.lock"


def signing_home(progress: Progress = NULL) -> Path:
    """The GnuPG home holding the master copy of the lab's signing key (made once, shared by every
    lab).

    Read it only through :func:`private_home` (or under its lock): a gpg run in it starts an agent
    there that another process's run would share.
    """
    if shutil.which("gpg") is None:
        raise FleetError(
            "gpg is not installed", fix="run scripts/bootstrap.sh (apt-get install gnupg)"
        )
    home = _cache_home()
    with file_lock(_cache_lock(), "the lab's apt signing key", progress):
        if not (home / "ready").exists():
            if home.exists():
                shutil.rmtree(home)
            home.mkdir(mode=0o700, parents=True)
            progress(Event("building", "apt signing key (ed25519)"))
            try:
                _gpg(
                    home, "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never"
                )
            finally:
                _kill_agent(home)
            (home / "ready").write_text("")
        if not (home / "fingerprint").exists() or not (home / "public.asc").exists():
            # Written once (also into a cache an older fleetctl made): readers need no gpg, no
            # agent.
            try:
                out = _gpg(home, "--with-colons", "--list-keys").decode()
                public = _gpg(home, "--armor", "--export")
            finally:
                _kill_agent(home)
            fprs = [ln.split(":")[9] for ln in out.splitlines() if ln.startswith("fpr:")]
            if not fprs:
                raise FleetError(f"the lab's apt key in {home} has no fingerprint",
                                 fix=f"delete {home} to regenerate the lab's apt key")
            (home / "public.asc").write_bytes(public)
            (home / "fingerprint").write_text(fprs[0] + "\n")
    return home


def key_fingerprint() -> str | None:
    """The lab signing key's fingerprint (what the lab inventory pins), None before the key
    exists."""
    home = _cache_home()
    if not (home / "ready").exists():
        return None
    if not (home / "fingerprint").exists():
        signing_home()
    return (home / "fingerprint").read_text().strip() or None


def public_key() -> bytes:
    """The lab signing key, armored (what ``/apt/gpgkey`` serves); made first if need be."""
    return (signing_home() / "public.asc").read_bytes()


@contextmanager
def private_home(progress: Progress = NULL) -> Iterator[Path]:
    """A GnuPG home of this caller's own holding a copy of the lab's key; its agent stopped and the
    home removed on the way out. The copy is taken under the cache's lock, so that it never sees a
    key half
    made."""
    master = signing_home(progress)
    # Short and private (mkdtemp: 0700): gpg-agent's sockets go in it unless /run/user/UID/gnupg
    # exists.
    home = Path(tempfile.mkdtemp(prefix="fleetctl-gpg-"))
    try:
        with file_lock(_cache_lock(), "the lab's apt signing key", progress):
            for name in ("pubring.kbx", "trustdb.gpg"):
                if (master / name).exists():
                    shutil.copy2(master / name, home / name)
            shutil.copytree(master / "private-keys-v1.d", home / "private-keys-v1.d",
                            ignore=shutil.ignore_patterns("*.lock", ".#*"))
        yield home
    finally:
        _kill_agent(home)
        shutil.rmtree(home, ignore_errors=True)


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
            "#accept-nvidia-visible-devices-as-volume-mounts = false\n"
            'disable-require = false\n\n[nvidia-container-runtime]\nlog-level = "info"\nmode = '
            '"auto"\n'
            'runtimes = ["runc", "crun"]\n'
        )
        size_kb = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) // 1024 + 1
        debian = root / "DEBIAN"
        debian.mkdir()
        (debian / "control").write_text(
            f"Package: {PACKAGE}\nVersion: {version}\nArchitecture: all\n"
            "Maintainer: fleetctl lab <lab@fleetctl.invalid>\n"
            f"Installed-Size: {size_kb}\nDepends: python3\n"
            "Provides: nvidia-container-toolkit-base, nvidia-container-runtime, "
            "libnvidia-container-tools\n"
            "Section: utils\nPriority: optional\nHomepage: https://github.com/NVIDIA/nvidia-container-toolkit\n"
            "Description: NVIDIA Container toolkit (fleetctl lab stand-in)\n"
            " Provides nvidia-ctk, nvidia-container-runtime and the runtime hook so that\n"
            " `docker run --gpus all` works on a simulated DGX Spark.\n"
        )
        (debian / "conffiles").write_text("/etc/nvidia-container-runtime/config.toml\n")
        out = out_dir / f"{PACKAGE}_{version}_all.deb"
        proc = subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
            capture_output=True,
            check=False,
        )
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
    with private_home(progress) as home:
        return _build(directory, home, progress)


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
            f"MD5sum: {h['MD5Sum']}\nSHA1: {h['SHA1']}\nSHA256: {h['SHA256']}\nSHA512: "
            f"{h['SHA512']}\n"
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
        _gpg(
            home,
            "--digest-algo",
            "SHA512",
            "--armor",
            "--detach-sign",
            "--output",
            "-",
            input=release,
        )
    )
    (directory / "gpgkey").write_bytes(public_key())
    os.chmod(directory, 0o755)
    return AptRepo(directory=directory, packages=tuple(names))
