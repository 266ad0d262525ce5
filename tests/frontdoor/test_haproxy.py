"""The HAProxy front door against a real haproxy on loopback, through its admin socket."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.frontdoor import DRAIN, READY, FrontDoorError, build
from fleetctl.frontdoor.drain import vllm_in_flight, wait_drained, wait_in_rotation
from fleetctl.frontdoor.haproxy import HAProxy
from fleetctl.inventory import Host
from tests.frontdoor.servers import Backend, loopback_pool

A, B = Host("spark-01", "127.0.0.1"), Host("spark-02", "127.0.0.1")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[HAProxy, dict[str, Backend], int]]:
    with loopback_pool(tmp_path, [A.name, B.name]) as pool:
        door = build({"type": "haproxy", "socket": str(pool.socket), "backend": "vllm"})
        assert isinstance(door, HAProxy)
        yield door, pool.backends, pool.port


def _state_column(door: HAProxy, server: str, column: str) -> str:
    return door.servers_state()[server][column]


def test_drain_sets_admin_state_8_and_ready_clears_it(
    fleet: tuple[HAProxy, dict[str, Backend], int],
) -> None:
    door, backends, port = fleet
    assert door.state(A).admin == READY and door.state(A).healthy is True
    door.drain(A)
    assert _state_column(door, "spark-01", "srv_admin_state") == "8"
    assert _state_column(door, "spark-02", "srv_admin_state") == "0"
    st = door.state(A)
    assert (st.admin, st.in_rotation) == (DRAIN, False)
    # No new request reaches the drained server.
    before = backends["spark-01"].served
    for _ in range(6):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200
    assert backends["spark-01"].served == before
    door.readmit(A)
    assert _state_column(door, "spark-01", "srv_admin_state") == "0"
    assert wait_in_rotation(door, A, 30).in_rotation


def test_in_flight_sessions_are_counted_and_the_drain_waits_for_them(
        fleet: tuple[HAProxy, dict[str, Backend], int]) -> None:
    door, backends, port = fleet
    door.drain(B)  # every new request goes to spark-01
    results: list[int] = []

    def hold() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hold", timeout=60) as r:
            results.append(r.status)

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    seen = wait_until(lambda: door.in_flight(A) == 3 and backends["spark-01"].running == 3)
    assert seen, f"in flight: door {door.in_flight(A)}, backend {backends['spark-01'].running}"
    door.drain(A)
    assert door.state(A).in_flight == 3
    vllm = lambda: vllm_in_flight(backends["spark-01"].url)  # noqa: E731
    left = wait_drained(door, A, vllm, timeout=0.5, poll=0.05)
    assert left.timed_out and left.door_left == 3 and left.vllm_left == 3 and left.leftover == 6
    threading.Timer(0.3, backends["spark-01"].release.set).start()
    done = wait_drained(door, A, vllm, timeout=30, poll=0.05)
    for t in threads:
        t.join(30)
    assert (done.timed_out, done.door_left, done.vllm_left) == (False, 0, 0)
    assert results == [200, 200, 200]
    door.readmit(A)
    door.readmit(B)
    assert wait_in_rotation(door, A, 30).in_rotation and wait_in_rotation(door, B, 30).in_rotation


def test_unknown_server_and_dead_socket_are_one_message(
    fleet: tuple[HAProxy, dict[str, Backend], int], tmp_path: Path
) -> None:
    door, _, _ = fleet
    ghost = Host("spark-09", "127.0.0.9")
    with pytest.raises(FrontDoorError) as e:
        door.drain(ghost)
    assert "spark-09" in e.value.message() and "servers" in e.value.message()
    assert door.state(ghost).admin == "absent"
    dead = HAProxy("vllm", socket_path=str(tmp_path / "nothing.sock"))
    with pytest.raises(FrontDoorError) as e:
        dead.drain(A)
    assert "nothing.sock" in e.value.message() and "level admin" in e.value.message()


def test_a_server_that_fails_its_check_is_unhealthy_to_the_door(
        fleet: tuple[HAProxy, dict[str, Backend], int]) -> None:
    door, backends, _ = fleet
    backends["spark-02"].close()
    assert wait_until(lambda: door.state(B).healthy is False)
    with pytest.raises(FrontDoorError) as e:
        wait_in_rotation(door, B, 0.5)
    assert "spark-02" in e.value.message() and "health check" in e.value.message()


def wait_until(cond: object, timeout: float = 30) -> bool:
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(cond) and cond():
            return True
        time.sleep(0.05)
    return False
