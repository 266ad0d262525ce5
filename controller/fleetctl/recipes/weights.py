"""The directories a recipe mounts: its weight sets (body and drafter, pinned to a revision) and
its compile caches, and those parts of a recipe checked."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from fleetctl.recipes.problems import Bad

#: Checkpoint formats a weight set can declare, and the ``--quantization`` each needs.
FORMAT_QUANTIZATION: Mapping[str, str | None] = {
    "compressed-tensors": "compressed-tensors",
    "modelopt": "modelopt",
    "bf16": None,
}


ROLES = ("body", "drafter")


#: Where weights live on a host: a recipe may only stage below it.
WEIGHTS_ROOT = "/opt/"


SOURCES = ("hub", "mirror")


_WEIGHT_KEYS = {
    "role",
    "repo",
    "revision",
    "path",
    "mount",
    "format",
    "min_date",
    "size_gb",
    "manifest_sha256",
}


_REQUIRED_WEIGHT_KEYS = ("role", "repo", "revision", "path", "mount", "format")


_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")


#: A git revision: a commit sha, a tag or a branch (``refs/pr/1``); it becomes a directory name when
#: staging from a local copy, so no ``..`` and nothing a shell or rsync would read.
_REVISION = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127}){0,3}\Z"
)


#: Paths on the host and in the container: they go into ``docker -v SRC:DST:ro`` and rsync
#: arguments, where ':' and ',' would add mount options and shell characters would be read.
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._+/-]+\Z")


#: The marker a verified, staged weight set carries in its directory on a host (written by the
#: stage just before its atomic swap; the rollout refuses a host whose sets lack it). The weights
#: role's modules, which run on the hosts, keep their own copy of this name.
STAGED_MARKER = ".fleetctl-staged.json"


@dataclass(frozen=True)
class WeightSet:
    """One directory of weights a recipe needs: the body checkpoint or the drafter."""

    role: str
    #: Hub repository, ``owner/name``.
    repo: str
    #: Pinned revision (commit sha, tag or branch) fetched from the hub or the mirror.
    revision: str
    #: Directory on the host, under /opt.
    path: str
    #: Where the directory is bind-mounted (read-only) inside the container.
    mount: str
    #: Checkpoint format: compressed-tensors, modelopt or bf16.
    format: str
    #: Oldest acceptable revision date (drafters fetched before a fix crash;
    #: docs/domain.md#weights).
    min_date: date | None = None
    #: Expected size in GB (preflight before the exact size is known from a manifest).
    size_gb: float = 0.0
    #: sha256 of the mirror's manifest.json for this set, pinned out of band: with it a plain-http
    #: mirror is trusted (every file is checked against the manifest); without it, only https is.
    manifest_sha256: str | None = None


@dataclass(frozen=True)
class CacheDir:
    """One compile-cache directory the server writes while it loads (torch.compile, Triton,
    FlashInfer).

    Bind-mounted read-write from the host's keyed cache (fleetctl.warmcache) at ``mount``, so that a
    host started after the canary reuses the kernels the canary compiled (docs/warm-start.md)."""

    #: Short name, the directory's name under the host's keyed cache (``vllm``, ``triton``...).
    name: str
    #: Where the server looks for it inside the container (``/root/.cache/vllm``...).
    mount: str


_CACHE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}\Z")


#: The largest size in GB a recipe may give (a petabyte: past any Spark's disk, and far from a
#: float that overflows when a step counts its bytes, as `.inf` did in `stage`).
MAX_GB = 1_000_000


def is_gb(value: Any) -> bool:
    """A size in GB: a number from 0 to :data:`MAX_GB` (YAML's ``.nan``, ``.inf`` and booleans
    are not)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value <= MAX_GB


def build_caches(raw: object, weight_mounts: Sequence[str], bad: Bad) -> tuple[CacheDir, ...]:
    """``compile_cache: [{name: vllm, mount: /root/.cache/vllm}, ...]``: unique names and container
    paths."""
    if raw is None:
        return ()
    fix = ("e.g. compile_cache: [{name: vllm, mount: /root/.cache/vllm}, {name: triton, mount: "
           "/root/.triton}]")
    if not isinstance(raw, list):
        bad("compile_cache", "must be a list of {name, mount}", fix)
        return ()
    out: list[CacheDir] = []
    for i, c in enumerate(raw):
        where = f"compile_cache[{i}]"
        if not isinstance(c, Mapping) or set(c) != {"name", "mount"}:
            bad(where, "must be a mapping with exactly name and mount", fix)
            continue
        name, mount = str(c["name"]), str(c["mount"]).rstrip("/")
        if not _CACHE_NAME.match(name):
            bad(
                f"{where}.name",
                f"{name!r} is not a short lower-case name",
                "use letters, digits, _ and -, e.g. triton",
            )
        elif not mount.startswith("/") or ".." in mount.split("/") or not _SAFE_PATH.match(mount):
            bad(
                f"{where}.mount",
                f"{mount!r} is not an absolute container path of plain characters",
                "use e.g. /root/.cache/vllm",
            )
        elif mount in weight_mounts:
            bad(
                f"{where}.mount",
                f"{mount!r} is a weight set's mount",
                "give the cache its own directory",
            )
        else:
            out.append(CacheDir(name, mount))
    if len({c.name for c in out}) != len(out) or len({c.mount for c in out}) != len(out):
        bad(
            "compile_cache",
            "two cache directories share a name or a mount",
            "give each its own name and mount",
        )
        return ()
    return tuple(out)


