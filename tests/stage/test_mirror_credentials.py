"""A weights mirror written with ``user:pass@`` never shows its password (issue 32, a problem
noticed after finding 11).

Before: ``fleetctl stage`` printed ``mirror http://fleet:<password>@...`` as its first progress line
(and in ``--json``'s events), and the plain-http refusal quoted the URL whole. Now both show
``http://<redacted>@...`` (the URL scrubber the soak and the registry messages use).
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetctl.cli.main import main
from tests.cli.test_hostile_input import Listener

REPO = Path(__file__).resolve().parents[2]
PW = "Weights-Pass-5c2d9"


@pytest.fixture
def closed_port() -> int:
    s = socket.create_server(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


def _inventory(tmp_path: Path, listener: Listener, fleet_vars: dict[str, object]) -> Path:
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "example", inv, symlinks=False)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    for h in hosts["all"]["children"]["sparks"]["hosts"].values():
        h["ansible_host"] = "127.0.0.1"
        h["ansible_port"] = listener.port
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (inv / "group_vars" / "all" / "zz_mirror.yml").write_text(yaml.safe_dump(fleet_vars))
    return inv / "hosts.yml"


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()


def test_a_plain_http_refusal_does_not_show_the_password(
        tmp_path: Path, listener: Listener, closed_port: int, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "1000")
    mirror = f"http://fleet:{PW}@127.0.0.1:{closed_port}/weights"
    hosts = _inventory(tmp_path, listener, {"fleetctl_weights_mirror": mirror,
                                            "fleetctl_allow_unpinned_revisions": True})
    code = main(["-i", str(hosts), "stage", "--source", "mirror", "--limit", "spark-01"])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert PW not in out + err
    assert "<redacted>@127.0.0.1" in err and "plain http" in err, err
    assert listener.accepted == 0


@pytest.mark.parametrize("json_out", [True, False])
def test_stage_progress_shows_the_mirror_without_its_password(
        tmp_path: Path, listener: Listener, closed_port: int, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], json_out: bool) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "1000")
    mirror = f"http://fleet:{PW}@127.0.0.1:{closed_port}/weights"
    hosts = _inventory(tmp_path, listener, {"fleetctl_weights_mirror": mirror,
                                            "fleetctl_weights_mirror_insecure": True,
                                            "fleetctl_allow_unpinned_revisions": True})
    main(["-i", str(hosts), "stage", "--source", "mirror", "--limit", "spark-01",
          *(["--json", "--events", "-"] if json_out else [])])
    out, err = capsys.readouterr()
    assert PW not in out + err
    assert f"mirror http://<redacted>@127.0.0.1:{closed_port}/weights" in out + err, (out, err)
