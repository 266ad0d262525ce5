"""``fleetctl watch --remediate`` on the lab: real nodes over SSH, the lab's real HAProxy as the
front door, users' traffic through it (``fleetctl lab traffic``), and the engine wedged by the lab's
fault (``fleetctl lab node NAME --wedge``, ``--wedge-after-start``): the same commands an operator
runs, as subprocesses. HAProxy's view of every node is sampled through its admin socket every
0.2 s (tests/rollout/test_frontdoor_lab.py's sampler)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, ssh
from fleetctl.errors import FleetError
from fleetctl.lab import wedge
from fleetctl.lab.frontdoor import LabFrontDoor
from fleetctl.lab.layout import current
from fleetctl.rollout import host as remote
from fleetctl.state import hoststate
from tests.plugins.serving import engine, serve
from tests.plugins.webhook import Receiver
from tests.rollout.test_frontdoor_lab import FLEETCTL, NEW, NODES, OLD, Sampler

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


def _watch(host: str, duration: int, events: Path, *extra: str, interval: int = INTERVAL,
           env: Mapping[str, str] | None = None, until: int | None = None) -> dict[str, Any]:
    """`fleetctl watch --remediate` of one host; its --json result and exit code. It runs for
    ``duration`` at most; with ``until``, it is stopped as systemd would stop it (SIGTERM: it ends
    with its verdicts) once ``until`` remediations are recorded."""
    out, err = events.with_suffix(".out"), events.with_suffix(".err")
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [FLEETCTL, "watch", "--limit", host, "--remediate", "--interval", f"{interval}s",
             "--duration", f"{duration}s", "--events", str(events), "--json", *extra],
            stdout=o, stderr=e, text=True, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + duration + 400
        while until is not None and proc.poll() is None and time.monotonic() < deadline:
            if len(_remediations(_events(events, partial=True))) >= until:
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(1)
        try:
            proc.wait(timeout=max(60.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert out.read_text(), err.read_text()[-2000:]
    return {"result": json.loads(out.read_text()), "stderr": err.read_text(), "rc": proc.returncode}


def _events(path: Path, partial: bool = False) -> list[dict[str, Any]]:
    """The watch's events; ``partial``: of a file still being written (its last line may be cut,
    the file not there yet)."""
    if partial and not path.exists():
        return []
    lines = []
    for x in path.read_text().splitlines():
        if not x.strip():
            continue
        try:
            lines.append(json.loads(x))
        except ValueError:
            if not partial:
                raise
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
        w = _watch(host, 3 * INTERVAL + 30, events, "--gate", "2s", until=1)
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
    # The host on a version that never passed a gate there (a smoke-gated `rollback --to`), so its
    # known-good (OLD, from the fleet's first rollout) is another version: the breaker's rollback
    # has somewhere to go, on a fresh lab as on one reused.
    moved = subprocess.run(
        [FLEETCTL, "rollback", "--to", NEW, "--limit", host, "--yes", "--json"],
        capture_output=True, text=True, timeout=900, check=False)
    assert moved.returncode == 0, moved.stderr[-2000:]
    inv = inventory.load(None)
    h = inv.hosts[host]
    before = remote.inspect(h, remote.container_name(h))
    assert before is not None and before.running
    others = {n: remote.inspect(inv.hosts[n], remote.container_name(inv.hosts[n]))
              for n in NODES if n != host}
    wedge.apply(host, wedge.AFTER_START, 20)
    events = tmp_path / "events.jsonl"
    # Smoke-only re-gates (--gate 0): each restart's re-gate well inside the 20 s before the
    # engine wedges again (one that found the wedge itself would go straight to the rollback).
    w = _watch(host, 15 * INTERVAL, events, "--breaker", "2", "--gate", "0", until=3)
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


def _last_known_good(h: Any, value: hoststate.Version | None) -> hoststate.Version | None:
    """Set the last known-good ``h``'s own state file records; what it was."""
    eng = engine()
    was: list[hoststate.Version | None] = []
    try:
        def change(s: hoststate.HostState) -> hoststate.HostState:
            was[:] = [s.last_known_good]
            return dataclasses.replace(s, last_known_good=value)

        hoststate.update(eng.session.host_store, h, change)
    finally:
        eng.close()
    return was[0]


