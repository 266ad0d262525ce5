"""fleetctl.ssh: a connection whose close hangs must not hang the controller."""

from __future__ import annotations

import threading

import paramiko

from fleetctl import ssh


class _StuckClient(paramiko.SSHClient):
    """A client whose close blocks until released, as paramiko's can in Channel._unlink."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.closed = threading.Event()

    def close(self) -> None:
        self.release.wait()
        self.closed.set()


def test_a_stuck_close_is_abandoned_and_the_others_still_close() -> None:
    stuck, fine = _StuckClient(), _StuckClient()
    fine.release.set()
    ssh._close_bounded([stuck, fine], timeout=0.2)
    # Returned although one close never finished; the other one did close.
    assert fine.closed.is_set()
    assert not stuck.closed.is_set()
    stuck.release.set()
    assert stuck.closed.wait(5)
