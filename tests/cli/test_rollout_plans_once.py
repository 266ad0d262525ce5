"""An interactive ``fleetctl rollout`` asks about the one plan it runs: the preflight (every host's
facts) and the registry are asked once, on a simulated fleet behind the real command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fleetctl.cli import rollout as cli_rollout
from fleetctl.cli.main import cli
from fleetctl.inventory import Inventory
from fleetctl.progress import Event, Progress
from fleetctl.rollout.api import Engine
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger

from ..rollout.sim import OK, SimFleet, SimGates, digest_of

EXAMPLE_INVENTORY = Path(__file__).resolve().parents[2] / "inventory" / "example" / "hosts.yml"
HOSTS = ["spark-01", "spark-02", "spark-03"]
A, B = "v1", "v2"


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fleet: SimFleet, answer: str,
         *args: str) -> tuple[Any, list[Event]]:
    events: list[Event] = []

    def engine(inv: Inventory, progress: Progress, take_over: bool = False) -> Engine:
        def both(e: Event) -> None:
            events.append(e)
            progress(e)

        eng = Engine(inv, both, state_dir=tmp_path / "state", secrets={}, take_over=take_over,
                     seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
        fleet.watch(eng.ledger)
        return eng

    monkeypatch.setattr(cli_rollout, "Engine", engine)
    # The question needs a terminal; CliRunner's stdin stands in for the operator.
    monkeypatch.setattr(cli_rollout, "_need_terminal", lambda ctx, yes, what: None)
    r = CliRunner().invoke(cli, ["-i", str(EXAMPLE_INVENTORY), "rollout", "--tag", B,
                                 "--limit", ",".join(HOSTS), "--soak", "1s", *args],
                           input=answer, env={"FLEETCTL_STATE_DIR": str(tmp_path / "state")})
    return r, events


def _preflights(events: list[Event]) -> int:
    return sum(1 for e in events if e.phase == "preflight" and e.host is None)


def test_yes_to_the_plan_runs_it_with_one_preflight(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    r, events = _run(monkeypatch, tmp_path, fleet, "y\n")
    assert r.exit_code == 0, r.output
    assert "Roll out 3 host(s) to v2?" in r.output
    assert _preflights(events) == 1, "plan, checks and facts once per interactive rollout"
    assert sum(1 for e in events if e.phase == "preflight" and e.host == "spark-01") == 1
    assert {fleet.serving_digest(h) for h in HOSTS} == {digest_of(B)}


def test_no_to_the_plan_changes_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    r, events = _run(monkeypatch, tmp_path, fleet, "n\n")
    assert r.exit_code != 0
    assert _preflights(events) == 1
    assert {fleet.serving_digest(h) for h in HOSTS} == {digest_of(A)}
    with fleet_ledger.open_ledger(tmp_path / "state") as led:
        assert led.history(10) == [], "a refused rollout records nothing"


def test_nothing_to_do_is_said_and_not_recorded(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    assert _run(monkeypatch, tmp_path, fleet, "y\n")[0].exit_code == 0
    r, events = _run(monkeypatch, tmp_path, fleet, "", "--json")
    assert r.exit_code == 0, r.output
    assert "nothing to do: 3 host(s) already serve" in r.output
    assert '"status": "nothing-to-do"' in r.output
    assert _preflights(events) == 1
    with fleet_ledger.open_ledger(tmp_path / "state") as led:
        assert len(led.history(10)) == 1, "only the first rollout is recorded"
