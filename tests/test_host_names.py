"""Issue 32, finding 15: a host's name is a host alias (letters, digits, ``.``, ``-``, ``_``; ``:``
for IPv6), refused otherwise with one message naming the file; and the rollout's per-host artifacts
directory is one plain path component whatever name reaches it.

Before: ``../x``, a newline or ``$(id)`` were accepted as host names; ``runs/<id>/soak-<name>``
took the name as it was (``../../../x`` wrote outside the state directory), and a newline split a
table's row.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from fleetctl import inventory
from fleetctl.errors import InventoryError
from fleetctl.inventory import Host
from fleetctl.rollout.run import Run

HOSTILE = ["../../../../tmp/x", "a/b", "spark\n01", "$(id)", "`id`", "a b", "-oProxyCommand=x",
           ".hidden", "spärk", "x;y", "a\rb"]


def _inventory(tmp_path: Path, name: str) -> Path:
    src = tmp_path / "hosts.yml"
    src.write_text(yaml.safe_dump({"all": {"children": {"sparks": {"hosts": {
        name: {"ansible_host": "127.0.0.1"}, "spark-02": {"ansible_host": "127.0.0.2"}}}}}}))
    return src


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_is_no_host_alias_is_refused(tmp_path: Path, name: str) -> None:
    src = _inventory(tmp_path, name)
    with pytest.raises(InventoryError) as e:
        inventory.load(src)
    msg = e.value.message()
    assert msg.startswith(f"{src}: host name {name!r} has "), msg
    assert "\n" not in msg and "put the address in ansible_host" in msg


def test_an_ini_inventory_is_held_to_the_same_rule(tmp_path: Path) -> None:
    src = tmp_path / "hosts"
    src.write_text("[sparks]\nspark-01 ansible_host=127.0.0.1\n$(id) ansible_host=127.0.0.2\n")
    with pytest.raises(InventoryError, match=r"host name '\$\(id\)' has characters '\$' '\(' '\)'"):
        inventory.load(src)


@pytest.mark.parametrize("name", ["spark-01", "spark01.lab.example", "gpu_node_3", "10.0.0.5",
                                  "fe80::1", "SPARK-A7", "_spare"])
def test_names_real_fleets_use_are_kept(tmp_path: Path, name: str) -> None:
    assert sorted(inventory.load(_inventory(tmp_path, name)).hosts) == sorted([name, "spark-02"])


@pytest.mark.parametrize("name", [*HOSTILE, "..", "spark-01"])
def test_the_artifacts_directory_stays_in_the_run_whatever_the_name(
    tmp_path: Path, name: str
) -> None:
    """Defence in depth: a Host built by other means than the inventory gets a plain directory."""
    run = Run(session=cast(Any, SimpleNamespace(state_dir=tmp_path)), id="r1", kind="rollout")
    art = run.artifacts(Host(name=name, address="127.0.0.1"))
    assert art.parent == tmp_path / "runs" / "r1", art
    assert art.name.startswith("soak-") and art.resolve().parent == (tmp_path / "runs" / "r1")
    assert all(c.isascii() and (c.isalnum() or c in "_.:-") for c in art.name), art.name
    if name == "spark-01":
        assert art.name == "soak-spark-01"  # a plain name is kept as it is
    else:
        other = run.artifacts(Host(name=name + "x", address="127.0.0.1"))
        assert other != art  # names that clean to the same text keep apart
