"""What an SSH connection costs the controller, direct and through a jump host, in one run.

The pool (``fleetctl.ssh``) keeps at most ``MAX_POOLED`` idle connections; this measures the
costs that bound trades, for hosts reached directly and the same hosts reached through a
ProxyJump host (one shared connection to it): the controller CPU of a connect (handshake, key
exchange, auth, one ``true``), of ``true`` on a pooled connection, and what an idle pooled
connection burns (paramiko's transport thread polls its socket every 0.1 s).

Against the lab's nodes (lab up; FLEETCTL_LAB_DIR etc. set) through the lab's bastion, as its
inventory says, and the same nodes directly (the bench opens their port 22 to the controller for
the run and closes it again)::

    .venv/bin/python bench/ssh_pool.py [--idle 10] [--rounds 3] [--json bench/results/ssh_pool.json]

Without a lab, as root, against local sshd servers (a bastion on 127.0.0.1 and N "hosts", the
ports of one sshd on 127.0.0.2; tests/sshd.py)::

    .venv/bin/python bench/ssh_pool.py --local 16

Figures are this process's CPU (user + system) divided per host; medians of ``--rounds``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from _figures import write_figures  # bench/ is on sys.path when a bench runs
from fleetctl import inventory, ssh
from fleetctl.inventory import Host
from fleetctl.ssh import pool


def cpu() -> float:
    # user + system of this process, to the nanosecond (os.times counts 10 ms ticks: 2.5 ms per
    # host on 4 lab nodes)
    return time.process_time()


def measure(hosts: list[Host], rounds: int, idle: float) -> dict[str, float]:
    """Median controller CPU per host: connect + ``true``, ``true`` when pooled, idle per second."""
    connect, reuse, held = [], [], []
    for _ in range(rounds):
        ssh.close_all()
        c0 = cpu()
        outs = ssh.fan_out(
            hosts, lambda h: ssh.run(h, "true", timeout=30).rc, timeout=60, max_workers=4
        )
        connect.append((cpu() - c0) / len(hosts))
        bad = {n: str(o.error) for n, o in outs.items() if not o.ok}
        if bad:
            raise SystemExit(f"cannot reach {bad}")
        c0 = cpu()
        ssh.fan_out(hosts, lambda h: ssh.run(h, "true", timeout=30).rc, timeout=60, max_workers=4)
        reuse.append((cpu() - c0) / len(hosts))
        c0, t0 = cpu(), time.monotonic()
        time.sleep(idle)
        held.append((cpu() - c0) / (time.monotonic() - t0) / len(hosts))
    gateways = pool.POOL.gateways()
    ssh.close_all()
    return {"connect_cpu_ms": 1000 * statistics.median(connect),
            "command_on_pooled_cpu_ms": 1000 * statistics.median(reuse),
            "idle_cpu_ms_per_s": 1000 * statistics.median(held), "jump_connections": gateways}


@contextmanager
def local_hosts(n: int) -> Iterator[tuple[list[Host], Host]]:
    """``n`` hosts (ports of one local sshd) and a local bastion host, as root."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import sshd

    if not sshd.available():
        raise SystemExit("--local needs root and openssh-server (scripts/bootstrap.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="fleetctl-bench-ssh-") as d:
        tmp = Path(d)
        with sshd.root_fleet(tmp, n) as (bastion, targets):
            common: dict[str, Any] = {"user": "root", "key_file": str(tmp / "id"),
                                      "known_hosts": str(tmp / "known_hosts")}
            ports = [p for t in targets for p in t.ports]
            hosts = [Host(f"local-{i}", "127.0.0.2", port=p, **common) for i, p in enumerate(ports)]
            yield hosts, Host("bastion", "127.0.0.1", port=bastion.port, **common)


@contextmanager
def lab_hosts() -> Iterator[tuple[list[Host], Host]]:
    """The lab's nodes reached directly (port 22 opened for the run), and the lab's bastion."""
    from fleetctl import lab

    routed = inventory.load(None).select(None)
    if not routed[0].jumps:
        raise SystemExit(
            "the lab's inventory names no bastion (ProxyJump): `fleetctl lab down` and up again"
        )
    bastion = routed[0].jumps[0]
    with lab.direct_ssh():
        yield (
            [dataclasses.replace(h, jumps=()) for h in routed],
            Host(
                "bastion",
                bastion.address,
                port=bastion.port,
                user=bastion.user,
                key_file=bastion.key_files[0],
                known_hosts=bastion.known_hosts,
            ),
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle", type=float, default=10.0, help="seconds to hold the connections idle")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--local", type=int, metavar="N", help="N local sshd hosts instead of the lab (root)"
    )
    ap.add_argument("--json", default="bench/results/ssh_pool.json")
    a = ap.parse_args()
    with local_hosts(a.local) if a.local else lab_hosts() as (hosts, bastion):
        jumped = [dataclasses.replace(h, jumps=(bastion.hop(),)) for h in hosts]
        direct = measure(hosts, a.rounds, a.idle)
        via = measure(jumped, a.rounds, a.idle)
    where = (
        f"{len(hosts)} local sshd hosts"
        if a.local
        else f"{len(hosts)} lab nodes (bastion: the lab's)"
    )
    figures = {"hosts": len(hosts), "where": where, "direct": direct, "via_jump": via,
               "max_pooled": ssh.MAX_POOLED, "rounds": a.rounds, "cpu_count": os.cpu_count()}
    con = Console(width=90)
    t = Table("per host", "direct", "via jump host", title=f"SSH to {where} (median of {a.rounds})")
    t.add_row(
        "connect + `true`", f"{direct['connect_cpu_ms']:.1f} ms", f"{via['connect_cpu_ms']:.1f} ms"
    )
    t.add_row("`true` on a pooled one", f"{direct['command_on_pooled_cpu_ms']:.1f} ms",
              f"{via['command_on_pooled_cpu_ms']:.1f} ms")
    t.add_row("held idle", f"{direct['idle_cpu_ms_per_s']:.2f} ms per second",
              f"{via['idle_cpu_ms_per_s']:.2f} ms per second")
    t.add_row("connections to the jump host", "-", str(via["jump_connections"]))
    con.print(t)
    write_figures(con, a.json, figures)


if __name__ == "__main__":
    main()
