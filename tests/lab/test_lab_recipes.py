"""``lab up --recipe``: the host_vars it writes, what it refuses before anything is made; and the
vault password found beside the lab's inventory (pure logic, no lab needed)."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest

from fleetctl import inventory as fleet_inventory
from fleetctl.ansible.config import ansible_cfg
from fleetctl.errors import FleetError
from fleetctl.inventory.sources import beside_vault_password_file
from fleetctl.lab import access, inventory, layout
from fleetctl.lab.models.mirror import repo_recipes
from fleetctl.recipes import default_recipe_name

NODES = ["spark-01", "spark-02", "spark-03", "spark-04"]


def _layout(root: Path) -> layout.Layout:
    return layout.Layout(root=root, subnet=ipaddress.IPv4Network("10.78.1.0/24"))


@pytest.fixture
def lay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> layout.Layout:
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    return _layout(tmp_path / "lab")


def test_recipe_options_parse_one_node_or_several() -> None:
    got = inventory.parse_recipe_options(
        ["spark-03=qwen36-27b-mm", "spark-01,spark-02=gemma4-26b-a4b"]
    )
    assert got == {"spark-03": "qwen36-27b-mm", "spark-01": "gemma4-26b-a4b",
                   "spark-02": "gemma4-26b-a4b"}
    for bad in ("spark-03", "=qwen36-27b-mm", "spark-03="):
        with pytest.raises(FleetError, match="NODE=RECIPE"):
            inventory.parse_recipe_options([bad])
    with pytest.raises(FleetError, match="two recipes"):
        inventory.parse_recipe_options(["spark-03=a", "spark-03=b"])


def test_a_recipe_the_lab_cannot_give_is_refused_naming_node_and_fix() -> None:
    recipes = repo_recipes()
    made = inventory.units(NODES, 1)  # pair-1: spark-03, spark-04
    inventory.check_recipes({"spark-01": "qwen36-27b-mm"}, NODES, made, recipes)
    cases = {
        "spark-09": ("qwen36-27b-mm", "not one of the lab's nodes"),
        "spark-03": ("qwen36-27b-mm", "member of unit pair-1"),
        "spark-02": ("no-such", "has no recipe 'no-such'"),
    }
    for node, (recipe, why) in cases.items():
        with pytest.raises(FleetError, match=why) as e:
            inventory.check_recipes({node: recipe}, NODES, made, recipes)
        assert e.value.host == node and e.value.fix
    with pytest.raises(FleetError, match="unit of 2 nodes"):
        inventory.check_recipes({"spark-01": "qwen35-35b-bf16-pair"}, NODES, {}, recipes)


def test_recipes_are_host_vars_rewritten_at_every_up(lay: layout.Layout) -> None:
    path = inventory.write(lay, NODES, recipes={"spark-03": "qwen36-27b-mm",
                                                "spark-04": "qwen35-35b-bf16"})
    inv = fleet_inventory.load(path)
    assert {n: default_recipe_name(inv, h) for n, h in inv.hosts.items()} == {
        "spark-01": "qwen36-35b-heretic", "spark-02": "qwen36-35b-heretic",
        "spark-03": "qwen36-27b-mm", "spark-04": "qwen35-35b-bf16"}
    assert inventory.node_recipes(lay) == {"spark-03": "qwen36-27b-mm",
                                           "spark-04": "qwen35-35b-bf16"}
    # The next up says only spark-04: spark-03 is back on the default.
    inventory.write(lay, NODES, recipes={"spark-04": "gemma4-26b-a4b"})
    inv = fleet_inventory.load(path)
    assert default_recipe_name(inv, inv.host("spark-03")) == "qwen36-35b-heretic"
    assert default_recipe_name(inv, inv.host("spark-04")) == "gemma4-26b-a4b"
    assert not (lay.inventory_dir / "host_vars" / "spark-03" / "recipe.yml").exists()


def test_a_users_own_recipe_file_is_kept_and_never_replaced(lay: layout.Layout) -> None:
    inventory.write(lay, NODES)
    own = lay.inventory_dir / "host_vars" / "spark-02" / "recipe.yml"
    own.write_text("fleetctl_recipe: gemma4-26b-a4b\n")
    inventory.write(lay, NODES, recipes={"spark-03": "qwen36-27b-mm"})
    assert own.read_text() == "fleetctl_recipe: gemma4-26b-a4b\n"
    assert inventory.node_recipes(lay)["spark-02"] == "gemma4-26b-a4b"
    with pytest.raises(FleetError, match="not one `lab up` wrote") as e:
        inventory.check_recipe_files(lay, {"spark-02": "qwen36-27b-mm"})
    assert e.value.host == "spark-02" and own.read_text() == "fleetctl_recipe: gemma4-26b-a4b\n"


def test_the_vault_password_is_found_beside_the_labs_inventory(lay: layout.Layout) -> None:
    """No ANSIBLE_VAULT_PASSWORD_FILE (a new shell): spark-02's sudo password still opens."""
    path = inventory.write(lay, NODES)
    cfg = (lay.inventory_dir / "ansible.cfg").read_text()
    assert f"vault_password_file = {lay.vault_password_file}" in cfg
    assert access.become_password(lay) not in cfg
    secret = lay.vault_password_file.read_text().strip()
    assert secret not in cfg
    assert stat.S_IMODE(lay.vault_password_file.stat().st_mode) == 0o600
    inv = fleet_inventory.load(path)
    h = inv.host("spark-02")
    assert h.become.password is not None
    assert h.become.password.reveal() == access.become_password(lay)
    assert inv.vault_password_file == str(lay.vault_password_file)
    # The playbooks fleetctl runs on it are given the same file (their ansible.cfg replaces any).
    run_cfg = ansible_cfg(inv, ["spark-02"])
    assert f"vault_password_file = {lay.vault_password_file}" in run_cfg
    assert secret not in run_cfg


def test_the_environments_vault_password_file_wins(lay: layout.Layout, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = inventory.write(lay, NODES)
    other = tmp_path / "other-vault"
    other.write_text("not the lab's\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(other))
    inv = fleet_inventory.load(path)
    assert inv.vault_password_file == str(other)
    with pytest.raises(FleetError, match="cannot be decrypted"):
        pw = inv.host("spark-02").become.password
        assert pw is not None
        pw.reveal()


def test_a_world_writable_inventory_directory_names_no_vault_file(lay: layout.Layout) -> None:
    path = inventory.write(lay, NODES)
    assert beside_vault_password_file(path) == str(lay.vault_password_file)
    lay.inventory_dir.chmod(0o777)
    try:
        assert beside_vault_password_file(path) is None
    finally:
        lay.inventory_dir.chmod(0o755)
