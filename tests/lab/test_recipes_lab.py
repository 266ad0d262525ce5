"""A lab whose nodes serve different recipes (``lab up --recipe``), through the CLI as a user runs
it in a new shell (no ANSIBLE_VAULT_PASSWORD_FILE, the lab's own inventory): status reaches the
node whose sudo password is vaulted, ``stage`` stages each node's own recipe in a tree per recipe,
and ``status`` flags a node whose configured recipe is not what it serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, ssh
from fleetctl import lab as fleetlab
from fleetctl.lab import access, layout
from fleetctl.recipes import load_recipes

pytestmark = pytest.mark.lab

FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
HERETIC, MM = "qwen36-35b-heretic", "qwen36-27b-mm"


def fresh_env() -> dict[str, str]:
    """A new shell's environment: the lab chosen, nothing that names a vault password or
    another inventory."""
    return {k: v for k, v in os.environ.items()
            if k not in ("ANSIBLE_VAULT_PASSWORD_FILE", "FLEETCTL_INVENTORY", "ANSIBLE_CONFIG")}


def fleetctl(cwd: Path, *args: str, width: int = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEETCTL, *args], capture_output=True, text=True, timeout=900,
                          cwd=cwd, env={**fresh_env(), "COLUMNS": str(width)})


@pytest.fixture
def recipes_on(lab: fleetlab.LabStatus) -> Iterator[Any]:
    """``recipes_on({"spark-03": NAME})``: ``lab up --recipe`` for the test; every node back on
    the inventory's default afterwards."""
    def give(assigned: Mapping[str, str]) -> fleetlab.LabStatus:
        st = fleetlab.up(nodes=len(lab.nodes), units=len(lab.units), recipes=dict(assigned))
        assert dict(st.recipes) == dict(assigned)
        return st

    try:
        yield give
    finally:
        fleetlab.up(nodes=len(lab.nodes), units=len(lab.units))
        ssh.close_all()


def test_a_new_shell_reaches_the_vaulted_node_without_lab_env(
    lab: fleetlab.LabStatus, tmp_path: Path
) -> None:
    vault = layout.current().vault_password_file
    cfg = (lab.inventory.parent / "ansible.cfg").read_text()
    assert str(vault) in cfg and vault.read_text().strip() not in cfg
    assert oct(vault.stat().st_mode & 0o777) == "0o600"
    r = fleetctl(tmp_path, "status", "--limit", "spark-02", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["spark-02"]["reachable"], doc["spark-02"]["error"]
    # The status probe ran through sudo with the vaulted password: it read the root-only state.
    assert doc["spark-02"]["gpu"] == "NVIDIA GB10"
    secret = access.become_password(layout.current())
    assert secret not in r.stdout + r.stderr
    assert vault.read_text().strip() not in r.stdout + r.stderr


def _table(text: str) -> list[str]:
    """The lines of the tables in ``text`` (free-text lines after them may be longer)."""
    return [line for line in text.splitlines() if line[:1] in ("┏", "┃", "┡", "│", "└")]


def _sha256s(host: inventory.Host, path: str) -> dict[str, str]:
    r = ssh.run(host, f"cd {path} && find . -type f ! -name '.fleetctl-*' -print0 | sort -z | "
                      "xargs -0 sha256sum", timeout=30)
    assert r.ok, f"{host.name}: {path}: {r.stderr}"
    return {line.split()[1][2:]: line.split()[0] for line in r.stdout.splitlines()}


def test_stage_without_recipe_stages_each_nodes_own_recipe(
    lab: fleetlab.LabStatus, provisioned: Any, recipes_on: Any, tmp_path: Path
) -> None:
    del provisioned
    recipes_on({"spark-03": MM, "spark-04": MM})
    inv = inventory.load(lab.inventory)
    mm = load_recipes(inv)[MM]
    # Nothing of MM's on its nodes yet: the run must fetch it once and copy it in its own tree.
    for name in ("spark-03", "spark-04"):
        r = ssh.run(inv.host(name), ["rm", "-rf", *(w.path for w in mm.weights)], become=True,
                    timeout=60)
        assert r.ok, r.stderr
    r = fleetctl(tmp_path, "stage", "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["failed_hosts"] == []
    by = {name: sorted(res["hosts"]) for name, res in doc["recipes"].items()}
    assert by == {HERETIC: ["spark-01", "spark-02"], MM: ["spark-03", "spark-04"]}
    got = doc["recipes"][MM]
    assert got["recipe"] == MM and got["source"] == "mirror"
    seed = got["seed"]
    assert seed in ("spark-03", "spark-04")
    other = next(n for n in got["hosts"] if n != seed)
    assert got["hosts"][other]["copied_from"] == seed, "MM's tree is MM's hosts only"
    assert all(s["state"] == "staged" for s in got["hosts"][other]["sets"])
    for res in doc["recipes"].values():  # no copy ever crosses from another recipe's hosts
        assert all(h["copied_from"] in (None, *res["hosts"]) for h in res["hosts"].values())
    mirror = Path(lab.directory) / "www" / "weights"
    recipes = load_recipes(inv)
    for name, res in doc["recipes"].items():
        for host in res["hosts"]:
            for w in recipes[name].weights:
                manifest = json.loads((mirror / w.repo / w.revision / "manifest.json").read_text())
                on_host = _sha256s(inv.host(host), w.path)
                want = {f["path"]: f["sha256"] for f in manifest["files"]}
                assert {p: on_host.get(p) for p in want} == want, f"{host}: {w.path}"
    # The table: each recipe's own section, in 80 columns.
    again = fleetctl(tmp_path, "stage", width=80)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"recipe {HERETIC}" in again.stdout and f"recipe {MM}" in again.stdout
    assert max(len(line) for line in _table(again.stdout)) <= 80


def test_status_flags_a_node_serving_another_recipe_than_its_own(
    lab: fleetlab.LabStatus, serving: Any, recipes_on: Any, tmp_path: Path
) -> None:
    """Every node serves the default recipe; spark-02 is then configured for MM (its host_vars
    changed, no rollout yet): it is the one flagged, from its container and its /v1/models."""
    del serving
    inv = inventory.load(lab.inventory)
    heretic_names = list(load_recipes(inv)[HERETIC].served_model_names)
    recipes_on({"spark-02": MM})
    r = fleetctl(tmp_path, "status", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert {n: h["recipe"] for n, h in doc.items()} == {
        "spark-01": HERETIC, "spark-02": MM, "spark-03": HERETIC, "spark-04": HERETIC}
    drifted = doc["spark-02"]
    assert drifted["served_recipe"] == HERETIC
    assert sorted(drifted["served_models"]) == sorted(heretic_names)
    assert f"serves {HERETIC}" in drifted["drift"] and f"configured {MM}" in drifted["drift"]
    assert [n for n, h in doc.items() if h["drift"]] == ["spark-02"]
    table = fleetctl(tmp_path, "status", width=80)
    assert table.returncode == 0, table.stderr[-2000:]
    lines = table.stdout.splitlines()
    assert max(len(line) for line in _table(table.stdout)) <= 80
    row = next(line for line in lines if "spark-02" in line and "│" in line)
    assert MM in row and "DRIFT" in row
    assert not any("DRIFT" in line for line in lines if "spark-01" in line)
    assert any(line.startswith("drift spark-02:") for line in lines)
