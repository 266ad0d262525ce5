"""fleetctl.ssh against real OpenSSH servers: a bastion and a target behind it, a real user, real
sudo.

System ``sshd`` run on loopback from a temp dir (tests/sshd.py): the bastion on 127.0.0.1
(forwarding allowed, its log at DEBUG1 to see each forwarded connection) and the target on 127.0.0.2
(forwarding off). A third, a bastion that refuses forwarding, shows that a jumped host is
reached only through its jump. The login is a real local user ``fleetctl-test`` whose rights
(sudoers.d file, docker group) each test sets and the fixture removes. Needs root,
openssh-server and sudo (scripts/bootstrap.sh installs them).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import paramiko
import pytest
import yaml

from fleetctl import ansible, inventory, ssh
from fleetctl.errors import FleetError, HostUnreachable
from fleetctl.inventory import Host
from fleetctl.ssh import connection, pool
from tests import sshd

USER = "fleetctl-test"
PASSWORD = "pw-Zq8!not-in-logs"
SUDOERS = pathlib.Path("/etc/sudoers.d/fleetctl-test")
COMMENT = "fleetctl direct-SSH tests"
DOCKER = shutil.which("docker") or "/usr/bin/docker"

pytestmark = pytest.mark.skipif(
    not sshd.available() or not shutil.which("sudo"),
    reason="needs root, openssh-server and sudo (scripts/bootstrap.sh installs them)",
)


@dataclass
class Fleet:
    tmp: pathlib.Path
    bastion: sshd.Sshd
    target: sshd.Sshd  # two ports: two "hosts" behind the same bastion
    closed: sshd.Sshd  # a bastion that does not forward

    def inventory(
        self, *, known: str | None = None, jump: str | None = None, **host_vars: object
    ) -> Host:
        """Host ``spark-01`` read through fleetctl.inventory from a hosts.yml like a real
        fleet's."""
        (self.tmp / "known_hosts").write_text(
            known
            if known is not None
            else self.bastion.known() + self.target.known() + self.closed.known()
        )
        jump = jump or f"{USER}@127.0.0.1:{self.bastion.port}"
        v = {"ansible_host": "127.0.0.2", "ansible_port": self.target.port, **host_vars}
        inv = self.tmp / "hosts.yml"
        inv.write_text(
            yaml.safe_dump(
                {
                    "all": {
                        "vars": {
                            "ansible_user": USER,
                            "ansible_ssh_private_key_file": str(self.tmp / "id"),
                            "fleetctl_known_hosts": str(self.tmp / "known_hosts"),
                            "ansible_ssh_common_args": f"-o ProxyJump={jump} -o "
                                                       "StrictHostKeyChecking=yes",
                        },
                        "hosts": {
                            "spark-01": v,
                            "spark-02": {**v, "ansible_port": self.target.ports[1]},
                        },
                    }
                }
            )
        )
        return inventory.load(inv).host("spark-01")


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("sshd")
    # ours when absent, or left behind by a killed run of these tests (its comment says so)
    entry = subprocess.run(["getent", "passwd", USER], capture_output=True, text=True).stdout
    created = not entry or COMMENT in entry
    if not entry:
        _run("useradd", "--create-home", "--shell", "/bin/sh", "--comment", COMMENT, USER)
    servers: list[sshd.Sshd] = []
    try:
        subprocess.run(["chpasswd"], input=f"{USER}:{PASSWORD}\n", text=True, check=True)
        home = pathlib.Path(f"/home/{USER}/.ssh")
        home.mkdir(mode=0o700, exist_ok=True)
        sshd.keygen(tmp / "id")
        (home / "authorized_keys").write_text((tmp / "id.pub").read_text())
        _run("chown", "-R", f"{USER}:{USER}", str(home))
        for name, addr, forwarding, ports in (
            ("bastion", "127.0.0.1", True, 1),
            ("target", "127.0.0.2", False, 2),
            ("closed", "127.0.0.1", False, 1),
        ):
            servers.append(
                sshd.start(tmp, name, addr, forwarding=forwarding, allow_user=USER, ports=ports)
            )
        yield Fleet(tmp, *servers)
    finally:
        ssh.close_all()
        for s in servers:
            s.stop()
        SUDOERS.unlink(missing_ok=True)
        if created:
            # --force: a session process of the stopped servers may still be exiting
            _run("userdel", "--force", "--remove", USER)


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    ssh.close_all()
    SUDOERS.unlink(missing_ok=True)
    subprocess.run(["gpasswd", "-d", USER, "docker"], capture_output=True)
    yield
    ssh.close_all()
    SUDOERS.unlink(missing_ok=True)


