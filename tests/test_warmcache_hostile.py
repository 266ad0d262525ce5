"""Warm start's cache import against hostile archives of a compromised canary (issue 39, M2).

Before, each tar member was written in full and only then checked: a 144-byte archive became a
150 MiB file, and a 149-byte one declaring a 1 TiB sparse file wrote until ``ulimit -f`` stopped
it. Each archive here is fed to the very script a receiver runs (its python3 here, the cache root
in a temporary directory), under a 16 MiB file-size limit: a script that writes first is killed by
SIGXFSZ and the test fails; one that checks first answers ``ok: false`` having written nothing.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fleetctl import warmcache
from tests.test_warmcache import RECIPE

KEY = "k" * 32
FSIZE = 16 << 20
BIG = 64 << 20


class _Zeros(io.RawIOBase):
    """``n`` zero bytes, read without holding them."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k


def _archive(members: dict[str, int]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
        for name, n in members.items():
            ti = tarfile.TarInfo(name)
            ti.size = n
            tar.addfile(ti, io.BufferedReader(_Zeros(n)))
    return buf.getvalue()


def _zeros_sha(n: int) -> str:
    h = hashlib.sha256()
    block = bytes(1 << 20)
    for _ in range(n >> 20):
        h.update(block)
    h.update(bytes(n % (1 << 20)))
    return h.hexdigest()


def _manifest(files: dict[str, int]) -> str:
    return json.dumps({"key": KEY, "files": {k: [n, _zeros_sha(n)] for k, n in files.items()},
                       "bytes": sum(files.values())})


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)


def _import(root: Path, manifest: str, archive: bytes, *args: str) -> dict[str, object]:
    argv = shlex.split(warmcache.helper_command(RECIPE, "img", "import", KEY, *args))
    i = argv.index("-c")
    r = subprocess.run([sys.executable, *argv[i:]], check=False, capture_output=True, text=True,
                       input=manifest + "\n" + base64.b64encode(archive).decode() + "\n",
                       env={**os.environ, "FLEETCTL_CACHE_DIR": str(root)},
                       preexec_fn=_limit_files, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-500:])  # -25: SIGXFSZ, it wrote first
    assert list(root.iterdir()) == []  # nothing left where a container mounts, nothing half-made
    out = json.loads(r.stdout)
    assert isinstance(out, dict)
    return out


def test_a_member_larger_than_its_manifest_entry_is_refused_before_writing(tmp_path: Path) -> None:
    archive = _archive({"vllm/a.bin": BIG})
    assert len(archive) < 100_000  # a small archive standing for 64 MiB
    out = _import(tmp_path, _manifest({"vllm/a.bin": 10}), archive)
    assert out["ok"] is False and "the manifest says 10" in str(out["why"]), out


def test_a_cache_over_the_bound_is_refused_before_writing(tmp_path: Path) -> None:
    """An honest manifest of a cache larger than a receiver takes (the bound: MAX_BYTES)."""
    out = _import(tmp_path, _manifest({"vllm/a.bin": BIG}), _archive({"vllm/a.bin": BIG}),
                  str(32 << 20))
    assert out["ok"] is False and "over the 33554432" in str(out["why"]), out
    assert f"else {warmcache.MAX_BYTES}" in warmcache.helper_command(RECIPE, "i", "import", KEY)


def test_a_sparse_member_is_refused(tmp_path: Path) -> None:
    """A 1 TiB sparse file (GNU tar's --sparse) in an archive of a few hundred bytes."""
    if shutil.which("tar") is None:
        pytest.skip("needs GNU tar to make a sparse archive")
    src = tmp_path / "src"
    (src / "vllm").mkdir(parents=True)
    with open(src / "vllm" / "a.bin", "wb") as fh:
        fh.truncate(1 << 40)
    tgz = tmp_path / "a.tgz"
    subprocess.run(["tar", "--sparse", "-czf", str(tgz), "-C", str(src), "vllm/a.bin"],
                   check=True, timeout=60)
    archive = tgz.read_bytes()
    assert len(archive) < 10_000
    root = tmp_path / "root"
    root.mkdir()
    for declared in (10, 1 << 40):
        out = _import(root, _manifest({"vllm/a.bin": declared}) if declared == 10 else json.dumps(
            {"key": KEY, "files": {"vllm/a.bin": [declared, "0" * 64]}}), archive)
        assert out["ok"] is False, out
        assert "unexpected member" in str(out["why"]) or "over the" in str(out["why"]), out


def test_a_manifest_that_is_not_byte_counts_is_refused(tmp_path: Path) -> None:
    man = json.dumps({"key": KEY, "files": {"vllm/a.bin": [-5, "0" * 64]}})
    out = _import(tmp_path, man, _archive({"vllm/a.bin": 0}))
    assert out["ok"] is False and "not byte counts" in str(out["why"]), out
