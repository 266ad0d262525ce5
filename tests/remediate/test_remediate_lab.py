"""``fleetctl watch --remediate`` on the lab: real nodes over SSH, the lab's real HAProxy as the
front door, users' traffic through it (``fleetctl lab traffic``), and the engine wedged by the lab's
fault (``fleetctl lab node NAME --wedge``, ``--wedge-after-start``): the same commands an operator
runs, as subprocesses. HAProxy's view of every node is sampled through its admin socket every
0.2 s (tests/rollout/test_frontdoor_lab.py's sampler)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, ssh
from fleetctl.errors import FleetError
from fleetctl.lab import wedge
from fleetctl.lab.frontdoor import LabFrontDoor
from fleetctl.lab.layout import current
from fleetctl.rollout import host as remote
from tests.plugins.serving import serve
from tests.rollout.test_frontdoor_lab import FLEETCTL, NODES, OLD, Sampler

pytestmark = pytest.mark.lab

#: The probe interval: at least the lab recipe's liveness bound (20 s), so that a wedge found by
#: the interval after it started is found within two intervals.
INTERVAL = 20


@pytest.fixture
def door(serving: Any) -> Iterator[LabFrontDoor]:
    d = LabFrontDoor(current())
    assert d.running(), "the lab's HAProxy is not running: `fleetctl lab up` starts it"
    serve(OLD)
    d.use_in_inventory(True)
    try:
        yield d
    finally:
        for n in NODES:
            with contextlib.suppress(FleetError):  # a node serving nothing has nothing to unwedge
                wedge.apply(n, wedge.UNWEDGE)
        serve(OLD)
        d.use_in_inventory(False)
        ssh.close_all()


def _watch(host: str, duration: int, events: Path, *extra: str) -> dict[str, Any]:
    """`fleetctl watch --remediate` of one host, to its end; its --json result."""
    out = subprocess.run(
        [FLEETCTL, "watch", "--limit", host, "--remediate", "--interval", f"{INTERVAL}s",
         "--duration", f"{duration}s", "--events", str(events), "--json", *extra],
        capture_output=True, text=True, timeout=duration + 400)
    assert out.stdout, out.stderr[-2000:]
    return {"result": json.loads(out.stdout), "stderr": out.stderr}


def _events(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [e for e in lines if "phase" in e]


def _remediations(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["phase"] == "remediation"]


def test_a_wedged_host_under_traffic_is_drained_restarted_regated_and_readmitted(
    door: LabFrontDoor, tmp_path: Path
) -> None:
    host = "spark-02"
    inv = inventory.load(None)
    before = remote.inspect(inv.hosts[host], remote.container_name(inv.hosts[host]))
    assert before is not None and before.running
    sampler = Sampler(door)
    traffic = subprocess.Popen([FLEETCTL, "lab", "traffic", "--rate", "2", "--duration", "1800",
                                "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    t0 = time.monotonic()
    sampler.thread.start()
    try:
        time.sleep(3)
        wedged_at = time.monotonic() - t0
        wedge.apply(host, wedge.WEDGE)
        events = tmp_path / "events.jsonl"
        w = _watch(host, 3 * INTERVAL + 30, events, "--gate", "2s")
        time.sleep(3)
    finally:
        sampler.stop.set()
        sampler.thread.join(10)
        traffic.terminate()
        out, _err = traffic.communicate(timeout=300)
    report = json.loads(out)
    ev = _events(events)
    # Found within two probe intervals: the breach came in the first or second interval's probe.
    phases = [(e["phase"], (e.get("data") or {}).get("interval")) for e in ev if e.get("host")]
    first_breach = next(i for i, (p, _n) in enumerate(phases) if p == "breach")
    intervals = [n for p, n in phases[:first_breach] if p == "watch" and n]
    assert intervals and max(intervals) <= 2, phases[: first_breach + 1]
    assert "liveness" in ev[[i for i, e in enumerate(ev) if e.get("host")][first_breach]]["message"]
    assert _remediations(ev), w["stderr"][-3000:]
    (r,) = _remediations(ev)[:1]
    assert (r["action"], r["result"], r["check"]) == ("restart", "healed", "liveness"), r
    steps = [e["phase"] for e in ev if e.get("host") == host]
    assert steps.index("drained") < steps.index("restarted") < steps.index("remediation")
    # The door: out once (drained), back once, never another node out.
    assert sampler.course(host) == ["ready", "drain", "ready"], sampler.course(host)
    assert all(sampler.course(n) == ["ready"] for n in NODES if n != host)
    # It serves again, the same version, and the ledger keeps nobody out.
    c = remote.inspect(inv.hosts[host], remote.container_name(inv.hosts[host]))
    assert c is not None and c.running and c.digest == before.digest, (c, before)
    # Traffic: what failed was sent before the drain (in flight on the wedged engine, or routed to
    # it before the door took it out), nothing after it.
    drain_at = next(i for i, s in enumerate(sampler.samples) if s[host] != "ready") * 0.2
    assert report["sent"] > 0 and report["failed"] < report["sent"], report
    late = [f for f in report["failures"] if f["at_s"] > drain_at + 1.0]
    assert late == [], (drain_at, wedged_at, report["failures"])
    print(f"traffic: {report['sent']} sent, {report['failed']} failed "
          f"({report['causes']}), wedge at {wedged_at:.1f}s, drain at ~{drain_at:.1f}s")


def test_a_host_that_wedges_after_every_start_is_rolled_back_after_n_restarts(
    door: LabFrontDoor, tmp_path: Path
) -> None:
    host = "spark-03"
    inv = inventory.load(None)
    h = inv.hosts[host]
    before = remote.inspect(h, remote.container_name(h))
    assert before is not None and before.running
    others = {n: remote.inspect(inv.hosts[n], remote.container_name(inv.hosts[n]))
              for n in NODES if n != host}
    wedge.apply(host, wedge.AFTER_START, 20)
    events = tmp_path / "events.jsonl"
    # Smoke-only re-gates (--gate 0): the soak's ramp would outlast the 20 s and find the wedge
    # itself (which goes straight to the rollback, one restart early).
    w = _watch(host, 15 * INTERVAL, events, "--breaker", "2", "--gate", "0")
    rs = [(r["action"], r["result"]) for r in _remediations(_events(events))]
    print(w["stderr"][-4000:])
    assert rs[:3] == [("restart", "healed"), ("restart", "healed"),
                      ("rollback", "rolled-back")], rs
    after = remote.inspect(h, remote.container_name(h))
    # Serving its known-good (another version, whose container has no wedge), back in rotation.
    assert after is not None and after.running and after.digest != before.digest, after
    assert door.running() and all(Sampler(door).admin()[n] == "ready" for n in NODES)
    # The other hosts kept serving their version all along.
    for n, was in others.items():
        c = remote.inspect(inv.hosts[n], remote.container_name(inv.hosts[n]))
        assert c is not None and c.running and was is not None and c.digest == was.digest, (n, c)
