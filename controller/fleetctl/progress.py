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
from typing import Any, Protocol, TextIO


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


class Relay:
    """Every event to ``sink``, then to the listeners added since (a command's webhook, for its
    life)."""

    def __init__(self, sink: Progress) -> None:
        self.sink = sink
        self._listeners: tuple[Progress, ...] = ()
        self._lock = threading.Lock()

    def add(self, listener: Progress) -> None:
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def remove(self, listener: Progress) -> None:
        with self._lock:
            self._listeners = tuple(x for x in self._listeners if x is not listener)

    def __call__(self, event: Event) -> None:
        self.sink(event)
        for listener in self._listeners:
            listener(event)


def event_json(event: Event, t: float) -> dict[str, Any]:
    """One event as a line of an event log: ``t`` (seconds since the run started), then its
    fields."""
    return {"t": round(t, 3), "phase": event.phase, "message": event.message, "host": event.host,
            "data": event.data}


def event_from_json(line: dict[str, Any]) -> tuple[float, Event]:
    """The inverse of :func:`event_json`."""
    return float(line.get("t") or 0.0), Event(
        str(line.get("phase") or ""),
        str(line.get("message") or ""),
        line.get("host"),
        dict(line.get("data") or {}),
    )


#: The event stream's format: the first line's ``schema`` (a change a reader must know of raises
#: it).
SCHEMA = 1


class EventLog:
    """Appends every event as a JSON line to ``path`` (created 0600), or to ``stream`` (``--events
    -``): what a second process (``fleetctl ui``, a script) watches a run through. The first line
    says when the run started and what it is (``{"t": 0, "started": <epoch>, "schema": 1, "title":
    "rollout"}``), the last that it ended (``{"t": ..., "ended": true}``); a value JSON cannot hold
    is written as its text.
    Thread-safe."""

    def __init__(
        self, path: str | os.PathLike[str] | None, title: str = "", *, stream: TextIO | None = None
    ) -> None:
        self.path = os.fspath(path) if path is not None else None
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        if stream is not None:
            self._file, self._owned = stream, False
        else:
            assert self.path is not None
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            self._file, self._owned = os.fdopen(fd, "a", encoding="utf-8"), True
        self._closed = False
        self._write({"t": 0.0, "started": round(time.time(), 3), "schema": SCHEMA, "title": title})

    def _write(self, line: dict[str, Any]) -> None:
        text = json.dumps(line, default=str)
        with self._lock:
            if not self._closed:
                try:
                    self._file.write(text + "\n")
                    self._file.flush()
                except (OSError, ValueError):
                    # A reader that went away (``--events - | head``) ends the stream, never the
                    # run.
                    self._closed = True

    def __call__(self, event: Event) -> None:
        self._write(event_json(event, time.monotonic() - self.t0))

    def close(self) -> None:
        self._write({"t": round(time.monotonic() - self.t0, 3), "ended": True})
        with self._lock:
            self._closed = True
            if self._owned:
                self._file.close()
