"""fleetctl.access: the inventory's ssh options, ssh_config and become read as Ansible's ssh
would."""

from __future__ import annotations

import pathlib
import pickle
import subprocess
import sys
import textwrap

import pytest

from fleetctl import access, inventory, ssh
from fleetctl.access import Hop, parse_jump, parse_ssh_args, resolve_route
from fleetctl.errors import FleetError, InventoryError


def test_ssh_options_fleetctl_honours() -> None:
    a = parse_ssh_args(
        "-o ProxyJump=admin@bastion:2222 -o UserKnownHostsFile=/k/known -o "
        "StrictHostKeyChecking=yes"
        " -oUser=nvidia -p 2200 -i ~/.ssh/a -o 'IdentityFile /b' -F /cfg -o ForwardAgent=no -C -q",
        host="h",
    )
    assert (a.proxy_jump, a.known_hosts, a.user, a.port, a.config_file) == (
        "admin@bastion:2222", "/k/known", "nvidia", 2200, "/cfg")
    assert a.key_files == ("~/.ssh/a", "/b") and a.identities_only is None
    assert (
        parse_ssh_args("-o IdentitiesOnly=yes -o IdentitiesOnly=no", host="h").identities_only
        is True
    )
    # ssh keeps the first value of an option; -J is ProxyJump
    assert parse_ssh_args("-J a,b -o ProxyJump=c -l u -o User=v", host="h").proxy_jump == "a,b"
    assert parse_ssh_args("-Jjump", host="h").proxy_jump == "jump"


@pytest.mark.parametrize(("args", "says"), [
    ("-o StrictHostKeyChecking=no", "would accept an unknown host key"),
    ("-o StrictHostKeyChecking=accept-new", "would accept an unknown host key"),
    ("-L 8000:localhost:8000", "cannot honour the ssh option '-L'"),
    ("-o HostKeyAlias=x", "cannot honour the ssh option hostkeyalias"),
    ("-o UserKnownHostsFile='/a /b'", "names 2 files"),
    ("-o Port=ssh", "is not a number"),
    ("-J", "needs a value"),
    ("-o 'unterminated", "not a valid shell word list"),
    ("bastion", "unexpected word"),
])
def test_ssh_options_it_cannot_honour_are_refused_with_one_message(args: str, says: str) -> None:
    with pytest.raises(InventoryError) as e:
        parse_ssh_args(args, host="spark-04")
    assert says in e.value.cause and e.value.host == "spark-04" and e.value.fix


def test_proxycommand_or_proxyjump_whichever_comes_first(tmp_path: pathlib.Path) -> None:
    r = resolve_route(
        "h",
        {
            "ansible_host": "10.0.0.5",
            "ansible_user": "nvidia",
            "ansible_port": 2200,
            "ansible_ssh_common_args": "-o ProxyCommand='ssh -W %h:%p -q admin@bastion' -J other",
        },
    )
    assert (r.jumps, r.proxy_command) == ((), "ssh -W 10.0.0.5:2200 -q admin@bastion")
    assert access.expand_proxy_command("x %h %p %r %%h", r.target) == "x 10.0.0.5 2200 nvidia %h"
    r = resolve_route("h", {"ansible_ssh_common_args": "-J other -o ProxyCommand='ssh -W %h:%p b'"})
    assert ([j.address for j in r.jumps], r.proxy_command) == (["other"], None)
    # from ssh_config too; a jump host reached by a ProxyCommand is refused
    cfg = tmp_path / "config"
    cfg.write_text("Host spark-*\n    ProxyCommand nc -X connect -x proxy:3128 %h %p\n"
                   "Host jump\n    ProxyCommand ssh -W %h:%p far\n")
    assert resolve_route("spark-9", {"ansible_ssh_common_args": f"-F {cfg}"}).proxy_command == (
        "nc -X connect -x proxy:3128 spark-9 22")
    with pytest.raises(InventoryError, match="jump host jump by a ProxyCommand"):
        resolve_route("h", {"ansible_ssh_common_args": f"-F {cfg} -J jump"})


def test_jump_specs() -> None:
    assert parse_jump("admin@bastion:2222", host="h") == ("admin", "bastion", 2222)
    assert parse_jump("ssh://bastion", host="h") == (None, "bastion", None)
    assert parse_jump("u@[fd00::1]:22", host="h") == ("u", "fd00::1", 22)
    assert parse_jump("fd00::1", host="h") == (None, "fd00::1", None)
    with pytest.raises(InventoryError, match="not a number"):
        parse_jump("b:x", host="h")


