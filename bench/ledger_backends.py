"""Benchmark of the ledger's bookkeeping on SQLite vs PostgreSQL: what one host transition costs
the controller.

Run (Debian's postgresql and fleetctl[postgres] installed: scripts/bootstrap.sh)::

    .venv/bin/python bench/ledger_backends.py [--hosts 16,256] [--repeat 5] [--json
    bench/results/ledger_backends.json]

The PostgreSQL server is a local one started for the run (``fleetctl.lab.pgserver``:
unix socket, fsync on as in production), so the figures are the ledger's own cost with no network
round trip; a team's server across a LAN adds its round-trip time to every
statement (a write transaction is BEGIN, the per-fleet writer lock and lock check,
one round trip per statement, COMMIT). SQLite runs as fleetctl runs it
(WAL, ``synchronous=FULL``: every commit is an fsync) in a temporary directory on the
same disk as the server's data (both under /tmp).

For each fleet size N and backend, ``--repeat`` times on a fresh fleet:
the bookkeeping of one rollout of N hosts as the engine does it (acquire the
lock, create, and per host: read its record, 7 phase transitions, a
known-good upsert; wave and status updates; release), and apart, per
operation, the median of ``host_phase`` (one host transition), ``get`` (the
full record of an N-host rollout) and ``acquire``+``release``. Medians over
the repeats; the PostgreSQL / SQLite ratio is within this run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from _figures import write_figures  # bench/ is on sys.path when a bench runs
from fleetctl.lab import pgserver
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

D = "sha256:" + "d" * 64
PHASES = ("inspected", "pulling", "stopping", "starting", "ready", "soak")


def _rollout(led: fleet_ledger.Ledger, n: int, rid: str) -> dict[str, float]:
    """One rollout's bookkeeping for n hosts; seconds per part."""
    hosts = [f"spark-{i:03d}" for i in range(n)]
    t0 = time.perf_counter()
    led.acquire(rid)
    led.create(
        rid,
        kind="rollout",
        recipe="qwen",
        requested="v0.24.0",
        tag="t",
        digest=D,
        image="img",
        options={},
        command="fleetctl rollout",
        waves=[hosts],
        hosts=[
            {
                "host": h,
                "wave": 0,
                "step": 0,
                "before_tag": "old",
                "before_digest": "sha256:old",
                "target_tag": "t",
                "target_digest": D,
            }
            for h in hosts
        ],
    )
    led.set_wave(rid, 0, fleet_records.RUNNING)
    t1 = time.perf_counter()
    for h in hosts:
        led.host_record(rid, h)
        for ph in PHASES:
            led.host_phase(rid, h, ph, status=fleet_records.IN_PROGRESS)
        led.host_phase(
            rid,
            h,
            "done",
            status=fleet_records.DONE,
            after_tag="t",
            after_digest=D,
            verdict={"outcome": "pass"},
        )
        led.add_known_good(
            h,
            tag="t",
            digest=D,
            fingerprint="f",
            settings={"image": "img"},
            source="gate",
            rollout_id=rid,
        )
    t2 = time.perf_counter()
    led.set_wave(rid, 0, fleet_records.DONE)
    led.set_status(rid, fleet_records.COMPLETED)
    led.release(rid)
    t3 = time.perf_counter()
    return {"rollout_s": t3 - t0, "per_host_ms": (t2 - t1) / n * 1000}


def _median_ms(fn: Callable[[], object], k: int) -> float:
    times = []
    for _ in range(k):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def measure(
    open_ledger: Callable[[str], fleet_ledger.Ledger], n: int, repeat: int
) -> dict[str, float]:
    """Medians over ``repeat`` fresh fleets of size n."""
    runs: list[dict[str, float]] = []
    for _ in range(repeat):
        with open_ledger(f"bench-{uuid.uuid4().hex[:8]}") as led:
            r = _rollout(led, n, "ro-bench")
            r["host_phase_ms"] = _median_ms(
                lambda: led.host_phase("ro-bench", "spark-000", "soak", detail="x"), 50
            )
            r["get_ms"] = _median_ms(lambda: led.get("ro-bench"), 20)
            r["lock_ms"] = _median_ms(lambda: (led.acquire("ro-x"), led.release("ro-x")), 20)
            runs.append(r)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="16,256", help="fleet sizes, comma-separated")
    ap.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="fresh fleets per size and backend (medians over them)",
    )
    ap.add_argument(
        "--json", default="bench/results/ledger_backends.json", help="where to write the figures"
    )
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.hosts.split(",")]
    con = Console(width=100)
    figures: dict[str, Any] = {"cpu_count": os.cpu_count(), "repeat": a.repeat, "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp, pgserver.running(fsync=True) as server:
        backends: dict[str, Callable[[str], fleet_ledger.Ledger]] = {
            "sqlite": lambda fleet: fleet_ledger.open_ledger(Path(tmp) / fleet, fleet),
            "postgresql": lambda fleet: fleet_ledger.open_ledger(Path(tmp), fleet, server.url()),
        }
        for n in sizes:
            figures["sizes"][str(n)] = {
                name: measure(op, n, a.repeat) for name, op in backends.items()
            }
    t = Table(title="ledger bookkeeping, medians (PostgreSQL local, unix socket)")
    for col in ("hosts", "figure", "SQLite", "PostgreSQL", "PG/SQLite"):
        t.add_column(col, justify="right")
    for n, by in figures["sizes"].items():
        sq, pg = by["sqlite"], by["postgresql"]
        for key, label in (
            ("per_host_ms", "per host, ms"),
            ("host_phase_ms", "host_phase, ms"),
            ("get_ms", "get, ms"),
            ("lock_ms", "lock+unlock, ms"),
            ("rollout_s", "rollout, s"),
        ):
            t.add_row(n, label, f"{sq[key]:.2f}", f"{pg[key]:.2f}", f"{pg[key] / sq[key]:.2f}x")
    con.print(t)
    write_figures(con, a.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
