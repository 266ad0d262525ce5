"""Progress events: the core reports what it is doing, the CLI decides how to show it.

The core calls a :class:`Progress`; ``fleetctl.cli`` plugs in a rich display,
tests plug in :data:`NULL` (or a :class:`Recorder` to assert on events).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Event:
    """One thing that happened: on ``host`` (or fleet-wide when None), in ``phase``."""

    phase: str
    message: str = ""
    host: str | None = None
    #: Structured figures for displays (e.g. {"task": ..., "ok": 3}, {"bytes": 123}).
    data: dict[str, Any] = field(default_factory=dict)


class Progress(Protocol):
    """Anything that accepts events. Must be thread-safe: fan-outs call it from workers."""

    def __call__(self, event: Event) -> None: ...


def _null(event: Event) -> None:
    del event


#: A progress sink that discards everything.
NULL: Progress = _null


class Recorder:
    """Keeps every event, for tests."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def phases(self, host: str | None = None) -> list[str]:
        """The phases seen, in order, optionally for one host."""
        return [e.phase for e in self.events if host is None or e.host == host]


class Tee:
    """Every event to each of several sinks, in order."""

    def __init__(self, *sinks: Progress) -> None:
        self.sinks = sinks

    def __call__(self, event: Event) -> None:
        for sink in self.sinks:
            sink(event)


def event_json(event: Event, t: float) -> dict[str, Any]:
    """One event as a line of an event log: ``t`` (seconds since the run started), then its fields."""
    return {"t": round(t, 3), "phase": event.phase, "message": event.message, "host": event.host,
            "data": event.data}


def event_from_json(line: dict[str, Any]) -> tuple[float, Event]:
    """The inverse of :func:`event_json`."""
    return float(line.get("t") or 0.0), Event(str(line.get("phase") or ""), str(line.get("message") or ""),
                                              line.get("host"), dict(line.get("data") or {}))


class EventLog:
    """Appends every event as a JSON line to ``path`` (created 0600): what a second process (``fleetctl ui``)
    watches a run through. The first line says when the run started (``{"t": 0, "started": <epoch>}``), the
    last that it ended (``{"t": ..., "ended": true}``); a value JSON cannot hold is written as its text.
    Thread-safe."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._write({"t": 0.0, "started": round(time.time(), 3)})

    def _write(self, line: dict[str, Any]) -> None:
        text = json.dumps(line, default=str)
        with self._lock:
            if not self._file.closed:
                self._file.write(text + "\n")
                self._file.flush()

    def __call__(self, event: Event) -> None:
        self._write(event_json(event, time.monotonic() - self.t0))

    def close(self) -> None:
        self._write({"t": round(time.monotonic() - self.t0, 3), "ended": True})
        with self._lock:
            self._file.close()
