"""One call per host in parallel with bounded waits: each host's outcome, failures as data."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

from fleetctl.errors import FleetError, HostUnreachable
from fleetctl.inventory import Host

T = TypeVar("T")



@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One host's result in a fan-out: a value, or the error that stopped it."""

    host: str
    value: T | None = None
    error: FleetError | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the host produced a value."""
        return self.error is None


#: Hosts a fan-out talks to at once by default: each is a thread and an SSH session (a few ms of
#: controller CPU per command); 32 keeps 2 cores busy without queueing the GIL behind hundreds.
FAN_OUT_WORKERS = 32


def fan_out(hosts: Iterable[Host], fn: Callable[[Host], T], timeout: float | None = None,
            max_workers: int = FAN_OUT_WORKERS) -> dict[str, Outcome[T]]:
    """Call ``fn(host)`` for every host, ``max_workers`` at once; failures are data, not exceptions.

    Each host has ``timeout`` seconds from its own start (a host queued behind busy
    workers has used none of it, so a fleet larger than the pool is not cut short). A
    host still running after its ``timeout`` is reported as unreachable and never
    delays the others' results; hosts that cannot start because every worker is held
    by such a host are reported as not started.
    """
    hosts = list(hosts)
    out: dict[str, Outcome[T]] = {}
    if not hosts:
        return out
    workers = min(max_workers, len(hosts))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleetctl-ssh")
    starts: dict[str, float] = {}

    def call(h: Host) -> T:
        starts[h.name] = time.monotonic()
        return fn(h)

    futures = {pool.submit(call, h): h for h in hosts}
    late, waiting = _wait(futures, starts, timeout, workers)
    for f, h in futures.items():
        took = time.monotonic() - starts.get(h.name, time.monotonic())
        if f in late:
            out[h.name] = Outcome(
                h.name,
                error=HostUnreachable(
                    f"no answer within {timeout:.0f}s",
                    host=h.name,
                    fix="check the host; it is reported as unreachable and left as it is",
                ),
                seconds=took,
            )
        elif f in waiting:
            out[h.name] = Outcome(h.name, error=HostUnreachable(
                f"not started: all {workers} workers were held by hosts that did not answer within "
                f"{timeout:.0f}s", host=h.name,
                fix="retry without the hosts reported unreachable (--limit '!NAME')"))
        else:
            out[h.name] = _finished(h, f, took)
    pool.shutdown(wait=False, cancel_futures=True)
    return {h.name: out[h.name] for h in hosts}


def _wait(futures: Mapping[Future[T], Host], starts: Mapping[str, float], timeout: float | None,
          workers: int) -> tuple[set[Future[T]], set[Future[T]]]:
    """Wait for the calls: (those still running past their host's ``timeout``, those never
    started because every worker was held by such a host)."""
    waiting = set(futures)
    late: set[Future[T]] = set()
    if timeout is None:
        wait(waiting)
        return late, set()
    while waiting:
        now = time.monotonic()
        for f in waiting:
            s = starts.get(futures[f].name)
            if s is not None and now - s >= timeout and not f.done():
                late.add(f)
        waiting -= late
        if not waiting or sum(1 for f in late if not f.done()) >= workers:
            break  # every worker is held by a host that did not answer: the rest cannot start
        deadlines = [s + timeout for f in waiting if (s := starts.get(futures[f].name)) is not None]
        nap = max(0.01, min(deadlines) - now) if deadlines else timeout
        done, _ = wait(waiting, timeout=nap, return_when=FIRST_COMPLETED)
        waiting -= done
    return late, waiting


def _finished(h: Host, f: Future[T], took: float) -> Outcome[T]:
    """The outcome of a call that returned or raised: a FleetError as it is, anything else named."""
    exc = f.exception()
    if exc is None:
        return Outcome(h.name, value=f.result(), seconds=took)
    if isinstance(exc, FleetError):
        return Outcome(h.name, error=exc, seconds=took)
    error = FleetError(f"{type(exc).__name__}: {exc}", host=h.name)
    return Outcome(h.name, error=error, seconds=took)
