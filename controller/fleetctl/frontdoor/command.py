"""A front door driven by a shell command: for anything fleetctl has no backend for (nginx upstream
edits and a reload, a cloud load balancer's CLI).

The command runs on the controller (``/bin/sh -c COMMAND``) with these environment variables:

- ``FLEETCTL_FD_ACTION``: ``drain``, ``readmit``, ``in-flight`` or ``state``;
- ``FLEETCTL_FD_HOST``: the host's inventory name; ``FLEETCTL_FD_ADDRESS``: its address
  (``ansible_host``).

Exit status 0 is success; anything else is the door's refusal (its stderr is in the message).
``in-flight`` prints a whole number (or nothing: the door cannot tell); ``state`` prints one line,
``ready``, ``drain`` or ``maint``, optionally followed by ``healthy`` or ``unhealthy``
(nothing: the command does not track state). Each run is bounded by ``timeout`` seconds.
"""

from __future__ import annotations

import os
import subprocess

from fleetctl.frontdoor import DRAIN, MAINT, READY, DoorState, Drained, FrontDoorError, Settings
from fleetctl.inventory import Host

ACTIONS = ("drain", "readmit", "in-flight", "state")


class CommandHook:
    """The front door as a shell command."""

    kind = "command"

    def __init__(self, command: str, timeout: float = 30.0) -> None:
        self.command, self.timeout = command, timeout

    def run(self, host: Host, action: str) -> str:
        env = {**os.environ, "FLEETCTL_FD_ACTION": action, "FLEETCTL_FD_HOST": host.name,
               "FLEETCTL_FD_ADDRESS": host.address}
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", self.command],
                env=env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise FrontDoorError(
                f"the front door's command did not finish {action} within {self.timeout:.0f}s",
                host=host.name,
                fix="make fleetctl_front_door.command return sooner, or raise "
                "fleetctl_front_door.timeout",
            ) from None
        if done.returncode != 0:
            err = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1][:300]
            raise FrontDoorError(
                f"the front door's command failed {action} (exit {done.returncode}): {err}",
                host=host.name,
                fix="run it by hand with FLEETCTL_FD_ACTION, FLEETCTL_FD_HOST and "
                "FLEETCTL_FD_ADDRESS set (see docs/frontdoor.md)",
            )
        return done.stdout.strip()

    def drain(self, host: Host) -> Drained:
        self.run(host, "drain")
        return Drained(host.name)

    def readmit(self, host: Host, drained: Drained | None = None) -> None:
        self.run(host, "readmit")

    def in_flight(self, host: Host) -> int | None:
        out = self.run(host, "in-flight")
        if not out:
            return None
        if not out.isdigit():
            raise FrontDoorError(
                f"the front door's command printed {out[:80]!r} for in-flight, not a whole number",
                host=host.name,
                fix="print the number of requests open to the host, or nothing",
            )
        return int(out)

    def state(self, host: Host) -> DoorState:
        out = self.run(host, "state")
        if not out:
            return DoorState(host.name, "unknown", None, None, "the command does not report state")
        words = out.split()
        admin = words[0]
        if admin not in (READY, DRAIN, MAINT):
            raise FrontDoorError(
                f"the front door's command printed {out[:80]!r} for state",
                host=host.name,
                fix="print ready, drain or maint, then optionally healthy or unhealthy",
            )
        healthy = {"healthy": True, "unhealthy": False}.get(words[1]) if len(words) > 1 else None
        return DoorState(host.name, admin, healthy, None, out[:120])


def from_settings(s: Settings) -> CommandHook:
    cmd = s.text(
        "command", '\'/usr/local/bin/lb-pool "$FLEETCTL_FD_ACTION" "$FLEETCTL_FD_ADDRESS"\''
    )
    assert cmd is not None
    return CommandHook(cmd, s.number("timeout", 30.0, "30"))
