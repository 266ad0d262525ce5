"""The hosts' lock and intent (fleetctl.state.hoststate): claim rules, all-or-nothing, CAS, the
file format.

The files live in memory here (a Store with the same compare-and-swap contract
as the hosts'); the SSH store on real hosts is covered by
tests/rollout/test_recovery_lab.py.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest

from fleetctl.errors import ExitCode, FleetError, LockedError
from fleetctl.inventory import Host
from fleetctl.state import hoststate, lock


class MemoryStore(hoststate.MemoryStore):
    """The in-memory store, able to let "another controller" write between a read and the next
    swap."""

    def __init__(self) -> None:
        super().__init__()
        self.between: dict[str, str] = {}

    def swap(self, host: Host, expect: str, text: str) -> bool:
        if host.name in self.between:
            self.files[host.name] = self.between.pop(host.name)
        return super().swap(host, expect, text)

    def state(self, name: str) -> hoststate.HostState:
        return hoststate.HostState.from_json(self.files.get(name, ""), name)


HOSTS = [Host(f"spark-{i}", f"10.0.0.{i}") for i in range(1, 5)]


def other_owner(
    *, controller: str = "laptop", pid: int = 4242, heartbeat: float | None = None
) -> hoststate.Owner:
    now = time.time()
    return hoststate.Owner(
        "ro-20260701-120000-beef",
        "rollout",
        controller,
        "bob",
        pid,
        "1",
        now - 600,
        now if heartbeat is None else heartbeat,
    )


def dead_local_pid() -> int:
    """The pid of a process that has exited (so its /proc entry is gone)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_state_round_trips_and_a_damaged_file_names_its_fix() -> None:
    s = hoststate.HostState(
        lock=other_owner(),
        target=hoststate.Version("t2", "sha256:b", "ro-x", 2.0),
        last_known_good=hoststate.Version("t1", "sha256:a", None, 1.0),
    )
    assert hoststate.HostState.from_json(s.to_json()) == s
    assert hoststate.HostState.from_json("") == hoststate.HostState()
    with pytest.raises(FleetError) as e:
        hoststate.HostState.from_json("{not json", "spark-3")
    assert e.value.host == "spark-3" and e.value.fix and "move it away" in e.value.fix


def test_a_live_holder_on_another_controller_is_refused_even_with_take_over() -> None:
    mine = hoststate.me("ro-mine", "rollout")
    with pytest.raises(LockedError) as e:
        hoststate.claim_state(
            "spark-1", hoststate.HostState(lock=other_owner()), mine, time.time(), take_over=True
        )
    assert e.value.exit_code == ExitCode.LOCKED
    assert e.value.host == "spark-1"
    assert "ro-20260701-120000-beef by bob@laptop (pid 4242)" in e.value.cause


def test_a_silent_remote_holder_needs_take_over() -> None:
    mine = hoststate.me("ro-mine", "rollout")
    stale = hoststate.HostState(lock=other_owner(heartbeat=time.time() - hoststate.STALE_AFTER - 5),
                         last_known_good=hoststate.Version("t1", "sha256:a"))
    with pytest.raises(LockedError) as e:
        hoststate.claim_state("spark-1", stale, mine, time.time(), take_over=False)
    assert "heartbeat is" in e.value.cause and e.value.fix == hoststate.TAKE_OVER_FIX
    new, note = hoststate.claim_state("spark-1", stale, mine, time.time(), take_over=True)
    assert new.lock is not None and new.lock.same_process(mine)
    assert note is not None and "took over" in note and "bob@laptop" in note
    assert new.last_known_good == stale.last_known_good


def test_a_dead_pid_on_this_controller_is_taken_over_without_asking() -> None:
    mine = hoststate.me("ro-mine", "rollout")
    dead = dataclasses.replace(
        mine, rollout_id="ro-killed", pid=dead_local_pid(), proc_start="12345"
    )
    new, note = hoststate.claim_state(
        "spark-1", hoststate.HostState(lock=dead), mine, time.time(), take_over=False
    )
    assert new.lock is not None and new.lock.rollout_id == "ro-mine"
    assert note is not None and "is gone" in note


