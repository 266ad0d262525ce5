"""A lock holder's identity on this machine: a pid is only an identity together with its start time.

Both locks fleetctl takes (the fleet's lock in the ledger, ``state.ledger``, and each host's lock in
its state file, ``state.hoststate``) record the holder's pid and its start time, so that a lock
left by a killed controller on this machine is told apart from one held by a live process that
happens to reuse the pid.
"""

from __future__ import annotations

from pathlib import Path


def proc_start(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" if no such process): pid + this =
    identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # Field 22, counted after the ")" that closes the command name (which may hold spaces).
    return stat.rsplit(")", 1)[1].split()[19]
