"""What the event stream's sinks cost the controller, and how hard the webhook's progress hits a
receiver.

A fleet of N hosts each sending the recorded rollout's soak events
(tests/cli/fixtures/rollout-events.jsonl,
host names multiplied) to, in one run:

- ``log``: the run's event log alone (what every run already writes: the baseline);
- ``log+file``: and an ``--events FILE`` stream;
- ``log+file+hook``: and the webhook's per-host progress (``Webhook.watch``) posting to a real HTTP
  receiver on loopback, with ``--interval`` seconds between posts (10 s in fleetctl; shorter here
  so that a run of a few seconds shows the bound).

Figures per configuration: the controller's CPU per event in microseconds (median of ``--rounds``)
and its ratio to the baseline; for the webhook, the posts the receiver got and the most hosts in
one, against the events sent: posts are bounded by time (one per interval) and hosts per post by
``PROGRESS_HOSTS``, not by the fleet's size or its event rate. No lab needed::

    .venv/bin/python bench/event_stream.py [--hosts 100,500] [--events 20000] [--rounds 3]
    [--interval 0.5]
        [--json bench/results/event_stream.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from _figures import write_figures  # bench/ is on sys.path when a bench runs
from fleetctl.progress import Event, EventLog, Progress, Tee, event_from_json
from fleetctl.rollout.webhook import PROGRESS_HOSTS, Webhook

FIXTURE = (
    Path(__file__).resolve().parents[1] / "tests" / "cli" / "fixtures" / "rollout-events.jsonl"
)


class _Receiver(ThreadingHTTPServer):
    daemon_threads = True
    hosts_per_post: list[int]


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["event"] == "progress":
            self.server.hosts_per_post.append(len(body["hosts"]))
        self.send_response(204)
        self.end_headers()


def fleet_events(hosts: int, count: int) -> list[Event]:
    """``count`` events: the recording's host events, cycled over ``hosts`` host names."""
    recorded = [event_from_json(json.loads(ln))[1] for ln in FIXTURE.read_text().splitlines()]
    per_host = [e for e in recorded if e.host]
    return [Event(e.phase, e.message, f"spark-{i % hosts:03d}", e.data)
            for i, e in enumerate(per_host[j % len(per_host)] for j in range(count))]


def run(config: str, events: list[Event], tmp: Path, interval: float) -> dict[str, Any]:
    log = EventLog(tmp / f"{config}-log.jsonl", "rollout")
    sinks: list[Progress] = [log]
    extra = hook = receiver = None
    if "file" in config:
        extra = EventLog(tmp / f"{config}-events.jsonl", "rollout")
        sinks.append(extra)
    if "hook" in config:
        receiver = _Receiver(("127.0.0.1", 0), _Handler)
        receiver.hosts_per_post = []
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
        hook = Webhook(
            f"http://127.0.0.1:{receiver.server_port}/hook/T0KEN-0123456789abcdef",
            "ro-bench",
            "bench",
            allow_http=True,
            secrets=["hunter2-sudo"],
            interval=interval,
        )
        sinks.append(hook.watch)
    sink = Tee(*sinks)
    t0, c0 = time.perf_counter(), time.process_time()
    for e in events:
        sink(e)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    out: dict[str, Any] = {"cpu_us_per_event": cpu / len(events) * 1e6, "wall_s": wall}
    log.close()
    if extra is not None:
        extra.close()
    if hook is not None and receiver is not None:
        hook.close()
        out.update(
            posts=len(receiver.hosts_per_post),
            most_hosts_in_a_post=max(receiver.hosts_per_post, default=0),
            hosts_posted=sum(receiver.hosts_per_post),
        )
        receiver.shutdown()
        receiver.server_close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="100,500", help="fleet sizes, comma-separated")
    ap.add_argument("--events", type=int, default=20000, help="events per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--interval", type=float, default=0.5, help="seconds between two webhook progress posts"
    )
    ap.add_argument("--json", dest="json_out", default="bench/results/event_stream.json")
    a = ap.parse_args()
    con = Console()
    configs = ("log", "log+file", "log+file+hook")
    figures: dict[str, Any] = {"events": a.events, "rounds": a.rounds, "interval": a.interval,
                               "progress_hosts": PROGRESS_HOSTS, "fleets": {}}
    table = Table(title=f"event stream sinks: {a.events} events, median of {a.rounds}")
    for col in (
        "hosts",
        "sinks",
        "CPU µs/event",
        "x baseline",
        "wall s",
        "posts",
        "most hosts/post",
    ):
        table.add_column(col, justify="right" if col not in ("sinks",) else "left")
    with tempfile.TemporaryDirectory() as d:
        for n in (int(x) for x in a.hosts.split(",")):
            events = fleet_events(n, a.events)
            rows: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
            for r in range(a.rounds):
                where = Path(d) / f"{n}-{r}"
                where.mkdir()
                for c in configs:
                    rows[c].append(run(c, events, where, a.interval))
            base = statistics.median(x["cpu_us_per_event"] for x in rows["log"])
            fleet: dict[str, Any] = {}
            for c in configs:
                med = {k: statistics.median(x[k] for x in rows[c]) for k in rows[c][0]}
                med["ratio"] = med["cpu_us_per_event"] / base
                fleet[c] = med
                table.add_row(
                    str(n),
                    c,
                    f"{med['cpu_us_per_event']:.1f}",
                    f"{med['ratio']:.2f}",
                    f"{med['wall_s']:.2f}",
                    f"{med['posts']:.0f}" if "posts" in med else "-",
                    f"{med['most_hosts_in_a_post']:.0f}" if "posts" in med else "-",
                )
            figures["fleets"][str(n)] = fleet
    con.print(table)
    write_figures(con, a.json_out, figures)


if __name__ == "__main__":
    main()
