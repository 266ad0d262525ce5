"""fleetctl.ssh: a connection whose close hangs must not hang the controller."""

from __future__ import annotations

import pathlib
import socket
import threading

import paramiko
import pytest

from fleetctl import ssh
from fleetctl.inventory import Host


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
    ssh._close_bounded([stuck, fine], timeout=0.2)
    # Returned although one close never finished; the other one did close.
    assert fine.closed.is_set()
    assert not stuck.closed.is_set()
    stuck.release.set()
    assert stuck.closed.wait(5)


class _Server(paramiko.ServerInterface):
    """An SSH server that answers `exec` with the command's text; it can go silent on channel opens."""

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
            channel.sendall(b"ran: " + command)
            channel.send_exit_status(0)
            channel.close()
        threading.Thread(target=answer, daemon=True).start()
        return True


def test_a_pooled_connection_that_stops_opening_channels_is_replaced(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host_key = paramiko.RSAKey.generate(2048)
    client_key = paramiko.RSAKey.generate(2048)
    client_key.write_private_key_file(str(tmp_path / "id_rsa"))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    silent = threading.Event()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            t = paramiko.Transport(sock)
            t.add_server_key(host_key)
            t.start_server(server=_Server(silent))
            transports.append(t)

    threading.Thread(target=serve, daemon=True).start()
    monkeypatch.setattr(ssh, "CHANNEL_OPEN_TIMEOUT", 0.5)
    host = Host("node", "127.0.0.1", port=port, user="u", key_file=str(tmp_path / "id_rsa"),
                known_hosts=str(tmp_path / "known_hosts"))
    try:
        assert ssh.run(host, "first", timeout=10).stdout == "ran: first"
        silent.set()  # the first connection now ignores channel opens, as a wedged peer does
        r = ssh.run(host, "second", timeout=10)
        assert (r.rc, r.stdout) == (0, "ran: second")
        assert len(transports) == 2, "the command ran on a new connection"
    finally:
        ssh.close_all()
        listener.close()
        for t in transports:
            t.close()
