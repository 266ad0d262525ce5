"""Warm start: the canary's compile caches, copied to the next wave's hosts before they restart.

On a Spark most of a vLLM server's load after the weights is compiling: torch.compile's graphs,
Triton's and FlashInfer's kernels. They depend on the image, the server's settings and the GPU, so
one host's cache serves every other host that runs the same three. A recipe declares the directories
(``compile_cache``); each host keeps them under a directory named by the *cache key*
(:func:`cache_key`: image digest + recipe fingerprint + GPU) and the container mounts exactly that
directory, so that a cache is only ever used on an exact key match: a host whose key directory is
empty or stale compiles as before (cold) and is never failed because of its cache.

After the canary passes its gate, :func:`share` reads the canary's key directory once (a tar,
every file's sha256 taken from the same bytes), and writes it to each wave host that the operator
put in the canary's trust domain (:data:`TRUST_DOMAIN`; none by default: the canary's root writes
the files and their checksums, and the files are code the receivers run) (bounded fan-out):
unpacked into a temporary directory, every file checked against the canary's checksums, then
swapped in by a rename. The file operations run in a throw-away container of the target image
(``docker run --rm --network none``, already pulled on every host by the prefetch): the admin user
needs no root for them, only the docker access the rollout needs anyway.

The bytes travel through the controller, so the cache a recipe may share is bounded
(:data:`MAX_BYTES`, at most one copy in the controller's memory): torch.compile and Triton caches
of one model are tens to hundreds of MB. A larger cache is not copied (those hosts start cold).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from fleetctl import ssh
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe

#: Where each host keeps its compile caches: ``ROOT/<recipe>/<key>/<cache name>``.
ROOT = "/var/cache/fleetctl/compile"
#: The checksums of a shared cache, written in its key directory on each receiver.
MANIFEST = ".fleetctl-cache.json"
#: The container's environment variable naming its cache key (the lab's emulator checks it).
KEY_ENV = "FLEETCTL_COMPILE_CACHE_KEY"
#: The most a shared cache may weigh (bytes): it is relayed through the controller's memory.
MAX_BYTES = 1024**3
#: Receivers written to at once (decision 0003): each holds an SSH session streaming the cache.
FAN_OUT = 4
#: Seconds one run of the cache script may take on a host (a copy of up to MAX_BYTES).
HELPER_TIMEOUT = 600.0
#: The host variable naming a host's trust domain for compile caches: a canary's cache is copied
#: only to hosts of its own, named domain (none by default: every host compiles its own). A cache
#: holds generated Python, pickles and ``.so`` files that vLLM loads with the GPUs, the host network
#: and ``VLLM_API_KEY``: a host able to write one runs code on every host that takes its copy.
TRUST_DOMAIN = "fleetctl_compile_cache_trust_domain"


def trust_domain(host: Host) -> str | None:
    """The compile-cache trust domain the operator put ``host`` in (:data:`TRUST_DOMAIN`), or
    None."""
    value = host.vars.get(TRUST_DOMAIN)
    return value.strip() or None if isinstance(value, str) else None


def cache_key(digest: str, fingerprint: str, gpu: str) -> str:
    """The key a compile cache is valid for: the image digest, the recipe's fingerprint and the GPU
    model.

    Pure: the same three always give the same 32 hex digits; any one differing gives another key."""
    doc = json.dumps(
        {"digest": digest, "fingerprint": fingerprint, "gpu": gpu.strip()},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(doc.encode()).hexdigest()[:32]


def key_dir(recipe: Recipe, key: str) -> str:
    """The host directory holding ``recipe``'s caches for ``key``."""
    return f"{ROOT}/{recipe.name}/{key}"


def binds(recipe: Recipe, key: str | None) -> list[tuple[str, str]]:
    """``(host path, container path)`` read-write mounts of the recipe's caches for ``key`` (none
    without)."""
    if key is None:
        return []
    return [(f"{key_dir(recipe, key)}/{c.name}", c.mount) for c in recipe.compile_cache]


