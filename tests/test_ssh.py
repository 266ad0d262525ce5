"""fleetctl.ssh: a connection whose close hangs must not hang the controller."""

from __future__ import annotations

import pathlib
import socket
import threading

import paramiko
import pytest

from fleetctl import ssh
from fleetctl.errors import FleetError, HostUnreachable
from fleetctl.inventory import Host
from fleetctl.ssh import access_probe, connection, pool, session


class _StuckClient(paramiko.SSHClient):
    """A client whose close blocks until released, as paramiko's can in Channel._unlink."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.closed = threading.Event()

    def close(self) -> None:
        self.release.wait()
        self.closed.set()


def test_a_stuck_close_is_abandoned_and_the_others_still_close() -> None:
    stuck, fine = _StuckClient(), _StuckClient()
    fine.release.set()
    connection.close_bounded([stuck, fine], timeout=0.2)
    # Returned although one close never finished; the other one did close.
    assert fine.closed.is_set()
    assert not stuck.closed.is_set()
    stuck.release.set()
    assert stuck.closed.wait(5)


class _Server(paramiko.ServerInterface):
    """An SSH server that answers `exec` with the command's text; it can go silent on channel
    opens."""

    def __init__(self, silent: threading.Event) -> None:
        self.silent = silent
        self.opened = 0

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if self.opened and self.silent.is_set():
            # A peer that no longer answers: the open request is never acknowledged in time.
            threading.Event().wait(3)
        self.opened += 1
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        def answer() -> None:
            # EOF, not close: the server acknowledges the exec request only once this method has
            # returned, and a channel closed before that fails the client's exec_command ("Channel
            # closed"); the client reads to EOF and the exit status either way.
            channel.sendall(b"ran: " + command)
            channel.send_exit_status(0)
            channel.shutdown_write()
        threading.Thread(target=answer, daemon=True).start()
        return True


class _SshServer:
    """A local SSH server (paramiko) on loopback; hosts of several users share it."""

    def __init__(self, tmp_path: pathlib.Path) -> None:
        host_key = paramiko.RSAKey.generate(2048)
        client_key = paramiko.RSAKey.generate(2048)
        client_key.write_private_key_file(str(tmp_path / "id_rsa"))
        self.tmp = tmp_path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        (tmp_path / "known_hosts").write_text(
            f"[127.0.0.1]:{self.port} {host_key.get_name()} {host_key.get_base64()}\n")
        self.silent = threading.Event()
        self.transports: list[paramiko.Transport] = []
        #: Connections to drop as an overloaded sshd does (MaxStartups): at once, or after its
        #: banner; as OpenSSH 9.8+ refuses a penalised address (PerSourcePenalties: a line that is
        #: no banner, then close); or held open without a banner (an sshd too slow to send one).
        self.drop: list[str] = []
        self.held: list[socket.socket] = []

        def serve() -> None:
            while True:
                try:
                    sock, _ = self.listener.accept()
                except OSError:
                    return
                if self.drop:
                    how = self.drop.pop(0)
                    if how == "silent":
                        self.held.append(sock)
                        continue
                    if how == "after-banner":
                        sock.sendall(b"SSH-2.0-OpenSSH_9.2p1\r\n")
                        sock.recv(4096)
                    elif how == "penalty":
                        sock.sendall(b"Not allowed at this time\r\n")
                    sock.close()
                    continue
                t = paramiko.Transport(sock)
                t.add_server_key(host_key)
                t.start_server(server=_Server(self.silent))
                self.transports.append(t)

        threading.Thread(target=serve, daemon=True).start()

    def host(self, user: str = "u") -> Host:
        return Host(
            f"node-{user}",
            "127.0.0.1",
            port=self.port,
            user=user,
            key_file=str(self.tmp / "id_rsa"),
            known_hosts=str(self.tmp / "known_hosts"),
        )

    def close(self) -> None:
        ssh.close_all()
        self.listener.close()
        for held in self.held:
            held.close()
        for t in self.transports:
            t.close()


def test_a_pooled_connection_that_stops_opening_channels_is_replaced(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = _SshServer(tmp_path)
    monkeypatch.setattr(session, "CHANNEL_OPEN_TIMEOUT", 0.5)
    host = srv.host()
    try:
        assert ssh.run(host, "first", timeout=10).stdout == "ran: first"
        srv.silent.set()  # the first connection now ignores channel opens, as a wedged peer does
        r = ssh.run(host, "second", timeout=10)
        assert (r.rc, r.stdout) == (0, "ran: second")
        assert len(srv.transports) == 2, "the command ran on a new connection"
    finally:
        srv.close()


@pytest.mark.parametrize("how", ["at-once", "after-banner", "penalty"])
def test_a_connection_an_overloaded_sshd_drops_in_its_handshake_is_tried_again(
        tmp_path: pathlib.Path, how: str) -> None:
    """An sshd over its MaxStartups (a bastion in front of a busy fleet) drops new connections
    before or during the handshake, and OpenSSH 9.8+ refuses an address for a while after it made
    connections that never authenticated (PerSourcePenalties): fleetctl tries again, a few times,
    instead of failing the host (a lab bastion under load failed a whole rollback with "No existing
    session"); when every try is dropped, the error names both causes and the fix."""
    srv = _SshServer(tmp_path)
    srv.drop = [how, how]
    try:
        r = ssh.run(srv.host(), "after two drops", timeout=10)
        assert (r.rc, r.stdout) == (0, "ran: after two drops")
        assert srv.drop == [] and len(srv.transports) == 1
        srv.drop = [how] * 5  # more than it tries: the host's error names the cause
        ssh.close_all()
        with pytest.raises(FleetError) as e:
            ssh.run(srv.host("v"), "never", timeout=10)
        assert e.value.host == "node-v" and str(srv.port) in e.value.cause, e.value.message()
        assert "handshake (3 tries)" in e.value.cause, e.value.cause
        assert "PerSourcePenalties" in e.value.cause and "MaxStartups" in e.value.cause
        assert "PerSourcePenaltyExemptList" in (e.value.fix or "")
    finally:
        srv.close()


def test_a_banner_that_times_out_is_not_tried_again(tmp_path: pathlib.Path) -> None:
    """paramiko words a banner timeout as it words a dropped connection: a timeout is not a drop,
    so it is reported once as what it is, not tried again three times."""
    srv = _SshServer(tmp_path)
    srv.drop = ["silent"] * 3
    try:
        host = srv.host()
        with pytest.raises(FleetError) as e:
            connection.connect(host, host.hop(), None, 0.5)
        assert srv.drop == ["silent", "silent"], "one try only"
        assert "PerSourcePenalties" not in e.value.cause, e.value.cause
        assert "banner" in e.value.cause, e.value.cause
    finally:
        srv.close()


def test_the_pool_keeps_at_most_max_pooled_idle_connections(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = _SshServer(tmp_path)
    monkeypatch.setattr(pool, "MAX_POOLED", 2)
    hosts = [srv.host(f"u{i}") for i in range(5)]
    try:
        for h in hosts:
            assert ssh.run(h, "x", timeout=10).stdout == "ran: x"
            assert pool.POOL.size() <= 2
        # The evicted connections are closed, not only forgotten: two stay open on the server.
        assert len(srv.transports) == 5
        # The server sees a close a moment after the client made it.
        for _ in range(100):
            if sum(1 for t in srv.transports if t.is_active()) <= 2:
                break
            threading.Event().wait(0.1)
        assert sum(1 for t in srv.transports if t.is_active()) <= 2
        # The two most recent are the ones kept: running on them again opens nothing.
        for h in hosts[-2:]:
            ssh.run(h, "again", timeout=10)
        assert len(srv.transports) == 5
    finally:
        srv.close()


def test_a_connection_in_use_is_never_evicted(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = _SshServer(tmp_path)
    monkeypatch.setattr(pool, "MAX_POOLED", 1)
    busy = srv.host("busy")
    try:
        held = pool.POOL.client(busy, 5.0)  # a command running on it (counted in use until done)
        for i in range(3):
            ssh.run(srv.host(f"u{i}"), "x", timeout=10)
        transport = held.transport
        assert transport is not None and transport.is_active()
        pool.POOL.done(busy)
        assert pool.POOL.size() <= 1
    finally:
        srv.close()

def _hosts(n: int) -> list[Host]:
    return [Host(f"h{i}", f"10.0.0.{i}") for i in range(n)]


def test_fan_out_gives_each_host_its_timeout_from_its_own_start() -> None:
    # 12 hosts through one worker take longer in all than the timeout, each one far less:
    # a deadline counted from the submit would cut the queued ones short.
    def slow(h: Host) -> str:
        threading.Event().wait(0.2)
        return h.name

    outs = ssh.fan_out(_hosts(12), slow, timeout=2.0, max_workers=1)
    assert [o.value for o in outs.values()] == [f"h{i}" for i in range(12)]
    assert all(o.ok for o in outs.values())


def test_fan_out_reports_hung_hosts_and_those_they_kept_from_starting() -> None:
    release = threading.Event()

    def fn(h: Host) -> str:
        if h.name == "h0":
            release.wait()
        return h.name

    try:
        outs = ssh.fan_out(_hosts(3), fn, timeout=0.3, max_workers=1)
    finally:
        release.set()
    assert outs["h0"].error is not None and "no answer within" in outs["h0"].error.cause
    for n in ("h1", "h2"):
        err = outs[n].error
        assert err is not None and err.cause.startswith("not started"), outs[n]
        assert isinstance(err, HostUnreachable) and err.host == n


def test_fan_out_runs_at_most_max_workers_at_once() -> None:
    mu = threading.Lock()
    running, peak = 0, 0

    def fn(h: Host) -> None:
        nonlocal running, peak
        with mu:
            running += 1
            peak = max(peak, running)
        threading.Event().wait(0.02)
        with mu:
            running -= 1

    for timeout in (30.0, None):
        peak = 0
        outs = ssh.fan_out(_hosts(40), fn, timeout=timeout, max_workers=4)
        assert all(o.ok for o in outs.values())
        assert 1 <= peak <= 4


def test_sudo_command_lines_never_carry_the_password() -> None:
    from fleetctl.access import Become, Secret

    host = Host(
        "h", "10.0.0.1", user="nvidia", become=Become(user="root", password=Secret("p@ss 'x"))
    )
    cmd, stdin = access_probe.sudo_command(host, "cat > /var/lib/fleetctl/x", "body\n",
                                           ssh.SUDO_PASSWORD)
    assert cmd == "sudo -k -S -p '' -u root -- sh -c 'cat > /var/lib/fleetctl/x'"
    assert stdin == "p@ss 'x\nbody\n"  # sudo takes the first line; the command gets the rest
    assert access_probe.sudo_command(host, "id -u", None, ssh.SUDO_NOPASSWD) == (
        "sudo -n -u root -- sh -c 'id -u'", None)
    bad = Host("h", "10.0.0.1", user="nvidia", become=Become(password=Secret("a\nb")))
    with pytest.raises(FleetError, match="line break") as e:
        access_probe.sudo_command(bad, "true", None, ssh.SUDO_PASSWORD)
    assert "a\nb" not in str(e.value)
