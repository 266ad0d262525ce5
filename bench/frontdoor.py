"""What the front door costs a rollout step, and what it saves users.

1. Overhead (no lab; a real haproxy on loopback, two tiny HTTP backends): a host with ``--held``
requests in
   flight, released ``--release`` seconds after the drain. Per round: the drain call, the wait
   until both counts are 0 minus the requests' own ``--release`` time (the poll's lateness), the
   re-admission until HAProxy sees the host in rotation. Goal: drain + re-admit add at most 1 s to a
   step::

       .venv/bin/python bench/frontdoor.py overhead [--rounds 10] [--json
       bench/results/frontdoor.json]

2. Failed user requests (the lab, serving; FLEETCTL_LAB_DIR/FLEETCTL_LAB_SUBNET set): a rollout of
every node
   to ``--tag`` under ``fleetctl lab traffic --rate R``, once with fleetctl driving the lab's
   HAProxy (``lab door on``) and once with the same HAProxy alone (``lab door off``: its own health
   checks and redispatch only); the traffic runs from 2 s before the rollout to 2 s after it::

       .venv/bin/python bench/frontdoor.py lab [--rate 4] [--repeat 1] [--json
       bench/results/frontdoor_lab.json]

   Each measured rollout starts from every node on ``--back`` (a smoke-gated ``rollback --to``, no
   traffic).

3. The floor check before each step (no lab; a real haproxy with ``--pool`` servers): fleetctl's
bulk read of
   the door's view against one ``state`` per host, in the same run::

       .venv/bin/python bench/frontdoor.py floor [--rounds 10] [--pool 200] [--json
       bench/results/frontdoor_floor.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from _figures import write_figures  # bench/ is on sys.path when a bench runs
from fleetctl.frontdoor import states_of
from fleetctl.frontdoor.drain import wait_drained, wait_in_rotation
from fleetctl.frontdoor.haproxy import HAProxy
from fleetctl.inventory import Host
from fleetctl.rollout.results import RollbackOptions


class Held:
    """An HTTP backend whose /hold requests wait for ``release``; /health answers 200."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.running = 0
        me = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.startswith("/hold"):
                    me.running += 1
                    me.release.wait(60)
                    me.running -= 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        class S(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, *a: object) -> None:
                pass

        self.srv = S(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _haproxy(d: Path, servers: dict[str, int], check: bool = True) -> Iterator[tuple[str, int]]:
    sock, port = d / "admin.sock", _free_port()
    lines = "\n".join(
        f"  server {n} 127.0.0.1:{p}{' check inter 1s' if check else ''}"
        for n, p in servers.items()
    )
    (d / "h.cfg").write_text(
        f"global\n  stats socket {sock} mode 600 level admin\ndefaults\n  mode http\n"
        "  timeout connect 2s\n  timeout client 60s\n  timeout server 60s\n"
        f"frontend fe\n  bind 127.0.0.1:{port}\n  default_backend vllm\n"
        f"backend vllm\n  option httpchk GET /health\n{lines}\n"
    )
    p = subprocess.Popen(
        [shutil.which("haproxy") or "/usr/sbin/haproxy", "-f", str(d / "h.cfg"), "-db"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not sock.exists():
            time.sleep(0.02)
        yield str(sock), port
    finally:
        p.terminate()
        p.wait()


def overhead(rounds: int, held: int, release: float) -> dict[str, Any]:
    import urllib.request

    a, b = Held(), Held()
    host = Host("spark-01", "127.0.0.1")
    rows: list[dict[str, float]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        _haproxy(Path(tmp), {"spark-01": a.port, "spark-02": b.port}) as (sock, port),
    ):
        door = HAProxy("vllm", sock)
        wait_in_rotation(door, host, 30)
        for _ in range(rounds):
            a.release.clear()
            door.drain(Host("spark-02", "x"))
            threads = [threading.Thread(target=lambda: urllib.request.urlopen(
                f"http://127.0.0.1:{port}/hold", timeout=60).read()) for _ in range(held)]
            for t in threads:
                t.start()
            while a.running < held:
                time.sleep(0.01)
            door.readmit(Host("spark-02", "x"))
            t0 = time.monotonic()
            door.drain(host)
            t_drain = time.monotonic() - t0
            timer = threading.Timer(release, a.release.set)
            t_rel = time.monotonic()
            timer.start()
            w = wait_drained(door, host, lambda: a.running, timeout=60)
            late = (time.monotonic() - t_rel) - release
            t1 = time.monotonic()
            door.readmit(host)
            wait_in_rotation(door, host, 30)
            t_readmit = time.monotonic() - t1
            for t in threads:
                t.join()
            assert not w.timed_out
            rows.append({"drain_call": t_drain, "wait_late": max(0.0, late), "readmit": t_readmit,
                         "added": t_drain + max(0.0, late) + t_readmit})
    return {"rounds": rounds, "held": held, "release_s": release,
            **{k: {"median": round(statistics.median(r[k] for r in rows), 4),
                   "max": round(max(r[k] for r in rows), 4)} for k in rows[0]}}


def _traffic(rate: float, duration: float) -> subprocess.Popen[str]:
    exe = str(Path(sys.executable).parent / "fleetctl")
    return subprocess.Popen(
        [exe, "lab", "traffic", "--rate", str(rate), "--duration", str(duration), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def lab_rollout(
    door_on: bool, tag: str, rate: float, duration: float, soak: float
) -> dict[str, Any]:
    from fleetctl import inventory, ssh
    from fleetctl.lab.frontdoor import LabFrontDoor
    from fleetctl.lab.layout import current
    from fleetctl.rollout.api import Engine
    from fleetctl.rollout.results import Options

    LabFrontDoor(current()).use_in_inventory(door_on)
    traffic = _traffic(rate, duration)
    time.sleep(2)
    t0 = time.monotonic()
    eng = Engine(inventory.load(None))
    try:
        r = eng.rollout(Options(tag=tag, waves="1,100%", max_unavailable="1", soak=soak))
    finally:
        eng.close()
        ssh.close_all()
    seconds = time.monotonic() - t0
    time.sleep(2)
    traffic.terminate()  # stops the sending; the requests in flight are waited for and reported
    out, _ = traffic.communicate(timeout=300)
    rep = json.loads(out)
    return {
        "door": door_on,
        "status": r.status,
        "rollout_s": round(seconds, 1),
        "sent": rep["sent"],
        "ok": rep["ok"],
        "failed": rep["failed"],
        "p95_s": rep["p95_s"],
        "causes": rep["causes"],
        "steps_drain_s": {h.host: round(h.timings.get("drain", 0.0), 3) for h in r.hosts},
        "steps_readmit_s": {h.host: round(h.timings.get("readmit", 0.0), 3) for h in r.hosts},
    }


def _reset(tag: str) -> None:
    """Every node on ``tag`` again (smoke-gated rollback, no traffic), before a measured rollout."""
    from fleetctl import inventory, ssh
    from fleetctl.rollout.api import Engine

    eng = Engine(inventory.load(None))
    try:
        r = eng.rollback(RollbackOptions(to=tag, max_unavailable="100%"))
    finally:
        eng.close()
        ssh.close_all()
    if r.status != "completed":
        raise SystemExit(f"could not put every node on {tag}: {r.error}")


def floor_read(rounds: int, pool: int) -> dict[str, Any]:
    """A step's floor check (the door's view of every selected host) on a backend of ``pool``
    servers: the bulk read fleetctl makes (``frontdoor.states_of``: one ``show servers state`` + one
    ``show stat``) against asking the door host by host (``state`` per host: two commands each), in
    the same
    run."""
    hosts = [Host(f"spark-{i:03d}", "127.0.0.1") for i in range(1, pool + 1)]
    rows: list[dict[str, float]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        _haproxy(Path(tmp), {h.name: 9 for h in hosts}, check=False) as (sock, _port),
    ):
        door = HAProxy("vllm", sock)
        for _ in range(rounds):
            t0 = time.monotonic()
            bulk = states_of(door, hosts)
            t1 = time.monotonic()
            each = {h.name: door.state(h) for h in hosts}
            t2 = time.monotonic()
            assert bulk == each and len(bulk) == pool
            rows.append({"bulk": t1 - t0, "per_host": t2 - t1})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"rounds": rounds, "pool": pool, **{k: round(v, 4) for k, v in med.items()},
            "ratio": round(med["per_host"] / med["bulk"], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("what", choices=["overhead", "lab", "floor"])
    ap.add_argument("--pool", type=int, default=200, help="floor: servers in the backend")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--held", type=int, default=4)
    ap.add_argument("--release", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument(
        "--duration",
        type=float,
        default=1800.0,
        help="traffic seconds at most (stopped with the rollout)",
    )
    ap.add_argument("--tag", default="v0.24.0")
    ap.add_argument("--back", default="v0.23.0")
    ap.add_argument("--soak", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=1, help="lab: pairs of runs (with, without)")
    ap.add_argument("--json", dest="json_path")
    a = ap.parse_args()
    con = Console(width=int(os.environ.get("COLUMNS", "80")))
    if a.what == "overhead":
        figs = overhead(a.rounds, a.held, a.release)
        t = Table(title=f"added per step, s ({a.held} held {a.release:g} s)")
        for c in ("what", "median", "max"):
            t.add_column(c)
        for k in ("drain_call", "wait_late", "readmit", "added"):
            t.add_row(k, f"{figs[k]['median']:.4f}", f"{figs[k]['max']:.4f}")
        con.print(t)
        con.print(
            "added = drain call + wait beyond the requests' own time + re-admit until in rotation"
        )
    elif a.what == "floor":
        figs = floor_read(a.rounds, a.pool)
        t = Table(title=f"a step's floor check, {a.pool} servers (median of {a.rounds}), s")
        for c in ("bulk read (fleetctl)", "state per host", "ratio"):
            t.add_column(c)
        t.add_row(f"{figs['bulk']:.4f}", f"{figs['per_host']:.4f}", f"{figs['ratio']:g}x")
        con.print(t)
    else:
        runs = []
        for _ in range(a.repeat):
            for on in (True, False):
                _reset(a.back)
                runs.append({**lab_rollout(on, a.tag, a.rate, a.duration, a.soak), "tag": a.tag})
        figs = {"rate": a.rate, "runs": runs}
        t = Table(title=f"failed user requests during a rollout, {a.rate:g} req/s")
        for c in ("door", "tag", "sent", "ok", "failed", "p95 s", "rollout s"):
            t.add_column(c)
        for r in runs:
            t.add_row(
                "fleetctl" if r["door"] else "haproxy alone",
                r["tag"],
                str(r["sent"]),
                str(r["ok"]),
                str(r["failed"]),
                str(r["p95_s"]),
                str(r["rollout_s"]),
            )
        con.print(t)
    if a.json_path:
        write_figures(con, a.json_path, figs)


if __name__ == "__main__":
    main()
