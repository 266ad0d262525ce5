"""Long runs that end early on SIGINT or SIGTERM with what they saw so far.

``fleetctl watch`` runs for hours; an operator's Ctrl-C, systemd stopping its unit or a CI job's
time limit must not lose the verdicts of the time it watched. The first signal asks the run to
stop: the work in flight (a probe, a remediation: a rollback is never cut in the middle) finishes,
and the run writes its verdicts as at its end. A second signal interrupts at once, as without the
handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

from fleetctl.progress import Event, Progress

#: The signals that ask a run to stop.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_on_signals(progress: Progress, what: str) -> Iterator[asyncio.Event]:
    """Inside a running event loop: an event the first SIGINT or SIGTERM sets (said through
    ``progress``, with ``what`` the run then does). The handlers are removed at the first signal
    and on exit. Outside the main thread (no signal handlers there) the event is never set."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed: list[signal.Signals] = []

    def remove() -> None:
        while installed:
            loop.remove_signal_handler(installed.pop())

    def on_signal(sig: signal.Signals) -> None:
        remove()  # a second signal: its default action
        progress(Event("stopping", f"{sig.name}: {what} (again to interrupt at once)"))
        stop.set()

    for sig in SIGNALS:
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
            break
        installed.append(sig)
    try:
        yield stop
    finally:
        remove()
