"""Debian root filesystems for the lab's images, built with debootstrap and cached as tarballs.

Two are built: the node rootfs (sshd, Docker, Python, what a Spark's OS offers
the roles) and a much smaller one with only ``python3`` as the base of the vLLM
stand-in images. Each tarball's name carries a key derived from everything that
goes into it, so a change of the package list builds a new one, and a file lock
lets several labs (several developers, parallel CI jobs) share the cache: the
first one builds, the others wait and reuse.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.progress import NULL, Event, Progress

SUITE = "trixie"
MIRROR = os.environ.get("FLEETCTL_LAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")

#: Bump when the post-processing below changes, so that cached tarballs are rebuilt.
_FORMAT = 3


@dataclass(frozen=True)
class RootfsSpec:
    """What to debootstrap: a name, the packages on top of minbase, the paths to strip."""

    name: str
    packages: tuple[str, ...]
    strip: tuple[str, ...] = ()

    def key(self) -> str:
        """A short hash of everything that changes the tarball's content."""
        blob = json.dumps(
            [_FORMAT, SUITE, MIRROR, self.name, sorted(self.packages), list(self.strip)]
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


#: The OS of a lab Spark. docker.io ships Debian's /etc/init.d/docker, which
#: `service docker restart` (init-system-helpers) drives since a container has no
#: systemd; python3-apt is what Ansible's apt modules need; gpg dearmors the
#: toolkit repository's key as NVIDIA's install instructions do.
NODE = RootfsSpec(
    name="node",
    packages=(
        "python3", "python3-apt", "openssh-server", "docker.io", "docker-cli", "docker-compose",
        "iproute2", "ca-certificates", "curl", "sudo", "iptables", "procps", "rsync",
        "init-system-helpers", "sysvinit-utils", "gpg", "less",
    ),
    strip=("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"),
)

#: The base of the vLLM stand-in images: every node pulls them, so only python3.
PYTHON = RootfsSpec(
    name="python",
    packages=("python3",),
    strip=(
        "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
        "var/cache/apt", "var/lib/apt/lists", "usr/share/common-licenses",
    ),
)


@contextmanager
def file_lock(path: Path, what: str, progress: Progress = NULL) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed), telling progress while waiting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(Event("waiting", f"another process is building {what} ({path})"))
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tarball(spec: RootfsSpec, progress: Progress = NULL) -> Path:
    """The cached tarball of ``spec``, built first if the cache lacks it."""
    cache = paths.cache_dir() / "rootfs"
    target = cache / f"{spec.name}-{SUITE}-{spec.key()}.tar"
    if target.exists():
        return target
    with file_lock(cache / f"{spec.name}.lock", f"the {spec.name} rootfs", progress):
        if target.exists():  # built by whoever held the lock before us
            return target
        _build(spec, target, progress)
    return target


def _build(spec: RootfsSpec, target: Path, progress: Progress) -> None:
    if shutil.which("debootstrap") is None:
        raise FleetError(
            "debootstrap is not installed",
            fix="run scripts/bootstrap.sh (apt-get install debootstrap)",
        )
    work = target.with_name(target.name + ".build")
    if work.exists():
        _rmtree(work)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    progress(
        Event(
            "building", f"{spec.name} rootfs: debootstrap {SUITE} ({len(spec.packages)} packages)"
        )
    )
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(spec.packages)}",
        SUITE,
        str(work),
        MIRROR,
    ]
    log = target.with_name(target.name + ".log")
    rc = _run_logged(cmd, log, spec.name, progress)
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        _rmtree(work)
        raise FleetError(
            f"debootstrap of the {spec.name} rootfs failed (exit {rc}): {' | '.join(tail)}",
            fix=f"check that {MIRROR} is reachable (full log: {log})",
        )
    _postprocess(work, spec)
    progress(Event("building", f"{spec.name} rootfs: packing into the cache"))
    tmp = target.with_name(target.name + ".tmp")
    subprocess.run(["tar", "-C", str(work), "--numeric-owner", "-cf", str(tmp), "."], check=True)
    tmp.replace(target)
    _rmtree(work)
    progress(
        Event(
            "built",
            f"{spec.name} rootfs in {time.monotonic() - t0:.0f}s ({target.stat().st_size >> 20} "
            "MiB)",
        )
    )


def _run_logged(cmd: list[str], log: Path, name: str, progress: Progress) -> int:
    """Run debootstrap into ``log``, turning its ``I: <Verb> ...`` lines into a few progress
    events."""
    seen: set[str] = set()
    last_time = 0.0
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if not line.startswith("I: "):
                continue
            verb = line[3:].split(" ", 1)[0]
            now = time.monotonic()
            # The first line of each stage (Retrieving, Extracting, Unpacking, Configuring ...),
            # then a heartbeat every 15 s: a few dozen events rather than hundreds.
            if verb not in seen or now - last_time > 15:
                progress(Event("building", f"{name} rootfs: {line[3:].strip()[:100]}"))
                seen.add(verb)
                last_time = now
        return proc.wait()


def _postprocess(root: Path, spec: RootfsSpec) -> None:
    # Host keys made by openssh-server's postinst would be shared by every node:
    # each node makes its own at first start instead.
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    # A lab node cannot reach Debian's mirrors; an unreachable source would make
    # every `apt-get update` of the provisioning role fail or hang on timeouts.
    (root / "etc" / "apt" / "sources.list").write_text("")
    for src in (root / "etc" / "apt" / "sources.list.d").glob("*"):
        src.unlink()
    for rel in ("var/lib/apt/lists", "var/cache/apt/archives"):
        for p in (root / rel).glob("*"):
            if p.is_file():
                p.unlink()
    for rel in spec.strip:
        p = root / rel
        if p.is_dir():
            _rmtree(p)
            p.mkdir()


def _rmtree(p: Path) -> None:
    # Some debootstrap trees hold read-only dirs; rm -rf copes where shutil may not.
    subprocess.run(["rm", "-rf", "--one-file-system", str(p)], check=False)
