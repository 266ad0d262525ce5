"""Issue 32, finding 3: a command's output over fleetctl's own SSH is capped (4 MiB per stream).

Before: ``chan_out.read()`` took whatever the host sent (1.5 GB took ``status`` to 3.15 GB). The
host here is a paramiko SSH server on loopback, in this process, that answers every command with
far more than the cap and exits 0; the client runs in a child whose peak RSS (MB) and seconds are
the figures.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paramiko
import pytest

from tests import sshd
from tests.childpeak import run_child

#: What the hostile host sends on the stream under test.
FLOOD = 192 << 20
#: The child's peak while refusing it: interpreter, fleetctl, paramiko and 4 MiB (~80-100 MB).
RSS_LIMIT_MB = 160
#: Seconds from connecting to the error (the whole flood takes ~30-60 s to cross loopback).
WITHIN_S = 20


class _Host(paramiko.ServerInterface):
    """Any key logs in; every command gets ``FLOOD`` bytes on ``stream``, or a line of output."""

    def __init__(self, stream: str) -> None:
        self.stream = stream

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        threading.Thread(target=self._answer, args=(channel, command), daemon=True).start()
        return True

    def _answer(self, channel: paramiko.Channel, command: bytes) -> None:
        # paramiko answers the exec request once this method's caller returns: an answer (and the
        # channel's close) before that reads, to the client, as a refused request
        time.sleep(0.2)
        try:
            if command == b"echo ok":
                channel.sendall(b"ok\n")
            elif command == b"hang":
                channel.sendall(b"started\n")
                time.sleep(30)  # then nothing more: the client's idle timeout ends it first
            elif command == b"mixed":
                # lines split across packets, a CRLF, invalid UTF-8, no newline at the end
                for part in (b"one\ntw", b"o\r\n\xff", b"\nthree"):
                    channel.sendall(part)
                    channel.sendall_stderr(b"warn " + part[:2] + b"\n")
                channel.send_exit_status(3)
                channel.close()
                return
            else:
                block = (b"x" * 1023 + b"\n") * 64  # lines, so the line reader meets them too
                send = channel.sendall if self.stream != "stderr" else channel.sendall_stderr
                for _ in range(FLOOD // len(block)):
                    send(block)
            channel.send_exit_status(0)
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the client closed the channel (or the connection): what the fix does


@contextmanager
def _host(tmp_path: Path, stream: str) -> Iterator[Path]:
    """A loopback SSH host flooding ``stream``; yields an inventory reaching it."""
    sshd.keygen(tmp_path / "host_key")
    sshd.keygen(tmp_path / "client_key")
    host_key = paramiko.Ed25519Key.from_private_key_file(str(tmp_path / "host_key"))
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    (tmp_path / "known_hosts").write_text(
        f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    flood-01:\n      ansible_host: 127.0.0.1\n"
        f"      ansible_port: {port}\n      ansible_user: fleet\n"
        f"      ansible_ssh_private_key_file: {tmp_path / 'client_key'}\n"
        f"      fleetctl_known_hosts: {tmp_path / 'known_hosts'}\n")
    transports: list[paramiko.Transport] = []
    stop = threading.Event()

    def serve() -> None:
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except TimeoutError:
                continue
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            t.start_server(server=_Host(stream))
            transports.append(t)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield tmp_path / "hosts.yml"
    finally:
        stop.set()
        thread.join(5)
        for t in transports:
            t.close()
        lsock.close()


CHILD = """
    import sys, time
    from fleetctl import inventory, ssh
    from fleetctl.errors import FleetError
    host = inventory.load(sys.argv[1]).host("flood-01")
    print("before:", ssh.run(host, "echo ok", timeout=30).stdout.strip())
    lines = []
    t0 = time.monotonic()
    try:
        r = ssh.run(host, "cat /dev/zero", timeout=120,
                    on_line=lines.append if sys.argv[2] == "lines" else None)
        print("no error: %d bytes" % (len(r.stdout) + len(r.stderr)))
    except FleetError as e:
        print("ERROR", e.message())
    print("SECONDS %.1f" % (time.monotonic() - t0))
    print("after:", ssh.run(host, "echo ok", timeout=30).stdout.strip())
    ssh.close_all()
"""


@pytest.mark.parametrize("stream, reader", [("stdout", "all"), ("stdout", "lines"),
                                            ("stderr", "all")])
def test_a_host_flooding_a_command_output_is_cut_off(
    tmp_path: Path, stream: str, reader: str
) -> None:
    with _host(tmp_path, stream) as hosts:
        r = run_child(CHILD, str(hosts), reader, timeout=300)
    out = " ".join(r.stdout.split())
    assert "before: ok" in out, (out, r.stderr[-2000:])
    assert "SECONDS" in out, (out, r.stderr[-2000:])
    seconds = float(out.split("SECONDS ")[1].split()[0])
    assert 0 < r.peak_mb < RSS_LIMIT_MB and seconds < WITHIN_S, (r.peak_mb, seconds, out)
    assert (f"ERROR flood-01: `cat /dev/zero` sent more than 4 MiB on {stream}; fleetctl stopped "
            "reading and closed the connection (fix: run the command on the host by hand") in out, \
        (out, r.stderr[-2000:])
    assert "after: ok" in out  # the host's next command gets a fresh connection


def test_output_within_the_cap_is_whole_and_its_lines_are_handed_on(tmp_path: Path) -> None:
    """Both streams read together still give each stream whole, and ``on_line`` each line."""
    from fleetctl import inventory, ssh

    lines: list[str] = []
    with _host(tmp_path, "stdout") as hosts:
        host = inventory.load(hosts).host("flood-01")
        try:
            r = ssh.run(host, "mixed", timeout=30, on_line=lines.append)
        finally:
            ssh.close_all()
    assert r.rc == 3 and r.stdout == "one\ntwo\r\n\ufffd\nthree", r
    assert r.stderr == "warn on\nwarn o\r\nwarn \nt\n", r
    assert lines == ["one", "two", "\ufffd", "three"]


def test_a_command_that_goes_quiet_still_times_out(tmp_path: Path) -> None:
    from fleetctl import inventory, ssh
    from fleetctl.errors import HostUnreachable

    with _host(tmp_path, "stdout") as hosts:
        host = inventory.load(hosts).host("flood-01")
        try:
            with pytest.raises(HostUnreachable, match="`hang` did not finish within 2s"):
                ssh.run(host, "hang", timeout=2)
        finally:
            ssh.close_all()
