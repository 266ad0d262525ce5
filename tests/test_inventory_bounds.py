"""Issue 32, finding 1 (and 13's deep YAML): the inventory's files are bounded in what they expand
to, in values and in bytes, all files together, whatever their format or place.

Before: the alias guard counted nodes per file, in group_vars and a .yml source only. A 1 MB
group_vars file standing for a terabyte of text (``s: &s <1 MiB>``, ``a: [*s x1000]``,
``b: [*a x1000]``) took ``recipes`` to MemoryError at 6 GB; the 9^9 bomb in ``hosts.json`` or a
directory inventory was never looked at (``status``: 1.5 GB in 120 s); two 15 MB vars files took
``status`` 209 s; YAML nested 50,000 deep was a RecursionError traceback. Each case runs
``fleetctl`` in a child whose peak RSS (MB) and seconds are the figures.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from fleetctl import inventory
from fleetctl.errors import InventoryError
from tests.childpeak import FLEETCTL, Child, run_child

#: The child may hold the interpreter, ansible-core and fleetctl (~70-110 MB), not the expansion.
RSS_LIMIT_MB = 200
#: Seconds a refusal may take (reading the files and their YAML events; the old code ran for
#: minutes or died).
REFUSED_WITHIN_S = 30

#: The bounds, as documented in docs/security.md (written out: the tests must fail on code without
#: them, not fail to import).
TOTAL_BYTES = 16 << 20
DEPTH = 100

HOSTS = "all:\n  children:\n    sparks:\n      hosts:\n        s1: {ansible_host: 127.0.0.1}\n"


def _bomb(indent: str = "") -> str:
    """The 9^9 alias bomb (nine levels of nine aliases: 387 million strings)."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in itertools.pairwise("abcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "".join(f"{indent}{line}\n" for line in lines)


def _write(root: Path, tree: dict[str, str]) -> None:
    for rel, text in tree.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


def _fleetctl(tmp_path: Path, source: Path, *argv: str) -> Child:
    env = dict(os.environ, FLEETCTL_STATE_DIR=str(tmp_path / "state"), COLUMNS="1000")
    return run_child(FLEETCTL, "-i", str(source), *argv, timeout=120, env=env)


def _refused(r: Child, says: str) -> str:
    err = " ".join(r.stderr.split())
    assert r.rc == 2, (r.rc, err[-2000:])
    assert says in err and "fix:" in err, err[-2000:]
    assert 0 < r.peak_mb < RSS_LIMIT_MB, (r.peak_mb, err[-500:])
    assert r.seconds < REFUSED_WITHIN_S, r.seconds
    return err


def test_a_terabyte_of_aliased_text_is_refused_by_its_bytes(tmp_path: Path) -> None:
    big = "x" * (1 << 20)
    _write(tmp_path, {
        "hosts.yml": HOSTS,
        "group_vars/all/b.yml": f's: &s "{big}"\na: &a [' + ", ".join(["*s"] * 1000)
        + "]\nb: [" + ", ".join(["*a"] * 1000) + "]\n",
    })
    err = _refused(_fleetctl(tmp_path, tmp_path / "hosts.yml", "recipes"),
                   "expands to more than 64 MiB of text through YAML aliases")
    assert str(tmp_path / "group_vars/all/b.yml") in err


@pytest.mark.parametrize("layout", ["hosts.json", "directory"])
def test_the_alias_bomb_is_refused_in_every_source(tmp_path: Path, layout: str) -> None:
    """ansible-core's yaml plugin reads a .json source as YAML when it is not JSON, and every file
    of a directory source."""
    if layout == "hosts.json":
        bad = tmp_path / "hosts.json"
        _write(tmp_path, {"hosts.json": "all:\n  hosts:\n    s1: {ansible_host: 127.0.0.1}\n"
                                        "  vars:\n" + _bomb("    ")})
        source = bad
    else:
        bad = tmp_path / "inv" / "more.yml"
        _write(tmp_path, {"inv/fleet.yml": HOSTS,
                          "inv/more.yml": "all:\n  vars:\n" + _bomb("    ")})
        source = tmp_path / "inv"
    err = _refused(_fleetctl(tmp_path, source, "status"), "expands to more than 250000 values")
    assert f"{bad}: " in err


def test_vars_files_are_bounded_together(tmp_path: Path) -> None:
    """Each under the per-file bound, together over the inventory's."""
    half = TOTAL_BYTES // 2 + 1024
    _write(tmp_path, {"hosts.yml": HOSTS, "group_vars/all/a.yml": "s: " + "y" * half + "\n",
                      "group_vars/sparks.yml": "t: " + "z" * half + "\n"})
    err = _refused(_fleetctl(tmp_path, tmp_path / "hosts.yml", "status"),
                   f"more than an inventory may ({TOTAL_BYTES})")
    assert str(tmp_path / "group_vars/all/a.yml") in err
    assert str(tmp_path / "group_vars/sparks.yml") in err


