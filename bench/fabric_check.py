"""What the fabric check costs per unit: the probe over SSH (one round trip per member) and its
judging.

For each unit the controller runs ``fleetctl.status.probe_fabric`` on every member in parallel (the
fabric probe script over the member's SSH connection, parsed and judged by ``fleetctl.fabric``),
then the unit's parity. Measured: the wall time per unit of the whole check, on new connections
(a preflight's first contact) and on pooled ones (``fleetctl status`` right after another command),
and the controller CPU of judging one member's output (parsers + checks, on the fixtures of
tests/fixtures/fabric).

Without a lab, as root, against one local sshd with a port per member (tests/sshd.py)::

    .venv/bin/python bench/fabric_check.py --units 4 [--rounds 3] [--json
    bench/results/fabric_check.json]

Figures are medians of ``--rounds``; wall time per unit is the whole check's wall time divided by
the number of units (members of every unit are probed at once, within ssh.FAN_OUT_WORKERS).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

from _figures import write_figures  # bench/ is on sys.path when a bench runs
from fleetctl import fabric, ssh
from fleetctl.inventory import Fabric, Host, Unit
from fleetctl.status import probe_fabric

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "fabric"


@contextmanager
def local_units(n: int) -> Iterator[list[tuple[Unit, list[Host]]]]:
    """``n`` two-member units, each member a port of one local sshd (root)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import sshd

    if not sshd.available():
        raise SystemExit("needs root and openssh-server (scripts/bootstrap.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="fleetctl-bench-fabric-") as d:
        tmp = Path(d)
        sshd.keygen(tmp / "id")
        (tmp / "authorized_keys").write_text((tmp / "id.pub").read_text())
        server = sshd.start(
            tmp,
            "members",
            "127.0.0.2",
            forwarding=False,
            allow_user="root",
            ports=2 * n,
            authorized_keys=tmp / "authorized_keys",
        )
        try:
            (tmp / "known_hosts").write_text(server.known())
            units = []
            for u in range(n):
                names = [f"spark-{2 * u + 1:02d}", f"spark-{2 * u + 2:02d}"]
                hosts = [
                    Host(
                        name,
                        "127.0.0.2",
                        port=server.ports[2 * u + i],
                        user="root",
                        key_file=str(tmp / "id"),
                        known_hosts=str(tmp / "known_hosts"),
                        unit=f"pair-{u}",
                        unit_rank=i,
                    )
                    for i, name in enumerate(names)
                ]
                fab = {
                    name: Fabric(addresses=(f"127.0.{u + 10}.{i + 1}",))
                    for i, name in enumerate(names)
                }
                units.append((Unit(f"pair-{u}", tuple(names), fab), hosts))
            yield units
        finally:
            ssh.close_all()
            server.stop()


def check_all(units: list[tuple[Unit, list[Host]]]) -> float:
    """Wall seconds of the fabric check of every unit (all members at once, bounded by the
    fan-out)."""
    unit_of = {h.name: u for u, hosts in units for h in hosts}
    hosts = [h for _, hs in units for h in hs]
    t0 = time.perf_counter()
    outs = ssh.fan_out(hosts, lambda h: probe_fabric(h, unit_of[h.name], 30), timeout=60)
    seconds = time.perf_counter() - t0
    bad = {n: str(o.error) for n, o in outs.items() if not o.ok or (o.value and o.value.error)}
    if bad:
        raise SystemExit(f"the fabric probe failed: {bad}")
    return seconds


def judge_cpu(rounds: int) -> float:
    """Controller CPU (s) of parsing and judging one member's tools' output (the fixtures)."""
    unit = Unit(
        "u",
        ("a", "b"),
        {"a": Fabric(addresses=("192.168.177.11",)), "b": Fabric(addresses=("192.168.177.12",))},
    )
    texts = {
        k: (FIX / f).read_text()
        for k, f in (
            ("ibdev", "ibdev2netdev-half-down.txt"),
            ("ibstat", "ibstat-half-down.txt"),
            ("ip", "ip-addr-mtu1500.json"),
            ("route", "ip-route-get-mgmt.json"),
        )
    }
    n = 200
    out = []
    for _ in range(rounds):
        c0 = time.process_time()
        for _ in range(n):
            facts = fabric.MemberFabric(
                fabric.parse_ibdev2netdev(texts["ibdev"]),
                fabric.parse_ibstat(texts["ibstat"]),
                fabric.parse_ip_links(texts["ip"]),
                {"192.168.177.12": fabric.parse_route_get(texts["route"])},
            )
            fabric.check_member(unit, "a", facts)
        out.append((time.process_time() - c0) / n)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="bench/results/fabric_check.json")
    a = ap.parse_args()
    cold, warm = [], []
    with local_units(a.units) as units:
        for _ in range(a.rounds):
            ssh.close_all()
            cold.append(check_all(units) / a.units)
            warm.append(check_all(units) / a.units)
    figures = {
        "units": a.units,
        "members_per_unit": 2,
        "where": "one local sshd, a port per member",
        "wall_per_unit_new_connections_s": statistics.median(cold),
        "wall_per_unit_pooled_s": statistics.median(warm),
        "judge_cpu_per_member_ms": 1000 * judge_cpu(a.rounds),
        "rounds": a.rounds,
        "fan_out_workers": ssh.FAN_OUT_WORKERS,
        "cpu_count": os.cpu_count(),
    }
    con = Console(width=80)
    t = Table(
        "per unit of 2", "figure", title=f"fabric check, {a.units} units (median of {a.rounds})"
    )
    t.add_row(
        "probe + judge, new SSH", f"{figures['wall_per_unit_new_connections_s'] * 1000:.0f} ms wall"
    )
    t.add_row("probe + judge, pooled", f"{figures['wall_per_unit_pooled_s'] * 1000:.0f} ms wall")
    t.add_row("judging one member", f"{figures['judge_cpu_per_member_ms']:.2f} ms CPU")
    con.print(t)
    write_figures(con, a.json, figures)


if __name__ == "__main__":
    main()
