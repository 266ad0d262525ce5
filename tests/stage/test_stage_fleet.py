"""``fleetctl stage`` without --recipe before any host is touched: each host grouped by its own
recipe, every recipe checked first, and the result's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl import inventory, paths
from fleetctl.errors import FleetError
from fleetctl.recipes import hosts_by_recipe
from fleetctl.stage import HostStage, StageResult
from fleetctl.stage_fleet import FleetStage, plan, stage_each

EXAMPLE = paths.project_root() / "inventory" / "example" / "hosts.yml"


def test_hosts_are_grouped_by_their_own_recipe_in_inventory_order() -> None:
    inv = inventory.load(EXAMPLE)
    groups = hosts_by_recipe(inv, inv.select(None))
    assert {r: [h.name for h in hs] for r, hs in groups.items()} == {
        "qwen36-35b-heretic": ["spark-01", "spark-02", "spark-03"],
        "gemma4-26b-a4b": ["spark-04"],
    }
    only = hosts_by_recipe(inv, inv.select("spark-04"))
    assert list(only) == ["gemma4-26b-a4b"]


def test_every_recipe_is_checked_before_any_host_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example pins no commit: the first recipe refused names its hosts; nothing ran."""
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    inv = inventory.load(EXAMPLE)
    with pytest.raises(FleetError) as e:
        stage_each(inv)
    msg = e.value.message()
    assert "spark-01, spark-02, spark-03 (fleetctl_recipe qwen36-35b-heretic)" in msg
    assert "commit sha" in msg and e.value.host == "spark-01"
    assert not (tmp_path / "state" / "runs").exists(), "no playbook ran"


def test_a_host_configured_with_an_unknown_recipe_is_named(tmp_path: Path) -> None:
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    seed = paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"
    (tmp_path / "group_vars" / "all" / "recipes.yml").write_text(seed.read_text())
    (tmp_path / "hosts.yml").write_text(
        "all:\n  vars: {fleetctl_allow_unpinned_revisions: true}\n  hosts:\n"
        "    spark-01: {ansible_host: 192.0.2.1}\n"
        "    spark-02: {ansible_host: 192.0.2.2, fleetctl_recipe: qwen36-27b-m}\n")
    inv = inventory.load(tmp_path / "hosts.yml")
    with pytest.raises(FleetError) as e:
        plan(inv, inv.select(None))
    assert e.value.host == "spark-02" and "qwen36-27b-m" in e.value.message()
    assert "qwen36-27b-mm" in (e.value.fix or "")
    jobs = plan(inv, inv.select("spark-01"))
    assert list(jobs) == ["qwen36-35b-heretic"] and jobs["qwen36-35b-heretic"][0].source == "hub"


def _result(recipe: str, **hosts: str) -> StageResult:
    return StageResult(run_id="stage-x", recipe=recipe, source="mirror", elapsed=1.0,
                       artifacts_dir=Path("/tmp/x"),
                       hosts={n: HostStage(n, st, True, ()) for n, st in hosts.items()})


def test_the_result_lists_each_recipe_and_every_host() -> None:
    r = FleetStage("stage-x", {"a": _result("a", h1="ok", h2="ok"),
                               "b": _result("b", h3="failed")}, 2.0)
    assert not r.ok and r.failed_hosts == ["h3"]
    assert list(r.hosts) == ["h1", "h2", "h3"]
    assert r.recipe_of("h3") == "b" and r.recipe_of("nope") is None
    assert FleetStage("stage-x", {"a": _result("a", h1="ok")}, 1.0).ok
