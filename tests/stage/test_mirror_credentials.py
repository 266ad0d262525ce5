"""A weights mirror written with ``user:pass@`` never shows its password (issue 32, a problem
noticed after finding 11).

Before: ``fleetctl stage`` printed ``mirror http://fleet:<password>@...`` as its first progress line
(and in ``--json``'s events), and the plain-http refusal quoted the URL whole. Now both show
``http://<redacted>@...`` (the URL scrubber the soak and the registry messages use).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetctl.cli.main import main
from tests.cli.test_hostile_input import Listener, fleet
from tests.cli.test_mirror_credentials import closed_port

__all__ = ["closed_port", "fleet"]  # fixtures: the example inventory at a listener, a closed port

PW = "Weights-Pass-5c2d9"


def _inventory(fleet: tuple[Path, Listener], fleet_vars: dict[str, object]) -> Path:
    hosts, _listener = fleet
    (hosts.parent / "group_vars" / "all" / "zz_mirror.yml").write_text(yaml.safe_dump(fleet_vars))
    return hosts


def test_a_plain_http_refusal_does_not_show_the_password(
        tmp_path: Path, fleet: tuple[Path, Listener], closed_port: int,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "1000")
    mirror = f"http://fleet:{PW}@127.0.0.1:{closed_port}/weights"
    hosts = _inventory(fleet, {"fleetctl_weights_mirror": mirror,
                               "fleetctl_allow_unpinned_revisions": True})
    code = main(["-i", str(hosts), "stage", "--source", "mirror", "--limit", "spark-01"])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert PW not in out + err
    assert "<redacted>@127.0.0.1" in err and "plain http" in err, err
    assert fleet[1].accepted == 0


@pytest.mark.parametrize("json_out", [True, False])
def test_stage_progress_shows_the_mirror_without_its_password(
        tmp_path: Path, fleet: tuple[Path, Listener], closed_port: int,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], json_out: bool) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "1000")
    mirror = f"http://fleet:{PW}@127.0.0.1:{closed_port}/weights"
    hosts = _inventory(fleet, {"fleetctl_weights_mirror": mirror,
                               "fleetctl_weights_mirror_insecure": True,
                               "fleetctl_allow_unpinned_revisions": True})
    main(["-i", str(hosts), "stage", "--source", "mirror", "--limit", "spark-01",
          *(["--json", "--events", "-"] if json_out else [])])
    out, err = capsys.readouterr()
    assert PW not in out + err
    assert f"mirror http://<redacted>@127.0.0.1:{closed_port}/weights" in out + err, (out, err)
