"""The inventory reader (ansible-core underneath): INI, YAML, scripts, variable precedence, --limit
patterns, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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
        ("all: [1, 2]", "not a valid group definition"),
        ("all:\n  hosts:\n    h1: {ansible_port: abc}\n", "not a number"),
        ("all:\n  hostz: {}\n", "unexpected key \\(hostz\\)"),
        ("all:\n  hosts: [h1]\n", "Invalid \"hosts\" entry"),
        ("all:\n  hosts:\n    h1: {a: [\n", "not valid YAML at line"),
    ],
)
def test_malformed_inventory_is_one_clear_error(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(InventoryError, match=match) as e:
        inventory.load(write(tmp_path, text))
    assert str(tmp_path / "hosts.yml") in e.value.message()


def test_missing_inventory_points_at_lab_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEETCTL_INVENTORY", raising=False)
    monkeypatch.setenv("FLEETCTL_LAB_DIR", str(tmp_path / "nolab"))
    with pytest.raises(InventoryError, match="fleetctl lab up"):
        inventory.load(None)


INI = """
[sparks]
s1 ansible_host=10.0.0.1
s2 ansible_host=10.0.0.2 ansible_port=2222

[canary]
s1

[rack2]
s3 ansible_host=10.0.0.3 fleetctl_recipe=small

[dc:children]
sparks
rack2

[dc:vars]
ansible_user=ops
"""

NESTED_YAML = """
all:
  children:
    dc:
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
        rack2:
          hosts:
            s3: {ansible_host: 10.0.0.3, fleetctl_recipe: small}
"""


def ansible_inventory_list(source: Path) -> dict[str, Any]:
    """What the real `ansible-inventory --list` says about ``source``."""
    exe = Path(sys.executable).with_name("ansible-inventory")
    out = subprocess.run(
        [str(exe), "-i", str(source), "--list"], check=True, capture_output=True, text=True
    )
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def members(tree: dict[str, Any], group: str) -> set[str]:
    node = tree.get(group, {})
    out = set(node.get("hosts", []))
    for child in node.get("children", []):
        out |= members(tree, child)
    return out


@pytest.mark.parametrize(("name", "text"), [("hosts.ini", INI), ("hosts.yml", NESTED_YAML)])
def test_same_hosts_groups_and_vars_as_ansible_inventory(
    tmp_path: Path, name: str, text: str
) -> None:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "canary.yml").write_text("fleetctl_recipe: canary\n")
    (tmp_path / "group_vars" / "all.yml").write_text(
        "fleetctl_recipe: base\nfleetctl_weights_mirror: m\n"
    )
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "s2.yml").write_text("ansible_port: 2200\n")
    src = tmp_path / name
    src.write_text(text)
    inv = inventory.load(src)
    ref = ansible_inventory_list(src)
    assert set(inv.hosts) == set(ref["_meta"]["hostvars"]) == {"s1", "s2", "s3"}
    for h, hv in ref["_meta"]["hostvars"].items():
        assert dict(inv.host(h).vars) == hv, h
    for g in ("sparks", "canary", "rack2", "dc"):
        assert set(inv.groups[g]) == members(ref, g), g
    # precedence: host_vars > inventory host > child group > parent group > all
    assert (inv.host("s1").vars["fleetctl_recipe"], inv.host("s2").vars["fleetctl_recipe"]) == (
        "canary",
        "base",
    )
    assert inv.host("s3").vars["fleetctl_recipe"] == "small"
    assert inv.host("s2").port == 2200 and inv.host("s3").user == "ops"
    assert inv.vars["fleetctl_weights_mirror"] == "m"


def test_dynamic_inventory_script(tmp_path: Path) -> None:
    script = tmp_path / "fleet.py"
    script.write_text(f"""#!{sys.executable}
import json, sys
if "--host" in sys.argv:
    print("{{}}")
else:
    print(json.dumps({{
        "sparks": {{"hosts": ["d1", "d2"], "vars": {{"ansible_user": "ops"}}}},
        "_meta": {{"hostvars": {{"d1": {{"ansible_host": "10.1.0.1"}}, "d2": {{"ansible_host": "10.1.0.2"}}}}}},
    }}))
""")  # noqa: E501 (data: lines as the program reads them)
    script.chmod(0o755)
    inv = inventory.load(script)
    assert [(h.name, h.address, h.user) for h in inv.select("sparks")] == [
        ("d1", "10.1.0.1", "ops"), ("d2", "10.1.0.2", "ops")]
    assert {h: dict(v) for h, v in ansible_inventory_list(script)["_meta"]["hostvars"].items()} == {
        h.name: dict(h.vars) for h in inv.hosts.values()}


def test_limit_has_ansible_semantics(tmp_path: Path) -> None:
    src = tmp_path / "hosts.ini"
    src.write_text(INI)
    inv = inventory.load(src)
    names = lambda lim: [h.name for h in inv.select(lim)]  # noqa: E731
    assert names("sparks:rack2") == ["s1", "s2", "s3"]
    assert names("dc:!canary") == ["s2", "s3"]
    assert names("dc:&sparks:!s2") == ["s1"]
    assert names("dc[1:2]") == ["s2", "s3"]
    assert names("~s[13]") == ["s1", "s3"]
    assert names("s*,!rack2") == ["s1", "s2"]
    with pytest.raises(InventoryError, match="'rack3' matches no host"):
        inv.select("sparks:rack3")


def test_directory_of_sources(tmp_path: Path) -> None:
    (tmp_path / "a.ini").write_text("[sparks]\ns1 ansible_host=10.0.0.1\n")
    (tmp_path / "b.yml").write_text(
        "all:\n  children:\n    sparks:\n      hosts:\n        s2: {ansible_host: 10.0.0.2}\n"
    )
    inv = inventory.load(tmp_path)
    assert set(inv.groups["sparks"]) == {"s1", "s2"}