def test_values_are_counted_across_files(tmp_path: Path) -> None:
    """Two files of 150,000 values each: each under the bound, together over it (ansible-core
    takes ~20 s per 100,000 values written out)."""
    keys = "".join(f"k{i}: {i}\n" for i in range(75_000))
    _write(tmp_path, {"hosts.yml": HOSTS, "group_vars/all.yml": keys,
                      "group_vars/sparks.yml": keys})
    err = _refused(_fleetctl(tmp_path, tmp_path / "hosts.yml", "status"),
                   "expands to more than 250000 values through YAML aliases (with the inventory "
                   "files before it)")
    assert str(tmp_path / "group_vars/sparks.yml") in err


def test_a_long_group_string_is_held_once_not_once_per_host(tmp_path: Path) -> None:
    """A 4 MiB string in the group of 200 hosts: before, each host held its own copy (888 MB)."""
    hosts = "".join(f"        s{i}: {{ansible_host: 127.0.0.1}}\n" for i in range(200))
    _write(tmp_path, {"hosts.yml": "all:\n  children:\n    sparks:\n      hosts:\n" + hosts,
                      "group_vars/sparks.yml": "s: " + "y" * (4 << 20) + "\n"})
    r = run_child("""
        import sys
        from fleetctl import inventory
        inv = inventory.load(sys.argv[1])
        print(len(inv.hosts), len(inv.hosts["s199"].vars["s"]))
    """, str(tmp_path / "hosts.yml"))
    assert r.stdout.split() == ["200", str(4 << 20)], r.stderr[-2000:]
    assert 0 < r.peak_mb < RSS_LIMIT_MB, r.peak_mb


@pytest.mark.parametrize("depth", [50_000, DEPTH + 1])
def test_yaml_nested_too_deep_is_one_message(tmp_path: Path, depth: int) -> None:
    _write(tmp_path, {"hosts.yml": HOSTS,
                      "group_vars/all/d.yml": "x: " + "[" * depth + "]" * depth + "\n"})
    with pytest.raises(InventoryError) as e:
        inventory.load(tmp_path / "hosts.yml")
    assert e.value.cause == (f"{tmp_path / 'group_vars/all/d.yml'}: YAML nested more than "
                             f"{DEPTH} levels deep"), e.value.cause
    assert e.value.fix and "flatten" in e.value.fix


def test_an_inventory_within_the_bounds_still_loads(tmp_path: Path) -> None:
    """Aliases, a vault tag, an INI and a JSON file in a directory source: all read as before."""
    _write(tmp_path, {
        "inv/fleet.yml": HOSTS,
        "inv/more.ini": "[gpus]\ns2 ansible_host=127.0.0.2\n",
        "inv/extra.json": '{"all": {"hosts": {"s3": {"ansible_host": "127.0.0.3"}}}}',
        "inv/group_vars/all.yml": "base: &b {a: 1}\nuse: [*b, *b]\n"
                                  "secret: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n",
    })
    inv = inventory.load(tmp_path / "inv")
    assert sorted(inv.hosts) == ["s1", "s2", "s3"]
    assert inv.hosts["s2"].vars["use"] == [{"a": 1}, {"a": 1}]


def test_a_vars_file_encrypted_whole_is_left_to_ansible(tmp_path: Path) -> None:
    """``ansible-vault encrypt group_vars/all/vault.yml``: its text is no YAML mapping, and was
    refused as one before it reached ansible-core."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    secret = VaultSecret(b"pw")
    text = VaultLib([("default", secret)]).encrypt("vault_x: 7\n", secret).decode()
    _write(tmp_path, {"hosts.yml": HOSTS, "group_vars/all/vault.yml": text, "pw": "pw\n"})
    inv = inventory.load(tmp_path / "hosts.yml", vault_password_file=tmp_path / "pw")
    assert inv.hosts["s1"].vars["vault_x"] == 7


def test_a_directory_source_is_walked_once_through_a_symlink_loop(tmp_path: Path) -> None:
    from fleetctl.inventory import files

    _write(tmp_path, {"inv/fleet.yml": HOSTS})
    (tmp_path / "inv" / "loop").symlink_to("..")
    assert files._source_files(tmp_path / "inv") == [tmp_path / "inv" / "fleet.yml"]
