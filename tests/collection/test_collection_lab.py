"""The fleetctl.spark collection, built and installed into a clean venv, run with plain
ansible-playbook.

No fleetctl in the loop: ``ansible-galaxy collection build`` of the repository, an offline
``ansible-galaxy collection install`` of the tarball into a fresh venv holding only
ansible-core from PyPI (the version pyproject.toml pins), then the collection's playbooks by
FQCN against the lab inventory: provision, a deploy of v0.23.0 then v0.24.0 to one node
(a --check first, a second run that changes nothing), and rollback.yml back to v0.23.0. The
served digest is read over SSH, as the controller reads it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from fleetctl import inventory, paths, registry, ssh
from fleetctl import lab as fleetlab
from fleetctl.container import Container
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe, recipe_for
from fleetctl.rollout import host as remote

pytestmark = pytest.mark.lab

OLD, NEW = "v0.23.0", "v0.24.0"


def _ansible_core_requirement() -> str:
    deps = tomllib.loads((paths.project_root() / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    return next(d for d in deps if re.match(r"ansible-core\b", d))


@pytest.fixture(scope="module")
def collection_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a clean venv with ansible-core and the built collection installed
    (offline)."""
    root = tmp_path_factory.mktemp("collection")
    venv.create(root / "venv", with_pip=True)
    bin_dir = root / "venv" / "bin"
    subprocess.run(
        [bin_dir / "pip", "install", "-q", _ansible_core_requirement()], check=True, timeout=600
    )
    # Built with the test process's own ansible-galaxy (the project's), installed with the venv's.
    subprocess.run(
        [
            Path(sys.executable).parent / "ansible-galaxy",
            "collection",
            "build",
            "--output-path",
            root / "dist",
            paths.project_root(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (tarball,) = (root / "dist").glob("fleetctl-spark-*.tar.gz")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "ANSIBLE_COLLECTIONS_PATH": str(root / "colls"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }
    subprocess.run(
        [
            bin_dir / "ansible-galaxy",
            "collection",
            "install",
            "--offline",
            "-p",
            root / "colls",
            tarball,
        ],
        check=True,
        capture_output=True,
        env=env,
        timeout=120,
    )
    return env


def _run(
    env: dict[str, str], playbook: str, limit: str, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ansible-playbook",
            "-i",
            str(paths.lab_inventory()),
            f"fleetctl.spark.{playbook}",
            "--limit",
            limit,
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _play(env: dict[str, str], playbook: str, limit: str, *args: str) -> dict[str, int]:
    """Run a playbook of the collection by FQCN; the recap counts of ``limit`` (fails on rc !=
    0)."""
    p = _run(env, playbook, limit, *args)
    assert p.returncode == 0, (
        f"{playbook} failed (rc {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}"
    )
    m = re.search(rf"^{re.escape(limit)}\s+:\s+(.*)$", p.stdout, re.MULTILINE)
    assert m, p.stdout[-2000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def _target(lab: fleetlab.LabStatus) -> tuple[str, Host, Recipe, dict[str, str], str, str]:
    """The last healthy node, its host, the recipe, the registry mirrors and the OLD and NEW
    digests."""
    node = [n.name for n in lab.nodes if n.state == "running" and not n.faults][-1]
    inv = inventory.load(lab.inventory)
    recipe = recipe_for(inv)
    mirrors = {str(k): str(v) for k, v in (inv.vars.get("fleetctl_registry_mirrors") or {}).items()}
    old, new = (registry.resolve(recipe.image, t, mirrors).digest for t in (OLD, NEW))
    return node, inv.hosts[node], recipe, mirrors, old, new


def test_the_built_collection_provisions_deploys_and_rolls_back(
    staged: object, lab: fleetlab.LabStatus, collection_env: dict[str, str]
) -> None:
    del staged
    node, host, recipe, mirrors, old, new = _target(lab)

    def serving() -> Container | None:
        try:
            return remote.inspect(host, remote.container_name(host))
        finally:
            ssh.close_all()

    recap = _play(collection_env, "provision", node)
    assert recap["failed"] == 0 and recap["unreachable"] == 0

    _play(
        collection_env,
        "deploy",
        node,
        "-e",
        f"vllm_serve_tag={OLD}",
        "-e",
        f"vllm_serve_digest={old}",
    )
    before = serving()
    assert before is not None and before.running and before.digest == old

    recap = _play(collection_env, "deploy", node, "--check", "--diff",
                  "-e", f"vllm_serve_tag={NEW}", "-e", f"vllm_serve_digest={new}")
    assert recap["changed"] == 1
    assert serving() == before, "--check changed the host"

    recap = _play(
        collection_env,
        "deploy",
        node,
        "-e",
        f"vllm_serve_tag={NEW}",
        "-e",
        f"vllm_serve_digest={new}",
    )
    assert recap["changed"] == 1 and recap["failed"] == 0
    now = serving()
    assert now is not None and now.running and now.digest == new and now.tag == NEW
    assert now.image == registry.pull_ref(recipe.image, new, mirrors)
    prev = remote.inspect(host, remote.container_name(host) + remote.PREV_SUFFIX)
    assert prev is not None and not prev.running and prev.digest == old

    recap = _play(
        collection_env,
        "deploy",
        node,
        "-e",
        f"vllm_serve_tag={NEW}",
        "-e",
        f"vllm_serve_digest={new}",
    )
    assert recap["changed"] == 0, "a second deploy of the same digest changed something"

    recap = _play(collection_env, "rollback", node)
    assert recap["changed"] == 1
    back = serving()
    assert back is not None and back.running and back.digest == old and back.tag == OLD


def test_a_refused_deploy_names_the_cause_and_the_fix_and_leaves_the_host_alone(
        staged: object, lab: fleetlab.LabStatus, collection_env: dict[str, str]) -> None:
    del staged
    node, host, recipe, _, _, new = _target(lab)
    before = remote.inspect(host, remote.container_name(host))
    ssh.close_all()

    # Weights not staged (as far as the role can tell: it looks for another marker file).
    p = _run(collection_env, "deploy", node, "-e", f"vllm_serve_digest={new}",
             "-e", "vllm_serve_stage_marker=.not-the-stage-marker.json")
    assert p.returncode != 0
    assert "not staged and verified (no .not-the-stage-marker.json)" in p.stdout
    assert f"fleetctl stage --recipe {recipe.name} --limit {node}" in p.stdout
    # A tag where the digest belongs.
    p = _run(collection_env, "deploy", node, "-e", f"vllm_serve_digest={NEW}")
    assert p.returncode != 0 and "is not sha256:<64 hex digits>" in p.stdout, p.stdout[-2000:]
    try:
        assert remote.inspect(host, remote.container_name(host)) == before
    finally:
        ssh.close_all()
