"""Rendering shared by every command: JSON or rich, stdout vs stderr, live progress."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console, ConsoleOptions
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fleetctl import paths
from fleetctl.durations import DurationError, parse_duration
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
    #: The live view while a command shows one (a question stops it, see :meth:`ask`).
    live: Live | None = None
    #: ``--events FILE|-``: where a long command also writes its event stream (JSON lines).
    events: str | None = None
    #: ``--ui PORT``: the port a long command serves its live web page on (127.0.0.1), while it
    #: runs.
    ui_port: int | None = None
    #: ``--metrics-port PORT`` / ``--metrics-bind ADDR``: where a long command serves its Prometheus
    #: metrics while it runs (docs/observability.md).
    metrics_port: int | None = None
    metrics_bind: str = "127.0.0.1"

    def ask(self, question: str) -> None:
        """``Question? [y/N]`` on stderr, like apt or terraform: anything but y/yes aborts (no is
        the default).

        The live view, if one is showing, stops for the question and starts again after it.
        """
        live = self.live
        if live is not None:
            # Erased, not left behind: the question comes right under what was printed before it.
            live.transient = True
            live.stop()
            live.transient = False
            # Started again below the question, not over it: rich would move up by the erased
            # height.
            live._live_render._shape = None
        click.confirm(question, default=False, abort=True, err=True, prompt_suffix=" ")
        if live is not None:
            live.start()

    def drop_live(self) -> None:
        """Erase the live view and stop it (a command that ends before doing anything: "nothing to
        do")."""
        live = self.live
        if live is not None:
            live.transient = True
            live.stop()

    def emit(self, result: Any, render: Callable[[Console], None]) -> None:
        """Print ``result`` as JSON (with --json) or through ``render`` on stdout. When the event
        stream also goes to stdout (``--events -``), every line there is one JSON object: the result
        is the last,
        ``{"result": ...}`` on one line."""
        if self.json and self.events == "-":
            click.echo(json.dumps({"result": to_jsonable(result)}))
        elif self.json:
            click.echo(json.dumps(to_jsonable(result), indent=2, sort_keys=False))
        else:
            render(self.out)

    @contextmanager
    def progress(
        self, title: str, columns: tuple[str, ...] = ("phase", "message")
    ) -> Iterator[Progress]:
        """A progress sink for the core: a live host table on a terminal, log lines otherwise."""
        if not self.err.is_terminal:
            yield _LineProgress(self.err)
            return
        display = _LiveTable(title, columns)
        # The table itself is the renderable: built at each refresh (4 a second), never per event.
        with Live(display, console=self.err, refresh_per_second=4, transient=False) as live:
            display.live = self.live = live
            try:
                yield display
                live.refresh()
            finally:
                self.live = None


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


class Duration(click.types.FloatParamType):
    """The type of every option that takes a length of time (a duration, an interval, a timeout):
    ``90``, ``90s``, ``3m``, ``1h``, ``1m30s``, read by the one parser
    (:func:`fleetctl.durations.parse_duration`)
    into seconds; a bare number is seconds. ``low`` and ``high`` bound it (seconds) where the
    command
    needs bounds. (A float type: what click hands the command is a number of seconds.)"""

    name = "duration"

    def __init__(self, low: float | None = None, high: float | None = None) -> None:
        self.low, self.high = low, high

    def __repr__(self) -> str:
        return "DURATION"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            seconds = parse_duration(value, "duration")
        except DurationError:
            self.fail(
                f"{value!r} is not a duration (write e.g. 90s, 3m or 1h; a bare number is seconds)",
                param,
                ctx,
            )
        if (self.low is not None and seconds < self.low) or (
            self.high is not None and seconds > self.high
        ):
            said = str(value).strip()
            shown = said if said in (f"{seconds:g}", f"{seconds:g}s") else f"{said} ({seconds:g}s)"
            self.fail(f"{shown} is not within {self._range()}", param, ctx)
        return seconds

    def _range(self) -> str:
        if self.high is None:
            return f"{self.low:g}s or more"
        return f"{self.low or 0:g}s..{self.high:g}s"


def metrics_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--metrics-port PORT`` and ``--metrics-bind ADDR``: Prometheus' /metrics while the command
    runs (the long commands, ``watch``, ``ui``)."""

    def port_cb(ctx: click.Context, _p: click.Parameter, value: int | None) -> int | None:
        if value is not None:
            ctx.ensure_object(Ctx).metrics_port = value
        return value

    def bind_cb(ctx: click.Context, _p: click.Parameter, value: str) -> str:
        ctx.ensure_object(Ctx).metrics_bind = value
        return value

    f = click.option(
        "--metrics-bind", metavar="ADDR", default="127.0.0.1", show_default=True,
        expose_value=False, callback=bind_cb,
        help="Address --metrics-port listens on (0.0.0.0 or :: is every interface).")(f)
    return click.option(
        "--metrics-port", type=click.IntRange(0, 65535), metavar="PORT", expose_value=False,
        callback=port_cb,
        help="Serve Prometheus metrics on PORT's /metrics while this runs (0: any free port; the "
        "URL goes to stderr; docs/observability.md).")(f)


def stream_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--events FILE|-``, ``--ui PORT`` and the metrics' options of the long commands (rollout,
    rollback, abort, soak, stage, watch)."""

    def events_cb(ctx: click.Context, _p: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            ctx.ensure_object(Ctx).events = value
        return value

    def ui_cb(ctx: click.Context, _p: click.Parameter, value: int | None) -> int | None:
        if value is not None:
            ctx.ensure_object(Ctx).ui_port = value
        return value

    f = metrics_options(f)
    f = click.option(
        "--ui",
        "ui_port",
        type=click.IntRange(0, 65535),
        metavar="PORT",
        expose_value=False,
        callback=ui_cb,
        help="While it runs, serve the live web page (as `fleetctl ui`) on 127.0.0.1:PORT (0: any "
        "free port; the URL goes to stderr).",
    )(f)
    return click.option(
        "--events",
        "events",
        metavar="FILE|-",
        expose_value=False,
        callback=events_cb,
        help="Also write the event stream as JSON lines to FILE (created 0600), or to stdout "
        "with '-' (then --json's result is its last line, {\"result\": ...}).",
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
                f"[{time.monotonic() - self.t0:6.1f}s] {who}{event.phase}{msg}",
                markup=False,
                highlight=False,
            )


#: Phases of a host with nothing going on: the first rows to give way when the fleet is taller than
#: the terminal (a host being changed, failed or paused is always shown first).
_QUIET_PHASES = frozenset(
    {"planned", "skip", "pull", "pulled", "done", "ok", "checked", "restored"}
)


class _LiveTable:
    """A live table, one row per host, plus the latest fleet-wide line.

    An event only updates the host's row (a fleet of hundreds sends thousands); the table is
    built when Live refreshes (``__rich_console__``). On a fleet taller than the terminal, the busy
    hosts are shown and the quiet ones counted by phase in the caption.
    """

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
                self.fleet_line = (
                    f"{event.phase}: {event.message}" if event.message else event.phase
                )
            else:
                row = self.rows.setdefault(event.host, {})
                row["phase"] = event.phase
                row["message"] = event.message
                for k, v in event.data.items():
                    row[k] = str(v)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Table]:
        # Built for the width it is printed at (Live's console, or any other), never wider.
        yield self.render(options.max_width)

    def render(self, width: int | None = None) -> Table:
        console = self.live.console if self.live is not None else None
        width = width or (console.width if console is not None else 80)
        # Title, borders, header and caption take 7 lines; a terminal may say it has fewer.
        limit = max(8, (console.height if console is not None else 40) - 7)
        with self.lock:
            items = [(host, dict(row)) for host, row in self.rows.items()]
            fleet_line = self.fleet_line
        caption = fleet_line
        if len(items) > limit:
            busy = [i for i, (_h, row) in enumerate(items) if row.get("phase") not in _QUIET_PHASES]
            busy_set = set(busy)
            quiet = [i for i in range(len(items)) if i not in busy_set]
            shown = set(busy[:limit]) | set(quiet[:max(0, limit - len(busy))])
            counts: dict[str, int] = {}
            for i, (_h, row) in enumerate(items):
                if i not in shown:
                    counts[row.get("phase", "?")] = counts.get(row.get("phase", "?"), 0) + 1
            hidden = ", ".join(
                f"{n} {phase}" for phase, n in sorted(counts.items(), key=lambda kv: -kv[1])
            )
            caption = f"{len(items) - len(shown)} more hosts: {hidden}" + (
                f" | {fleet_line}" if fleet_line else ""
            )
            items = [it for i, it in enumerate(items) if i in shown]
        cols = [Col("host"), *(_LIVE_COLUMNS.get(c, Col(c)) for c in self.columns)]
        rows = [[Text(host), *(Text(row.get(c, "")) for c in self.columns)] for host, row in items]
        return fit_table(
            width,
            cols,
            rows,
            caption=Text(caption, no_wrap=True, overflow="ellipsis"),
            title=f"{self.title}  [dim]{time.monotonic() - self.t0:.0f}s[/dim]",
        )


@dataclass(frozen=True)
class Col:
    """A column of a table that must fit a CI log's 80 columns.

    ``drop``: 0 = always shown; otherwise columns are dropped, highest first,
    until the rest fits. ``flex``: free text, cut with an ellipsis to the room
    left (at least ``min`` cells); every other column keeps its whole values.
    Cells are never wrapped over several lines.
    """

    name: str
    drop: int = 0
    flex: bool = False
    min: int = 10


#: Cells a column costs besides its content: one space either side and a rule.
_COL_OVERHEAD = 3


def fit_table(width: int, columns: Sequence[Col | str], rows: Iterable[Sequence[Any]],
              **table_kw: Any) -> Table:
    """A rich Table of ``rows`` (markup strings or Text) no wider than ``width``: columns dropped,
    free text cut."""
    cols = [c if isinstance(c, Col) else Col(c) for c in columns]
    texts = [[c if isinstance(c, Text) else Text.from_markup(str(c)) for c in row] for row in rows]
    natural = [max([len(c.name), *(r[i].cell_len for r in texts)]) for i, c in enumerate(cols)]

    def need(keep: list[int], flex: set[int]) -> int:
        return sum(min(natural[i], cols[i].min) if i in flex else natural[i] for i in keep) \
            + _COL_OVERHEAD * len(keep) + 1

    keep = list(range(len(cols)))
    flex = {i for i, c in enumerate(cols) if c.flex}
    while need(keep, flex) > width:
        droppable = [i for i in keep if cols[i].drop > 0]
        if not droppable:
            break
        keep.remove(max(droppable, key=lambda i: (cols[i].drop, i)))
    # Still too wide with every droppable column gone: the widest whole column is cut too.
    while need(keep, flex) > width and any(i not in flex for i in keep):
        flex.add(max((i for i in keep if i not in flex), key=lambda i: natural[i]))
    # The room left is shared by the cut columns, narrowest first (each takes no more than it
    # needs).
    room = width - sum(natural[i] for i in keep if i not in flex) - _COL_OVERHEAD * len(keep) - 1
    caps: dict[int, int] = {}
    cut = sorted((i for i in keep if i in flex), key=lambda i: natural[i])
    for n, i in enumerate(cut):
        caps[i] = max(1, min(natural[i], room // (len(cut) - n)))
        room -= caps[i]
    t = Table(**table_kw)
    for i in keep:
        t.add_column(cols[i].name, no_wrap=True, overflow="ellipsis", max_width=caps.get(i))
    for r in texts:
        cells = []
        for i in keep:
            cell = r[i].copy()
            cell.no_wrap, cell.overflow = True, "ellipsis"
            cells.append(cell)
        t.add_row(*cells)
    return t


#: How the live tables' columns give way on a narrow terminal (the rest are kept whole).
_LIVE_COLUMNS = {"message": Col("message", flex=True), "acceptance": Col("acceptance", drop=3),
                 "tok/s": Col("tok/s", drop=2), "wave": Col("wave", drop=1)}


_DATED = re.compile(r"^\d{4}-\d{2}-\d{2}-")
_VERSION_PART = re.compile(r"^v?\d+(?:\.\d+)+$")


def short_tag(tag: str | None) -> str:
    """A tag as people say it: its version part (``2026-07-01-v0.24.0-dflashfix`` -> ``v0.24.0``),
    else the tag without its leading date; ``-`` when unknown. The full tag and the digest are in
    ``--json`` and
    history."""
    if not tag:
        return "-"
    for part in tag.split("-"):
        if _VERSION_PART.match(part):
            return part
    return _DATED.sub("", tag) or tag


def short_digest(digest: str | None) -> str:
    """``sha256:4eb9270da69e...`` -> ``4eb9270da69e`` (12 hex digits, as docker prints image ids);
    ``-`` if unknown."""
    return digest.split(":", 1)[-1][:12] if digest else "-"


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (``-`` is stdout)."""
    text = json.dumps(to_jsonable(data), indent=2)
    if str(path) == "-":
        sys.stdout.write(text + "\n")
        return
    paths.write_private(Path(path), text + "\n")


def when(ts: float | None, *, utc: bool = False) -> str:
    """A timestamp for people: local time in tables, ISO 8601 UTC (``...Z``) for JSON; ``-`` if
    unknown."""
    if not ts:
        return "-"
    if utc:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
