"""Benchmark: no-op re-provision and ``fleetctl status`` on 1 node vs every lab node, in the same
run.

Goals (issue 3): no-op re-provision of 8 nodes <= 1.5x one node; status on 8
nodes <= 1.3x one node. On the lab (whose nodes are reached through its bastion) the status of
every node is also measured with the nodes reached directly, for the bastion's cost. Ratios against
the 1-node baseline measured in the same
run, so the machine's speed cancels out. Uses the lab (``fleetctl lab up``;
``--nodes N`` grows it first) or, with ``-i``, a real fleet. Prints a table and writes JSON.

    FLEETCTL_LAB_DIR=... FLEETCTL_LAB_SUBNET=... .venv/bin/python bench/provision_status.py --nodes
    8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetctl import inventory as inv
from fleetctl import lab as fleetlab
from fleetctl import ssh
from fleetctl.cli.output import write_json
from fleetctl.provision import provision
from fleetctl.status import probe_fleet

GOALS = {"provision_noop": 1.5, "status": 1.3}


def _timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.monotonic()
        fn()
        out.append(time.monotonic() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 0 (a benchmark reports, it does not gate)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--nodes", type=int, default=0, help="grow the lab to this many nodes first (0: as it is)"
    )
    ap.add_argument(
        "--inventory", "-i", help="a real fleet's inventory instead of the lab (every host is used)"
    )
    ap.add_argument(
        "--repeat", type=int, default=2, help="runs of each no-op provision (median kept)"
    )
    ap.add_argument(
        "--status-repeat", type=int, default=5, help="runs of each status probe (median kept)"
    )
    ap.add_argument(
        "--out",
        default=str(Path(__file__).parent / "results" / "provision_status.json"),
        help="JSON output ('-': stdout)",
    )
    args = ap.parse_args(argv)

    if args.inventory:
        inventory = inv.load(args.inventory)
        names = list(inventory.hosts)
    else:
        if args.nodes:
            fleetlab.up(nodes=args.nodes)
        st = fleetlab.status()
        names = [n.name for n in st.nodes if n.state == "running" and not n.faults]
        if not st.up or not names:
            print(
                "the lab is not up (or has no healthy node): run `fleetctl lab up`", file=sys.stderr
            )
            return 2
        inventory = inv.load(st.inventory)
    one, every = names[0], ",".join(names)

    # Bring every node to the provisioned state (not timed), then warm SSH masters for both cases.
    first = provision(inventory, limit=every)
    if not first.ok:
        print(
            f"provisioning failed on {first.failed_hosts}: see {first.artifacts_dir}",
            file=sys.stderr,
        )
        return 2
    results: dict[str, Any] = {}

    def noop(limit: str) -> None:
        r = provision(inventory, limit=limit)
        changed = {n: h.changed for n, h in r.hosts.items() if h.changed}
        if not r.ok or changed:
            raise SystemExit(
                f"a no-op re-provision was not a no-op: failed={r.failed_hosts} changed={changed}"
            )

    prov_one = _timed(lambda: noop(one), args.repeat)
    prov_all = _timed(lambda: noop(every), args.repeat)
    hosts_one = [inventory.host(one)]
    hosts_all = [inventory.host(n) for n in names]

    def probe(hosts: list[inv.Host]) -> None:
        statuses = probe_fleet(inventory, hosts)
        down = [n for n, s in statuses.items() if not s.reachable]
        if down:
            raise SystemExit(f"status found unreachable hosts: {down}")

    # Each timed status run opens its own SSH connections, as one `fleetctl status` does.
    def cold_probe(hosts: list[inv.Host]) -> None:
        try:
            probe(hosts)
        finally:
            ssh.close_all()

    stat_one = _timed(lambda: cold_probe(hosts_one), args.status_repeat)
    stat_all = _timed(lambda: cold_probe(hosts_all), args.status_repeat)
    jumped = bool(hosts_all[0].jumps)
    if jumped and not args.inventory:
        # The same probe with the bastion out of the way (the lab opens the nodes' port 22 for it).
        direct = [dataclasses.replace(h, jumps=()) for h in hosts_all]
        with fleetlab.direct_ssh():
            stat_direct = _timed(lambda: cold_probe(direct), args.status_repeat)
        m_direct, m_via = statistics.median(stat_direct), statistics.median(stat_all)
        results["status_via_bastion"] = {
            "direct_s": round(m_direct, 3), "via_bastion_s": round(m_via, 3), "nodes": len(names),
            "ratio": round(m_via / m_direct, 3), "runs_direct": [round(x, 3) for x in stat_direct],
        }

    n = len(names)
    for key, a, b in (("provision_noop", prov_one, prov_all), ("status", stat_one, stat_all)):
        m1, mn = statistics.median(a), statistics.median(b)
        results[key] = {
            "one_node_s": round(m1, 3), "all_nodes_s": round(mn, 3), "nodes": n,
            "ratio": round(mn / m1, 3), "goal_ratio_at_8": GOALS[key],
            "per_node_s": round(mn / n, 3), "runs_one": [round(x, 3) for x in a],
            "runs_all": [round(x, 3) for x in b],
        }
    report = {
        "benchmark": "provision_status", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version()},
        "nodes": names, "first_provision_s": round(first.elapsed, 2), "results": results,
    }

    print(
        f"{'measure':<16}{'1 node':>10}{f'{n} nodes':>10}"
        f"{'ratio':>8}{'goal (8)':>10}{'per node':>10}"
    )
    for key, r in results.items():
        if key == "status_via_bastion":
            continue
        print(f"{key:<16}{r['one_node_s']:>9.2f}s{r['all_nodes_s']:>9.2f}s{r['ratio']:>8.2f}"
              f"{r['goal_ratio_at_8']:>10.2f}{r['per_node_s']:>9.2f}s")
    if "status_via_bastion" in results:
        r = results["status_via_bastion"]
        print(f"status of {r['nodes']} nodes: direct {r['direct_s']:.2f}s, through the bastion "
              f"{r['via_bastion_s']:.2f}s (x{r['ratio']:.2f})")
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    if args.out != "-":
        print(f"written to {args.out}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