def _sudoers(line: str) -> None:
    tmp = SUDOERS.with_name("fleetctl-test.tmp")
    tmp.write_text(line + "\n")
    tmp.chmod(0o440)
    _run("visudo", "-cf", str(tmp))
    tmp.rename(SUDOERS)


def test_proxyjump_reaches_the_target_through_the_bastion_and_shares_it(fleet: Fleet) -> None:
    host = fleet.inventory()
    r = ssh.run(host, "id -un; echo $SSH_CONNECTION", timeout=20)
    assert r.ok and r.stdout.splitlines()[0] == USER
    # the bastion's sshd forwarded this connection to the target
    assert f"target 127.0.0.2 port {fleet.target.port}" in fleet.bastion.log.read_text()
    other = inventory.load(fleet.tmp / "hosts.yml").host("spark-02")
    assert ssh.run(other, "true", timeout=20).ok
    assert (pool.POOL.size(), pool.POOL.gateways()) == (2, 1), "two hosts, one bastion connection"
    # the bastion connection drops (a bastion reboot): the hosts behind it reconnect through a new
    # one
    for g in list(pool.POOL._gateways.values()):
        g.close()
    assert ssh.run(host, "true", timeout=20).ok and ssh.run(other, "true", timeout=20).ok
    assert (pool.POOL.size(), pool.POOL.gateways()) == (2, 1)
    ssh.close_all()
    assert pool.POOL.gateways() == 0


def test_a_jump_host_that_does_not_forward_stops_the_connection(fleet: Fleet) -> None:
    host = fleet.inventory(jump=f"{USER}@127.0.0.1:{fleet.closed.port}")
    with pytest.raises(HostUnreachable) as e:
        ssh.run(host, "true", timeout=20)
    assert "cannot reach 127.0.0.2" in e.value.cause and e.value.host == "spark-01"


def test_a_proxycommand_through_the_bastion(fleet: Fleet) -> None:
    # the OpenSSH client as the ProxyCommand, as older inventories reach a bastion
    proxy = (
        f"ssh -i {fleet.tmp}/id -o UserKnownHostsFile={fleet.tmp}/known_hosts -o "
        "StrictHostKeyChecking=yes"
        f" -o BatchMode=yes -p {fleet.bastion.port} -W %h:%p {USER}@127.0.0.1"
    )
    before = fleet.bastion.log.read_text().count(f"target 127.0.0.2 port {fleet.target.port}")
    # host vars beat the group's ProxyJump: ansible_ssh_common_args of the host itself
    host = fleet.inventory(ansible_ssh_common_args=f"-o ProxyCommand='{proxy}'")
    assert host.jumps == () and host.proxy_command == proxy.replace(
        "%h:%p", f"127.0.0.2:{fleet.target.port}"
    )
    assert ssh.run(host, "id -un", timeout=20).stdout.strip() == USER
    assert (
        fleet.bastion.log.read_text().count(f"target 127.0.0.2 port {fleet.target.port}")
        == before + 1
    )
    # the target's key is still checked by fleetctl
    ssh.close_all()
    (fleet.tmp / "known_hosts").write_text(fleet.bastion.known())
    with pytest.raises(FleetError, match=f"host key of 127.0.0.2:{fleet.target.port} is not in"):
        ssh.run(host, "true", timeout=20)


def test_nested_jumps(fleet: Fleet) -> None:
    # the bastion jumps to itself, then to the target: ProxyJump a,b
    jump = f"{USER}@127.0.0.1:{fleet.bastion.port},{USER}@127.0.0.1:{fleet.bastion.port}"
    assert ssh.run(fleet.inventory(jump=jump), "true", timeout=20).ok
    chain = connection.chain(next(iter(pool.POOL._gateways.values())))
    assert len(chain) == 2 and all(connection.alive(c) for c in chain)
    ssh.close_all()  # closes both hops, not only the last
    assert not any(c.is_connected for c in chain)


