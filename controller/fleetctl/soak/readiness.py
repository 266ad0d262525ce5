"""Readiness: ``/health`` within a deadline, the container watched while it loads; a container that
exits is a boot failure whose cause is read from its log."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

from fleetctl.container import Container
from fleetctl.errors import FleetError
from fleetctl.progress import NULL, Event, Progress
from fleetctl.soak import secrets
from fleetctl.soak.client import Client, Probe
from fleetctl.soak.verdict import (
    Outcome,
    Readiness,
    SoakTarget,
)

#: Log lines shown while waiting, and searched for a boot failure's cause.
LOG_TAIL = 40
#: Log lines searched for a crash's cause: every in-flight stream logs two generic lines
#: after the root cause, so at c=64 it sits well over 100 lines up.
CRASH_LOG_TAIL = 400


def boot_failure_cause(log: str) -> str:
    """The line of a container log that says why the server died ('' when none stands out).

    vLLM prints the root cause (``ValueError: max_num_scheduled_tokens is set to
    -512``, ``RuntimeError: block_table must have shape ...``) followed by generic
    lines (``EngineDeadError: ... See stack trace (above)``, ``Engine core died``):
    the last error line that is not one of the generic ones wins.
    """
    keys = ("Error", "ERROR", "Exception", "error:", "FATAL", "Fatal", "No valid", "Killed",
            "out of memory", "OOM")
    lines = [_strip_log_prefix(ln) for ln in log.splitlines() if ln.strip()]
    candidates = [ln for ln in lines if any(k in ln for k in keys)
                  and not ln.startswith(("Traceback", 'File "'))]
    for ln in reversed(candidates):
        if not any(g in ln for g in _GENERIC):
            return ln[:400]
    return candidates[-1][:400] if candidates else ""


#: Lines vLLM prints after the real cause; they name no cause themselves.
_GENERIC = (
    "EngineDeadError",
    "encountered a fatal error",
    "encountered an issue",
    "output_handler failed",
    "Error in chat completion stream generator",
    "Error in completion stream generator",
    "Engine core died",
    "shutting down",
    "Shutting down",
    "Engine core initialization failed",
    "See root cause above",
    "See stack trace",
    # uvicorn's access log of a request refused after the death ("POST ... 500").
    "Internal Server Error",
)
_LOG_PREFIX = re.compile(
    r"^(?:\([A-Za-z]+ pid=\d+\) )?(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) [\d-]+ [\d:]+ "
    r"\[[^\]]+\] "
)


def _strip_log_prefix(line: str) -> str:
    return _LOG_PREFIX.sub("", line.strip())


def log_tail(log: str, n: int = LOG_TAIL) -> str:
    return "\n".join(log.splitlines()[-n:])


def last_lines(log: str, n: int = 3) -> str:
    lines = [ln.rstrip() for ln in log.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[:300]




async def container_call(target: SoakTarget, fn: Callable[[SoakTarget], Any]) -> Any:
    # Container access is blocking (SSH): keep it off the event loop that is timing streams.
    return await asyncio.to_thread(fn, target)


async def container_state(target: SoakTarget) -> Container:
    assert target.container is not None
    st: Container = await container_call(
        target, lambda t: t.container.state())  # type: ignore[union-attr]
    return st


async def container_logs(target: SoakTarget, tail: int = LOG_TAIL) -> str:
    if target.container is None:
        return ""
    try:
        text: str = await container_call(target, lambda t: t.container.logs(tail))  # type: ignore[union-attr]
        return text
    except FleetError as e:
        return f"(container log unreadable: {e.cause})"


#: Seconds of /health connections accepted and never answered after which the server is called hung:
#: a vLLM still loading refuses connections (its HTTP server starts when the engine is ready).
HUNG_SECONDS = 60.0


def _health_404(target: SoakTarget, waited: float) -> Readiness:
    """/health answered 404: the URL is not a vLLM server's root (``.../v1``, a path, a query)."""
    path = target.base_url.split("://", 1)[-1].partition("/")[2]
    fix = ("give the server's root, not .../v1 (e.g. http://10.0.0.11:8000)"
           if path.rstrip("/").endswith("v1")
           else "give the vLLM server's root URL (e.g. http://10.0.0.11:8000)")
    return Readiness(Outcome.ERROR,
                     f"{target.base_url}/health answered HTTP 404: this URL is not a vLLM server's "
                     f"root, and waiting will not change that; {fix}", waited)


def _state_text(probe: Probe) -> str:
    """What a failed /health probe says: a hung answer named as such, a refusal as still loading."""
    if probe.state == "timeout":
        return f"hung: connection accepted, {probe.detail}"
    if probe.state == "refused":
        return f"not listening yet, still loading? ({probe.detail})"
    return probe.detail or f"HTTP {probe.status}"


async def _hung(target: SoakTarget, hung: float, waited: float) -> Readiness:
    """The wait's end when /health accepted connections for ``hung`` seconds and never answered."""
    msg = (f"{target.base_url}/health hangs: the server accepted every connection for "
           f"{hung:.0f}s and never answered (a vLLM still loading refuses connections "
           "instead)")
    if target.container is None:
        return Readiness(Outcome.ERROR, msg + "; check what listens on that port", waited)
    log = await container_logs(target, CRASH_LOG_TAIL)
    return Readiness(Outcome.FAIL, f"{msg}; last log lines: {last_lines(log)}", waited,
                     cause=boot_failure_cause(log), log_tail=log_tail(log))


