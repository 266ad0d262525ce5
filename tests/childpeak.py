"""A piece of Python run in a child process, with its own peak RSS and its seconds: for the tests
that bound what hostile input may cost the controller.

The peak is the child's VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over exec, so a
child of a grown pytest worker would report the worker's peak. The child's address space is
capped (``RLIMIT_AS``), so code that would grow without bound fails there with MemoryError
instead of taking the machine's memory.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

#: The child's address-space cap: far above any bound a test asserts, far below the machine.
ADDRESS_SPACE = 3 << 30

_EPILOGUE = textwrap.dedent("""
    import atexit as _atexit, sys as _sys

    def _peak() -> None:
        hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
        _sys.stdout.write("\\nPEAK_RSS_MB %d\\n" % (int(hwm.split()[1]) // 1024))
        _sys.stdout.flush()

    _atexit.register(_peak)
""")


@dataclass(frozen=True)
class Child:
    """What the child printed, how it ended, its peak RSS (MB) and its seconds."""

    rc: int
    stdout: str
    stderr: str
    peak_mb: int
    seconds: float


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_child(code: str, *args: str, timeout: float = 120, env: dict[str, str] | None = None
              ) -> Child:
    """Run ``code`` (with ``args`` as sys.argv[1:]) in a fresh interpreter; raises
    subprocess.TimeoutExpired past ``timeout`` (the child is killed)."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _EPILOGUE + textwrap.dedent(code), *args],
                       capture_output=True, text=True, timeout=timeout, preexec_fn=_cap, env=env)
    took = time.monotonic() - t0
    out, _, peak = r.stdout.rpartition("PEAK_RSS_MB")
    return Child(r.returncode, out, r.stderr, int(peak) if peak.strip() else -1, took)


#: ``fleetctl ARGV...`` as the installed command runs it (exit code as the child's).
FLEETCTL = """
    import sys
    from fleetctl.cli.main import main
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.exit(code)
"""
