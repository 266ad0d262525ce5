"""rollback and abort confirm like rollout: without a terminal and without --yes they refuse,
changing nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetctl.cli.main import cli
from fleetctl.errors import FleetError

EXAMPLE_INVENTORY = Path(__file__).resolve().parents[2] / "inventory" / "example" / "hosts.yml"


@pytest.mark.parametrize("argv, what", [
    (["rollback"], "roll back"),
    (["rollback", "--to", "v0.23.0"], "roll back to v0.23.0"),
    (["rollout", "abort"], "abort the rollout"),
])
def test_refused_without_yes_when_not_a_terminal(
    argv: list[str], what: str, tmp_path: Path
) -> None:
    r = CliRunner().invoke(
        cli, ["-i", str(EXAMPLE_INVENTORY), *argv], env={"FLEETCTL_STATE_DIR": str(tmp_path)}
    )
    assert isinstance(r.exception, FleetError), r.output
    assert f"refusing to {what}" in r.exception.cause and r.exception.fix == "pass --yes"
    # Refused before the engine opened anything: no ledger was created.
    assert not list(tmp_path.iterdir())
