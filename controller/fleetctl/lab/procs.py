"""Background processes the lab starts (its dockerd, registry, HTTP server), tracked by pid files.

A pid file alone can lie after a reboot (the pid is reused), so a process is
only taken for ours when its command line still names the lab's directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fleetctl.errors import FleetError


def read_pid(pidfile: Path, marker: str) -> int | None:
    """The pid in ``pidfile`` if that process is alive and its command line contains ``marker``."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        cmdline = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return None
    return pid if marker in cmdline else None


def spawn(argv: Sequence[str], pidfile: Path, log: Path, env: dict[str, str] | None = None) -> int:
    """Start ``argv`` detached (own session, so it outlives this command) and record its pid."""
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            list(argv), stdin=devnull, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env=env, close_fds=True,
        )
    pidfile.write_text(f"{proc.pid}\n")
    return proc.pid


def wait_until(check: Callable[[], bool], timeout: float, what: str, fix: str,
               alive: Callable[[], bool] | None = None, interval: float = 0.2) -> None:
    """Poll ``check`` until true; a FleetError naming ``what`` after ``timeout`` or if ``alive``
    turns false."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if alive is not None and not alive():
            raise FleetError(f"{what}: the process exited", fix=fix)
        if time.monotonic() > deadline:
            raise FleetError(f"{what}: not ready after {timeout:.0f}s", fix=fix)
        time.sleep(interval)


def stop(pidfile: Path, marker: str, timeout: float = 30.0) -> bool:
    """Stop the process of ``pidfile`` (TERM, then KILL after ``timeout``); True if one was
    running."""
    pid = read_pid(pidfile, marker)
    if pid is None:
        pidfile.unlink(missing_ok=True)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while alive(pid):
            time.sleep(0.05)
    pidfile.unlink(missing_ok=True)
    return True


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (a zombie child is reaped)."""
    # A zombie (our own child not yet reaped) counts as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def processes_under(marker: str) -> list[tuple[int, str]]:
    """Every process whose command line contains ``marker`` (to check that ``down`` left none)."""
    out: list[tuple[int, str]] = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if marker in cmd:
            out.append((int(d.name), cmd))
    return out