def test_every_hops_host_key_is_verified_and_never_added(fleet: Fleet) -> None:
    wrong_key = sshd.keygen(fleet.tmp / "other_host_key")
    jump = f"jump host {USER}@127.0.0.1:{fleet.bastion.port}"
    cases = {
        "no bastion key": (fleet.target.known(), f"host key of {jump} is not in"),
        "changed bastion key": (
            fleet.bastion.known().replace(fleet.bastion.key, wrong_key) + fleet.target.known(),
            f"host key of {jump} does not match",
        ),
        "no target key": (
            fleet.bastion.known(),
            f"host key of 127.0.0.2:{fleet.target.port} is not in",
        ),
        "changed target key": (
            fleet.bastion.known() + fleet.target.known().replace(fleet.target.key, wrong_key),
            f"host key of 127.0.0.2:{fleet.target.port} does not match",
        ),
    }
    for case, (known, says) in cases.items():
        ssh.close_all()
        host = fleet.inventory(known=known)
        with pytest.raises(FleetError) as e:
            ssh.run(host, "true", timeout=20)
        assert says in e.value.cause, (case, e.value.cause)
        assert (fleet.tmp / "known_hosts").read_text() == known, f"{case}: known_hosts was written"
    ssh.close_all()
    # a refused connect leaves no transport running (paramiko keeps it unless closed)
    time.sleep(0.2)
    assert not [
        t for t in threading.enumerate() if isinstance(t, paramiko.Transport) and t.is_active()
    ]


def test_an_ssh_config_alias_with_its_own_proxyjump(fleet: Fleet) -> None:
    cfg = fleet.tmp / "ssh_config"
    cfg.write_text(textwrap.dedent(f"""\
        Host spark-alias
            HostName 127.0.0.2
            Port {fleet.target.port}
            User {USER}
            IdentityFile {fleet.tmp}/id
            ProxyJump bastion
        Host bastion
            HostName 127.0.0.1
            Port {fleet.bastion.port}
            User {USER}
    """))
    (fleet.tmp / "known_hosts").write_text(fleet.bastion.known() + fleet.target.known())
    inv = fleet.tmp / "alias.yml"
    inv.write_text(
        f"all:\n  hosts:\n    spark-alias:\n      fleetctl_known_hosts: {fleet.tmp}/known_hosts\n"
        f"      ansible_ssh_common_args: -F {cfg}\n"
    )
    host = inventory.load(inv).host("spark-alias")
    assert (host.address, host.user, [j.label for j in host.jumps]) == (
        "127.0.0.2", USER, [f"{USER}@127.0.0.1:{fleet.bastion.port}"])
    assert ssh.run(host, "id -un", timeout=20).stdout.strip() == USER


def test_sudo_without_password(fleet: Fleet) -> None:
    _sudoers(f"{USER} ALL=(ALL) NOPASSWD: ALL")
    host = fleet.inventory()
    assert ssh.run(host, "id -u").stdout.strip() != "0"
    assert ssh.run(host, "id -u; echo $0", become=True).stdout.split() == ["0", "sh"]
    target = fleet.tmp / "root-only" / "state.json"
    target.parent.mkdir(mode=0o700, exist_ok=True)  # root's: the login alone cannot write there
    ssh.put_text(host, str(target), '{"a": 1}\n', become=True)
    assert target.read_text() == '{"a": 1}\n' and target.stat().st_uid == 0
    acc = ssh.check_access(host)
    assert (acc.user, acc.sudo, acc.docker) == (USER, ssh.SUDO_NOPASSWD, ssh.DOCKER_SUDO)
    # a script that execs docker with a variable it exported (as the rollout's container start does)
    r = ssh.docker(
        host,
        'eval "$(cat)"; exec sh -c \'echo "$SECRET_X $(id -u)"\'',
        stdin="SECRET_X=s1\nexport SECRET_X\n",
    )
    assert r.stdout.split() == ["s1", "0"]


