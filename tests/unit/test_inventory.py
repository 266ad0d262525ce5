"""The inventory reader: Ansible's YAML format, variable precedence, --limit patterns, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl import inventory
from fleetctl.errors import InventoryError


def write(tmp: Path, text: str) -> Path:
    p = tmp / "hosts.yml"
    p.write_text(text)
    return p


def test_groups_vars_and_precedence(tmp_path: Path) -> None:
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "a.yml").write_text("x: all\ny: all\nz: all\n")
    (tmp_path / "group_vars" / "canary.yml").write_text("y: canary\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "s2.yml").write_text("z: hostvars\n")
    p = write(tmp_path, """
all:
  vars: {ansible_user: ops}
  children:
    sparks:
      hosts:
        s1: {ansible_host: 10.0.0.1}
        s2: {ansible_host: 10.0.0.2, ansible_port: 2222}
      children:
        canary:
          hosts:
            s1:
""")
    inv = inventory.load(p)
    assert list(inv.hosts) == ["s1", "s2"]
    s1, s2 = inv.host("s1"), inv.host("s2")
    assert (s1.address, s1.user, s1.port) == ("10.0.0.1", "ops", 22)
    assert s2.port == 2222
    assert s1.vars["y"] == "canary" and s2.vars["y"] == "all"
    assert s2.vars["z"] == "hostvars"
    assert set(s1.groups) == {"sparks", "canary"}
    assert inv.groups["sparks"] == ("s1", "s2")


def test_limit_patterns(tmp_path: Path) -> None:
    p = write(tmp_path, """
all:
  children:
    a: {hosts: {h1: , h2: }}
    b: {hosts: {h3: , h4: }}
""")
    inv = inventory.load(p)
    names = lambda lim: [h.name for h in inv.select(lim)]  # noqa: E731
    assert names(None) == ["h1", "h2", "h3", "h4"]
    assert names("b,h1") == ["h1", "h3", "h4"]
    assert names("all:!a") == ["h3", "h4"]
    assert names("h*:&b") == ["h3", "h4"]
    with pytest.raises(InventoryError, match="matches no host"):
        inv.select("h9")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("all: [1, 2]", "mapping with an 'all' group"),
        ("all:\n  hosts:\n    h1: {ansible_port: abc}\n", "not a number"),
        ("all:\n  hostz: {}\n", "unknown key"),
        ("all:\n  hosts: [h1]\n", "mapping of name"),
        ("all:\n  hosts:\n    h1: {a: [\n", "not valid YAML at line"),
    ],
)
def test_malformed_inventory_is_one_clear_error(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(InventoryError, match=match) as e:
        inventory.load(write(tmp_path, text))
    assert str(tmp_path / "hosts.yml") in e.value.message()


def test_missing_inventory_points_at_lab_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETCTL_INVENTORY", raising=False)
    monkeypatch.setenv("FLEETCTL_LAB_DIR", str(tmp_path / "nolab"))
    with pytest.raises(InventoryError, match="fleetctl lab up"):
        inventory.load(None)