def test_with_no_known_good_a_host_that_wedges_after_every_start_is_parked_and_paged(
    door: LabFrontDoor, tmp_path: Path, receiver: Receiver
) -> None:
    """The breaker with nothing to roll back to: a watch on its own state directory (a ledger that
    records no known-good) and the host's state file's known-good cleared (what a host that never
    passed a gate has). After one restart (--breaker 1) the host is parked: left drained at the
    door, the reason in the ledger, paged once; the other nodes keep serving, always in rotation.
    The host is put back after (unwedged, its known-good record restored, `rollback --to`)."""
    host = "spark-04"
    inv = inventory.load(None)
    h = inv.hosts[host]
    others = {n: remote.inspect(inv.hosts[n], remote.container_name(inv.hosts[n]))
              for n in NODES if n != host}
    state = {"FLEETCTL_STATE_DIR": str(tmp_path / "state")}
    allow = inv.path.parent / "group_vars" / "all" / "zz-test-webhook.yml"
    allow.write_text("fleetctl_webhook_allow_http: true\n")
    kept = _last_known_good(h, None)
    sampler = Sampler(door)
    events = tmp_path / "events.jsonl"
    try:
        wedge.apply(host, wedge.AFTER_START, 20)
        sampler.thread.start()
        w = _watch(host, 150, events, "--breaker", "1", "--gate", "0", "--webhook",
                   f"http://127.0.0.1:{receiver.server_port}/hook", interval=10, env=state,
                   until=2)
        sampler.stop.set()
        sampler.thread.join(10)
        course = sampler.course(host), {n: sampler.course(n) for n in NODES if n != host}
        parked_admin = Sampler(door).admin()[host]
    finally:
        sampler.stop.set()
        wedge.apply(host, wedge.UNWEDGE)
        _last_known_good(h, kept)
        allow.unlink(missing_ok=True)
        back = subprocess.run([FLEETCTL, "rollback", "--to", OLD, "--limit", host, "--yes"],
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, **state})
    rs = [(r["action"], r["result"]) for r in _remediations(_events(events))]
    assert rs[:2] == [("restart", "healed"), ("park", "parked")], (rs, w["stderr"][-3000:])
    parked = _remediations(_events(events))[1]
    assert "no rollback" in parked["detail"] and "known-good" in parked["detail"], parked
    # Paged once through the webhook, for the park; the watch fails (exit 1) on it.
    pages = [b for b in receiver.bodies
             if b.get("event") == "breach" and b.get("check") == "parked"]
    assert len(pages) == 1 and pages[0]["host"] == host, receiver.bodies
    assert w["rc"] == 1 and w["result"]["outcome"] == "fail", w["result"]["outcome"]
    (v,) = w["result"]["verdicts"]
    rem = next(c for c in v["checks"] if c["name"] == "remediation")
    assert rem["outcome"] == "fail" and "parked" in rem["message"], rem
    # The door: drained, re-admitted after the restart, drained again and left so (parked).
    assert course[0][:4] == ["ready", "drain", "ready", "drain"] and parked_admin == "drain", course
    # The other nodes kept serving their version, in rotation all along.
    assert all(c == ["ready"] for c in course[1].values()), course[1]
    for n, was in others.items():
        c = remote.inspect(inv.hosts[n], remote.container_name(inv.hosts[n]))
        assert c is not None and c.running and was is not None and c.digest == was.digest, (n, c)
    # Put back: serving, in rotation.
    assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]
    assert Sampler(door).admin()[host] == "ready"
