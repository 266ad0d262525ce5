"""The lab's weights mirror: every repo the recipes name, written once as model directories with
the ``manifest.json`` the stage verifies."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.lab.models.directory import write_model
from fleetctl.lab.models.kinds import kind_for_repo


# --- the weights mirror ---------------------------------------------------------------------
@dataclass(frozen=True)
class MirrorSpec:
    """One revision of one repo to put in the mirror."""

    repo: str
    revision: str
    kind: str | None = None
    variant: str = "good"
    date: str | None = None


@dataclass(frozen=True)
class MirrorEntry:
    """One revision written to the mirror: where, and its manifest."""

    repo: str
    revision: str
    path: Path
    manifest: dict[str, Any]


def manifest_for(
    directory: Path, *, repo: str, revision: str, revision_date: str | None
) -> dict[str, Any]:
    """``{"files": [{"path", "size", "sha256"}], "repo", "revision", "revision_date"}`` of a
    directory."""
    files = []
    for path in sorted(
        p for p in directory.rglob("*") if p.is_file() and p.name != "manifest.json"
    ):
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        files.append(
            {
                "path": path.relative_to(directory).as_posix(),
                "size": path.stat().st_size,
                "sha256": digest.hexdigest(),
            }
        )
    return {"files": files, "repo": repo, "revision": revision, "revision_date": revision_date}


def _specs(items: Iterable[Any] | Mapping[str, Any]) -> list[MirrorSpec]:
    """Mirror specs from MirrorSpecs, Recipe objects, or raw ``fleetctl_recipes`` mappings."""
    values: Iterable[Any] = items.values() if isinstance(items, Mapping) else items
    out: list[MirrorSpec] = []
    for item in values:
        if isinstance(item, MirrorSpec):
            out.append(item)
            continue
        weights = (
            item.get("weights", []) if isinstance(item, Mapping) else getattr(item, "weights", ())
        )
        for w in weights:
            get = (
                w.get
                if isinstance(w, Mapping)
                else (lambda key, default=None, _w=w: getattr(_w, key, default))
            )
            repo, revision, role = get("repo"), get("revision", "main"), get("role", None)
            if not repo:
                raise FleetError(
                    "a recipe weight set has no repo", fix="give every weight set a repo"
                )
            out.append(
                MirrorSpec(
                    repo=str(repo),
                    revision=str(revision or "main"),
                    kind=kind_for_repo(str(repo), role),
                )
            )
    return out


def repo_recipes() -> Mapping[str, Any]:
    """The raw ``fleetctl_recipes`` of the checkout's lab inventory
    (inventory/lab/group_vars/all)."""
    import yaml

    from fleetctl import paths

    path = paths.project_root() / "inventory/lab/group_vars/all/recipes.yml"
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise FleetError(
            f"cannot read the lab recipes {path}: {exc}", fix="restore the file from git"
        ) from None
    recipes = raw.get("fleetctl_recipes") if isinstance(raw, Mapping) else None
    if not isinstance(recipes, Mapping):
        raise FleetError(f"{path} has no fleetctl_recipes mapping", fix="restore the file from git")
    return recipes


def populate_mirror(
    root: Path | str, recipes_or_specs: Iterable[Any] | Mapping[str, Any] | None = None
) -> list[MirrorEntry]:
    """Write every recipe's body and drafter (or each MirrorSpec) as ``<root>/<repo>/<revision>/``
    + manifest.json.

    Accepts ``fleetctl_recipes`` (a mapping name -> recipe dict), Recipe objects (with
    ``.weights``), or MirrorSpec items; None means the checkout's lab recipes. A revision
    already present with a manifest is kept as is (a second ``lab up`` is fast); duplicates
    are written once.
    """
    base = Path(root)
    written: list[MirrorEntry] = []
    seen: set[tuple[str, str]] = set()
    for spec in _specs(repo_recipes() if recipes_or_specs is None else recipes_or_specs):
        if (spec.repo, spec.revision) in seen:
            continue
        seen.add((spec.repo, spec.revision))
        target = base / spec.repo / spec.revision
        manifest_path = target / "manifest.json"
        if manifest_path.is_file():
            written.append(
                MirrorEntry(spec.repo, spec.revision, target, json.loads(manifest_path.read_text()))
            )
            continue
        kind = spec.kind or kind_for_repo(spec.repo)
        tmp = target.with_name(target.name + ".tmp")
        if tmp.exists():
            _rmtree(tmp)
        write_model(tmp, kind, spec.variant, date=spec.date)
        date = json.loads((tmp / "config.json").read_text()).get("revision_date")
        manifest = manifest_for(tmp, repo=spec.repo, revision=spec.revision, revision_date=date)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if target.exists():
            _rmtree(target)
        tmp.rename(target)
        written.append(MirrorEntry(spec.repo, spec.revision, target, manifest))
    return written


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)
