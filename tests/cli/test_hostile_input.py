"""Hostile and mistaken input is refused before any host is contacted: exit 2, one message, the fix.

Every host of the inventory points at a listener on loopback that counts the connections it gets;
each case asserts that count is still 0 after the command.
"""

from __future__ import annotations

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
    """A TCP listener on 127.0.0.1 that accepts and counts connections (an SSH server would answer)."""

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
    """``fleetctl -i HOSTS ARGV...`` in this process, as the installed command runs it: exit code, stdout, stderr."""
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
])
def test_a_limit_that_would_select_the_wrong_hosts_is_refused(
        fleet: tuple[Path, Listener], run: Callable[..., tuple[int, str, str]], limit: str, says: str) -> None:
    hosts, listener = fleet
    for argv in (["rollout", "--tag", "v0.24.0", "--dry-run"], ["status"], ["stage"], ["rollback", "--yes"]):
        code, _, err = run(hosts, *argv, "--limit", limit)
        assert code == 2, (argv, limit, err)
        assert says in err and f"--limit {limit!r}" in err, err
        if "not a valid" not in says:
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


def test_json_errors_without_an_inventory(tmp_path: Path, run: Callable[..., tuple[int, str, str]]) -> None:
    code, out, _ = run(tmp_path / "missing.yml", "status", "--json")
    assert code == 2 and json.loads(out)["error"]["cause"]


@pytest.mark.parametrize("argv, says", [
    (["rollout", "--tag", "v1 ; id", "--yes"], "is not an image tag"),
    (["rollout", "--tag", "v0.24.0", "--waves", "0,200%", "--yes"], "wave size '0' is out of range"),
    (["rollout", "--tag", "v0.24.0", "--waves", "1,200%", "--yes"], "wave size '200%' is out of range"),
    (["rollout", "--tag", "v0.24.0", "--max-unavailable", "0", "--yes"], "--max-unavailable '0' is out of range"),
    (["rollout", "--tag", "v0.24.0", "--failure-budget", "x", "--yes"], "--failure-budget 'x' is not a count"),
    (["rollback", "--to", "$(id)", "--yes"], "--to '$(id)' is not an image tag"),
    (["rollback", "--max-unavailable", "-1", "--yes"], "--max-unavailable '-1' is not a count"),
])
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


def test_an_inventory_without_hosts_is_refused(tmp_path: Path, run: Callable[..., tuple[int, str, str]]) -> None:
    empty = tmp_path / "hosts.yml"
    empty.write_text("all:\n  hosts: {}\n")
    for argv in (["status"], ["stage"], ["provision"], ["rollout", "--tag", "v1", "--dry-run"]):
        code, _, err = run(empty, *argv)
        assert code == 2 and ("has no hosts" in err or "defines no fleetctl_recipes" in err), (argv, err)
