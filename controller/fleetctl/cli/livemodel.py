"""The live view's model: one model folded from the core's progress events, which the terminal's
live view (:mod:`fleetctl.cli.live`) and the web view (``fleetctl ui``, :mod:`fleetctl.cli.ui`) both
draw.

:class:`LiveModel` folds :class:`~fleetctl.progress.Event` s (the same events the line log, the
event log and ``--json`` runs get) into one row per host: its phase, a progress figure for the long
phases (readiness: waited of timeout; soak: phase k of n, the sustained phase's seconds of its
length; a role step: its Ansible task), the gate's running figures (requests, errors, tok/s against
the baseline's, acceptance), and the time so far and an estimate of the time left (the plan's hosts
still to do times the measured steps). :func:`replay` folds a run's event log (``<state
dir>/events``,
:func:`events_dir`).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.cli.output import short_digest, short_tag
from fleetctl.progress import Event, event_from_json
from fleetctl.stage import human_bytes

#: Phases of a host with nothing going on: the first rows to give way when the fleet is taller than
#: the screen.
QUIET = frozenset(
    {"planned", "skip", "pull", "pulled", "done", "ok", "checked", "restored", "preflight"}
)
#: Phases of a host that needs the operator's eyes: shown first.
TROUBLE = frozenset({"failed", "rolled-back", "paused", "rolling-back", "undoing"})
#: Phases a host ends its step in (its step's time is then measured).
FINISHED = frozenset({"done", "failed", "rolled-back", "paused", "restored"})
#: Phases of a host's step (from stopping the old container to its gate's verdict).
STEP = frozenset(
    {"stopping", "starting", "deploying", "loading", "soak", "rolling-back", "undoing"}
)


@dataclass
class HostRow:
    """What a live view knows of one host."""

    host: str
    phase: str = ""
    message: str = ""
    wave: str = ""
    tag: str = ""
    digest: str = ""
    health: str = ""
    #: Seconds (from the start of the run) when the current phase began, the step began and it
    #: ended.
    since: float = 0.0
    started: float | None = None
    finished: float | None = None
    #: The soak's or readiness's figures of the latest event (see rollout.run.LIVE_FIGURES).
    figures: dict[str, Any] = field(default_factory=dict)
    soak_phase: str = ""
    task: str = ""
    #: In the plan of this run (a ``planned`` event came): counted in the header and the time left.
    planned: bool = False

    @property
    def state(self) -> str:
        """``trouble``, ``busy`` or ``quiet``: the order rows are shown in on a tall fleet."""
        if self.phase in TROUBLE:
            return "trouble"
        return "quiet" if self.phase in QUIET or not self.phase else "busy"


class LiveModel:
    """Progress events folded into one row per host and a fleet-wide line; thread-safe.

    ``clock`` gives the seconds since the run started (the event log records them, so a recorded
    stream replays with its own times).
    """

    def __init__(self, title: str, clock: Any = None) -> None:
        self.title = title
        self.t0 = time.monotonic()
        self.clock = clock or (lambda: time.monotonic() - self.t0)
        self.rows: dict[str, HostRow] = {}
        self.fleet_line = ""
        self.lock = threading.Lock()
        #: The most hosts seen in a step at once (the rollout's real --max-unavailable).
        self.parallel = 1
        self.last_t = 0.0
        #: From an event log (:func:`replay`): when the run started (epoch seconds) and whether it
        #: ended.
        self.started: float | None = None
        self.ended = False

    def __call__(self, event: Event) -> None:
        self.fold(event, self.clock())

    def fold(self, event: Event, t: float) -> None:
        """Fold one event that happened ``t`` seconds into the run."""
        with self.lock:
            self.last_t = max(self.last_t, t)
            if event.host is None:
                if event.phase not in ("start", "end", "play"):  # an Ansible run's own lines
                    self.fleet_line = (
                        f"{event.phase}: {event.message}" if event.message else event.phase
                    )
                return
            row = self.rows.get(event.host)
            if row is None:
                row = self.rows[event.host] = HostRow(event.host, since=t)
            d = event.data
            if event.phase == "deploying":
                # A role-driven step: the Ansible task goes into the message, the phase stays.
                row.task = str(d.get("task") or "")
                row.message = event.message
                return
            if event.phase != row.phase:
                row.since = t
                row.figures = {}
                row.task = ""
            row.phase = event.phase
            row.message = event.message
            row.planned = row.planned or event.phase == "planned"
            for key in ("wave", "tag", "digest", "health"):
                if key in d and d[key] is not None:
                    setattr(row, key, str(d[key]))
            row.soak_phase = str(d.get("soak_phase") or "")
            figs = {k: v for k, v in d.items() if k in _FIGURES and v is not None}
            if figs:
                row.figures.update(figs)
            if event.phase in STEP and (row.started is None or row.finished is not None):
                row.started, row.finished = t, None
            if event.phase in FINISHED and row.started is not None and row.finished is None:
                row.finished = t
            busy = sum(
                1 for r in self.rows.values() if r.started is not None and r.finished is None
            )
            self.parallel = max(self.parallel, busy)

    # -- what is shown
    # ----------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything a view shows, as JSON: header figures and one dict per host (with its
        cells)."""
        with self.lock:
            rows = [
                HostRow(**{**asdict(r), "figures": dict(r.figures)}) for r in self.rows.values()
            ]
            fleet_line, now = self.fleet_line, max(self.clock(), self.last_t)
            parallel = self.parallel
        left = time_left(rows, now, parallel)
        planned = [r for r in rows if r.started is not None or r.planned]
        finished = [r for r in planned if r.finished is not None and r.phase in FINISHED]
        done = [r for r in finished if r.phase in ("done", "restored")]
        return {
            "title": self.title,
            "elapsed": round(now),
            "left": None if left is None else round(left),
            "hosts_done": len(done),
            "hosts_failed": len(finished) - len(done),
            "hosts_planned": len(planned),
            "fleet": fleet_line,
            "started": self.started,
            "ended": self.ended,
            "hosts": [
                {**asdict(r), "state": r.state, "fraction": _fraction(r), "cells": cells(r, now)}
                for r in rows
            ],
        }