def env(recipe: Recipe, key: str | None) -> dict[str, str]:
    """The container environment naming its cache key (empty when the recipe declares no cache)."""
    return {KEY_ENV: key} if key is not None and recipe.compile_cache else {}


#: Runs in the target image's python3 with the recipe's cache root at /c (``$FLEETCTL_CACHE_DIR``
#: elsewhere, as the unit tests run it). argv: op key [max_bytes].
#: ``export``: one JSON line (the manifest, or why nothing is shared), then the base64 of a tar.
#: ``import``: reads that from stdin, unpacks beside the key directory, checks, swaps; one JSON
#: line.
#: ``verify``: whether the key directory holds exactly what its manifest says; one JSON line.
_SCRIPT = r"""
import base64, hashlib, io, json, os, shutil, sys, tarfile
op, key = sys.argv[1], sys.argv[2]
root = os.environ.get("FLEETCTL_CACHE_DIR", "/c"); d = os.path.join(root, key); MAN = ".fleetctl-cache.json"
def files(top):
    for dp, dns, fns in os.walk(top):
        dns.sort()
        for f in sorted(fns):
            p = os.path.join(dp, f)
            if os.path.isfile(p) and not os.path.islink(p) and not (dp == top and f == MAN):
                yield os.path.relpath(p, top), p
def check(top, man):
    if man.get("key") != key:
        return "the cache was made for key %s, not %s" % (man.get("key"), key)
    seen = {}
    for rel, p in files(top):
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for b in iter(lambda: fh.read(1 << 20), b""):
                h.update(b)
        seen[rel] = [os.path.getsize(p), h.hexdigest()]
    want = {k: list(v) for k, v in man["files"].items()}
    if seen != want:
        bad = sorted(set(seen) ^ set(want)) or sorted(k for k in want if seen.get(k) != want[k])
        return "%d file(s) differ from the checksums, e.g. %s" % (len(bad), bad[0])
    return None
if op == "export":
    if not os.path.isdir(d):
        print(json.dumps({"files": {}, "why": "no cache directory"})); sys.exit(0)
    total = sum(os.path.getsize(p) for _, p in files(d))
    if total > int(sys.argv[3]):
        print(json.dumps({"files": {}, "why": "%d bytes, over the %s bytes a cache may share" % (total, sys.argv[3])}))
        sys.exit(0)
    buf = io.BytesIO(); man = {"key": key, "files": {}, "bytes": 0}
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for rel, p in files(d):
            with open(p, "rb") as fh:
                data = fh.read()
            man["files"][rel] = [len(data), hashlib.sha256(data).hexdigest()]; man["bytes"] += len(data)
            ti = tarfile.TarInfo(rel); ti.size = len(data); ti.mode = 0o644
            tar.addfile(ti, io.BytesIO(data))
    print(json.dumps(man)); sys.stdout.flush()
    sys.stdout.write(base64.b64encode(buf.getvalue()).decode()); sys.stdout.write("\n")
elif op == "verify":
    try:
        with open(os.path.join(d, MAN)) as fh:
            man = json.load(fh)
    except (OSError, ValueError) as e:
        print(json.dumps({"ok": False, "why": "no manifest: %s" % e.__class__.__name__})); sys.exit(0)
    why = check(d, man)
    print(json.dumps({"ok": why is None, "why": why}))
elif op == "import":
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else LIMIT
    tmp = os.path.join(root, ".incoming-%s-%d" % (key, os.getpid()))
    try:
        # Every bound is checked before a byte is written: the canary that made the archive may
        # be hostile (a 149-byte archive declared a 1 TiB sparse file).
        man = json.loads(sys.stdin.readline(1 << 24))
        sizes = {k: v[0] for k, v in man["files"].items()}
        if not all(type(n) is int and n >= 0 for n in sizes.values()):
            raise ValueError("the manifest's sizes are not byte counts")
        total = sum(sizes.values())
        if total > limit:
            raise ValueError("the manifest lists %d bytes, over the %d a cache may share" % (total, limit))
        free = shutil.disk_usage(root).free
        if total + (64 << 20) > free:
            raise ValueError("%d bytes to write and %d free under %s" % (total, free, root))
        raw = base64.b64decode(sys.stdin.read(4 * (limit + (1 << 20)) // 3 + 4096))
        shutil.rmtree(tmp, ignore_errors=True); os.makedirs(tmp)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
            seen = set()
            for m in tar:
                parts = m.name.split("/")
                if not m.isfile() or m.issparse() or m.name.startswith("/") or ".." in parts or m.name not in sizes or m.name in seen:
                    raise ValueError("unexpected member %r" % m.name)
                if m.size != sizes[m.name]:
                    raise ValueError("member %r holds %d bytes, the manifest says %d" % (m.name, m.size, sizes[m.name]))
                seen.add(m.name)
                out = os.path.join(tmp, m.name)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                src = tar.extractfile(m)
                with open(out, "wb") as fh:
                    shutil.copyfileobj(src, fh)
                    if fh.tell() != sizes[m.name]:
                        raise ValueError("member %r is not the size it declares" % m.name)
        why = check(tmp, man)
        if why is not None:
            raise ValueError(why)
        with open(os.path.join(tmp, MAN), "w") as fh:
            json.dump(man, fh)
        old = d + ".old-%d" % os.getpid()
        if os.path.exists(d):
            os.rename(d, old)
        os.rename(tmp, d)
        shutil.rmtree(old, ignore_errors=True)
        print(json.dumps({"ok": True, "files": len(man["files"]), "bytes": total}))
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        print(json.dumps({"ok": False, "why": "%s: %s" % (e.__class__.__name__, e)}))
"""  # noqa: E501 (data: lines as the program reads them)
_SCRIPT = _SCRIPT.replace("else LIMIT", f"else {MAX_BYTES}")


