"""fleetctl.ssh against lab nodes in a real fleet's shape: a login with one kind of right, behind a
bastion.

spark-04 gets a second user (removed at the end), created by the lab's admin user with sudo and
reached through the lab's bastion as every node is; each test gives that user one kind of right
(none, sudo for docker only, sudo for everything, the docker group) and checks what the direct
path makes of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl import inventory, ssh
from fleetctl import lab as fleetlab
from fleetctl.errors import FleetError
from fleetctl.inventory import Host

pytestmark = pytest.mark.lab

ADMIN = "fleetctl-admin"
SUDOERS = "/etc/sudoers.d/fleetctl-lab-test"


@pytest.fixture
def admin(lab: fleetlab.LabStatus) -> Iterator[tuple[Host, Host]]:
    """(spark-04 as the test user, spark-04 as the lab's admin user, who has sudo), both through
    the bastion."""
    inv = inventory.load(lab.inventory)
    root = inv.host("spark-04")
    assert root.jumps, "the lab reaches its nodes through its bastion"
    pub = Path(f"{lab.ssh_key}.pub").read_text()
    ssh.run(
        root,
        f"id {ADMIN} >/dev/null 2>&1 || useradd -m -s /bin/sh {ADMIN}; usermod -p '*' {ADMIN}; "
        f"install -d -m 700 -o {ADMIN} -g {ADMIN} /home/{ADMIN}/.ssh && "
        f"cat > /home/{ADMIN}/.ssh/authorized_keys && chown {ADMIN}: "
        f"/home/{ADMIN}/.ssh/authorized_keys",
        stdin=pub,
        timeout=60,
        become=True,
    ).check("creating the admin user")
    ssh.close_all()
    try:
        yield dataclasses.replace(root, user=ADMIN), root
    finally:
        ssh.close_all()
        ssh.run(
            root,
            f"rm -f {SUDOERS} /root/fleetctl-lab-access-test; userdel -r {ADMIN} 2>/dev/null; true",
            timeout=60,
            become=True,
        ).check("removing the admin user")
        ssh.close_all()


def _grant(root: Host, sudoers: str | None = None, docker_group: bool = False) -> None:
    script = f"rm -f {SUDOERS}; gpasswd -d {ADMIN} docker >/dev/null 2>&1; "
    if sudoers:
        script += (f"printf '%s\\n' {sudoers!r} > {SUDOERS}.tmp && chmod 440 {SUDOERS}.tmp && mv "
                   f"{SUDOERS}.tmp {SUDOERS}; ")
    if docker_group:
        script += f"usermod -aG docker {ADMIN}; "
    ssh.run(root, script + "true", timeout=30, become=True).check("granting rights")
    ssh.close_all()  # the rights a login has are read once per connection and process


def test_the_admin_is_reached_through_the_bastion(
    admin: tuple[Host, Host], lab: fleetlab.LabStatus
) -> None:
    host, _ = admin
    r = ssh.run(host, 'id -un; echo "$SSH_CONNECTION"', timeout=30)
    user, conn = r.stdout.splitlines()
    bastion = lab.bastion.partition("@")[2]
    assert user == ADMIN and conn.split()[0] == bastion, "the connection came from the bastion"


def test_no_rights_is_one_error(admin: tuple[Host, Host]) -> None:
    host, root = admin
    _grant(root)
    with pytest.raises(FleetError) as e:
        ssh.check_access(host)
    assert e.value.host == "spark-04" and f"logged in as {ADMIN}" in e.value.cause
    assert f"usermod -aG docker {ADMIN}" in (e.value.fix or "")


def test_sudo_for_docker_only(admin: tuple[Host, Host]) -> None:
    host, root = admin
    _grant(root, sudoers=f"{ADMIN} ALL=(root) NOPASSWD: /usr/bin/docker")
    assert ssh.check_access(host, sudo=False).docker == ssh.DOCKER_SUDO_DOCKER
    r = ssh.docker(host, "docker info --format '{{.ServerVersion}}'; id -u", timeout=60)
    assert r.ok and r.stdout.splitlines()[1] != "0", r.stderr


def test_sudo_for_everything_writes_root_state(admin: tuple[Host, Host]) -> None:
    host, root = admin
    _grant(root, sudoers=f"{ADMIN} ALL=(ALL) NOPASSWD: ALL")
    acc = ssh.check_access(host)
    assert (acc.sudo, acc.docker) == (ssh.SUDO_NOPASSWD, ssh.DOCKER_SUDO)
    ssh.put_text(host, "/root/fleetctl-lab-access-test", '{"v": 1}\n', become=True)
    r = ssh.run(
        root,
        "stat -c %U:%a /root/fleetctl-lab-access-test; cat /root/fleetctl-lab-access-test",
        become=True,
    )
    assert r.stdout.splitlines() == ["root:644", '{"v": 1}']
    assert ssh.docker(host, ["docker", "ps", "-q"], timeout=60).ok


def test_docker_group(admin: tuple[Host, Host]) -> None:
    host, root = admin
    _grant(root, docker_group=True)
    assert ssh.check_access(host, sudo=False).docker == ssh.DOCKER_DIRECT
    assert ssh.docker(host, ["docker", "ps", "-q"], timeout=60).ok


def test_connections_the_bastion_left_unauthenticated_do_not_shut_a_nodes_route(
        lab: fleetlab.LabStatus) -> None:
    """Every connection to a node comes from the bastion's one address. OpenSSH 9.8+ (the lab's
    Debian 13 nodes) refuses an address whose connections never authenticated once they add up
    (PerSourcePenalties: "Not allowed at this time"), so the connections a paused or overloaded node
    left unauthenticated shut the whole route to it: CI's lab failed a rollout test and the
    next one with "Error reading SSH protocol banner" after a node was paused. The lab exempts
    the route's address as docs/security.md tells a real fleet behind a jump host to: 40 such
    connections from the bastion leave the node reachable."""
    root = inventory.load(lab.inventory).host("spark-04")
    dead = fleetlab.node_exec("bastion", ["bash", "-c", (
        f"for i in $(seq 40); do timeout 3 bash -c 'exec 3<>/dev/tcp/{root.address}/22 && "
        "head -c 20 <&3' || exit 1; done"
    )], timeout=120)
    assert dead.returncode == 0, dead.stderr
    ssh.close_all()
    r = ssh.run(root, "echo still reachable", timeout=30)
    assert (r.rc, r.stdout.strip()) == (0, "still reachable"), r
    log = ssh.run(root, "cat /var/log/sshd.log", timeout=30, become=True)
    assert "penalty" not in log.stdout, log.stdout[-2000:]
