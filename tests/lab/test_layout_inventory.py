"""Where a lab puts things and the inventory it writes (pure logic, no lab needed)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from fleetctl import inventory as fleet_inventory
from fleetctl.errors import FleetError
from fleetctl.lab import access, inventory, layout


def _layout(root: Path, subnet: str = "10.78.1.0/24") -> layout.Layout:
    return layout.Layout(root=root, subnet=ipaddress.IPv4Network(subnet))


def test_addresses_and_names() -> None:
    lay = _layout(Path("/var/tmp/lab-x"))
    assert lay.gateway == "10.78.1.1" and lay.registry == "10.78.1.1:5000"
    assert [lay.node_name(i) for i in (1, 2, 12)] == ["spark-01", "spark-02", "spark-12"]
    assert [lay.node_address(i) for i in (1, 4)] == ["10.78.1.11", "10.78.1.14"]
    assert lay.node_index("spark-12") == 12
    with pytest.raises(FleetError, match="not a lab node name"):
        lay.node_index("gpu-1")
    # One interface name per subnet, within the kernel's 15 characters.
    names = {_layout(Path("/x"), f"10.78.{k}.0/24").bridge for k in range(256)}
    assert len(names) == 256 and max(len(n) for n in names) <= 15


def test_subnet_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEETCTL_LAB_DIR", str(tmp_path))
    monkeypatch.setenv("FLEETCTL_LAB_SUBNET", "10.78.7.0/24")
    assert layout.current().gateway == "10.78.7.1"
    for bad in ("10.79.0.0/24", "10.78.1.0/28", "not-a-net", "10.78.1.5/24"):
        monkeypatch.setenv("FLEETCTL_LAB_SUBNET", bad)
        with pytest.raises(FleetError, match="FLEETCTL_LAB_SUBNET"):
            layout.current()


def test_deep_lab_dirs_keep_sockets_short(tmp_path: Path) -> None:
    short = _layout(Path("/var/tmp/lab-a"))
    assert short.exec_root == Path("/var/tmp/lab-a/engine/exec")
    deep = _layout(Path("/tmp/" + "d" * 70))
    assert deep.exec_root.parent == Path("/run/fleetctl-lab")
    assert len(str(deep.exec_root / "containerd" / "containerd.sock.ttrpc")) < 100
    too_deep = _layout(Path("/tmp/" + "d" * 90))
    with pytest.raises(FleetError, match="too long"):
        too_deep.check()


def test_inventory_is_readable_by_fleetctl_and_links_repo_vars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    (repo / "inventory" / "lab" / "group_vars" / "all").mkdir(parents=True)
    (repo / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml").write_text(
        "fleetctl_recipes: {a: 1}\n"
    )
    monkeypatch.setenv("FLEETCTL_HOME", str(repo))
    lay = _layout(tmp_path / "lab")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(lay.vault_password_file))
    path = inventory.write(lay, ["spark-01", "spark-02", "spark-03"])
    inv = fleet_inventory.load(path)
    assert list(inv.hosts) == ["spark-01", "spark-02", "spark-03"]
    assert inv.groups["sparks"] == ("spark-01", "spark-02", "spark-03")
    assert inv.groups["canary"] == ("spark-01",)
    h = inv.host("spark-02")
    assert (h.address, h.user, h.key_file, h.known_hosts) == (
        "10.78.1.12", "nvidia", str(lay.ssh_key), str(lay.known_hosts))
    # A real fleet's shape: the admin user with become, reached through the bastion.
    assert [hop.address for hop in h.jumps] == ["10.78.1.10"]
    assert h.jumps[0].user == "nvidia" and h.become.enabled
    assert "ProxyJump=bastion" in h.vars["ansible_ssh_common_args"]
    # spark-02's sudo asks for the password: vault-encrypted on disk, opened with the vault
    # password.
    become = (lay.inventory_dir / "host_vars" / "spark-02" / "become.yml").read_text()
    assert "$ANSIBLE_VAULT;1.1;AES256" in become and access.become_password(lay) not in become
    assert h.become.password is not None and h.become.password.reveal() == access.become_password(
        lay
    )
    assert inv.host("spark-01").become.password is None
    assert h.vars["ansible_python_interpreter"] == "/usr/bin/python3"
    assert "StrictHostKeyChecking=yes" in h.vars["ansible_ssh_common_args"]
    assert h.vars["fleetctl_recipes"] == {"a": 1}
    assert h.vars["fleetctl_registry_mirrors"] == {
        "ghcr.io": "10.78.1.1:5000",
        "docker.io": "10.78.1.1:5000",
        "nvcr.io": "10.78.1.1:5000",
    }
    assert (
        h.vars["container_toolkit_verify_image"]
        == "10.78.1.1:5000/nvidia/cuda:13.0.0-base-ubuntu24.04"
    )
    link = lay.inventory_dir / "group_vars" / "all" / "recipes.yml"
    assert link.is_symlink()
    # An edit in the repository is seen at once; a file removed there disappears at the next write.
    (repo / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml").write_text(
        "fleetctl_recipes: {b: 2}\n"
    )
    assert fleet_inventory.load(path).vars["fleetctl_recipes"] == {"b": 2}
    (repo / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml").unlink()
    inventory.write(lay, ["spark-01"])
    assert not link.exists() and not link.is_symlink()
    assert list(fleet_inventory.load(path).hosts) == ["spark-01"]


def test_a_lab_keeps_the_subnet_it_was_made_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetctl import lab

    monkeypatch.setenv("FLEETCTL_LAB_DIR", str(tmp_path))
    monkeypatch.setenv("FLEETCTL_LAB_SUBNET", "10.78.3.0/24")
    (tmp_path / "lab.json").write_text('{"version": 1, "subnet": "10.78.250.0/24", "nodes": []}')
    st = lab.status()
    assert st.subnet == "10.78.250.0/24" and st.gateway == "10.78.250.1" and not st.up
    with pytest.raises(FleetError, match=r"was made on subnet 10\.78\.250\.0/24"):
        lab.up(nodes=1)
