"""The lab's wedge faults on a running server: its engine stops producing tokens while /health and
/metrics keep answering (the engine that answers 200 for days while serving nothing).

Driven from outside the process, so that a restart of the container is what heals it, as on a real
Spark (``fleetctl lab node NAME --wedge``, ``--unwedge``, ``--wedge-after-start S``):

- ``SIGUSR1``: wedge now. Requests are still accepted; streams in progress stop after their last
  token and stay open; new ones never get a first token.
- ``SIGUSR2``: unwedge (what was waiting goes on) and forget the wedge after start (its file too).
- ``SIGHUP``: read :data:`AFTER_START_FILE` again. When the file holds S, the engine wedges S
  seconds after it became ready, on this start (S seconds from the signal) and on every later start
  of the same container: docker keeps a container's own filesystem across ``docker kill`` and
  ``docker start``, while a rollback's other container has no such file.

A signal before the engine exists (still loading) is kept and applied once it does. A headless
worker ignores them (its head is the one that wedges).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from typing import Any

#: In the serving container's own filesystem: seconds after ready at which the engine wedges
#: (``EMU_WEDGE_AFTER_START_FILE`` names another, for emulators side by side on loopback).
AFTER_START_FILE = "/var/tmp/fleetctl-lab-wedge-after-start"


def after_start_seconds(path: str = AFTER_START_FILE) -> float | None:
    """The wedge-after-start delay the file holds, or None (no file, or not a number)."""
    try:
        with open(path, encoding="utf-8") as f:
            value = float(f.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


class Switch:
    """The wedge of one process: set by signals, applied to the engine once there is one."""

    def __init__(self, log: Callable[[str], None], path: str | None = None) -> None:
        self.log = log
        self.path = path or os.environ.get("EMU_WEDGE_AFTER_START_FILE") or AFTER_START_FILE
        self.engine: Any = None
        self.wedged = False
        self._timer: asyncio.TimerHandle | None = None

    def install(self) -> None:
        """Handle SIGUSR1, SIGUSR2 and SIGHUP in the running loop."""
        loop = asyncio.get_running_loop()
        for sig, fn in ((signal.SIGUSR1, self.wedge), (signal.SIGUSR2, self.unwedge),
                        (signal.SIGHUP, self.rearm)):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, fn)

    def attach(self, engine: Any) -> None:
        """The engine is ready: apply a wedge signalled while it loaded, and arm the wedge after
        start."""
        self.engine = engine
        if self.wedged:
            self.wedge()
        self.rearm()

    def rearm(self) -> None:
        """Schedule the wedge after start from the file (none: any scheduled one is cancelled)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        seconds = after_start_seconds(self.path)
        if seconds is None or self.engine is None:
            return
        self._timer = asyncio.get_running_loop().call_later(seconds, self.wedge)

    def wedge(self) -> None:
        """Stop producing tokens (requests accepted, /health 200)."""
        self.wedged = True
        if self.engine is not None and not self.engine.wedged:
            self.engine.wedged = True
            self.log("ERROR [core.py:720] EngineCore stopped producing tokens (no step completes); "
                     "the API server keeps answering")

    def unwedge(self) -> None:
        """Produce tokens again, and drop the wedge after start (its file removed)."""
        self.wedged = False
        with contextlib.suppress(OSError):
            os.remove(self.path)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.engine is not None and self.engine.wedged:
            self.engine.wedged = False
            self.log("INFO [core.py:720] EngineCore steps again")
