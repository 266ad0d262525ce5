"""Real OpenSSH servers on loopback, started from a temp dir: for the direct-SSH tests and bench.

Each is the system ``sshd`` in the foreground (``-D -e``), its log at DEBUG1 in a file (the
bastion's shows each connection it forwards), on one or more ports of a loopback address.
Starting one needs root (sshd drops privileges per connection) and openssh-server.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def available() -> bool:
    """True when this process can start sshd servers (root, openssh-server installed)."""
    return os.geteuid() == 0 and os.path.exists(SSHD)


def free_port(addr: str) -> int:
    """A TCP port free on ``addr`` now."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def keygen(path: pathlib.Path) -> str:
    """A new ed25519 key pair at ``path`` (+ ``.pub``); returns the public key's base64."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().split()[1]


@dataclass
class Sshd:
    """One running sshd."""

    name: str
    addr: str
    ports: tuple[int, ...]
    #: Its host key (ed25519, base64).
    key: str
    log: pathlib.Path
    proc: subprocess.Popen[bytes]

    @property
    def port(self) -> int:
        """Its first port."""
        return self.ports[0]

    def known(self) -> str:
        """known_hosts lines for every port."""
        return "".join(f"[{self.addr}]:{p} ssh-ed25519 {self.key}\n" for p in self.ports)

    def stop(self) -> None:
        """Stop it (and wait)."""
        self.proc.terminate()
        self.proc.wait(10)


def start(tmp: pathlib.Path, name: str, addr: str, *, forwarding: bool, allow_user: str,
          ports: int = 1, authorized_keys: pathlib.Path | None = None) -> Sshd:
    """Start sshd ``name`` on ``ports`` free ports of ``addr``, accepting keys of ``allow_user``
    only.

    ``authorized_keys`` replaces the user's ~/.ssh/authorized_keys (a root login needs no home
    to be touched); ``forwarding`` says whether it may serve as a ProxyJump host.
    """
    key = keygen(tmp / f"{name}_host_key")
    chosen = tuple(free_port(addr) for _ in range(ports))
    # a temp dir lies under /tmp, whose mode StrictModes refuses for an authorized_keys path
    keys_line = f"AuthorizedKeysFile {authorized_keys}\nStrictModes no\n" if authorized_keys else ""
    cfg = tmp / f"{name}.conf"
    cfg.write_text("".join(f"Port {p}\n" for p in chosen) + keys_line + textwrap.dedent(f"""\
        ListenAddress {addr}
        HostKey {tmp}/{name}_host_key
        PidFile none
        UsePAM no
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        PermitRootLogin prohibit-password
        AllowUsers {allow_user}
        AllowTcpForwarding {"yes" if forwarding else "no"}
        MaxStartups 200
        LogLevel DEBUG1
    """))
    pathlib.Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stderr=out)
    for _ in range(200):
        with socket.socket() as s:
            if all(s.connect_ex((addr, p)) == 0 for p in chosen[-1:]):
                break
        if proc.poll() is not None:
            raise RuntimeError(f"sshd {name} exited: {log.read_text()}")
        time.sleep(0.05)
    return Sshd(name, addr, chosen, key, log, proc)


#: sshd listens on at most 16 sockets (its MAX_LISTEN_SOCKS): bigger fleets get several servers.
MAX_PORTS = 16


@contextlib.contextmanager
def root_fleet(tmp: pathlib.Path, n: int) -> Iterator[tuple[Sshd, list[Sshd]]]:
    """A bastion on 127.0.0.1 (forwarding) and ``n`` "hosts": the ports of as many sshd servers on
    127.0.0.2 as :data:`MAX_PORTS` needs, root logging in with ``tmp/id``; ``tmp/known_hosts`` holds
    every server's keys. All of them stopped on leaving."""
    keygen(tmp / "id")
    (tmp / "authorized_keys").write_text((tmp / "id.pub").read_text())
    servers = [start(tmp, "bastion", "127.0.0.1", forwarding=True, allow_user="root",
                     authorized_keys=tmp / "authorized_keys")]
    try:
        for i in range(0, n, MAX_PORTS):
            servers.append(
                start(
                    tmp,
                    f"target{i // MAX_PORTS}",
                    "127.0.0.2",
                    forwarding=False,
                    allow_user="root",
                    ports=min(MAX_PORTS, n - i),
                    authorized_keys=tmp / "authorized_keys",
                )
            )
        (tmp / "known_hosts").write_text("".join(s.known() for s in servers))
        yield servers[0], servers[1:]
    finally:
        for s in servers:
            s.stop()


def jump_config(path: pathlib.Path, alias: str, bastion: Sshd, user: str, key: pathlib.Path,
                known_hosts: pathlib.Path) -> pathlib.Path:
    """Write an ssh_config naming ``bastion`` as ``alias``, for ``-F path -o ProxyJump=alias``:
    OpenSSH's
    jump runs a second ssh that reads only ssh_config, not the first one's ``-o`` options."""
    path.write_text(
        f"Host {alias}\n  HostName {bastion.addr}\n  Port {bastion.port}\n  User {user}\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n"
    )
    return path
