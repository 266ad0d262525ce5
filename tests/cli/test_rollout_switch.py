"""``fleetctl rollout`` on a fleet serving two models, on a simulated fleet behind the real command:
a model switch is shown in the plan and asked about apart on a terminal, refused under ``--yes``
unless ``--switch-model`` names it; a dry run shows every recipe's plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fleetctl.cli import rollout as cli_rollout
from fleetctl.cli.main import cli
from fleetctl.errors import ExitCode, FleetError
from fleetctl.inventory import Inventory
from fleetctl.progress import Progress
from fleetctl.rollout.api import Engine
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger

from ..rollout.sim import OK, SimFleet, SimGates
from ..rollout.sim_run import example_inventory

HERETIC, MM = "qwen36-35b-heretic", "qwen36-27b-mm"
INV = example_inventory({"spark-03": MM})
RECIPES = {"spark-01": HERETIC, "spark-02": HERETIC, "spark-03": MM, "spark-04": HERETIC}
A, B = "v1", "v2"


def _fleet() -> SimFleet:
    return SimFleet(dict.fromkeys(RECIPES, A), {A: OK, B: OK}, recipes=RECIPES)


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fleet: SimFleet, answer: str,
         *args: str) -> Any:
    def engine(inv: Inventory, progress: Progress, take_over: bool = False) -> Engine:
        return Engine(inv, progress, state_dir=tmp_path / "state", secrets={}, take_over=take_over,
                      seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))

    monkeypatch.setattr(cli_rollout, "Engine", engine)
    # The questions need a terminal; CliRunner's stdin stands in for the operator.
    monkeypatch.setattr(cli_rollout, "_need_terminal", lambda ctx, yes, what: None)
    return CliRunner().invoke(cli, ["-i", str(INV), "rollout", "--tag", B, "--soak", "1s", *args],
                              input=answer, env={"FLEETCTL_STATE_DIR": str(tmp_path / "state")})


def _recipes(fleet: SimFleet) -> dict[str, str | None]:
    return {n: c.labels.get("fleetctl.recipe") if (c := h.serving()) else None
            for n, h in fleet.hosts.items()}


def test_a_switch_is_asked_apart_and_no_leaves_the_host_untouched(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fleet = _fleet()
    r = _run(monkeypatch, tmp_path, fleet, "n\n", "--recipe", MM, "--limit", "spark-01")
    assert r.exit_code != 0
    assert f"spark-01: switch: {HERETIC} → {MM}" in r.output
    assert "Switch the model of 1 host(s)" in r.output and "Roll out" not in r.output
    assert _recipes(fleet) == RECIPES
    with fleet_ledger.open_ledger(tmp_path / "state") as led:
        assert led.history(5) == []

    r = _run(monkeypatch, tmp_path, fleet, "y\ny\n", "--recipe", MM, "--limit", "spark-01")
    assert r.exit_code == 0, r.output
    assert _recipes(fleet)["spark-01"] == MM


def test_under_yes_a_switch_needs_its_flag(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    fleet = _fleet()
    r = _run(monkeypatch, tmp_path, fleet, "", "--recipe", MM, "--limit", "spark-01", "--yes",
             "--json")
    # the command's FleetError (cli/main.py's entry point makes it one line and exit 2)
    err = r.exception
    assert isinstance(err, FleetError) and err.exit_code == ExitCode.INCONCLUSIVE, r.output
    assert err.host == "spark-01" and "--switch-model" in (err.fix or ""), err
    assert _recipes(fleet) == RECIPES
    r = _run(monkeypatch, tmp_path, fleet, "", "--recipe", MM, "--limit", "spark-01", "--yes",
             "--switch-model", "--json")
    assert r.exit_code == 0, r.output
    host = json.loads(r.stdout)["hosts"][0]
    assert (host["host"], host["recipe"], host["before_recipe"]) == ("spark-01", MM, HERETIC)


def test_a_dry_run_shows_each_recipes_plan(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    r = _run(monkeypatch, tmp_path, _fleet(), "", "--dry-run")
    assert r.exit_code == 0, r.output
    assert f"plan: recipe {HERETIC}" in r.output and f"plan: recipe {MM}" in r.output
