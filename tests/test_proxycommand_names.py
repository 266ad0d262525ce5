"""A ProxyCommand runs through /bin/sh: no host or user name of the inventory may reach that shell.

Issue 32, finding 4: ``ansible_host: "127.0.0.1 `id>/tmp/x`"`` with ``ProxyCommand="nc -w1 %h %p"``
ran ``id`` during ``fleetctl status``. OpenSSH 9.6+ refuses such names; so does fleetctl now, with
one message naming the host, and every ``%h``/``%r`` goes into the command shell-quoted. ``%p`` of
an ssh_config ProxyCommand is the host's ``ansible_port``, not ssh_config's 22.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import paramiko
import pytest
import yaml

from fleetctl import access, ssh
from fleetctl.access import Hop, resolve_route
from fleetctl.cli.main import main
from fleetctl.errors import InventoryError


def _inventory(tmp: Path, host_vars: dict[str, object]) -> Path:
    """hosts.yml of one host whose SSH would start (a key file and a known_hosts file exist)."""
    key = tmp / "id"
    if not key.exists():
        paramiko.RSAKey.generate(1024).write_private_key_file(str(key))
        (tmp / "known_hosts").write_text(
            f"elsewhere ssh-rsa {paramiko.RSAKey.generate(1024).get_base64()}\n")
    inv = tmp / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"sparks": {"hosts": {"spark-01": {
        "ansible_port": 2299, "ansible_ssh_private_key_file": str(key),
        "fleetctl_known_hosts": str(tmp / "known_hosts"), **host_vars}}}}}}))
    return inv


@pytest.mark.parametrize("where", ["common", "extra", "ssh_config"])
def test_a_host_name_with_shell_in_it_never_reaches_the_proxycommand_shell(
        tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "MARKER"
    proxy = "nc -w1 %h %p"
    host_vars: dict[str, object] = {"ansible_host": f"127.0.0.1 `touch {marker}`"}
    if where == "ssh_config":
        (tmp_path / "config").write_text(f"Host *\n    ProxyCommand {proxy}\n")
        host_vars["ansible_ssh_common_args"] = f"-F {tmp_path / 'config'}"
    else:
        host_vars[f"ansible_ssh_{where}_args"] = f"-o ProxyCommand='{proxy}'"
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "1000")
    try:
        code = main(["-i", str(_inventory(tmp_path, host_vars)), "status", "--timeout", "3",
                     "--json"])
    finally:
        ssh.close_all()
    out, err = capsys.readouterr()
    assert not marker.exists(), "the ProxyCommand's shell ran the command in ansible_host"
    assert code == 1
    says = ("ansible_host '127.0.0.1 `touch", "is not a valid host name: it contains ' '",
            "which OpenSSH refuses too")
    error = json.loads(out)["spark-01"]["error"]
    assert all(s in error for s in says), error
    assert err.count("is not a valid host name") == 1, err


@pytest.mark.parametrize(("host_vars", "what", "says"), [
    ({"ansible_host": "10.0.0.5;id"}, "ansible_host", "contains ';'"),
    ({"ansible_host": "$(id)"}, "ansible_host", "contains '$'"),
    ({"ansible_host": "-oProxyCommand=id"}, "ansible_host", "starts with '-'"),
    ({"ansible_host": "a\nb"}, "ansible_host", r"contains '\n'"),
    ({"ansible_host": "a,b"}, "ansible_host", "contains ','"),
    ({"ansible_host": ""}, "the inventory name", "contains '|'"),
    ({"ansible_user": "nv`id`"}, "ansible_user", "contains '`'"),
    ({"ansible_user": "nv -oX"}, "ansible_user", "has a space before a '-'"),
    ({"ansible_ssh_common_args": "-o User='a;b'"}, "User", "contains ';'"),
    ({"ansible_ssh_common_args": "-o HostName='x&y'"}, "HostName", "contains '&'"),
    ({"ansible_ssh_common_args": "-J 'b(x)'"}, "ProxyJump host", "contains '('"),
    ({"ansible_ssh_common_args": "-J 'u>x@b'"}, "ProxyJump user", "contains '>'"),
])
def test_names_openssh_refuses_are_refused_naming_the_host_and_the_fix(
        host_vars: dict[str, object], what: str, says: str) -> None:
    with pytest.raises(InventoryError) as e:
        resolve_route("spark|02", {"ansible_host": "10.0.0.5", **host_vars})
    assert e.value.host == "spark|02" and e.value.cause.startswith(f"{what} ")
    assert says in e.value.cause and e.value.fix == (
        f"set {what} to " + ("the login name" if "user" in what.lower() else
                             "the host's DNS name or address"))


def test_names_openssh_takes_are_taken() -> None:
    for name in ("spark-01", "10.0.0.5", "fd00::1", "fe80::1%enp1s0", "spark_1.lab.example", "@x"):
        assert access.check_name(name, what="ansible_host", host="h") == name
    for user in ("nvidia", "DOMAIN\\admin", "first last", "svc$"):
        assert access.check_name(user, what="ansible_user", host="h", user=True) == user


def test_substitutions_go_into_the_shell_quoted(tmp_path: Path) -> None:
    # a name check_name refuses, were it ever to get here, is still one word to the shell
    marker = tmp_path / "MARKER"
    hop = Hop(address=f"a `touch {marker}` $(touch {marker})", port=22, user=f"u;touch {marker}")
    command = access.expand_proxy_command("printf '%%s|' %h %p %r", hop)
    out = subprocess.run(["/bin/sh", "-c", "exec " + command], capture_output=True, text=True,
                         check=True).stdout
    assert not marker.exists()
    assert out == f"{hop.address}|22|{hop.user}|"
    # for valid names the quoting changes nothing: ssh -W %h:%p still reads host:port
    hop = Hop(address="fe80::1%enp1s0", port=2200, user="nvidia")
    assert access.expand_proxy_command("ssh -W %h:%p -l %r b %%", hop) == (
        "ssh -W fe80::1%enp1s0:2200 -l nvidia b %")


def test_an_ssh_config_proxycommand_gets_the_hosts_port_user_and_address(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(textwrap.dedent("""\
        Host spark-*
            User cfguser
            ProxyCommand ssh -W %h:%p -l %r bastion --tag=100%%
        Host named
            HostName 10.9.0.4
            Port 2204
            ProxyCommand nc %h %p
    """))
    common = f"-F {cfg}"
    assert resolve_route("spark-9", {"ansible_port": 2200, "ansible_ssh_common_args": common}
                         ).proxy_command == "ssh -W spark-9:2200 -l cfguser bastion --tag=100%"
    # ansible_* beat ssh_config, as ssh's command-line options do
    r = resolve_route("h", {"ansible_host": "spark-7", "ansible_user": "nvidia",
                            "ansible_ssh_common_args": common})
    assert r.proxy_command == "ssh -W spark-7:22 -l nvidia bastion --tag=100%"
    assert resolve_route("named", {"ansible_ssh_common_args": common}
                         ).proxy_command == "nc 10.9.0.4 2204"
    assert resolve_route("named", {"ansible_port": "2299", "ansible_ssh_common_args": common}
                         ).proxy_command == "nc 10.9.0.4 2299"
