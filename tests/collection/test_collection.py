"""The collection's files agree with each other: what the build, the EE and AWX each rely on."""

from __future__ import annotations

from pathlib import Path

import yaml

from fleetctl import paths

ROOT = paths.project_root()


def _yaml(rel: str) -> object:
    return yaml.safe_load((ROOT / rel).read_text())


def test_every_role_module_is_a_module_of_the_collection() -> None:
    # A role inside a collection cannot carry modules in library/: each must be in plugins/modules.
    role_modules = {p.name: p.resolve() for p in ROOT.glob("roles/*/library/*.py")}
    plugins = {p.name: p.resolve() for p in (ROOT / "plugins" / "modules").glob("*.py")}
    assert role_modules, "no role module found"
    assert plugins == role_modules


def test_the_execution_environment_installs_the_tarball_the_build_writes() -> None:
    galaxy = _yaml("galaxy.yml")
    assert isinstance(galaxy, dict)
    tarball = f"{galaxy['namespace']}-{galaxy['name']}-{galaxy['version']}.tar.gz"
    ee = _yaml("execution-environment.yml")
    assert isinstance(ee, dict) and ee["version"] == 3
    assert [f["src"] for f in ee["additional_build_files"]] == [f"dist/{tarball}"]
    assert [c["name"] for c in ee["dependencies"]["galaxy"]["collections"]] == [
        f"/build/collections/{tarball}"
    ]
    # The collection needs nothing from Galaxy; requirements.yml and galaxy.yml say so together.
    req = _yaml("requirements.yml")
    assert isinstance(req, dict) and req["collections"] == [] and galaxy["dependencies"] == {}


def test_each_awx_playbook_imports_a_playbook_of_the_collection() -> None:
    shipped = {p.stem for p in (ROOT / "playbooks").glob("*.yml")}
    awx = sorted((ROOT / "awx").glob("*.yml"))
    assert {p.stem for p in awx} == {"provision", "stage", "deploy", "rollback"}
    for p in awx:
        plays = yaml.safe_load(p.read_text())
        assert isinstance(plays, list)
        assert plays[0]["ansible.builtin.import_playbook"] == f"fleetctl.spark.{p.stem}"
        assert p.stem in shipped


def test_the_build_leaves_out_everything_but_ansible_content() -> None:
    galaxy = _yaml("galaxy.yml")
    assert isinstance(galaxy, dict)
    ignored = set(galaxy["build_ignore"])
    kept = {"roles", "playbooks", "plugins", "meta", "docs", "galaxy.yml"}
    tracked_top = {
        p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name in {".ci"}
    } - {"dist", "build"}
    assert not tracked_top - kept - ignored, sorted(tracked_top - kept - ignored)
    assert Path(ROOT / str(galaxy["readme"])).is_file()
