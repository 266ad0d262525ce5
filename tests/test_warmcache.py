"""Warm start's pure parts and its cache script, run for real on local directories.

The key (exact match or nothing), the mounts a key gives a container, the recipe's ``compile_cache``
validation, and :func:`fleetctl.warmcache.share` moving a cache between two "hosts" that are local
directories: the same script the hosts run in the target image, run here by the local python3 (its
root from ``$FLEETCTL_CACHE_DIR`` instead of the container's /c). The emulator's cold/warm compile
is checked on real files too.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetctl import warmcache
from fleetctl.errors import FleetError
from fleetctl.inventory import Host as InvHost
from fleetctl.lab.emulator import compile_cache
from fleetctl.recipes import CacheDir, Recipe, parse_recipes

D1, D2 = "sha256:" + "a" * 64, "sha256:" + "b" * 64
GB10 = "NVIDIA GB10"


def Host(name: str, address: str, domain: str | None = "fleet") -> InvHost:
    """A host in compile-cache trust domain ``domain`` (the operator's opt-in to warm copies)."""
    return InvHost(name, address, vars={warmcache.TRUST_DOMAIN: domain} if domain else {})


def _raw(**extra: Any) -> dict[str, Any]:
    return {
        "r": {
            "image": "vllm/vllm-openai",
            "served_model_names": ["m"],
            "vllm_args": ["--port", "8000"],
            "weights": [
                {
                    "role": "body",
                    "repo": "o/m",
                    "revision": "main",
                    "path": "/opt/m",
                    "mount": "/model",
                    "format": "bf16",
                }
            ],
            **extra,
        }
    }


RECIPE = parse_recipes(_raw(compile_cache=[{"name": "vllm", "mount": "/root/.cache/vllm"},
                                           {"name": "triton", "mount": "/root/.triton"}]))["r"]


def test_the_key_is_exact_on_digest_fingerprint_and_gpu() -> None:
    k = warmcache.cache_key(D1, "f1", GB10)
    assert k == warmcache.cache_key(D1, "f1", GB10 + "\n") and len(k) == 32
    assert len({k, warmcache.cache_key(D2, "f1", GB10), warmcache.cache_key(D1, "f2", GB10),
                warmcache.cache_key(D1, "f1", "NVIDIA H100 80GB HBM3")}) == 4


def test_a_key_mounts_each_declared_cache_from_its_key_directory() -> None:
    k = "c" * 32
    assert warmcache.binds(RECIPE, k) == [(f"{warmcache.ROOT}/r/{k}/vllm", "/root/.cache/vllm"),
                                          (f"{warmcache.ROOT}/r/{k}/triton", "/root/.triton")]
    assert warmcache.env(RECIPE, k) == {warmcache.KEY_ENV: k}
    assert warmcache.binds(RECIPE, None) == [] and warmcache.env(RECIPE, None) == {}
    plain = parse_recipes(_raw())["r"]
    assert plain.compile_cache == () and warmcache.env(plain, k) == {}


@pytest.mark.parametrize(("value", "field"), [
    ("vllm", "compile_cache"),
    ([{"name": "Bad Name", "mount": "/x"}], "compile_cache[0].name"),
    ([{"name": "x", "mount": "relative"}], "compile_cache[0].mount"),
    ([{"name": "x", "mount": "/model"}], "compile_cache[0].mount"),
    ([{"name": "x", "mount": "/a"}, {"name": "x", "mount": "/b"}], "compile_cache"),
    ([{"name": "x"}], "compile_cache[0]"),
])
def test_a_bad_compile_cache_is_refused_naming_the_field(value: object, field: str) -> None:
    from fleetctl.errors import RecipeError
    with pytest.raises(RecipeError) as e:
        parse_recipes(_raw(compile_cache=value))
    assert f"r: {field}" in str(e.value) or f"{field}:" in str(e.value), str(e.value)


class LocalHosts:
    """Each host's cache operations (``warmcache.CacheOps``) run as the hosts run them: the cache
    script of :func:`warmcache.helper_command`, each host's cache root a local directory."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.calls: list[tuple[str, str]] = []

    def root(self, h: InvHost) -> Path:
        return self.tmp / h.name

    def run(self, h: InvHost, cmd: str, stdin: str | None) -> str:
        argv = shlex.split(cmd)
        assert argv[:3] == ["docker", "run", "--rm"] and "--network" in argv  # what the host runs
        i = argv.index("-c")
        self.calls.append((h.name, argv[i + 2]))
        self.root(h).mkdir(exist_ok=True)
        r = subprocess.run(
            [sys.executable, *argv[i:]],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "FLEETCTL_CACHE_DIR": str(self.root(h))},
        )
        if r.returncode != 0:
            raise FleetError(r.stderr.strip()[-300:], host=h.name)
        return r.stdout

    def __call__(self, h: InvHost) -> LocalCacheOps:
        return LocalCacheOps(h, self.run)


@dataclass(frozen=True)
class LocalCacheOps:
    """:class:`warmcache.CacheOps` of one local "host": what ``SshHostOps`` runs over SSH."""

    host: InvHost
    run: Callable[[InvHost, str, str | None], str]

    def export_cache(self, recipe: Recipe, ref: str, key: str, max_bytes: int) -> str:
        cmd = warmcache.helper_command(recipe, ref, "export", key, str(max_bytes))
        return self.run(self.host, cmd, None)

    def verify_cache(self, recipe: Recipe, ref: str, key: str) -> str:
        return self.run(self.host, warmcache.helper_command(recipe, ref, "verify", key), None)

    def import_cache(self, recipe: Recipe, ref: str, key: str, exported: str) -> str:
        return self.run(self.host, warmcache.helper_command(recipe, ref, "import", key), exported)


def _compile_on(hosts: LocalHosts, h: InvHost, key: str) -> None:
    """What a cold start leaves: the emulator's artefacts in the ``vllm`` cache, and an empty
    triton dir."""
    top = hosts.root(h) / key
    c = (
        compile_cache.plan(top / "vllm", key, 6.0, 0.3)
        if (top / "vllm").mkdir(parents=True) is None
        else None
    )
    assert c is not None and not c.warm
    compile_cache.write(c)
    (top / "triton").mkdir()


def test_share_copies_the_canarys_cache_verified_and_only_on_the_same_key(tmp_path: Path) -> None:
    hosts = LocalHosts(tmp_path)
    canary, a, b, c = (
        Host(n, "10.0.0.1") for n in ("spark-01", "spark-02", "spark-03", "spark-04")
    )
    key = warmcache.cache_key(D1, "f", GB10)
    _compile_on(hosts, canary, key)
    other = warmcache.cache_key(D1, "f", "NVIDIA H100 80GB HBM3")
    # b holds a stale cache under the right key (compiled for another): replaced, not trusted.
    (hosts.root(b) / key / "vllm" / compile_cache.SUBDIR).mkdir(parents=True)
    (hosts.root(b) / key / "vllm" / compile_cache.SUBDIR / "compiled.json").write_text(
        '{"key": "stale"}'
    )
    out = warmcache.share(RECIPE, "img@" + D1, canary, key, {a: key, b: key, c: other}, ops=hosts)
    assert out["spark-02"].warm and out["spark-03"].warm and not out["spark-04"].warm
    assert "differs" in out["spark-04"].detail and out["spark-02"].files == 2
    for h in (a, b):
        man = json.loads((hosts.root(h) / key / warmcache.MANIFEST).read_text())
        assert man["key"] == key
        # The emulator on that host now starts warm with the same key, cold with any other.
        assert compile_cache.plan(hosts.root(h) / key / "vllm", key, 6.0, 0.3).warm
        assert not compile_cache.plan(hosts.root(h) / key / "vllm", other, 6.0, 0.3).warm
        assert warmcache.verify(RECIPE, "img", hosts(h), key) == (True, None)
    assert not (hosts.root(c) / key).exists()
    # A second share finds the copies verified and writes nothing.
    hosts.calls.clear()
    again = warmcache.share(RECIPE, "img@" + D1, canary, key, {a: key}, ops=hosts)
    assert again["spark-02"].warm and "already" in again["spark-02"].detail
    assert [op for _, op in hosts.calls] == ["export", "verify"]


def test_a_tampered_copy_is_found_and_the_host_starts_cold(tmp_path: Path) -> None:
    hosts = LocalHosts(tmp_path)
    canary, a = Host("spark-01", "10.0.0.1"), Host("spark-02", "10.0.0.2")
    key = warmcache.cache_key(D1, "f", GB10)
    _compile_on(hosts, canary, key)

    def corrupt(h: InvHost, cmd: str, stdin: str | None) -> str:
        if stdin is not None:  # the import: the manifest promises other bytes than the tar carries
            man_line, _, payload = stdin.partition("\n")
            man = json.loads(man_line)
            first = next(iter(man["files"]))
            man["files"][first][1] = "0" * 64
            stdin = json.dumps(man) + "\n" + payload
        return hosts.run(h, cmd, stdin)

    out = warmcache.share(RECIPE, "img@" + D1, canary, key, {a: key},
                          ops=lambda h: LocalCacheOps(h, corrupt))
    assert not out["spark-02"].warm and "did not verify" in out["spark-02"].detail
    assert not (
        hosts.root(a) / key
    ).exists()  # nothing half-written left where the container mounts
    ok, why = warmcache.verify(RECIPE, "img", hosts(a), key)
    assert not ok and why is not None and "no manifest" in why


def test_nothing_to_share_and_a_cache_over_the_bound_leave_hosts_cold(tmp_path: Path) -> None:
    hosts = LocalHosts(tmp_path)
    canary, a = Host("spark-01", "10.0.0.1"), Host("spark-02", "10.0.0.2")
    key = warmcache.cache_key(D1, "f", GB10)
    out = warmcache.share(RECIPE, "img", canary, key, {a: key}, ops=hosts)
    assert not out["spark-02"].warm and "no cache" in out["spark-02"].detail
    _compile_on(hosts, canary, key)
    out = warmcache.share(RECIPE, "img", canary, key, {a: key}, ops=hosts, max_bytes=1000)
    assert not out["spark-02"].warm and "over the 1000 bytes" in out["spark-02"].detail


def test_the_emulator_compiles_cold_then_warm_and_a_damaged_cache_is_cold(tmp_path: Path) -> None:
    key = "k" * 32
    assert (
        compile_cache.plan(tmp_path / "absent", key, 6.0, 0.3).directory is None
    )  # no cache mounted
    first = compile_cache.plan(tmp_path, key, 6.0, 0.3)
    assert (first.warm, first.seconds) == (False, 6.0)
    compile_cache.write(first)
    second = compile_cache.plan(tmp_path, key, 6.0, 0.3)
    assert (second.warm, second.seconds) == (True, 0.3)
    assert "compiled for key" in compile_cache.plan(tmp_path, "z" * 32, 6.0, 0.3).reason
    (tmp_path / compile_cache.SUBDIR / "kernels.bin").write_bytes(b"x")
    assert not compile_cache.plan(tmp_path, key, 6.0, 0.3).warm


def test_cache_dir_type() -> None:
    assert RECIPE.compile_cache == (
        CacheDir("vllm", "/root/.cache/vllm"),
        CacheDir("triton", "/root/.triton"),
    )


def test_a_cache_is_copied_only_within_the_canarys_named_trust_domain(tmp_path: Path) -> None:
    """Design finding of issue 39: the canary's root writes the cache and its checksums, and the
    files are code a receiver's vLLM loads; without the operator's trust domain nothing is
    copied."""
    hosts = LocalHosts(tmp_path)
    canary = Host("spark-01", "10.0.0.1", "rack-a")
    same, other, unmarked = (Host("spark-02", "10.0.0.2", "rack-a"),
                             Host("spark-03", "10.0.0.3", "rack-b"),
                             Host("spark-04", "10.0.0.4", None))
    key = warmcache.cache_key(D1, "f", GB10)
    _compile_on(hosts, canary, key)
    out = warmcache.share(RECIPE, "img@" + D1, canary, key,
                          {same: key, other: key, unmarked: key}, ops=hosts)
    assert out["spark-02"].warm
    for h in (other, unmarked):
        assert not out[h.name].warm and "trust domain" in out[h.name].detail
        assert not (hosts.root(h) / key).exists()
    assert {n for n, op in hosts.calls if op == "import"} == {"spark-02"}
    # a canary in no domain shares with nobody, even hosts that name one
    hosts.calls.clear()
    lone = Host("spark-01", "10.0.0.1", None)
    out = warmcache.share(RECIPE, "img@" + D1, lone, key, {same: key}, ops=hosts)
    assert not out["spark-02"].warm and "none there" in out["spark-02"].detail
    assert hosts.calls == []
