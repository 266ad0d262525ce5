"""Issue 32, finding 11: a registry mirror written with ``user:pass@`` is refused, its password
unshown.

Before: ``fleetctl_registry_mirrors: {ghcr.io: http://user:pass@host}`` was used as it was: the
password was printed on stderr ("cannot reach registry http://user:pass@...") and in ``rollout
--dry-run --json`` (and would have reached each host's pull reference). Now: exit 2 before the
registry or any host.
"""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetctl import registry
from fleetctl.cli.main import main
from fleetctl.errors import FleetError
from tests.cli.test_hostile_input import Listener

REPO = Path(__file__).resolve().parents[2]
PW = "Mirror-Pass-83b1e"


@pytest.fixture
def closed_port() -> int:
    s = socket.create_server(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def fleet(tmp_path: Path, closed_port: int) -> Iterator[tuple[Path, Listener]]:
    """The example inventory, hosts at a counting listener, ghcr.io mirrored at a URL with a
    password."""
    listener = Listener()
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "example", inv, symlinks=False)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    for h in hosts["all"]["children"]["sparks"]["hosts"].values():
        h["ansible_host"] = "127.0.0.1"
        h["ansible_port"] = listener.port
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    fleet_yml = inv / "group_vars" / "all" / "fleet.yml"
    fleet_yml.write_text(fleet_yml.read_text().replace(
        "fleetctl_registry_mirrors: {}",
        f"fleetctl_registry_mirrors: {{ghcr.io: 'http://fleet:{PW}@127.0.0.1:{closed_port}'}}"))
    yield inv / "hosts.yml", listener
    listener.close()


@pytest.mark.parametrize("json_out", [True, False])
def test_a_mirror_with_a_password_is_refused_without_showing_it(
        fleet: tuple[Path, Listener], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], json_out: bool) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "1000")
    hosts, listener = fleet
    code = main(["-i", str(hosts), "rollout", "--tag", "v0.24.0", "--dry-run",
                 *(["--json"] if json_out else [])])
    out, err = capsys.readouterr()
    assert PW not in out and PW not in err
    assert code == 2, (out, err)
    text = json.loads(out)["error"]["cause"] if json_out else err.replace("\n", " ")
    assert "fleetctl_registry_mirrors" in text and "user name or password" in text, text
    assert "<redacted>@127.0.0.1" in text
    assert listener.accepted == 0


def test_endpoint_and_pull_ref_refuse_userinfo() -> None:
    for mirror in (f"https://u:{PW}@mirror.lan", f"u:{PW}@mirror.lan:5000",
                   f"http://{PW}@mirror.lan"):
        with pytest.raises(FleetError) as e:
            registry.endpoint("ghcr.io", {"ghcr.io": mirror})
        assert PW not in e.value.message() and "mirror.lan" in e.value.message()
        with pytest.raises(FleetError):
            registry.pull_ref("ghcr.io/a/b", "sha256:" + "0" * 64, {"ghcr.io": mirror})
    ok = registry.endpoint("ghcr.io", {"ghcr.io": "https://mirror.lan"})
    assert ok.base == "https://mirror.lan"