_FIGURES = frozenset(
    {
        "sustained_s",
        "step",
        "steps",
        "elapsed",
        "level",
        "requests",
        "planned_requests",
        "errors",
        "tok_s",
        "baseline",
        "acceptance_rate",
        "level_elapsed",
        "level_seconds",
        "waited",
        "timeout",
        "concurrency",
        "bytes",
        "bytes_total",
        "layers",
        "layers_total",
    }
)


def _fraction(r: HostRow) -> float | None:
    """How far the host's current long phase has got (0..1), when its events say."""
    f = r.figures
    if f.get("layers_total"):
        if f.get("bytes_total"):
            return min(1.0, float(f.get("bytes") or 0) / float(f["bytes_total"]))
        return min(1.0, float(f.get("layers") or 0) / float(f["layers_total"]))
    if f.get("timeout") and "waited" in f and not f.get("steps"):
        return min(1.0, float(f["waited"]) / float(f["timeout"]))
    if f.get("steps"):
        within = 0.0
        if f.get("level_seconds") and f.get("level") == "sustained":
            within = min(1.0, float(f.get("level_elapsed") or 0) / float(f["level_seconds"]))
        elif f.get("planned_requests"):
            within = min(1.0, float(f.get("requests") or 0) / float(f["planned_requests"]))
        return min(1.0, (int(f["step"]) - 1 + within) / int(f["steps"]))
    return None


def time_left(rows: list[HostRow], now: float, parallel: int) -> float | None:
    """Seconds the run still needs: the plan's hosts not yet finished, ``parallel`` at a time, each
    taking the mean measured step (or, before any step has finished, what the busy hosts' progress
    implies);
    None when nothing has been measured yet."""
    steps = [
        r.finished - r.started for r in rows if r.started is not None and r.finished is not None
    ]
    busy = [r for r in rows if r.started is not None and r.finished is None]
    waiting = [r for r in rows if r.planned and r.started is None]
    if steps:
        per_step = sum(steps) / len(steps)
    else:
        guesses = []
        for r in busy:
            if r.phase != "soak" or r.started is None:
                continue
            so_far = now - r.started
            frac = _fraction(r)
            if frac and frac >= 0.05:
                guesses.append(so_far / frac)
            # The sustained phase is most of a soak: what is left of it bounds the step from below.
            sustained = r.figures.get("sustained_s")
            if sustained:
                done = (
                    float(r.figures.get("level_elapsed") or 0)
                    if r.figures.get("level") == "sustained"
                    else 0.0
                )
                guesses.append(so_far + max(0.0, float(sustained) - done))
        if not guesses:
            return None
        per_step = max(guesses)
    current = max((max(0.0, per_step - (now - (r.started or now))) for r in busy), default=0.0)
    return current + math.ceil(len(waiting) / max(1, parallel)) * per_step


def _bar(frac: float, cells: int = 5) -> str:
    full = round(frac * cells)
    return "█" * full + "░" * (cells - full)


def human_secs(s: float) -> str:
    """``41s``, ``2m03s``, ``1h05m``: a phase's or a run's time in a cell."""
    s = int(s)
    return (
        f"{s}s"
        if s < 100
        else f"{s // 60}m{s % 60:02d}s"
        if s < 3600
        else f"{s // 3600}h{s % 3600 // 60:02d}m"
    )


