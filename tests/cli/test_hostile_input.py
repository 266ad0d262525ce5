"""Hostile and mistaken input is refused before any host is contacted: exit 2, one message, the fix.

Every host of the inventory points at a listener on loopback that counts the connections it gets;
each case asserts that count is still 0 after the command.
"""

from __future__ import annotations

import itertools
import json
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from fleetctl import inventory
from fleetctl.cli.main import main
from fleetctl.errors import InventoryError

REPO = Path(__file__).resolve().parents[2]


class Listener:
    """A TCP listener on 127.0.0.1 that accepts and counts connections (an SSH server would
    answer)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Path, Listener]]:
    """A copy of the example inventory whose four hosts all point at one counting listener."""
    listener = Listener()
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "example", inv, symlinks=False)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    for h in hosts["all"]["children"]["sparks"]["hosts"].values():
        h["ansible_host"] = "127.0.0.1"
        h["ansible_port"] = listener.port
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    yield inv / "hosts.yml", listener
    listener.close()


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``fleetctl -i HOSTS ARGV...`` in this process, as the installed command runs it: exit code,
    stdout, stderr."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "1000")

    def go(hosts: Path, *argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["-i", str(hosts), *argv])
        out, err = capsys.readouterr()
        return code, out, err.replace("\n", " ")
    return go


@pytest.mark.parametrize("limit, says", [
    ("", "is empty"),
    ("  ", "is empty"),
    ("~spark-[", "not a valid pattern"),
    ("spark-0[1", "not a valid pattern"),
    ("~(", "not a valid regular expression"),
    ("canary:!canary", "selects no host"),
    ("spark-09", "matches no host or group"),
    # issue 32: an empty regex matched the whole fleet; a subscript past the group's end was an
    # AnsibleError traceback (exit 70)
    ("~", "matches every host: its regular expression '' matches an empty name"),
    ("~|", "matches every host"),
    ("~x*", "matches every host"),
    ("sparks[5]", "No hosts matched the subscripted pattern"),
])
def test_a_limit_that_would_select_the_wrong_hosts_is_refused(
    fleet: tuple[Path, Listener], run: Callable[..., tuple[int, str, str]], limit: str, says: str
) -> None:
    hosts, listener = fleet
    for argv in (
        ["rollout", "--tag", "v0.24.0", "--dry-run"],
        ["status"],
        ["stage"],
        ["rollback", "--yes"],
    ):
        code, _, err = run(hosts, *argv, "--limit", limit)
        assert code == 2, (argv, limit, err)
        assert says in err and f"--limit {limit!r}" in err, err
        if "subscripted" in says:
            assert "group 'sparks' has 4 host(s): subscripts 0 to 3" in err, err
        elif "not a valid" not in says:
            assert "spark-01" in err and "canary" in err, err  # the fix names the hosts and groups
    assert listener.accepted == 0


def test_a_limit_lists_at_most_a_dozen_names(tmp_path: Path) -> None:
    src = tmp_path / "hosts.yml"
    src.write_text(yaml.safe_dump({"all": {"hosts": {f"s{i:03d}": None for i in range(500)}}}))
    with pytest.raises(InventoryError) as e:
        inventory.load(src).select("nope")
    assert "and 488 more" in (e.value.fix or "") and len(e.value.message()) < 400


def test_json_errors_are_json_on_stdout(fleet: tuple[Path, Listener],
                                        run: Callable[..., tuple[int, str, str]]) -> None:
    hosts, listener = fleet
    code, out, _ = run(hosts, "status", "--json", "--limit", "")
    assert code == 2
    error = json.loads(out)["error"]
    assert "is empty" in error["cause"] and "spark-01" in error["fix"] and error["exit_code"] == 2
    assert listener.accepted == 0


def test_json_errors_without_an_inventory(
    tmp_path: Path, run: Callable[..., tuple[int, str, str]]
) -> None:
    code, out, _ = run(tmp_path / "missing.yml", "status", "--json")
    assert code == 2 and json.loads(out)["error"]["cause"]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["rollout", "--tag", "v1 ; id", "--yes"], "is not an image tag"),
        (
            ["rollout", "--tag", "v0.24.0", "--waves", "0,200%", "--yes"],
            "wave size '0' is out of range",
        ),
        (
            ["rollout", "--tag", "v0.24.0", "--waves", "1,200%", "--yes"],
            "wave size '200%' is out of range",
        ),
        (
            ["rollout", "--tag", "v0.24.0", "--max-unavailable", "0", "--yes"],
            "--max-unavailable '0' is out of range",
        ),
        (
            ["rollout", "--tag", "v0.24.0", "--failure-budget", "x", "--yes"],
            "--failure-budget 'x' is not a count",
        ),
        (["rollback", "--to", "$(id)", "--yes"], "--to '$(id)' is not an image tag"),
        (["rollback", "--max-unavailable", "-1", "--yes"], "--max-unavailable '-1' is not a count"),
        # The capacity floor: 0, above 100 %, every selected host or more, or beside
        # --max-unavailable.
        (
            ["rollout", "--tag", "v0.24.0", "--min-available", "0", "--yes"],
            "--min-available '0' is out of range",
        ),
        (
            ["rollout", "--tag", "v0.24.0", "--min-available", "101%", "--yes"],
            "--min-available '101%' is out of range",
        ),
        (
            ["rollout", "--tag", "v0.24.0", "--min-available", "100%", "--yes"],
            "--min-available 100% keeps every host",
        ),
        (
            ["rollout", "--tag", "v0.24.0", "--min-available", "5", "--yes"],
            "--min-available 5 keeps 5 host(s) serving, but only 4 are selected",
        ),
        (
            [
                "rollout",
                "--tag",
                "v0.24.0",
                "--min-available",
                "2",
                "--limit",
                "spark-01:spark-02",
                "--yes",
            ],
            "--min-available 2 keeps 2 host(s) serving, but only 2 are selected",
        ),
        (
            [
                "rollout",
                "--tag",
                "v0.24.0",
                "--min-available",
                "2",
                "--max-unavailable",
                "1",
                "--yes",
            ],
            "--max-unavailable 1 and --min-available 2 both given",
        ),
        (
            [
                "rollout",
                "--tag",
                "v0.24.0",
                "--min-available",
                "50%",
                "--max-unavailable",
                "1",
                "--dry-run",
            ],
            "--max-unavailable 1 and --min-available 50% both given",
        ),
        (["rollback", "--min-available", "0", "--yes"], "--min-available '0' is out of range"),
        (
            ["rollback", "--min-available", "9", "--yes"],
            "--min-available 9 keeps 9 host(s) serving, but only 4",
        ),
        (["rollback", "--min-available", "75%", "--max-unavailable", "2", "--yes"], "both given"),
    ],
)
def test_options_and_tags_are_refused_before_the_registry_and_the_hosts(
        fleet: tuple[Path, Listener], run: Callable[..., tuple[int, str, str]], tmp_path: Path,
        argv: list[str], says: str) -> None:
    hosts, listener = fleet
    code, _, err = run(hosts, *argv)
    assert code == 2 and says in err, err
    assert "resolve" not in err  # the registry was not asked (the example's is on the internet)
    assert listener.accepted == 0
    code, out, _ = run(hosts, "history", "--json")
    assert code == 0 and json.loads(out) == []  # nothing was recorded, no lock was taken


@pytest.mark.parametrize(
    "value, says",
    [
        (
            "9",
            "inventory variable fleetctl_min_available 9 keeps 9 host(s) serving, but only 4 are "
            "selected",
        ),
        ("'0%'", "inventory variable fleetctl_min_available '0%' is out of range"),
        ("lots", "inventory variable fleetctl_min_available 'lots' is not a count or a percentage"),
    ],
)
def test_a_bad_floor_in_the_inventory_is_refused_naming_the_variable(
    fleet: tuple[Path, Listener], run: Callable[..., tuple[int, str, str]], value: str, says: str
) -> None:
    hosts, listener = fleet
    (hosts.parent / "group_vars" / "all" / "capacity.yml").write_text(
        f"fleetctl_min_available: {value}\n"
    )
    for argv in (["rollout", "--tag", "v0.24.0", "--yes"], ["rollback", "--yes"]):
        code, _, err = run(hosts, *argv)
        assert code == 2 and says in err, err
    code, out, _ = run(hosts, "history", "--json")
    assert code == 0 and json.loads(out) == []
    assert listener.accepted == 0


def test_an_inventory_without_hosts_is_refused(
    tmp_path: Path, run: Callable[..., tuple[int, str, str]]
) -> None:
    empty = tmp_path / "hosts.yml"
    empty.write_text("all:\n  hosts: {}\n")
    for argv in (["status"], ["stage"], ["provision"], ["rollout", "--tag", "v1", "--dry-run"]):
        code, _, err = run(empty, *argv)
        assert code == 2 and ("has no hosts" in err or "defines no fleetctl_recipes" in err), (
            argv,
            err,
        )


@pytest.mark.parametrize("port", [99999, -5, 0])
def test_a_port_out_of_range_names_the_host_and_file(tmp_path: Path, port: int) -> None:
    src = tmp_path / "hosts.yml"
    src.write_text(yaml.safe_dump({"all": {"hosts": {"spark-07": {"ansible_port": port}}}}))
    with pytest.raises(InventoryError) as e:
        inventory.load(src)
    assert (
        e.value.host == "spark-07"
        and str(src) in e.value.cause
        and f"ansible_port {port} is not a TCP port" in e.value.cause
    )


def _bomb() -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in itertools.pairwise("abcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "where, text, says",
    [
        (
            "group_vars/all/recipes.yml",
            "fleetctl_recipes:\n  x: [1, 2\n",
            "not valid YAML at line 3, column 1",
        ),
        ("host_vars/s1.yml", "ansible_port: 22\n  bad: indent\n", "not valid YAML at line 2"),
        (
            "group_vars/all/list.yml",
            "- 1\n- 2\n",
            "variables must be a mapping (name: value), not a sequence",
        ),
        ("group_vars/sparks", "a: [1\n", "not valid YAML"),
        ("group_vars/all/bomb.yml", _bomb(), "expands to more than 250000 values"),
    ],
)
def test_a_broken_vars_file_is_one_message_with_its_file(
    tmp_path: Path, where: str, text: str, says: str
) -> None:
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    sparks:\n      hosts:\n        s1: {}\n"
    )
    f = tmp_path / where
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)
    with pytest.raises(InventoryError) as e:
        inventory.load(tmp_path / "hosts.yml")
    assert e.value.cause.startswith(f"{f}: ") and says in e.value.cause, e.value.cause


def test_a_binary_hosts_file_and_a_huge_one_are_refused(tmp_path: Path) -> None:
    binary = tmp_path / "hosts.yml"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(InventoryError, match="not UTF-8 text"):
        inventory.load(binary)
    huge = tmp_path / "group_vars" / "all.yml"
    huge.parent.mkdir()
    binary.write_text("all:\n  hosts:\n    s1: {}\n")
    huge.write_text("x: " + "a" * (inventory.MAX_FILE_BYTES + 1) + "\n")
    with pytest.raises(InventoryError, match="more than an inventory file may hold"):
        inventory.load(binary)


def test_vault_tagged_values_pass_the_check(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    s1: {}\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "s1.yml").write_text(
        "secret: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  3031\n"
    )
    inventory.files.check_var_files(tmp_path / "hosts.yml")  # a tag is kept as a tag: no error


def test_recipes_refuses_a_host_whose_recipe_does_not_exist(
    fleet: tuple[Path, Listener], run: Callable[..., tuple[int, str, str]]
) -> None:
    hosts, listener = fleet
    data = yaml.safe_load(hosts.read_text())
    data["all"]["children"]["sparks"]["hosts"]["spark-03"]["fleetctl_recipe"] = "nope"
    hosts.write_text(yaml.safe_dump(data))
    code, _, err = run(hosts, "recipes")
    assert code == 2 and "spark-03 ('nope')" in err and "use one of: qwen36-35b-heretic" in err, err
    assert listener.accepted == 0


def test_a_hanging_inventory_script_is_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "fleet.sh"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    monkeypatch.setenv("FLEETCTL_INVENTORY_TIMEOUT", "1")
    with pytest.raises(InventoryError, match="did not answer --list within 1 s"):
        inventory.load(script)  # (the script sleeps 30 s: without the bound this would wait it out)


def test_recipe_problems_name_the_group_vars_file_and_a_name_given_twice_is_refused(
    tmp_path: Path,
) -> None:
    from fleetctl.recipes import RecipeValidationError, load_recipes

    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    s1: {}\n")
    gv = tmp_path / "group_vars" / "all"
    gv.mkdir(parents=True)
    (gv / "recipes.yml").write_text("fleetctl_recipes:\n  a:\n    image: 'bad image'\n")
    with pytest.raises(RecipeValidationError) as e:
        load_recipes(inventory.load(tmp_path / "hosts.yml"))
    assert f"in the recipes of {gv / 'recipes.yml'}:" in e.value.cause
    (gv / "recipes.yml").write_text("fleetctl_recipes:\n  a: {}\n  b: {}\n  a: {}\n")
    with pytest.raises(RecipeValidationError) as e:
        load_recipes(inventory.load(tmp_path / "hosts.yml"))
    assert (
        "defined twice (lines 2 and 4)" in e.value.cause
        and str(gv / "recipes.yml") in e.value.cause
    )
