"""Waiting for a drained host's requests to finish, and for a re-admitted host to be seen healthy.

A drained host still answers the requests the door sent before the drain. They are finished when
both counts are 0: the door's own (HAProxy's sessions to the server; None when the door cannot
count) and vLLM's ``vllm:num_requests_running`` + ``vllm:num_requests_waiting`` from the host's
/metrics (requests that reached the server by any path). The wait is bounded by ``drain_timeout``:
what is left then is counted and reported, and the step goes on (the stop then cuts those requests).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from fleetctl.frontdoor import DoorState, FrontDoor, FrontDoorError
from fleetctl.inventory import Host

#: vLLM's gauges of requests it holds (docs/domain.md: /metrics).
VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


@dataclass(frozen=True)
class DrainWait:
    """How the wait for in-flight requests ended."""

    seconds: float
    #: Requests still open when the wait ended (0 and 0 unless it timed out); None: could not be
    #: read.
    door_left: int | None
    vllm_left: int | None
    timed_out: bool

    @property
    def leftover(self) -> int:
        return (self.door_left or 0) + (self.vllm_left or 0)

    def to_dict(self) -> dict[str, object]:
        return {
            "seconds": round(self.seconds, 3),
            "door_left": self.door_left,
            "vllm_left": self.vllm_left,
            "timed_out": self.timed_out,
        }


def vllm_in_flight(base_url: str, timeout: float = 5.0) -> int | None:
    """Running + waiting requests from vLLM's /metrics at ``base_url`` (None: nothing answers
    there)."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as r:
            text = r.read().decode(errors="replace")
    except (OSError, ValueError):
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(VLLM_GAUGES):
            try:
                total += float(line.rsplit(None, 1)[1])
            except (IndexError, ValueError):
                continue
    return int(total)


def wait_drained(door: FrontDoor, host: Host, vllm: Callable[[], int | None], timeout: float,
                 poll: float = 0.2, clock: Callable[[], float] = time.monotonic) -> DrainWait:
    """Poll both counts until they are 0 or ``timeout`` seconds have passed."""
    t0 = clock()
    while True:
        door_n = door.in_flight(host)
        vllm_n = vllm()
        if not door_n and not vllm_n:
            return DrainWait(clock() - t0, door_n, vllm_n, False)
        if clock() - t0 >= timeout:
            return DrainWait(clock() - t0, door_n, vllm_n, True)
        time.sleep(poll)


def wait_in_rotation(door: FrontDoor, host: Host, timeout: float, poll: float = 0.2) -> DoorState:
    """Poll the door until it has ``host`` in rotation and not unhealthy; the last state if not
    within ``timeout``.

    Raises FrontDoorError when the door still does not see the host healthy after ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        st = door.state(host)
        # "unknown": a command hook that does not track state; its re-admission's exit status is
        # the answer.
        if st.admin in ("ready", "unknown") and st.healthy is not False:
            return st
        if time.monotonic() >= deadline:
            raise FrontDoorError(
                f"the {door.kind} front door does not see the host in rotation and healthy "
                f"{timeout:.0f}s after its re-admission: {st.admin}, {st.detail}",
                host=host.name,
                fix="look at the door's health check of this host (its address and port, "
                "the check's path); `fleetctl status` shows the door's view",
            )
        time.sleep(poll)
