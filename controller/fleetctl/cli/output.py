"""Rendering shared by every command: JSON or rich, stdout vs stderr, live progress."""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from fleetctl.progress import Event, Progress


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums, paths and dates to plain JSON values (recursively)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, datetime | date):
        return obj.isoformat()
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in obj]
    return obj


@dataclass
class Ctx:
    """What every command gets: the chosen inventory, output mode and consoles."""

    inventory: str | None = None
    json: bool = False
    out: Console = field(default_factory=lambda: Console(soft_wrap=True))
    err: Console = field(default_factory=lambda: Console(stderr=True, soft_wrap=True))

    def emit(self, result: Any, render: Callable[[Console], None]) -> None:
        """Print ``result`` as JSON (with --json) or through ``render`` on stdout."""
        if self.json:
            click.echo(json.dumps(to_jsonable(result), indent=2, sort_keys=False))
        else:
            render(self.out)

    @contextmanager
    def progress(self, title: str, columns: tuple[str, ...] = ("phase", "message")) -> Iterator[Progress]:
        """A progress sink for the core: a live host table on a terminal, log lines otherwise."""
        if not self.err.is_terminal:
            yield _LineProgress(self.err)
            return
        display = _LiveTable(title, columns)
        with Live(display.render(), console=self.err, refresh_per_second=4, transient=False) as live:
            display.live = live
            yield display
            live.update(display.render())


pass_ctx = click.make_pass_decorator(Ctx, ensure=True)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``: machine-readable result on stdout (progress still goes to stderr)."""

    def cb(ctx: click.Context, _p: click.Parameter, value: bool) -> bool:
        if value:
            ctx.ensure_object(Ctx).json = True
        return value

    return click.option(
        "--json", "json_out", is_flag=True, expose_value=False, callback=cb,
        help="Print the result as JSON on stdout.", is_eager=True,
    )(f)


class _LineProgress:
    """Plain, timestamped lines on stderr (CI logs, pipes): one per phase change or message."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.last: dict[str | None, tuple[str, str]] = {}

    def __call__(self, event: Event) -> None:
        key = (event.phase, event.message)
        with self.lock:
            if self.last.get(event.host) == key:
                return
            self.last[event.host] = key
            who = f"{event.host}: " if event.host else ""
            msg = f" {event.message}" if event.message else ""
            self.console.print(
                f"[{time.monotonic() - self.t0:6.1f}s] {who}{event.phase}{msg}", markup=False, highlight=False
            )


class _LiveTable:
    """A live table, one row per host, plus the latest fleet-wide line."""

    def __init__(self, title: str, columns: tuple[str, ...]) -> None:
        self.title = title
        self.columns = columns
        self.rows: dict[str, dict[str, str]] = {}
        self.fleet_line = ""
        self.lock = threading.Lock()
        self.live: Live | None = None
        self.t0 = time.monotonic()

    def __call__(self, event: Event) -> None:
        with self.lock:
            if event.host is None:
                self.fleet_line = f"{event.phase}: {event.message}" if event.message else event.phase
            else:
                row = self.rows.setdefault(event.host, {})
                row["phase"] = event.phase
                row["message"] = event.message
                for k, v in event.data.items():
                    row[k] = str(v)
            if self.live is not None:
                self.live.update(self.render())

    def render(self) -> Table:
        t = Table(title=f"{self.title}  [dim]{time.monotonic() - self.t0:.0f}s[/dim]", caption=self.fleet_line)
        t.add_column("host")
        for c in self.columns:
            t.add_column(c)
        for host, row in self.rows.items():
            t.add_row(host, *(row.get(c, "") for c in self.columns))
        return t


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (``-`` is stdout)."""
    text = json.dumps(to_jsonable(data), indent=2)
    if str(path) == "-":
        sys.stdout.write(text + "\n")
        return
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(p)
