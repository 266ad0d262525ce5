"""Issue 9's recovery paths on the lab, each checked over SSH by image ID (never by fleetctl's own
labels).

* two controllers with separate state dirs on one fleet: the hosts' own lock refuses the second
  (exit 4, naming the host and the holder), and a dead one's lock is taken over;
* a host whose dockerd restarts (as at a reboot) serves its version again, and the containers
  fleetctl stopped or killed stay down.

``rollback --to`` an image whose entrypoint exits 1 (every host left as it was, the cause named) and
``rollback`` after a rollout that failed on its canary (the others reported skipped, already there)
were here too: they are the engine's and run on the simulated fleet
(tests/rollout/test_gates_sim.py,
tests/rollout/test_recovery_harness.py); the cause read from a real container's log on a lab node is
tests/soak/test_lab.py's, a canary failing its gate on real nodes
tests/rollout/test_rollout_lab.py's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, ssh
from fleetctl.rollout import host as remote
from fleetctl.rollout.results import RolloutResult
from fleetctl.state import hoststate
from tests.plugins.serving import serve
from tests.rollout.test_rollout_lab import (
    FLEETCTL,
    NEW,
    OLD,
    real_state,
    serving_tag,
)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module", autouse=True)
def own_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This module's own ledger: the rollback below must act on this module's rollouts only."""
    d = tmp_path_factory.mktemp("recovery-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEETCTL_STATE_DIR", str(d))
        yield d


@pytest.fixture
def at_old(serving: RolloutResult) -> Iterator[dict[str, dict[str, Any]]]:
    """The fleet serving v0.23.0 (put back afterwards, whatever the test left)."""
    del serving
    serve(OLD)
    before = real_state()
    assert all(serving_tag(OLD).values()), before
    yield before
    serve(OLD)


def env_for(state_dir: Path) -> dict[str, str]:
    return {**os.environ, "FLEETCTL_STATE_DIR": str(state_dir)}


def host_states() -> dict[str, hoststate.HostState]:
    inv = inventory.load(None)
    return hoststate.read_all(hoststate.OpsStore(remote.SshHostOps), list(inv.hosts.values()))


def unchanged(before: dict[str, dict[str, Any]]) -> None:
    """Every node still runs the very container it ran (same ID, never restarted)."""
    after = real_state()
    for n, b in before.items():
        assert after[n]["running"] and (after[n]["id"], after[n]["started"]) == (
            b["id"],
            b["started"],
        ), (n, after[n])


def test_two_controllers_with_separate_state_dirs_cannot_race(
        at_old: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    a_dir, b_dir = tmp_path / "operator-a", tmp_path / "operator-b"
    # A: a rollback to v0.24.0, one host at a time (pull, start, readiness, smoke: seconds each),
    # so that it holds the hosts long enough (a rollback to what already serves skips every host at
    # once).
    a = subprocess.Popen(
        [FLEETCTL, "rollback", "--to", NEW, "--yes", "--max-unavailable", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(a_dir),
    )
    try:
        deadline = time.monotonic() + 120
        held: dict[str, hoststate.HostState] = {}
        while time.monotonic() < deadline and a.poll() is None:
            held = host_states()
            if held and all(s.lock is not None and s.lock.pid == a.pid for s in held.values()):
                break
            time.sleep(0.2)
        assert held and all(s.lock is not None and s.lock.pid == a.pid for s in held.values()), held
        # B: another ledger, so its own lock is free; the hosts refuse it.
        b = subprocess.run(
            [FLEETCTL, "rollout", "--tag", NEW, "--yes"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env_for(b_dir),
        )
        assert b.returncode == 4, b.stderr
        assert (
            "spark-0" in b.stderr
            and "held by rollback rb-" in b.stderr
            and f"(pid {a.pid})" in b.stderr
        ), b.stderr
        assert "nothing was changed" in b.stderr
        # A lost controller (kill -9, the laptop's lid shut): its lock stays on the hosts ...
        a.send_signal(signal.SIGKILL)
        a.wait(30)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait(30)
    assert any(s.lock is not None and s.lock.pid == a.pid for s in host_states().values())
    # ... and, its pid being gone on this controller, the next command takes it over and says so.
    c = subprocess.run([FLEETCTL, "rollback", "--to", OLD, "--yes", "--max-unavailable", "100%"],
                       capture_output=True, text=True, timeout=300, env=env_for(b_dir))
    ssh.close_all()
    assert c.returncode == 0, c.stderr
    assert "took over the lock of rollback" in c.stderr and f"pid {a.pid}" in c.stderr, c.stderr
    assert all(s.lock is None for s in host_states().values())
    assert all(serving_tag(OLD).values()), real_state()  # C put back whatever A left mid-way


def _containers(host: inventory.Host) -> dict[str, tuple[bool, str, str]]:
    """The host's vllm and vllm.prev: name -> (running, image ID, container ID), read with docker
    inspect."""
    r = ssh.docker(
        host,
        "docker inspect vllm vllm.prev --format "
        "'{{.Name}} {{.State.Running}} {{.Image}} {{.Id}}' 2>/dev/null; true",
        timeout=30,
    )
    return {
        n.lstrip("/"): (run == "true", img, cid)
        for n, run, img, cid in (line.split() for line in r.stdout.splitlines() if line.strip())
    }


def _restart_dockerd(host: inventory.Host) -> None:
    """What a reboot does to the containers: dockerd stops them all, then starts what its policies
    say."""
    ssh.run(
        host,
        "service docker restart >/dev/null && for i in $(seq 60); do docker info >/dev/null 2>&1 "
        "&& exit 0; sleep 1; done; exit 1",
        timeout=120,
        become=True,
    ).check("restarting dockerd")
    # The serving port answers again once the server has loaded (the lab's emulator: seconds).
    ssh.run(
        host,
        "for i in $(seq 120); do curl -fsS -o /dev/null http://127.0.0.1:8000/health && exit 0; "
        "sleep 1; done; exit 1",
        timeout=150,
    ).check("waiting for /health after the restart")


def test_a_host_whose_dockerd_restarts_serves_its_version_again_and_retired_ones_stay_down(
        at_old: dict[str, dict[str, Any]]) -> None:
    inv = inventory.load(None)
    host = inv.host("spark-04")
    # fleetctl moves the host to v0.24.0: v0.23.0 is stopped and kept as vllm.prev.
    r = subprocess.run([FLEETCTL, "rollback", "--to", NEW, "--limit", host.name, "--yes", "--json"],
                       capture_output=True, text=True, timeout=600, env=os.environ.copy())
    ssh.close_all()
    assert r.returncode == 0, r.stderr
    before = _containers(host)
    assert before["vllm"][0] and not before["vllm.prev"][0], before
    _restart_dockerd(host)
    after = _containers(host)
    assert after["vllm"] == before["vllm"] and after["vllm.prev"] == before["vllm.prev"], (
        before,
        after,
    )
    assert serving_tag(NEW)[host.name]
    # And back: `fleetctl rollback` swaps them, killing v0.24.0; a killed container stays down too.
    r = subprocess.run([FLEETCTL, "rollback", "--to", OLD, "--limit", host.name, "--yes", "--json"],
                       capture_output=True, text=True, timeout=600, env=os.environ.copy())
    ssh.close_all()
    assert r.returncode == 0, r.stderr
    before = _containers(host)
    assert before["vllm"][0] and before["vllm.prev"] and not before["vllm.prev"][0], before
    _restart_dockerd(host)
    assert _containers(host) == before
    assert serving_tag(OLD)[host.name]
    unchanged({n: s for n, s in at_old.items() if n != host.name})