def helper_command(recipe: Recipe, ref: str, op: str, key: str, *args: str) -> str:
    """The ``docker run`` of the cache script in the target image, the recipe's cache root at /c."""
    argv = ["docker", "run", "--rm", "-i", "--network", "none", "--entrypoint", "python3",
            "-v", f"{ROOT}/{recipe.name}:/c", ref, "-c", _SCRIPT, op, key, *args]
    return shlex.join(argv)


@dataclass(frozen=True)
class Seeded:
    """What the warm start did for one host: ``warm`` when its key directory holds the canary's
    cache."""

    host: str
    key: str
    warm: bool
    detail: str
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "key": self.key, "warm": self.warm, "detail": self.detail,
                "files": self.files, "bytes": self.bytes, "seconds": round(self.seconds, 2)}


class CacheOps(Protocol):
    """The warm start's operations on one host: a slice of the rollout's ``HostOps`` (over SSH,
    each is :func:`helper_command` run there; the simulated fleet keeps its caches in memory). Each
    returns what the cache script prints, and raises FleetError when it could not run."""

    @property
    def host(self) -> Host:
        """The host these operations act on."""
        ...

    def export_cache(self, recipe: Recipe, ref: str, key: str, max_bytes: int) -> str:
        """The key directory's manifest (one JSON line: its files, or why nothing is shared), then
        what :meth:`import_cache` takes on another host."""
        ...

    def verify_cache(self, recipe: Recipe, ref: str, key: str) -> str:
        """One JSON line: whether the key directory holds just what its manifest lists, or why."""
        ...

    def import_cache(self, recipe: Recipe, ref: str, key: str, exported: str) -> str:
        """Another host's :meth:`export_cache` unpacked beside the key directory, checked, swapped
        in; one JSON line: the files and bytes, or why not."""
        ...


