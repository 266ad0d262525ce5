"""``SshHostOps``' operations besides the container's, over real SSH to a local sshd
(tests/sshd.py).

The host's state file (read, compare-and-swap under flock, mode 0600), the fleet's lock taken and
released through it, and a stage's bytes: the scripts ``fleetctl.rollout.host_ssh`` runs, run by a
real OpenSSH server on loopback as root. Needs root and openssh-server (scripts/bootstrap.sh).
"""

from __future__ import annotations

import pathlib
import shutil
from collections.abc import Iterator

import pytest

from fleetctl import ssh
from fleetctl.inventory import Host
from fleetctl.rollout import host as remote
from fleetctl.state import hoststate
from tests import sshd

pytestmark = pytest.mark.skipif(not sshd.available() or not shutil.which("flock"),
                                reason="needs root, openssh-server and flock")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    tmp = tmp_path_factory.mktemp("host-ssh")
    with sshd.root_fleet(tmp, 1) as (_bastion, targets):
        state = tmp / "state" / "state.json"
        yield Host("spark-01", "127.0.0.2", port=targets[0].ports[0], user="root",
                   key_file=str(tmp / "id"), known_hosts=str(tmp / "known_hosts"),
                   vars={"fleetctl_state_file": str(state)})
        ssh.close_all()


def test_the_state_file_is_read_and_swapped_only_while_it_holds_what_was_read(host: Host) -> None:
    ops = remote.SshHostOps(host)
    path = pathlib.Path(hoststate.state_file(host))
    assert ops.read_state() == "" and not path.exists()
    assert ops.swap_state("", '{"a": 1}\n')
    assert ops.read_state() == '{"a": 1}\n' and path.stat().st_mode & 0o777 == 0o600
    assert not ops.swap_state("", "another controller's\n")  # it changed since "" was read
    assert ops.swap_state('{"a": 1}\n', "")
    assert ops.read_state() == ""


def test_the_fleets_lock_is_taken_and_released_in_the_hosts_file(host: Host) -> None:
    store = hoststate.OpsStore(remote.SshHostOps)
    locks = hoststate.HostLocks(store, [host], "ro-20260701-120000-cafe", "rollout")
    locks.claim()
    try:
        held = hoststate.read_all(store, [host])[host.name].lock
        assert held is not None and held.rollout_id == "ro-20260701-120000-cafe"
    finally:
        locks.release()
    assert hoststate.read_all(store, [host])[host.name].lock is None


def test_a_stages_bytes_are_counted_under_its_staging_directories(
        host: Host, tmp_path: pathlib.Path) -> None:
    (tmp_path / "w.staging-1" / "sub").mkdir(parents=True)
    (tmp_path / "w.staging-1" / "sub" / "f").write_bytes(b"x" * 5000)
    ops = remote.SshHostOps(host)
    got = ops.staged_bytes([str(tmp_path / "w.staging-1"), str(tmp_path / "absent")])
    assert got >= 5000
    assert ops.staged_bytes([str(tmp_path / "absent")]) == 0
