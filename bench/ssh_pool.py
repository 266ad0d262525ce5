"""What an SSH connection costs the controller: opening one, and keeping one open while idle.

The pool (``fleetctl.ssh``) keeps at most ``MAX_POOLED`` idle connections; this measures the two
costs that bound trades: the controller CPU of a connect (handshake, key exchange, auth, one
``true``) and the CPU an idle pooled connection burns (paramiko's transport thread polls its
socket every 0.1 s). Against the lab's nodes (lab up; FLEETCTL_LAB_DIR etc. set)::

    .venv/bin/python bench/ssh_pool.py [--idle 10] [--rounds 3] [--json bench/results/ssh_pool.json]

Figures are this process's CPU (user + system) divided per connection; medians of ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fleetctl import inventory, ssh


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle", type=float, default=10.0, help="seconds to hold the connections idle")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="bench/results/ssh_pool.json")
    a = ap.parse_args()
    hosts = inventory.load(None).select(None)
    connect, idle, reuse = [], [], []
    for _ in range(a.rounds):
        ssh.close_all()
        c0 = cpu()
        outs = ssh.fan_out(hosts, lambda h: ssh.run(h, "true", timeout=30).rc, timeout=60, max_workers=4)
        connect.append((cpu() - c0) / len(hosts))
        bad = [n for n, o in outs.items() if not o.ok]
        if bad:
            raise SystemExit(f"cannot reach {bad}")
        c0 = cpu()
        ssh.fan_out(hosts, lambda h: ssh.run(h, "true", timeout=30).rc, timeout=60, max_workers=4)
        reuse.append((cpu() - c0) / len(hosts))
        c0, t0 = cpu(), time.monotonic()
        time.sleep(a.idle)
        idle.append((cpu() - c0) / (time.monotonic() - t0) / len(hosts))
    ssh.close_all()
    figures = {"hosts": len(hosts), "connect_cpu_ms": 1000 * statistics.median(connect),
               "command_on_pooled_cpu_ms": 1000 * statistics.median(reuse),
               "idle_cpu_ms_per_s": 1000 * statistics.median(idle), "max_pooled": ssh.MAX_POOLED,
               "rounds": a.rounds, "cpu_count": os.cpu_count()}
    con = Console(width=80)
    t = Table("per connection", "controller CPU", title=f"SSH to {len(hosts)} lab nodes (median of {a.rounds})")
    t.add_row("connect + `true`", f"{figures['connect_cpu_ms']:.1f} ms")
    t.add_row("`true` on a pooled one", f"{figures['command_on_pooled_cpu_ms']:.1f} ms")
    t.add_row("held idle", f"{figures['idle_cpu_ms_per_s']:.2f} ms per second")
    con.print(t)
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    con.print(f"wrote {out}")


if __name__ == "__main__":
    main()