def _first_json(out: str) -> dict[str, object]:
    line, _, _ = out.partition("\n")
    doc = json.loads(line)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def share(recipe: Recipe, ref: str, source: Host, source_key: str, targets: Mapping[Host, str],
          ops: Callable[[Host], CacheOps], max_bytes: int = MAX_BYTES,
          fan_out: int = FAN_OUT) -> dict[str, Seeded]:
    """Copy ``source``'s cache for ``source_key`` to every target whose key is the same and that the
    operator put in ``source``'s trust domain (:data:`TRUST_DOMAIN`); one result per target.
    ``ops(host)``: the host's cache operations (the rollout's HostOps).

    Never raises for a host: a target whose key or trust domain differs, whose copy fails or does
    not verify is reported cold with why (it compiles at its start as it would have without warm
    start)."""
    if not recipe.compile_cache or not targets:
        return {}
    out: dict[str, Seeded] = {}
    domain = trust_domain(source)
    same = [h for h, k in targets.items() if k == source_key and domain is not None
            and trust_domain(h) == domain]
    for h, k in targets.items():
        if k == source_key and h not in same:
            out[h.name] = Seeded(
                h.name, k, False,
                f"not in {source.name}'s compile-cache trust domain ({TRUST_DOMAIN}: "
                f"{domain or 'none'} there, {trust_domain(h) or 'none'} here): starts cold")
        elif k != source_key:
            out[h.name] = Seeded(
                h.name,
                k,
                False,
                "its cache key differs from the canary's (another GPU or settings): starts cold",
            )
    if not same:
        return out
    t0 = time.monotonic()
    try:
        exported = ops(source).export_cache(recipe, ref, source_key, max_bytes)
        man_line, _, payload = exported.partition("\n")
        man = json.loads(man_line)
    except (FleetError, ValueError) as e:
        why = e.message() if isinstance(e, FleetError) else f"unreadable export ({e})"
        return {
            **out,
            **{
                h.name: Seeded(h.name, source_key, False, f"the canary's cache was not read: {why}")
                for h in same
            },
        }
    if not man.get("files"):
        why = str(man.get("why") or "empty")
        return {
            **out,
            **{
                h.name: Seeded(
                    h.name, source_key, False, f"the canary has no cache to share ({why})"
                )
                for h in same
            },
        }
    read_s = time.monotonic() - t0
    stdin = man_line + "\n" + payload

    def one(h: Host) -> Seeded:
        t = time.monotonic()
        try:
            have = _first_json(ops(h).verify_cache(recipe, ref, source_key))
            if have.get("ok"):
                return Seeded(
                    h.name,
                    source_key,
                    True,
                    "already held the canary's cache (verified)",
                    len(man["files"]),
                    int(man.get("bytes", 0)),
                    time.monotonic() - t,
                )
            res = _first_json(ops(h).import_cache(recipe, ref, source_key, stdin))
        except (FleetError, ValueError) as e:
            why = e.message() if isinstance(e, FleetError) else f"unreadable answer ({e})"
            return Seeded(
                h.name,
                source_key,
                False,
                f"copy failed, starts cold: {why}",
                seconds=time.monotonic() - t,
            )
        if not res.get("ok"):
            return Seeded(
                h.name,
                source_key,
                False,
                f"copy did not verify, starts cold: {res.get('why')}",
                seconds=time.monotonic() - t,
            )
        return Seeded(
            h.name,
            source_key,
            True,
            "copied from the canary, every file's sha256 checked",
            int(str(res.get("files", 0))),
            int(str(res.get("bytes", 0))),
            read_s + time.monotonic() - t,
        )

    for name, o in ssh.fan_out(same, one, timeout=None, max_workers=fan_out).items():
        out[name] = (
            o.value
            if o.value is not None
            else Seeded(
                name,
                source_key,
                False,
                f"copy failed, starts cold: {o.error.message() if o.error else '?'}",
            )
        )
    return out


def verify(recipe: Recipe, ref: str, ops: CacheOps, key: str) -> tuple[bool, str | None]:
    """Whether the key directory on ``ops``'s host holds exactly what its manifest lists (a warm
    start's cache)."""
    doc = _first_json(ops.verify_cache(recipe, ref, key))
    return bool(doc.get("ok")), (str(doc["why"]) if doc.get("why") else None)


def summary(seeded: Sequence[Seeded]) -> str:
    """``3 of 4 host(s) warm (12 files, 4.2 MB each)`` for the progress line and the ledger's
    note."""
    warm = [s for s in seeded if s.warm]
    size = f" ({warm[0].files} files, {warm[0].bytes / 1e6:.1f} MB each)" if warm else ""
    return f"{len(warm)} of {len(seeded)} host(s) warm{size}"