def build_weights(raw: Any, present: bool, bad: Callable[[str, str, str], None]) -> list[WeightSet]:
    """The recipe's weight sets, each checked; a set with a problem is left out (and reported)."""
    if not isinstance(raw, list) or not raw:
        if present:
            bad(
                "weights",
                "must be a non-empty list of weight sets",
                "give at least the body: - {role: body, repo: ..., ...}",
            )
        return []
    sets = (_weight_set(w, f"weights[{i}]", bad) for i, w in enumerate(raw))
    out = [ws for ws in sets if ws is not None]
    paths = [w.path for w in out]
    mounts = [w.mount for w in out]
    if len(set(paths)) != len(paths):
        bad(
            "weights",
            "two weight sets share a host path",
            "give each set its own directory under /opt",
        )
    if len(set(mounts)) != len(mounts):
        bad(
            "weights",
            "two weight sets share a container mount",
            "mount the body at /model and the drafter at /drafter",
        )
    if sum(w.role == "drafter" for w in out) > 1:
        bad("weights", "has more than one drafter", "keep one weight set with role: drafter")
    return out



def _weight_set(w: Any, where: str, bad: Bad) -> WeightSet | None:
    """One weight set, or None when it has a problem (each reported through ``bad``)."""
    if not isinstance(w, Mapping):
        bad(where, "must be a mapping", "give role, repo, revision, path, mount and format")
        return None
    n_bad = 0

    def wbad(fld: str, problem: str, fix: str) -> None:
        nonlocal n_bad
        n_bad += 1
        bad(f"{where}.{fld}", problem, fix)

    _check_fields(w, wbad)
    role, repo, path, mount, fmt = (
        str(w.get(k, "")) for k in ("role", "repo", "path", "mount", "format")
    )
    _check_paths(path, mount, wbad)
    _check_pins(w, wbad)
    pin = w.get("manifest_sha256")
    min_date = _min_date(w.get("min_date"), wbad)
    size = w.get("size_gb", 0)
    if not is_gb(size):
        wbad("size_gb", f"{size!r} is not a size in GB (0 to {MAX_GB})", "e.g. size_gb: 22")
        size = 0
    if n_bad:
        return None
    return WeightSet(role=role, repo=repo, revision=str(w["revision"]), path=path.rstrip("/"),
                     mount=mount.rstrip("/"), format=fmt, min_date=min_date, size_gb=float(size),
                     manifest_sha256=pin if isinstance(pin, str) else None)


def _check_fields(w: Mapping[str, Any], wbad: Bad) -> None:
    """A weight set's fields: known, the required ones given, role and repo valid."""
    for key in sorted(set(w) - _WEIGHT_KEYS):
        wbad(str(key), "unknown field", f"use one of: {', '.join(sorted(_WEIGHT_KEYS))}")
    for key in _REQUIRED_WEIGHT_KEYS:
        if not isinstance(w.get(key), str) or not w.get(key):
            wbad(key, "is missing or not a string", f"add {key}: to the weight set")
    role, repo = str(w.get("role", "")), str(w.get("repo", ""))
    if role and role not in ROLES:
        wbad("role", f"{role!r} is not a weight role", f"use one of: {', '.join(ROLES)}")
    if repo and not _REPO.match(repo):
        wbad(
            "repo",
            f"{repo!r} is not a hub repository",
            "write owner/name, e.g. z-lab/Qwen3.6-35B-A3B-DFlash",
        )


def _check_pins(w: Mapping[str, Any], wbad: Bad) -> None:
    """What a weight set is pinned to: its manifest's sha256, its revision, its format."""
    pin = w.get("manifest_sha256")
    if pin is not None and not (isinstance(pin, str) and re.fullmatch(r"[0-9a-f]{64}", pin)):
        wbad("manifest_sha256", f"{pin!r} is not a sha256 (64 lowercase hex digits)",
             "copy it from `sha256sum manifest.json` of the mirror's copy you verified")
    fmt = str(w.get("format", ""))
    rev = w.get("revision")
    if isinstance(rev, str) and rev and (not _REVISION.match(rev) or ".." in rev):
        wbad("revision", f"{rev!r} is not a git revision (a commit sha, tag or branch)",
             "pin the commit sha from the model's page on the hub (40 hex digits)")
    if fmt and fmt not in FORMAT_QUANTIZATION:
        wbad(
            "format",
            f"{fmt!r} is not a known checkpoint format",
            f"use one of: {', '.join(FORMAT_QUANTIZATION)}",
        )


def _check_paths(path: str, mount: str, wbad: Bad) -> None:
    """The host directory (under /opt) and the container mount: plain absolute paths."""
    if path and (
        not path.startswith(WEIGHTS_ROOT)
        or ".." in path.split("/")
        or path.rstrip("/") + "/" == WEIGHTS_ROOT
    ):
        wbad(
            "path",
            f"{path!r} is not a directory under {WEIGHTS_ROOT}",
            "use e.g. /opt/qwen36/qwen36-nvfp4",
        )
    elif path and not _SAFE_PATH.match(path):
        wbad("path", f"{path!r} has characters other than letters, digits and . _ + - /",
             "name the directory plainly, e.g. /opt/qwen36/qwen36-nvfp4")
    if mount and (not mount.startswith("/") or mount == "/" or ".." in mount.split("/")):
        wbad("mount", f"{mount!r} is not an absolute container path", "use e.g. /model or /drafter")
    elif mount and not _SAFE_PATH.match(mount):
        wbad("mount", f"{mount!r} has characters other than letters, digits and . _ + - / "
             "(':' or ',' would add docker mount options)", "use e.g. /model or /drafter")


def _min_date(md: Any, wbad: Bad) -> date | None:
    """The oldest acceptable revision date (a date, or YYYY-MM-DD)."""
    if isinstance(md, date) or md is None:
        return md
    try:
        return date.fromisoformat(str(md))
    except ValueError:
        wbad("min_date", f"{md!r} is not a date", "write YYYY-MM-DD, e.g. 2026-04-19")
        return None