async def _container_ended(target: SoakTarget, restarts: int | None, last_state: str,
                           waited: float) -> tuple[Readiness | None, int | None]:
    """The wait's end when the container is gone, unreadable or crashed at boot (else None), and
    its restart count as first seen."""
    try:
        st = await container_state(target)
    except FleetError as e:
        why = f"cannot inspect the container: {e.cause}"
        return Readiness(Outcome.ERROR, why, waited), restarts
    if not st.exists:
        return Readiness(
            Outcome.ERROR,
            f"nothing to soak: no container serves {target.base_url} ({last_state})",
            waited,
        ), restarts
    restarts = st.restart_count if restarts is None else restarts
    # Under a restart policy a crash at boot shows as a restart, the container up again.
    if st.running and st.restart_count <= restarts:
        return None, restarts
    log = await container_logs(target, CRASH_LOG_TAIL)
    cause = boot_failure_cause(log)
    code = f" with code {st.exit_code}" if st.exit_code is not None else ""
    again = (f" (docker restarted it {st.restart_count - restarts} time(s))"
             if st.restart_count > restarts else "")
    msg = f"boot failure: the container exited{code}{again} before /health answered"
    msg += f": {cause}" if cause else f"; last log lines: {last_lines(log)}"
    return Readiness(Outcome.FAIL, msg, waited, cause=cause, log_tail=log_tail(log)), restarts


async def await_ready(client: Client, target: SoakTarget, timeout: float, poll: float,
                      progress: Progress = NULL) -> Readiness:
    """Poll /health until 200, the container dies, or ``timeout`` passes (see :func:`wait_ready`).

    A 404 ends the wait at once (not a vLLM root URL); so do answers that hang (the connection
    accepted, nothing sent) for :data:`HUNG_SECONDS`: a server still loading refuses connections.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    last_log_at = -1e9
    tail = ""
    last_state = ""
    hung_since: float | None = None
    restarts: int | None = None  # the container's restart count when first seen
    while True:
        asked = time.monotonic()
        probe = await client.get("/health", timeout=min(10.0, max(poll * 4, 2.0)))
        waited = time.monotonic() - t0
        if probe.ok:
            return Readiness(Outcome.PASS, f"/health 200 after {waited:.0f}s", waited)
        if probe.state == "http" and probe.status == 404:
            return _health_404(target, waited)
        last_state = _state_text(probe)
        hung_since = (hung_since or asked) if probe.state == "timeout" else None
        if hung_since is not None and time.monotonic() - hung_since >= HUNG_SECONDS:
            return await _hung(target, time.monotonic() - hung_since, waited)
        if target.container is not None:
            ended, restarts = await _container_ended(target, restarts, last_state, waited)
            if ended is not None:
                return ended
            if time.monotonic() - last_log_at > 10:
                tail = last_lines(await container_logs(target, 5), 1)
                last_log_at = time.monotonic()
        # Whole 10 s steps in the message: line displays print a line per change, not per poll.
        progress(
            Event(
                "readiness",
                f"waiting for {target.base_url}/health ({last_state}), "
                f"{int(waited // 10 * 10)}s of {timeout:.0f}s" + (f"; log: {tail}" if tail else ""),
                host=target.name,
                data={"waited": round(waited), "timeout": round(timeout), "state": probe.state},
            )
        )
        if time.monotonic() + poll > deadline:
            break
        await asyncio.sleep(poll)
    waited = time.monotonic() - t0
    if target.container is not None:
        log = await container_logs(target, CRASH_LOG_TAIL)
        cause = boot_failure_cause(log)
        msg = (
            f"not healthy after {waited:.0f}s (readiness deadline {timeout:.0f}s; /health: "
            f"{last_state}); "
            f"the container runs but never became ready"
        )
        msg += f": {cause}" if cause else f"; last log lines: {last_lines(log)}"
        return Readiness(Outcome.FAIL, msg, waited, cause=cause, log_tail=log_tail(log))
    return Readiness(
        Outcome.ERROR,
        f"endpoint down: {target.base_url}/health gave no 200 in {waited:.0f}s ({last_state})",
        waited,
    )


def wait_ready(target: SoakTarget, timeout: float = 600.0, poll: float = 2.0,
               progress: Progress = NULL) -> Readiness:
    """Wait until ``target`` answers /health 200; the outcome says why it did not.

    ``pass``: ready. ``fail``: the container exited or never became healthy
    (the cause from its log in ``cause``). ``error``: nothing answers and there
    is no container to tell a slow boot from a dead endpoint.
    """

    scrub = secrets.Scrubber(secrets.known_secrets(target.api_key, target.base_url))
    target = secrets.scrubbed_target(target, scrub)
    progress = secrets.scrubbed_progress(progress, scrub)

    async def go() -> Readiness:
        async with Client(target.base_url, connections=4, api_key=target.api_key, scrub=scrub) as c:
            return await await_ready(c, target, timeout, poll, progress)

    return asyncio.run(go())
