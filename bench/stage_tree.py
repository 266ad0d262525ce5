"""Staging's tree fan-out on the lab: N nodes against 2, and the tree against one seed serving all.

In one run, with the same weight set (one body of ``--mb`` MB on the lab's mirror) and every node's
uplink shaped to ``--uplink-mbit`` (tc tbf on its eth0 egress: the lab's nodes share one machine, so
without it no host's uplink is ever the bottleneck a real fleet's seed is), ``fleetctl stage`` to:

- ``tree, 2 nodes``: the seed and one receiver;
- ``tree, N nodes``: the default tree (every host that verified serves ``weights_tree_fanout`` = 2
the next round);
- ``one seed, N nodes``: ``weights_tree_fanout`` = N - 1, i.e. the seed serves every receiver in
one round
  (the fan-out before the tree, which served 8 receivers at a time).

Ratios (same run, median of ``--repeats``): tree N / tree 2 (goal <= 2x), tree N / one seed N. Each
host's upload count comes from the run's result (the lab test reads the same from the hosts' sshd
logs).

    FLEETCTL_LAB_DIR=... .venv/bin/python bench/stage_tree.py [--mb 128] [--uplink-mbit 200]
    [--repeats 1]

Needs a lab that is up with at least 4 nodes (`fleetctl lab up --nodes 8`). Prints a table and
writes bench/results/stage_tree.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controller"))
from _figures import write_figures
from fleetctl import lab as fleetlab
from fleetctl import ssh
from fleetctl.stage import stage
from stage_throughput import PATH, bench_set


def _shape(nodes: list[str], mbit: int | None) -> None:
    """Every node's uplink (eth0 egress) at ``mbit`` Mbit/s, or unshaped with None."""
    for n in nodes:
        fleetlab.node_exec(n, ["tc", "qdisc", "del", "dev", "eth0", "root"])
        if mbit:
            r = fleetlab.node_exec(
                n,
                [
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    "eth0",
                    "root",
                    "tbf",
                    "rate",
                    f"{mbit}mbit",
                    "burst",
                    "256kb",
                    "latency",
                    "50ms",
                ],
            )
            if r.returncode != 0:
                raise SystemExit(f"{n}: tc failed: {r.stderr.strip()}")


def running_nodes(at_least: int = 4) -> list[str]:
    """The lab's running nodes; exits (2) with the fix when the lab is down or has fewer than
    ``at_least``."""
    st = fleetlab.status()
    nodes = [n.name for n in st.nodes if n.state == "running"]
    if not st.up or len(nodes) < at_least:
        print(
            f"needs a lab with at least {at_least} running nodes: `fleetctl lab up --nodes 8`",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return nodes


def _clean(nodes: list[str]) -> None:
    for n in nodes:
        fleetlab.node_exec(n, ["rm", "-rf", str(Path(PATH).parent)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=128, help="size of the body in MB")
    ap.add_argument(
        "--uplink-mbit", type=int, default=200, help="each node's uplink in Mbit/s (0: unshaped)"
    )
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "stage_tree.json"))
    args = ap.parse_args()
    con = Console(width=80)
    nodes = running_nodes()
    inv, size, tmp = bench_set(fleetlab.status(), args.mb)
    cases = [("tree, 2 nodes", nodes[:2], {}),
             (f"tree, {len(nodes)} nodes", nodes, {}),
             (f"one seed, {len(nodes)} nodes", nodes, {"weights_tree_fanout": len(nodes) - 1})]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in cases}
    try:
        _shape(nodes, args.uplink_mbit or None)
        for _ in range(args.repeats):
            for name, hosts, extra in cases:
                _clean(nodes)
                t0 = time.monotonic()
                r = stage(inv, "bench", limit=",".join(hosts), extravars=extra)
                wall = time.monotonic() - t0
                if not r.ok:
                    raise SystemExit(
                        f"{name}: "
                        + "; ".join(f"{h.name}: {h.message}" for h in r.hosts.values() if not h.ok)
                    )
                ups = r.uploads()
                runs[name].append(
                    {
                        "wall_s": round(wall, 1),
                        "rounds": r.rounds,
                        "seed_uploads": ups.get(r.seed or "", 0),
                        "max_uploads": max(ups.values(), default=0),
                        "sources": len(ups),
                    }
                )
    finally:
        _shape(nodes, None)
        _clean(nodes)
        ssh.close_all()
        shutil.rmtree(tmp, ignore_errors=True)

    med = {name: statistics.median(x["wall_s"] for x in rs) for name, rs in runs.items()}
    tree_n, tree_2, seed_n = (med[c[0]] for c in (cases[1], cases[0], cases[2]))
    table = Table(title=f"stage {size / 1e6:.0f} MB, uplink {args.uplink_mbit or '-'} Mbit/s, "
                        f"median of {args.repeats}")
    for col in ("case", "wall s", "rounds", "seed up", "sources"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for name, rs in runs.items():
        last = rs[-1]
        table.add_row(
            name,
            f"{med[name]:.1f}",
            str(last["rounds"]),
            str(last["seed_uploads"]),
            str(last["sources"]),
        )
    con.print(table)
    figures = {
        "size_bytes": size,
        "uplink_mbit": args.uplink_mbit,
        "nodes": len(nodes),
        "repeats": args.repeats,
        "runs": runs,
        "median_wall_s": med,
        "tree_n_over_tree_2": round(tree_n / tree_2, 2),
        "tree_n_over_one_seed_n": round(tree_n / seed_n, 2),
    }
    con.print(f"tree {len(nodes)} / tree 2 = {figures['tree_n_over_tree_2']}x (goal <= 2x); "
              f"tree / one seed at {len(nodes)} = {figures['tree_n_over_one_seed_n']}x")
    write_figures(con, args.out, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
