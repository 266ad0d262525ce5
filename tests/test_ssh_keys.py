"""No key to log in with is one clear message, not a traceback (issue 32, a problem noticed after
the third round), against a real OpenSSH server on loopback (tests/sshd.py).

Before: a host with no key file (no ``ansible_ssh_private_key_file``, no -i/IdentityFile) made
Fabric raise ``TypeError: 'NoneType' object is not iterable`` (fleetctl passed
``key_filename=None``), an internal error; a key file that does not exist was reported as
"cannot reach ... over SSH (No such file or directory)", fix "check that the host is up". Now:
each is the host's error naming the login, the cause and the fix; a key that exists still logs in.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import pytest
import yaml

from fleetctl import inventory, ssh
from fleetctl.cli.main import main
from fleetctl.errors import FleetError
from tests import sshd

pytestmark = pytest.mark.skipif(not sshd.available(),
                                reason="needs root and openssh-server (scripts/bootstrap.sh)")


@pytest.fixture
def server(tmp_path: pathlib.Path) -> Iterator[sshd.Sshd]:
    sshd.keygen(tmp_path / "id")
    (tmp_path / "authorized_keys").write_text((tmp_path / "id.pub").read_text())
    s = sshd.start(tmp_path, "target", "127.0.0.1", forwarding=False, allow_user="root",
                   authorized_keys=tmp_path / "authorized_keys")
    (tmp_path / "known_hosts").write_text(s.known())
    yield s
    s.stop()


Status = tuple[int, dict[str, object], str]


def _status(tmp_path: pathlib.Path, server: sshd.Sshd, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str], **host_vars: object) -> Status:
    # An empty home (no ~/.ssh keys, no ~/.ssh/config) and no agent: only the inventory's key.
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "1000")
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"spark-01": {
        "ansible_host": "127.0.0.1", "ansible_port": server.port, "ansible_user": "root",
        "fleetctl_known_hosts": str(tmp_path / "known_hosts"), **host_vars}}}}))
    code = main(["-i", str(inv), "status", "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def _error(result: dict[str, object]) -> str:
    text = json.dumps(result)
    assert "spark-01" in text
    return text


def _fix(tmp_path: pathlib.Path) -> str:
    """The fix of the error ``ssh.run`` raises for the inventory's host (status shows causes)."""
    with pytest.raises(FleetError) as e:
        ssh.run(inventory.load(tmp_path / "hosts.yml").host("spark-01"), "true", timeout=10)
    assert e.value.host == "spark-01"
    return e.value.fix or ""


def test_no_key_at_all_is_one_clear_error(
        tmp_path: pathlib.Path, server: sshd.Sshd, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, result, err = _status(tmp_path, server, monkeypatch, capsys)
    text = _error(result)
    assert "internal error" not in err + text and "TypeError" not in err + text, (err, text)
    assert "no SSH key to log in as root@127.0.0.1" in text, text
    assert code != 70, (code, err)
    assert "set ansible_ssh_private_key_file" in _fix(tmp_path)


def test_a_missing_key_file_is_named(
        tmp_path: pathlib.Path, server: sshd.Sshd, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-key"
    code, result, err = _status(tmp_path, server, monkeypatch, capsys,
                                ansible_ssh_private_key_file=str(missing))
    text = _error(result)
    assert f"SSH key file {missing} (ansible_ssh_private_key_file) does not exist" in text, text
    assert code != 70, (code, err)
    assert "set ansible_ssh_private_key_file" in _fix(tmp_path)


def test_a_key_that_exists_still_logs_in(
        tmp_path: pathlib.Path, server: sshd.Sshd, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _code, result, _err = _status(tmp_path, server, monkeypatch, capsys,
                                  ansible_ssh_private_key_file=str(tmp_path / "id"))
    text = json.dumps(result)
    assert "no SSH key" not in text and "does not exist" not in text, text
    assert '"reachable": true' in text, text
