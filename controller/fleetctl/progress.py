"""Progress events: the core reports what it is doing, the CLI decides how to show it.

The core calls a :class:`Progress`; ``fleetctl.cli`` plugs in a rich display,
tests plug in :data:`NULL` (or a :class:`Recorder` to assert on events).
"""

from __future__ import annotations

import threading
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
