"""Issue 32, finding 14: every secret of the ledger URL stays out of messages and ``--json``.

``password=`` was scrubbed, ``sslpassword=`` (the passphrase of the client's TLS key) was not: a
ledger that could not be reached printed it in the error, and ``ledger --json`` named it in
``where``. No server is needed: the URL points at a socket directory where nothing listens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.cli.main import main
from fleetctl.errors import FleetError
from fleetctl.state import backends
from fleetctl.state import ledger as fleet_ledger

pytest.importorskip("psycopg")

SSL_PW = "Key-Passphrase-7f3a"
PW = "Login-Secret-19c2"


def test_redact_drops_sslpassword_and_password() -> None:
    shown = backends.redact(
        f"postgresql://u:{PW}@db.example/fleet?sslpassword={SSL_PW}&sslmode=verify-full")
    assert SSL_PW not in shown and PW not in shown
    assert "db.example" in shown and "verify-full" in shown and "user=u" in shown


def test_an_unreachable_ledger_names_neither_secret(tmp_path: Path) -> None:
    url = f"postgresql://u:{PW}@/fleet?host={tmp_path}&sslpassword={SSL_PW}"
    with pytest.raises(FleetError) as e:
        fleet_ledger.open_ledger(tmp_path, "f", url)
    msg = e.value.message()
    assert "cannot reach the ledger database" in msg
    assert SSL_PW not in msg and PW not in msg


def test_the_cli_shows_no_sslpassword_in_errors_or_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("FLEETCTL_LEDGER_URL",
                       f"postgresql://u@/fleet?host={tmp_path}&sslpassword={SSL_PW}")
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    s1:\n      ansible_host: 10.0.0.1\n"
                   "  vars:\n    fleetctl_fleet: f\n")
    for args in (["ledger", "--json"], ["ledger"], ["history", "--json"]):
        capsys.readouterr()
        code = main(["-i", str(inv), *args])
        out = "".join(capsys.readouterr())
        assert code != 0 and "ledger database" in out, (args, out)
        assert SSL_PW not in out, args
