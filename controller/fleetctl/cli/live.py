"""The terminal's live view of a rollout, rollback or abort, and the sinks every long command
reports to.

:func:`render` draws the model of :mod:`fleetctl.cli.livemodel` for a width: a header with the time
so far and the time left, then the table; columns are dropped before the message is cut below 30
cells, nothing wraps, and on a fleet taller than the screen the failed and busy hosts come first and
the rest are counted.
:func:`streams` gives a long command its event log (``<state dir>/events``), the ``--events``
stream and the ``--ui`` page (:mod:`fleetctl.cli.ui`); :func:`watch` adds the live view on a
terminal.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, Group
from rich.live import Live
from rich.text import Text

from fleetctl import paths
from fleetctl.cli import metrics, ui
from fleetctl.cli import metrics_fleet as fleet_metrics
from fleetctl.cli.livemodel import LiveModel, events_dir, human_secs
from fleetctl.cli.output import Col, Ctx, fit_table
from fleetctl.errors import FleetError
from fleetctl.inventory import Inventory
from fleetctl.progress import EventLog, Progress, Tee

#: Columns shown even when empty.
ALWAYS = frozenset({"host", "phase", "message"})
#: The message column keeps at least this many cells: the one column that says what is happening.
MESSAGE_MIN = 30

#: How the columns give way on a narrow terminal, highest ``drop`` first; the message is cut last.
COLUMNS = (
    Col("host"),
    Col("wave", drop=5),
    Col("phase"),
    Col("tag", drop=3),
    Col("digest", drop=6),
    Col("health", drop=4),
    Col("progress", drop=2),
    Col("message", flex=True, min=MESSAGE_MIN),
)


#: Below this width the progress column shows its figures without the bar (the message keeps its 30
#: cells).
BAR_WIDTH = 100


def header(snap: Mapping[str, Any]) -> str:
    """``rollout  4m12s  2/4 hosts done, 1 failed  ~6m30s left``."""
    left = snap["left"]
    parts = [snap["title"], human_secs(snap["elapsed"])]
    if snap["hosts_planned"]:
        parts.append(f"{snap['hosts_done']}/{snap['hosts_planned']} hosts done"
                     + (f", {snap['hosts_failed']} failed" if snap["hosts_failed"] else ""))
    if snap["hosts_planned"] and snap["hosts_done"] + snap["hosts_failed"] < snap["hosts_planned"]:
        parts.append(
            f"~{human_secs(left)} left" if left is not None else "time left: after the first step"
        )
    return "  ".join(parts)


_ORDER = {"trouble": 0, "busy": 1, "quiet": 2}


def render(snap: Mapping[str, Any], width: int, height: int = 40) -> Group:
    """The header, the table (no wider than ``width``) and a caption; at most ``height`` lines of
    rows."""
    hosts = list(snap["hosts"])
    # Header, the table's borders and head, and the caption take 7 lines.
    limit = max(4, height - 7)
    caption = snap["fleet"]
    if len(hosts) > limit:
        order = sorted(range(len(hosts)), key=lambda i: (_ORDER[hosts[i]["state"]], i))
        shown = set(order[:limit])
        counts: dict[str, int] = {}
        for i, h in enumerate(hosts):
            if i not in shown:
                counts[h["phase"] or "?"] = counts.get(h["phase"] or "?", 0) + 1
        hidden = ", ".join(
            f"{n} {phase}" for phase, n in sorted(counts.items(), key=lambda kv: -kv[1])
        )
        caption = f"{len(hosts) - len(shown)} more hosts: {hidden}" + (
            f" | {caption}" if caption else ""
        )
        hosts = [hosts[i] for i in sorted(shown, key=lambda i: (_ORDER[hosts[i]["state"]], i))]
    key = {"progress": "progress" if width >= BAR_WIDTH else "figures"}
    # A column no host has anything in (a rollback has no waves; the plan before any step) is left
    # out.
    used = [
        c
        for c in COLUMNS
        if c.name in ALWAYS or any(h["cells"][key.get(c.name, c.name)] for h in hosts)
    ]
    rows = [[Text(h["cells"][key.get(c.name, c.name)]) for c in used] for h in hosts]
    # On a wide terminal the message takes more before the less useful columns give way.
    cols = [
        dataclasses.replace(c, min=max(MESSAGE_MIN, width * 2 // 5)) if c.flex else c for c in used
    ]
    table = fit_table(width, cols, rows)
    return Group(Text(header(snap), no_wrap=True, overflow="ellipsis", style="bold"), table,
                 Text(caption, no_wrap=True, overflow="ellipsis"))


class LiveView(LiveModel):
    """The terminal's live view: a :class:`LiveModel` drawn by rich's Live at each refresh (never
    per event)."""

    def __init__(self, title: str) -> None:
        super().__init__(title)
        self.live: Live | None = None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Group]:
        yield render(self.snapshot(), options.max_width, console.height)


#: Event logs kept in ``<state dir>/events`` (older ones are removed when a run starts).
KEEP_LOGS = 50


def new_log(state_dir: Path, title: str) -> Path:
    """A fresh event log's path (``<kind>-<UTC time>-<pid>.jsonl``); the oldest beyond
    :data:`KEEP_LOGS` go."""
    d = paths.private_dir(events_dir(state_dir))
    logs = sorted(d.glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    for old in logs[:max(0, len(logs) - KEEP_LOGS + 1)]:
        old.unlink(missing_ok=True)
    return (
        d
        / f"{title.replace(' ', '-')}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        f"-{os.getpid()}.jsonl"
    )


@contextmanager
def streams(
    ctx: Ctx, title: str, state_dir: Path, inv: Inventory | None = None
) -> Iterator[Progress]:
    """The sinks every long command reports to besides its display: its event log (``<state
    dir>/events``), the ``--events`` stream, and the ``--ui`` page served from the event log while
    the command
    runs."""
    # Bad input (an --events path that is no file, a --ui port taken) is refused before anything is
    # written.
    events = _events_file(ctx.events) if ctx.events and ctx.events != "-" else None
    path = new_log(state_dir, title)
    server = None
    if ctx.ui_port is not None:
        server = ui.serve(ui.Fleet(inv, state_dir, log=path), "127.0.0.1", ctx.ui_port)
    try:
        run, exporter = _metrics(ctx, title, state_dir, inv)
    except BaseException:
        if server is not None:
            server.server_close()
        raise
    try:
        log = EventLog(path, title)
    except BaseException:
        if server is not None:
            server.server_close()
        if exporter is not None:
            exporter.shutdown()
            exporter.server_close()
        raise
    extra: EventLog | None = None
    serving = False
    try:
        if ctx.events == "-":
            extra = EventLog(None, title, stream=sys.stdout)
        elif events is not None:
            extra = EventLog(events, title)
        if server is not None:
            threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.5},
                name="fleetctl-ui",
                daemon=True,
            ).start()
            serving = True
            ctx.err.print(f"live view on {ui.url_of(server)} (read-only, while this command runs)",
                          highlight=False, markup=False)
        sinks: list[Progress] = [x for x in (log, extra, run) if x is not None]
        yield Tee(*sinks) if len(sinks) > 1 else log
    finally:
        if run is not None:
            run.ended = True
        log.close()
        if exporter is not None:
            exporter.shutdown()
            exporter.server_close()
        if extra is not None:
            extra.close()
        if server is not None:
            if serving:
                server.shutdown()  # waits for serve_forever: only once it was started
            server.server_close()


def _metrics(ctx: Ctx, title: str, state_dir: Path,
             inv: Inventory | None) -> tuple[metrics.RunMetrics | None, Any]:
    """``--metrics-port``: the run's metrics (and, with an inventory, the fleet's) served while the
    command runs; (None, None) without it."""
    if ctx.metrics_port is None:
        return None, None
    fleet = ui.Fleet(inv, state_dir) if inv is not None else None
    run = metrics.RunMetrics(title, fleet_metrics.recipes_of(inv) if inv is not None else None)
    collectors: list[Any] = [run]
    if inv is not None and fleet is not None:
        collectors.append(fleet_metrics.FleetMetrics(inv, state_dir, run, fleet.hosts))
    server = metrics.metrics_server(metrics.registry_of(*collectors), ctx.metrics_bind,
                                    ctx.metrics_port)
    ctx.err.print(f"metrics on {metrics.url_of(server)} (Prometheus, while this command runs)",
                  highlight=False, markup=False)
    return run, server


def _events_file(name: str) -> Path:
    """``--events FILE``: a new or regular file (appended to), refused when it is a directory or a
    link."""
    path = Path(name)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise FleetError(
            f"--events {name}: not a regular file", fix="give a new file's path, or - for stdout"
        )
    if not path.parent.is_dir():
        raise FleetError(f"--events {name}: the directory {path.parent} does not exist",
                         fix="create it first, or give another path")
    return path


@contextmanager
def watch(
    ctx: Ctx, title: str, state_dir: Path, inv: Inventory | None = None
) -> Iterator[Progress]:
    """The sink a rollout, rollback or abort reports to: :func:`streams`, and the live view on a
    terminal
    (plain lines otherwise, as every command prints them)."""
    with streams(ctx, title, state_dir, inv) as sink:
        if not ctx.err.is_terminal:
            with ctx.progress(title) as lines:
                yield Tee(sink, lines)
            return
        view = LiveView(title)
        with Live(view, console=ctx.err, refresh_per_second=4, transient=False) as live:
            view.live = ctx.live = live
            try:
                yield Tee(sink, view)
                live.refresh()
            finally:
                ctx.live = None