def test_sudo_with_the_become_password_on_stdin(fleet: Fleet) -> None:
    _sudoers(f"{USER} ALL=(ALL) ALL")
    host = fleet.inventory(ansible_become_password=PASSWORD)
    r = ssh.run(host, "id -u", become=True)
    assert (r.rc, r.stdout.strip()) == (0, "0")
    assert PASSWORD not in repr(r) and PASSWORD not in repr(host)
    # stdin after the password reaches the command whole: sudo took exactly the first line
    target = fleet.tmp / "root-only" / "pw.txt"
    target.parent.mkdir(mode=0o700, exist_ok=True)
    ssh.put_text(host, str(target), "line one\nline two\n", become=True)
    assert target.read_text() == "line one\nline two\n"
    # the password never shows on a command line on the host
    seen = ssh.run(host, "ps -eo args", become=True).stdout
    assert PASSWORD not in seen
    assert (ssh.check_access(host).sudo, ssh.check_access(host).docker) == (
        ssh.SUDO_PASSWORD,
        ssh.DOCKER_SUDO,
    )
    # docker through sudo (the user is not in the docker group), the password on stdin before the
    # script's
    r = ssh.docker(
        host, 'eval "$(cat)"; docker --version; echo "$X"', stdin="X=after-the-password\n"
    )
    assert r.stdout.startswith("Docker version") and r.stdout.split()[-1] == "after-the-password"


def test_sudo_that_needs_a_password_not_given_or_wrong_is_one_clear_error(fleet: Fleet) -> None:
    _sudoers(f"{USER} ALL=(ALL) ALL")
    with pytest.raises(FleetError) as e:
        ssh.run(fleet.inventory(), "true", become=True)
    assert e.value.host == "spark-01" and "ansible_become_password is not set" in e.value.cause
    assert "set ansible_become_password (vault) for spark-01" in (e.value.fix or "")
    ssh.close_all()
    wrong = "wrong-" + PASSWORD
    with pytest.raises(FleetError) as e:
        ssh.check_access(fleet.inventory(ansible_become_password=wrong))
    assert "sudo refused ansible_become_password" in e.value.cause
    assert wrong not in str(e.value) and PASSWORD not in str(e.value)


def test_docker_through_sudo_for_docker_only(fleet: Fleet) -> None:
    _sudoers(f"{USER} ALL=(root) NOPASSWD: {DOCKER}")
    host = fleet.inventory()
    # each docker of a script goes through `sudo -n docker`; nothing else runs as root
    r = ssh.docker(host, "docker --version >/dev/null && docker --version && id -u")
    assert (
        r.ok
        and r.stdout.splitlines()[0].startswith("Docker version")
        and r.stdout.splitlines()[1] != "0"
    )
    assert ssh.check_access(host, sudo=False).docker == ssh.DOCKER_SUDO_DOCKER
    with pytest.raises(FleetError, match="ansible_become_password is not set"):
        ssh.run(host, "true", become=True)


def test_docker_group_member_runs_docker_as_itself(fleet: Fleet) -> None:
    _run("usermod", "-aG", "docker", USER)
    host = fleet.inventory()
    acc = ssh.check_access(host, sudo=False)
    assert acc.docker == ssh.DOCKER_DIRECT and "docker" in acc.groups
    assert ssh.docker(host, ["docker", "--version"]).ok


def test_no_rights_is_one_error_naming_the_host_user_and_both_fixes(fleet: Fleet) -> None:
    with pytest.raises(FleetError) as e:
        ssh.check_access(fleet.inventory())
    msg = str(e.value)
    assert msg.startswith("spark-01: ") and f"logged in as {USER}" in msg
    assert "docker" in e.value.cause and "sudo" in e.value.cause
    assert f"usermod -aG docker {USER}" in (e.value.fix or "")
    assert "/etc/sudoers.d/fleetctl" in (e.value.fix or "") and f"NOPASSWD: {DOCKER}'" in (
        e.value.fix or ""
    )


def test_become_method_other_than_sudo_is_refused(fleet: Fleet) -> None:
    with pytest.raises(FleetError, match="sudo only"):
        ssh.run(fleet.inventory(ansible_become_method="su"), "true", become=True)


