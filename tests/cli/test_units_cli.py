"""`fleetctl recipes` and `fleetctl status --json` on an inventory with a unit (a copy of the
example, in tmp)."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetctl.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fleet(tmp_path: Path) -> Callable[..., Path]:
    """The example inventory with spark-03 and spark-04 as unit pair-a serving a two-node recipe."""

    def make(recipe_nodes: int = 2, members: tuple[str, ...] = ("spark-03", "spark-04"),
             edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
        inv = tmp_path / f"inv{len(list(tmp_path.iterdir()))}"
        shutil.copytree(REPO / "inventory" / "example", inv)
        hosts = yaml.safe_load((inv / "hosts.yml").read_text())
        port = closed_port()
        sparks = hosts["all"]["children"]["sparks"]["hosts"]
        for i, (name, h) in enumerate(sparks.items()):
            h["ansible_host"], h["ansible_port"] = "127.0.0.1", port
            h.pop("fleetctl_recipe", None)
            if name in members:
                h["fleetctl_fabric"] = {"addresses": [f"192.168.177.{11 + i}"]}
        hosts["all"]["children"]["unit_pair_a"] = {"hosts": {m: None for m in members}}
        # in group_vars/, not the hosts file's vars: Ansible ranks group_vars/all above those
        (inv / "group_vars" / "unit_pair_a.yml").write_text(
            "fleetctl_unit: pair-a\nfleetctl_recipe: glm-pair\n"
        )
        if edit:
            edit(hosts)
        (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
        rf = inv / "group_vars" / "all" / "recipes.yml"
        recipes = yaml.safe_load(rf.read_text())
        pair = dict(recipes["fleetctl_recipes"]["qwen35-35b-bf16"], served_model_names=["glm-pair"])
        pair["topology"] = {"nodes": recipe_nodes, "launch": "native"}
        recipes["fleetctl_recipes"]["glm-pair"] = pair
        rf.write_text(yaml.safe_dump(recipes))
        return inv / "hosts.yml"
    return make


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "80")

    def go(hosts: Path, *argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["-i", str(hosts), *argv])
        out, err = capsys.readouterr()
        return code, out, " ".join(err.split())
    return go


def test_recipes_lists_the_unit_and_its_topology(fleet: Callable[..., Path],
                                                 run: Callable[..., tuple[int, str, str]]) -> None:
    hosts = fleet()
    code, out, err = run(hosts, "recipes", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["recipes"]["glm-pair"]["topology"]["nodes"] == 2
    assert doc["recipes"]["qwen35-35b-bf16"]["topology"]["nodes"] == 1
    unit = doc["units"]["pair-a"]
    assert (
        unit["members"] == ["spark-03", "spark-04"]
        and unit["head"] == "spark-03"
        and unit["recipe"] == "glm-pair"
    )
    assert unit["fabric"]["spark-04"]["addresses"] == ["192.168.177.14"]
    assert unit["fabric"]["spark-04"]["hcas"] == ["rocep1s0f1", "roceP2p1s0f1"]
    launch = {m["host"]: m for m in unit["launch"]}
    assert [m["host"] for m in unit["launch"]] == [
        "spark-04",
        "spark-03",
    ]  # native: the worker first
    assert (
        launch["spark-04"]["argv"][-1] == "--headless"
        and launch["spark-04"]["env"]["VLLM_HOST_IP"] == "192.168.177.14"
    )
    assert (
        launch["spark-03"]["env"]["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        and launch["spark-03"]["role"] == "head"
    )
    code, out, _ = run(hosts, "recipes")
    assert code == 0 and "unit pair-a: spark-03, spark-04 (head spark-03), recipe glm-pair" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_a_recipe_of_another_size_than_its_unit_is_refused(
    fleet: Callable[..., Path], run: Callable[..., tuple[int, str, str]]
) -> None:
    code, _out, err = run(fleet(recipe_nodes=4), "recipes")
    assert code == 2
    assert (
        "spark-03: recipe 'glm-pair' spans 4 node(s) but unit 'pair-a' has 2 members (spark-03, "
        "spark-04)"
        in err
    )
    assert "topology: {nodes: 2}" in err


def test_a_unit_recipe_on_a_single_host_is_refused(
    fleet: Callable[..., Path], run: Callable[..., tuple[int, str, str]]
) -> None:
    def single(hosts: dict[str, Any]) -> None:
        hosts["all"]["children"]["sparks"]["hosts"]["spark-01"]["fleetctl_recipe"] = "glm-pair"
    code, _, err = run(fleet(edit=single), "recipes", "--json")
    assert code == 2
    assert "spark-01: recipe 'glm-pair' spans 2 nodes but the host is in no unit" in err


def test_members_with_different_recipes_are_refused(
    fleet: Callable[..., Path], run: Callable[..., tuple[int, str, str]]
) -> None:
    def split(hosts: dict[str, Any]) -> None:
        hosts["all"]["children"]["sparks"]["hosts"]["spark-04"]["fleetctl_recipe"] = (
            "gemma4-26b-a4b"
        )

    code, _, err = run(fleet(edit=split), "recipes")
    assert (
        code == 2
        and "members of unit 'pair-a' serve different recipes" in err
        and "spark-04" in err
    )


def test_a_host_in_two_units_is_refused_by_every_command(
    fleet: Callable[..., Path], run: Callable[..., tuple[int, str, str]]
) -> None:
    def two(hosts: dict[str, Any]) -> None:
        hosts["all"]["children"]["unit_pair_b"] = {"hosts": {"spark-04": None, "spark-02": None},
                                                   "vars": {"fleetctl_unit": "pair-b"}}
        hosts["all"]["children"]["sparks"]["hosts"]["spark-02"]["fleetctl_fabric"] = {
            "addresses": ["192.168.177.9"]
        }

    hosts = fleet(edit=two)
    for argv in (["recipes"], ["status"]):
        code, out, _err = run(hosts, *argv, "--json")
        assert code == 2
        error = json.loads(out)["error"]
        assert error["host"] == "spark-04" and "two units" in error["cause"], error


def test_status_json_carries_each_hosts_unit(fleet: Callable[..., Path],
                                             run: Callable[..., tuple[int, str, str]]) -> None:
    code, out, _ = run(fleet(), "status", "--json", "--timeout", "3")
    assert code == 1  # every host is unreachable (a closed port): reported, not raised
    doc = json.loads(out)
    assert {n: (s["unit"], s["unit_rank"]) for n, s in doc.items()} == {
        "spark-01": (None, None),
        "spark-02": (None, None),
        "spark-03": ("pair-a", 0),
        "spark-04": ("pair-a", 1),
    }
    assert all(not s["reachable"] for s in doc.values())
    code, out, _ = run(fleet(), "status", "--timeout", "3")
    assert "unit pair-a: spark-03 (head), spark-04" in out


def test_a_pair_recipe_on_single_hosts_is_refused_before_any_change(
        fleet: Callable[..., Path], run: Callable[..., tuple[int, str, str]]) -> None:
    """Refused before a lock, a registry call or a host is touched (every host here is a closed
    port and
    there is no registry: anything further would fail otherwise)."""
    hosts = fleet()
    code, out, _ = run(
        hosts,
        "rollout",
        "--tag",
        "v0.24.0",
        "--limit",
        "spark-01,spark-02",
        "--recipe",
        "glm-pair",
        "--yes",
        "--json",
    )
    assert code == 2
    error = json.loads(out)["error"]
    assert "recipe 'glm-pair' refused before any change: it spans 2 nodes" in error["cause"], error
    assert "the selected hosts spark-01, spark-02 are in no unit" in error["cause"], error
    code, out, _ = run(hosts, "history", "--json")
    assert code == 0 and json.loads(out) == []  # nothing was recorded: no rollout began


def test_a_hand_run_soak_and_its_baselines_take_a_unit_as_one(
    fleet: Callable[..., Path], tmp_path: Path, run: Callable[..., tuple[int, str, str]]
) -> None:
    """`fleetctl soak` on a unit's member soaks the unit once, through its head, against the unit's
    own baseline (the key the rollout's gate keeps it under); `soak baseline` shows and resets the
    unit's."""
    from fleetctl import inventory as inv_mod
    from fleetctl import paths
    from fleetctl.cli import soak as soak_cli
    from fleetctl.soak import baselines
    from tests.soak.test_baselines import sweep

    hosts = fleet()
    inv = inv_mod.load(hosts)
    assert [h.name for h in soak_cli.unit_heads(inv, inv.select("spark-04,spark-01"))] == [
        "spark-01",
        "spark-03",
    ]
    assert [h.name for h in soak_cli.unit_heads(inv, inv.select("spark-04,spark-03"))] == [
        "spark-03"
    ]
    assert soak_cli.baseline_keys(inv, "spark-04,spark-02,spark-03") == ["spark-02", "unit:pair-a"]
    with baselines.open_for(inv, paths.state_dir(inv.path)) as store:
        baselines.save(
            store, baselines.unit_key("pair-a"), "v1", sweep("r1", 120.0, host="spark-03")
        )
        baselines.save(store, "spark-03", "v1", sweep("r2", 60.0, host="spark-03"))
    code, out, err = run(hosts, "soak", "baseline", "show", "--limit", "spark-04", "--json")
    assert code == 0, err
    assert [(w["host"], w["tag"], w["runs"]) for w in json.loads(out)] == [
        ("unit:pair-a", "v1", ["r1"])
    ]
    code, out, err = run(
        hosts, "soak", "baseline", "reset", "--limit", "spark-03", "--tag", "v1", "--json"
    )
    assert code == 0 and json.loads(out) == {"unit:pair-a": True}, err
    with baselines.open_for(inv, paths.state_dir(inv.path)) as store:
        assert baselines.windows(store, "spark-03") and not baselines.windows(store, "unit:pair-a")