def test_a_live_process_on_this_controller_is_refused() -> None:
    """Two checkouts (separate state dirs) on one machine: the other process is alive, so
    refused."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine = hoststate.me("ro-mine", "rollout")
        theirs = dataclasses.replace(hoststate.me("ro-theirs", "rollback"), pid=other.pid,
                                     proc_start=lock.proc_start(other.pid))
        with pytest.raises(LockedError):
            hoststate.claim_state(
                "spark-1", hoststate.HostState(lock=theirs), mine, time.time(), take_over=True
            )
    finally:
        other.kill()
        other.wait()


def test_claim_is_all_or_nothing() -> None:
    store = MemoryStore()
    lkg = hoststate.Version("t1", "sha256:a")
    store.files["spark-3"] = hoststate.HostState(lock=other_owner(), last_known_good=lkg).to_json()
    store.files["spark-1"] = hoststate.HostState(last_known_good=lkg).to_json()
    before = dict(store.files)
    locks = hoststate.HostLocks(store, HOSTS, "ro-mine", "rollout")
    with pytest.raises(LockedError) as e:
        locks.claim()
    assert e.value.host == "spark-3" and "nothing was changed" in e.value.cause
    assert e.value.exit_code == ExitCode.LOCKED
    # Every host as it was: the ones claimed meanwhile were released, their other fields kept.
    for h in HOSTS:
        assert store.state(h.name) == hoststate.HostState.from_json(before.get(h.name, ""))
    assert locks.held == []


def test_claim_release_and_record_intent() -> None:
    store = MemoryStore()
    locks = hoststate.HostLocks(store, HOSTS, "ro-mine", "rollout")
    locks.claim()
    try:
        assert all(
            (s := store.state(h.name).lock) is not None and s.rollout_id == "ro-mine" for h in HOSTS
        )
        a, b = hoststate.Version("t1", "sha256:a"), hoststate.Version("t2", "sha256:b", "ro-mine")
        store.files["spark-2"] = dataclasses.replace(
            store.state("spark-2"), last_known_good=a
        ).to_json()
        locks.seed({h.name: (b, hoststate.Version("t0", "sha256:0")) for h in HOSTS})
        # Seeding records what served before fleetctl came only where nothing is recorded yet.
        assert store.state("spark-1").last_known_good == hoststate.Version("t0", "sha256:0")
        assert store.state("spark-2").last_known_good == a
        assert store.state("spark-2").target == b
        locks.record("spark-2", last_known_good=b)
        assert store.state("spark-2").last_known_good == b
        # A second controller is refused while held.
        with pytest.raises(LockedError):
            hoststate.HostLocks(store, HOSTS[:1], "ro-second", "rollback", take_over=True).claim()
    finally:
        locks.release()
    assert all(store.state(h.name).lock is None for h in HOSTS)
    assert store.state("spark-2").last_known_good == hoststate.Version("t2", "sha256:b", "ro-mine")


def test_release_leaves_a_lock_taken_over_meanwhile() -> None:
    store = MemoryStore()
    locks = hoststate.HostLocks(store, HOSTS[:1], "ro-mine", "rollout")
    locks.claim()
    thief = other_owner()
    store.files["spark-1"] = hoststate.HostState(lock=thief).to_json()
    locks.release()
    assert store.state("spark-1").lock == thief


def test_a_write_that_lost_a_race_is_redone_on_the_new_content() -> None:
    """Compare-and-swap: another controller's write between our read and our swap is not
    overwritten."""
    store = MemoryStore()
    store.between["spark-1"] = hoststate.HostState(lock=other_owner()).to_json()
    with pytest.raises(LockedError) as e:
        hoststate.HostLocks(store, HOSTS[:1], "ro-mine", "rollout").claim()
    assert "bob@laptop" in e.value.cause
    held = store.state("spark-1").lock
    assert held is not None and (held.rollout_id, held.user) == ("ro-20260701-120000-beef", "bob")


def test_a_lock_this_process_left_behind_is_taken_over() -> None:
    """A release that could not reach a host leaves this process's lock there: not a live holder."""
    store = MemoryStore()
    store.files["spark-1"] = hoststate.HostState(
        lock=hoststate.me("ro-earlier", "rollout")
    ).to_json()
    locks = hoststate.HostLocks(store, HOSTS[:1], "ro-mine", "rollout")
    locks.claim()
    try:
        held = store.state("spark-1").lock
        assert held is not None and held.rollout_id == "ro-mine"
    finally:
        locks.release()


def test_proc_identity_is_this_process() -> None:
    mine = hoststate.me("ro-x", "rollout")
    assert mine.pid == os.getpid() and mine.proc_start