def test_a_root_login_needs_no_sudo(fleet: Fleet) -> None:
    keys = fleet.tmp / "root_authorized_keys"
    keys.write_text((fleet.tmp / "id.pub").read_text())
    server = sshd.start(
        fleet.tmp, "rootd", "127.0.0.1", forwarding=False, allow_user="root", authorized_keys=keys
    )
    try:
        (fleet.tmp / "root_known").write_text(server.known())
        host = Host(
            "lab-node",
            "127.0.0.1",
            port=server.port,
            user="root",
            key_file=str(fleet.tmp / "id"),
            known_hosts=str(fleet.tmp / "root_known"),
        )
        # the command's parent is the login's session, not a sudo
        cmd = "id -u; tr '\\0' ' ' < /proc/$PPID/cmdline"
        r = ssh.run(host, cmd, become=True)
        assert (r.rc, r.stdout.splitlines()[0], r.command) == (0, "0", cmd)
        assert "sshd" in r.stdout and "sudo" not in r.stdout
        _sudoers(f"{USER} ALL=(ALL) NOPASSWD: ALL")  # the same check sees sudo for a non-root login
        assert "sudo" in ssh.run(fleet.inventory(), cmd, become=True).stdout
        acc = ssh.check_access(host)
        assert (acc.user, acc.sudo, acc.docker) == ("root", ssh.SUDO_ROOT, ssh.DOCKER_DIRECT)
        assert ssh.docker(host, "docker --version").ok
    finally:
        ssh.close_all()
        server.stop()


def test_an_encrypted_key_file_unlocked_in_the_agent(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    enc = fleet.tmp / "id_enc"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "passphrase", "-f", str(enc)], check=True
    )
    home = pathlib.Path(f"/home/{USER}/.ssh/authorized_keys")
    home.write_text(home.read_text() + enc.with_suffix(".pub").read_text())
    sock = fleet.tmp / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        subprocess.run(
            ["ssh-add", "-q", str(enc)],
            input="passphrase\n",
            text=True,
            check=True,
            env={**os.environ, "SSH_ASKPASS_REQUIRE": "never"},
            capture_output=True,
            start_new_session=True,
        )
        # as ssh: the key file cannot be opened without its passphrase, the agent's copy logs in
        assert ssh.run(
            fleet.inventory(ansible_ssh_private_key_file=str(enc)), "true", timeout=20
        ).ok
        ssh.close_all()
        with pytest.raises(HostUnreachable, match="SSH to"):
            ssh.run(
                fleet.inventory(
                    ansible_ssh_private_key_file=str(enc),
                    ansible_ssh_extra_args="-o IdentitiesOnly=yes",
                ),
                "true",
                timeout=20,
            )
    finally:
        agent.terminate()
        agent.wait(10)


def _masters(control: pathlib.Path) -> list[str]:
    """Command lines of live ssh processes that name a socket under ``control`` (masters show
    it)."""
    out = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if ln.startswith("ssh") and str(control) in ln]


def test_a_playbook_run_keeps_one_master_per_host_and_closes_them_when_it_ends(
        fleet: Fleet, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetctl.ansible import config, runner
    from fleetctl.progress import Event

    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))
    cfg = sshd.jump_config(
        tmp_path / "ssh_config",
        "test-bastion",
        fleet.bastion,
        USER,
        fleet.tmp / "id",
        fleet.tmp / "known_hosts",
    )
    fleet.inventory(
        ansible_ssh_common_args=f"-F {cfg} -o ProxyJump=test-bastion"
    )  # writes hosts.yml
    inv = inventory.load(fleet.tmp / "hosts.yml")
    (tmp_path / "play.yml").write_text(textwrap.dedent("""\
        - hosts: all
          gather_facts: false
          tasks:
            - {name: one, ansible.builtin.raw: "true"}
            - {name: two, ansible.builtin.raw: "true"}
            - {name: three, ansible.builtin.raw: "true"}
    """))
    # this run's control directory only: other fleetctl runs (the lab's tests beside) have theirs
    made: list[pathlib.Path] = []

    def recorded() -> pathlib.Path:
        made.append(config.run_control_dir())
        return made[-1]

    monkeypatch.setattr(runner, "run_control_dir", recorded)
    seen: dict[str, set[str]] = {}

    def watch(e: Event) -> None:
        # while the run goes on: its masters' sockets, and the ssh processes serving them
        if e.phase == "task":
            for sock in made[0].iterdir():
                if sock.is_socket():
                    seen.setdefault(str(sock), set()).update(_masters(sock))

    r = ansible.run_playbook(str(tmp_path / "play.yml"), inv, progress=watch)
    assert r.ok, {h: x.message for h, x in r.hosts.items()}
    assert len(made) == 1
    assert len(seen) == 2, seen  # one master per host, shared by the three tasks
    assert all(seen.values()), seen
    # the run's directory and its masters are gone as soon as it returns
    assert not made[0].exists()
    time.sleep(0.2)
    assert not [m for s in seen for m in _masters(pathlib.Path(s))]