def progress_cell(r: HostRow, now: float, bar: bool = True) -> str:
    """A bar and its figure for the long phases: a pull ``██░░░ 8.1 GB/18.4 GB`` (then ``extracting
    3/7`` layers; its layers alone when the registry gave no sizes: ``3/7 layers``), readiness
    ``██░░░ 41/600s``, soak ``███░░ 7/9 2m03s``
    (phase 7 of 9), the sustained phase ``████░ 9/9 48/60s``; the phase's time otherwise. Without
    ``bar`` (a narrow terminal) the figures alone."""
    f = r.figures
    frac = _fraction(r)
    drawn = f"{_bar(frac)} " if bar and frac is not None else ""
    if frac is not None and f.get("layers_total"):
        layers = f"{f.get('layers', 0)}/{f['layers_total']}"
        if not f.get("bytes_total"):
            return f"{drawn}{layers} layers"
        if frac >= 1.0 and f.get("layers", 0) < f["layers_total"]:
            return f"{drawn}extracting {layers}"  # every byte is in; the layers are being unpacked
        done = human_bytes(float(f.get("bytes") or 0))
        return f"{drawn}{done}/{human_bytes(float(f['bytes_total']))}"
    if frac is not None and f.get("steps"):
        if f.get("level") == "sustained" and f.get("level_seconds"):
            figure = f"{f.get('level_elapsed', 0)}/{f['level_seconds']}s"
        else:
            figure = human_secs(float(f.get("elapsed") or 0))
        return f"{drawn}{f['step']}/{f['steps']} {figure}"
    if frac is not None:
        return f"{drawn}{f.get('waited', 0)}/{f['timeout']}s"
    if r.state == "busy":
        return human_secs(now - r.since)
    return ""


def message_cell(r: HostRow) -> str:
    """The phase's own words; while a level of the soak runs, its running figures in a fixed order
    (what matters at 3 a.m. first: errors, then tok/s against the baseline, then acceptance)."""
    f = r.figures
    if "planned_requests" in f and r.phase == "soak":
        # ``c=4 0/136 err 520 tok/s (100% base) acc 23%``: the level (a class's name first), errors
        # of the requests so far, throughput against the baseline's at the same level, acceptance.
        level = str(f.get("level") or "")
        conc = f"c={f['concurrency']}" if f.get("concurrency") else ""
        what = (
            level
            if level.startswith("c=")
            else conc
            if level == "sustained"
            else f"{level} {conc}".strip()
        )
        out = f"{what} {f.get('errors', 0)}/{f.get('requests', 0)} err"
        if f.get("tok_s") is not None:
            out += f" {float(f['tok_s']):.0f} tok/s"
            if f.get("baseline"):
                out += f" ({float(f['tok_s']) / float(f['baseline']):.0%} base)"
        if f.get("acceptance_rate") is not None:
            out += f" acc {float(f['acceptance_rate']):.0%}"
        return out
    return r.message


def cells(r: HostRow, now: float) -> dict[str, str]:
    """The row's cells by column name (the terminal table and the web page show the same);
    ``figures``:
    the progress without its bar, for a narrow terminal."""
    return {
        "host": r.host,
        "wave": r.wave,
        "phase": r.phase,
        "tag": short_tag(r.tag) if r.tag else "",
        "digest": short_digest(r.digest) if r.digest else "",
        "health": r.health,
        "progress": progress_cell(r, now),
        "figures": progress_cell(r, now, bar=False),
        "message": message_cell(r),
    }


def events_dir(state_dir: Path) -> Path:
    """Where runs leave their event logs (``fleetctl ui`` reads the newest)."""
    return state_dir / "events"


def replay(lines: Iterable[str], title: str, now: float | None = None) -> LiveModel:
    """A model folded from an event log's lines (a line cut short by a writer still writing is
    skipped).

    Its clock stands at ``now`` (seconds since the run started; default: its last event).
    ``started`` (epoch seconds) and ``ended`` are set from the log's first and last lines when it
    has them.
    """
    model = LiveModel(title)
    last = 0.0
    for line in lines:
        try:
            raw = json.loads(line)
            if "started" in raw:
                model.started = float(raw["started"])
                continue
            if raw.get("ended"):
                model.ended = True
                last = max(last, float(raw.get("t") or 0.0))
                continue
            if "phase" not in raw:
                continue
            t, event = event_from_json(raw)
        except (ValueError, TypeError, AttributeError):
            continue
        last = max(last, t)
        model.fold(event, t)
    at = last if now is None or model.ended else max(now, last)
    model.clock = lambda: at
    return model