def test_precedence_is_ansible_vars_then_options_then_ssh_config(tmp_path: pathlib.Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(textwrap.dedent(f"""\
        Host spark-04
            HostName 10.9.0.4
            User cfguser
            Port 2204
            IdentityFile {tmp_path}/cfgkey
            ProxyJump jump
        Host jump
            HostName 192.0.2.1
            User jumper
            ProxyJump outer
            UserKnownHostsFile {tmp_path}/jump_known
        Host outer
            HostName 192.0.2.9
            Port 2022
    """))
    r = resolve_route(
        "spark-04", {"ansible_ssh_common_args": f"-F {cfg} -o UserKnownHostsFile={tmp_path}/known"}
    )
    assert r.target == Hop(
        "10.9.0.4", 2204, "cfguser", (f"{tmp_path}/cfgkey",), f"{tmp_path}/known"
    )
    # the first jump's own ProxyJump (ssh_config) goes in front of it; hops without their own
    # IdentityFile/UserKnownHostsFile use the target's
    assert [h.label for h in r.jumps] == [
        f"{access.local_user()}@192.0.2.9:2022",
        "jumper@192.0.2.1:22",
    ]
    assert (
        r.jumps[0].known_hosts == f"{tmp_path}/known"
        and r.jumps[1].known_hosts == f"{tmp_path}/jump_known"
    )
    assert r.jumps[0].key_files == (f"{tmp_path}/cfgkey",)
    # ansible_* beat the options, the options beat ssh_config, and -J replaces the configured jump
    r = resolve_route(
        "spark-04",
        {
            "ansible_ssh_common_args": f"-F {cfg} -l optuser -p 2300 -J admin@b2:2",
            "ansible_user": "nvidia",
            "ansible_port": 22,
            "ansible_ssh_private_key_file": "/k/id",
        },
    )
    assert (r.target.user, r.target.port, r.target.key_files) == (
        "nvidia",
        22,
        ("/k/id", f"{tmp_path}/cfgkey"),
    )
    assert [h.label for h in r.jumps] == ["admin@b2:2"]
    r = resolve_route(
        "spark-04", {"ansible_ssh_common_args": f"-F {cfg} -l optuser -o ProxyJump=none"}
    )
    assert (r.target.user, r.jumps) == ("optuser", ())


def test_the_older_names_of_connection_variables() -> None:
    r = resolve_route(
        "h",
        {
            "ansible_ssh_host": "10.0.0.9",
            "ansible_ssh_port": "2222",
            "ansible_ssh_user": "admin",
            "ansible_private_key_file": "/k/id",
        },
    )
    assert r.target == Hop("10.0.0.9", 2222, "admin", ("/k/id",), None)
    r = resolve_route(
        "h",
        {
            "ansible_host": "a",
            "ansible_ssh_host": "b",
            "ansible_user": "u",
            "ansible_ssh_user": "v",
        },
    )
    assert (r.target.address, r.target.user) == ("a", "u")


def test_ssh_config_that_weakens_host_key_checking_is_refused(tmp_path: pathlib.Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host *\n    StrictHostKeyChecking no\n")
    with pytest.raises(InventoryError, match="would accept an unknown host key"):
        resolve_route("h", {"ansible_ssh_extra_args": f"-F {cfg}"})
    with pytest.raises(InventoryError, match="does not exist"):
        resolve_route("h", {"ansible_ssh_common_args": f"-F {tmp_path}/none"})


def test_a_proxyjump_loop_in_ssh_config_ends(tmp_path: pathlib.Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host a\n    ProxyJump b\nHost b\n    ProxyJump a\n")
    with pytest.raises(InventoryError, match="loop"):
        resolve_route("h", {"ansible_ssh_common_args": f"-F {cfg} -J a"})


def test_secret_never_shows() -> None:
    s = access.Secret("hunter2")
    b = access.Become(True, password=s)
    for text in (repr(s), str(s), f"{s}", f"{s!r:>20}", repr(b), str(FleetError(f"x {s}"))):
        assert "hunter2" not in text
    assert s.reveal() == "hunter2"
    with pytest.raises(TypeError):
        pickle.dumps(b)
    with pytest.raises(FleetError, match="no vault"):
        access.Secret(None, FleetError("no vault")).reveal()


def test_only_sudo_can_become() -> None:
    access.Become(method="sudo").check_method("h")
    with pytest.raises(FleetError, match=r"'su'.*sudo only"):
        access.Become(method="su").check_method("spark-04")


def _vault_encrypt(tmp_path: pathlib.Path, value: str) -> str:
    pw = tmp_path / "vault-pass"
    pw.write_text("correct horse\n")
    out = subprocess.run(
        [
            str(pathlib.Path(sys.executable).with_name("ansible-vault")),
            "encrypt_string",
            "--vault-password-file",
            str(pw),
            value,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split("\n", 1)[1]  # the indented ciphertext block after "!vault |"


def _reveal_error(h: inventory.Host) -> FleetError:
    """The error revealing the host's become password raises (the test fails if it does not)."""
    assert h.become.password is not None
    with pytest.raises(FleetError) as e:
        h.become.password.reveal()
    return e.value


def test_a_vaulted_become_password_is_decrypted_and_never_shown(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    block = textwrap.indent(_vault_encrypt(tmp_path, "s3cret-pw"), "    ")
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  vars:\n    ansible_user: nvidia\n    ansible_become: yes\n"
                   "    ansible_become_password: !vault |\n" + block +
                   "  hosts:\n    spark-04:\n      ansible_host: 10.0.0.4\n")
    h = inventory.load(inv).host("spark-04")
    assert h.become.enabled and h.become.user == "root"
    err = _reveal_error(h)
    assert err.host == "spark-04" and "no vault password" in err.cause
    assert "ANSIBLE_VAULT_PASSWORD_FILE" in (err.fix or "")

    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(tmp_path / "vault-pass"))
    loaded = inventory.load(inv)
    h = loaded.host("spark-04")
    assert h.become.password is not None and h.become.password.reveal() == "s3cret-pw"
    assert all("s3cret" not in repr(x) for x in (h, loaded, loaded.vars, h.vars))
    assert not any(k.startswith("ansible_become_pass") for k in {**h.vars, **loaded.vars})

    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    assert (
        "cannot be decrypted"
        in _reveal_error(inventory.load(inv, vault_password_file=wrong).host("spark-04")).cause
    )


def test_a_become_password_naming_a_vaulted_variable_is_rendered(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    block = textwrap.indent(_vault_encrypt(tmp_path, "s3cret-pw"), "  ")
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  vars:\n    ansible_become_password: '{{ vault_become_password }}'\n"
                   "    vault_become_password: !vault |\n" + block + "  hosts:\n    h1:\n")
    loaded = inventory.load(inv, vault_password_file=tmp_path / "vault-pass")
    pw = loaded.host("h1").become.password
    assert pw is not None and pw.reveal() == "s3cret-pw"
    # the variable it names stays out of the vars too
    assert (
        "vault_become_password" not in loaded.host("h1").vars
        and "vault_become_password" not in loaded.vars
    )
    assert "no vault password" in _reveal_error(inventory.load(inv).host("h1")).cause


def test_connection_variables_that_are_templates_are_rendered(tmp_path: pathlib.Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(textwrap.dedent("""\
        all:
          vars:
            bastion: bastion.example
            admin: nvidia
            ansible_user: "{{ admin }}"
            ansible_host: "{{ inventory_hostname }}.lan"
            ansible_ssh_common_args: -o ProxyJump={{ admin }}@{{ bastion }}:2222
          hosts:
            spark-01:
            spark-02: {ansible_ssh_common_args: "-J {{ nowhere }}"}
    """))
    loaded = inventory.load(inv)
    h = loaded.host("spark-01")
    assert (h.address, h.user, [j.label for j in h.jumps]) == (
        "spark-01.lan",
        "nvidia",
        ["nvidia@bastion.example:2222"],
    )
    bad = loaded.host("spark-02")
    assert bad.route_error is not None and "nowhere" in bad.route_error.cause
    with pytest.raises(InventoryError, match="cannot be rendered"):
        ssh.run(bad, "true")


def test_inventory_host_carries_the_route(tmp_path: pathlib.Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        textwrap.dedent("""\
        all:
          vars:
            ansible_user: nvidia
            ansible_ssh_common_args: -o ProxyJump=admin@bastion.example:2222 -o StrictHostKeyChecking=yes
            ansible_become_method: sudo
          hosts:
            spark-01: {ansible_host: 10.0.0.1}
    """)  # noqa: E501 (data: lines as the program reads them)
    )
    h = inventory.load(inv).host("spark-01")
    assert (h.address, h.user, h.port) == ("10.0.0.1", "nvidia", 22)
    assert [j.label for j in h.jumps] == ["admin@bastion.example:2222"]
    inv.write_text(inv.read_text().replace("StrictHostKeyChecking=yes", "StrictHostKeyChecking=no"))
    # the inventory still loads (playbooks run through ssh itself); the direct path refuses the host
    h = inventory.load(inv).host("spark-01")
    assert (h.address, h.user) == ("10.0.0.1", "nvidia")
    with pytest.raises(InventoryError) as e:
        ssh.run(h, "true")
    assert (
        e.value.host == "spark-01"
        and str(inv) in e.value.cause
        and "unknown host key" in e.value.cause
    )


def test_cli_vault_password_file_reaches_the_inventory_and_ansible(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import click

    from fleetctl.cli import main as cli_main

    # set then deleted: the variable the CLI sets is restored (to absent) after the test
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", "placeholder")
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE")
    block = textwrap.indent(_vault_encrypt(tmp_path, "s3cret-pw"), "    ")
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  vars:\n    ansible_become_password: !vault |\n" + block + "  hosts:\n    h1:\n"
    )
    seen: list[str] = []

    @click.command("probe-become")
    @click.pass_obj
    def probe(obj: cli_main.Ctx) -> None:
        pw = inventory.load(obj.inventory).host("h1").become.password
        assert pw is not None
        seen.append(pw.reveal())

    monkeypatch.setitem(cli_main.cli.commands, "probe-become", probe)
    assert cli_main.main(["-i", str(inv), "--vault-password-file", str(tmp_path / "vault-pass"),
                          "probe-become"]) == 0
    assert seen == ["s3cret-pw"]
    assert (
        cli_main.main(
            ["-i", str(inv), "--vault-password-file", str(tmp_path / "none"), "probe-become"]
        )
        == 3
    )
