"""Rollouts under users' traffic through the lab's real HAProxy (`fleetctl lab traffic`, the same
command an operator runs), with fleetctl driving the door (`fleetctl_front_door`) and without it.

HAProxy's own view is sampled through its admin socket every 0.2 s during each rollout: who was out
of rotation, and when.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fleetctl.frontdoor.haproxy import HAProxy
from fleetctl.inventory import Host
from fleetctl.lab.frontdoor import BACKEND, LabFrontDoor
from fleetctl.lab.layout import current
from fleetctl.rollout.results import Options, RolloutResult
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records
from tests.plugins.serving import LAB_SOAK, engine, serve

pytestmark = pytest.mark.lab

NEW, OLD, CRASH = "v0.24.0", "v0.23.0", "2026-06-11-pr41703"
NODES = [f"spark-0{i}" for i in range(1, 5)]
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
RATE = 4


class Sampler:
    """HAProxy's admin state of every node, every 0.2 s, while running."""

    def __init__(self, door: LabFrontDoor) -> None:
        self.haproxy = HAProxy(BACKEND, str(door.socket))
        self.samples: list[dict[str, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def admin(self) -> dict[str, str]:
        return {n: self.haproxy.state(Host(n, "x")).admin for n in NODES}

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.admin())
            self.stop.wait(0.2)

    def out_at_once(self) -> int:
        return max((sum(1 for a in s.values() if a != "ready") for s in self.samples), default=0)

    def course(self, node: str) -> list[str]:
        """The node's admin states in order, repeats collapsed."""
        out: list[str] = []
        for s in self.samples:
            if not out or out[-1] != s[node]:
                out.append(s[node])
        return out


@contextmanager
def traffic_and_sampler(door: LabFrontDoor) -> Iterator[tuple[dict[str, Any], Sampler]]:
    """`fleetctl lab traffic` from 2 s before to 2 s after the body; its --json report filled in at
    the end."""
    proc = subprocess.Popen(
        [FLEETCTL, "lab", "traffic", "--rate", str(RATE), "--duration", "1800", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler = Sampler(door)
    report: dict[str, Any] = {}
    sampler.thread.start()
    try:
        time.sleep(2)
        yield report, sampler
        time.sleep(2)
    finally:
        sampler.stop.set()
        sampler.thread.join(10)
        proc.terminate()
        out, err = proc.communicate(timeout=300)
        assert out, f"lab traffic printed nothing: {err[-500:]}"
        report.update(json.loads(out))


def rollout(tag: str, limit: str | None = None) -> RolloutResult:
    eng = engine()
    try:
        return eng.rollout(
            Options(tag=tag, waves="1,100%", max_unavailable="1", soak=LAB_SOAK, limit=limit)
        )
    finally:
        eng.close()


@pytest.fixture
def door(serving: Any) -> Iterator[LabFrontDoor]:
    d = LabFrontDoor(current())
    assert d.running(), "the lab's HAProxy is not running: `fleetctl lab up` starts it"
    serve(OLD)
    d.use_in_inventory(True)
    try:
        yield d
    finally:
        serve(OLD)
        d.use_in_inventory(False)


def test_a_rollout_under_traffic_through_the_door_fails_no_request(door: LabFrontDoor) -> None:
    with traffic_and_sampler(door) as (report, sampler):
        r = rollout(NEW)
    assert r.status == fleet_records.COMPLETED, r.error
    assert report["sent"] >= RATE * 20 and report["failed"] == 0, report
    assert report["ok"] == report["sent"]
    assert sampler.out_at_once() <= 1
    assert sampler.admin() == dict.fromkeys(NODES, "ready")
    for n in NODES:
        assert "drain" in sampler.course(n), (n, sampler.course(n))
    eng = engine()
    try:
        rec = eng.ledger.get(r.id)
        assert eng.ledger.out_of_rotation() == {}
    finally:
        eng.close()
    for n in NODES:
        phases = [p.phase for p in rec.phases if p.host == n]
        assert phases.index("draining") < phases.index("stopping"), phases
    assert all(h.timings.get("drain", 99) < 30 and "readmit" in h.timings for h in r.hosts), \
        [h.timings for h in r.hosts]


#: An operator's hook for a door fleetctl has no backend for: here the lab's HAProxy again, through
#: its admin socket from the shell (as `socat` would; python3 because the lab has no socat), and a
#: log of each call.
HOOK = r"""#!/bin/sh
set -eu
echo "$FLEETCTL_FD_HOST $FLEETCTL_FD_ACTION" >> "$HOOK_LOG"
cmd() { python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1]); s.sendall(sys.argv[2].encode() + b"\n")
print(s.makefile().read(), end="")' "$HAPROXY_SOCK" "$1"; }
case "$FLEETCTL_FD_ACTION" in
  drain|readmit)
    state=drain; [ "$FLEETCTL_FD_ACTION" = readmit ] && state=ready
    out=$(cmd "set server vllm/$FLEETCTL_FD_HOST state $state"); [ -z "$out" ] || { echo "$out" >&2; exit 1; } ;;
  in-flight)
    cmd "show stat vllm 4 -1" | awk -F, -v s="$FLEETCTL_FD_HOST" '$2 == s { print $3 + $5 }' ;;
  state)
    cmd "show servers state vllm" | awk -v s="$FLEETCTL_FD_HOST" '$4 == s {
      a = $7 + 0; st = (a % 2 == 1) ? "maint" : (int(a / 8) % 2 == 1) ? "drain" : "ready"
      print st, ($6 == 2 ? "healthy" : "unhealthy") }' ;;
  *) echo "unknown action $FLEETCTL_FD_ACTION" >&2; exit 2 ;;
esac
"""  # noqa: E501 (data: lines as the program reads them)


@pytest.fixture
def hook_door(
    door: LabFrontDoor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """The lab's inventory with the `command` front door: :data:`HOOK` driving the lab's HAProxy;
    yields its log."""
    import yaml

    hook, log = tmp_path / "lb-pool", tmp_path / "hook.log"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    monkeypatch.setenv("HOOK_LOG", str(log))
    monkeypatch.setenv("HAPROXY_SOCK", str(door.socket))
    door.inventory_file().write_text(
        yaml.safe_dump({"fleetctl_front_door": {"type": "command", "command": str(hook)}})
    )
    log.write_text("")
    try:
        yield log
    finally:
        door.use_in_inventory(True)  # the runtime-API door again, for `door`'s own teardown


def test_a_canary_failing_its_gate_under_traffic_is_never_in_rotation_on_the_bad_version(
        door: LabFrontDoor, hook_door: Path) -> None:
    """Through the `command` backend: a shell hook drains and re-admits at the lab's HAProxy (the
    runtime-API
    backend has the other lab tests), so the hook is proven on a real rollout and a real door."""
    with traffic_and_sampler(door) as (report, sampler):
        r = rollout(CRASH)
    assert r.status == fleet_records.FAILED
    canary = r.hosts[0]
    assert canary.host == "spark-01" and canary.status == fleet_records.ROLLED_BACK, canary
    # Out from before its stop until its restored version passed readiness and smoke, then back
    # once.
    assert sampler.course("spark-01") == ["ready", "drain", "ready"], sampler.course("spark-01")
    assert all(sampler.course(n) == ["ready"] for n in NODES[1:])
    assert report["failed"] == 0, report
    calls = [ln.split() for ln in hook_door.read_text().splitlines()]
    mine = [a for h, a in calls if h == "spark-01"]
    # the floor read the door first; drain, its requests, re-admission, then the door's view of it
    assert mine[:3] == ["state", "drain", "in-flight"] and mine.count("drain") == 1, mine
    assert mine.count("readmit") == 1 and mine[-1] == "state" and mine.index("readmit") > 2, mine
    assert not [h for h, a in calls if h != "spark-01" and a == "drain"], calls
    eng = engine()
    try:
        assert eng.ledger.out_of_rotation() == {}
        rec = eng.ledger.get(r.id)
    finally:
        eng.close()
    phases = [p.phase for p in rec.phases if p.host == "spark-01"]
    assert phases.index("draining") < phases.index("stopping"), phases


def test_without_the_door_fleetctl_leaves_haproxy_alone(serving: Any) -> None:
    """The baseline: the same traffic and rollout with fleetctl not driving the door (its figure:
    bench/frontdoor.py)."""
    d = LabFrontDoor(current())
    serve(OLD)
    d.use_in_inventory(False)
    try:
        with traffic_and_sampler(d) as (report, sampler):
            r = rollout(
                NEW, limit="spark-01,spark-02"
            )  # two steps show it (and save two soaks of CI time)
        assert len(r.hosts) == 2 and all("drain" not in sampler.course(n) for n in NODES)
        assert report["sent"] >= RATE * 10
        assert all("drain" not in h.timings for h in r.hosts)
        print(
            f"without the door: {r.status}, {report['failed']} of {report['sent']} failed "
            f"{report['causes']}"
        )
    finally:
        serve(OLD)


def _kill_when_drained(
    argv: list[str], node: str, led: fleet_ledger.Ledger, sampler: Sampler
) -> None:
    """Run `fleetctl ARGV` and SIGKILL it once ``node`` is loading or soaking, drained at
    HAProxy."""
    import os
    import signal

    p = subprocess.Popen([FLEETCTL, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=os.environ.copy())
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert p.poll() is None, f"`fleetctl {' '.join(argv)}` ended before it could be killed"
            rec = led.latest(kind="rollout", statuses=(fleet_records.RUNNING,))
            if (
                rec is not None
                and (h := rec.host(node)) is not None
                and h.phase in ("loading", "soak")
                and sampler.admin()[node] == "drain"
            ):
                break
            time.sleep(0.2)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(30)


def test_a_controller_killed_while_a_host_is_drained_then_resume_killed_again_then_abort(
        door: LabFrontDoor) -> None:
    """SIGKILL while the canary is drained; `--resume` re-admits it after its gate and is itself
    killed while the next host is drained; `rollout abort` puts both back on the old version: all in
    rotation."""
    import os

    from fleetctl import inventory, paths

    sampler = Sampler(door)
    led = fleet_ledger.open_ledger(paths.state_dir(inventory.load(None).path))
    try:
        _kill_when_drained(
            [
                "rollout",
                "--tag",
                NEW,
                "--yes",
                "--soak",
                f"{LAB_SOAK:.0f}s",
                "--waves",
                "1,100%",
                "--max-unavailable",
                "1",
            ],
            "spark-01",
            led,
            sampler,
        )
        assert sampler.admin()["spark-01"] == "drain"
        assert list(led.out_of_rotation()) == ["spark-01"]
        _kill_when_drained(["rollout", "--resume", "--yes"], "spark-02", led, sampler)
        # The canary passed its gate in the resume and went back in; spark-02 is the one left
        # drained now.
        assert sampler.admin()["spark-01"] == "ready" and sampler.admin()["spark-02"] == "drain"
        assert list(led.out_of_rotation()) == ["spark-02"]
        after = subprocess.run(
            [FLEETCTL, "rollout", "abort", "--yes", "--json"],
            capture_output=True,
            text=True,
            timeout=900,
            env=os.environ.copy(),
        )
        assert after.returncode == 0, after.stderr[-2000:]
        assert sampler.admin() == dict.fromkeys(NODES, "ready")
        assert led.out_of_rotation() == {}
        hosts = {h["host"]: h for h in json.loads(after.stdout)["hosts"]}
        assert {n for n, h in hosts.items() if h["status"] == "done"} >= {"spark-01", "spark-02"}, (
            hosts
        )
    finally:
        led.close()


# --- the bake (rollout --bake) and fleetctl watch, under the same users' traffic
# -------------------------

#: A version whose streams fail only when they came through the front door
#: (EMU_FORWARDED_ERROR_RATE): its soak, out of rotation, passes; users' traffic after its
#: re-admission does not.
ERRS = "2026-07-02-errors-under-traffic"
BAKE = 10.0
BAKED = NODES[:2]


@pytest.fixture(scope="module")
def errors_under_traffic(serving: Any) -> str:
    from fleetctl import lab as fleetlab

    fleetlab.add_image(
        ERRS, {"EMU_VERSION": "0.24.1", "EMU_LOAD_SECONDS": "3", "EMU_FORWARDED_ERROR_RATE": "0.7"}
    )
    return ERRS


def baked_rollout(tag: str) -> tuple[RolloutResult, fleet_records.RolloutRecord]:
    eng = engine()
    try:
        # Two hosts (a canary and a wave of one), as few as a bake against an old version needs.
        r = eng.rollout(
            Options(
                tag=tag,
                limit=",".join(BAKED),
                waves="1,100%",
                max_unavailable="1",
                soak=LAB_SOAK,
                bake=BAKE,
            )
        )
        assert r.id is not None, r.error
        return r, eng.ledger.get(r.id)
    finally:
        eng.close()


def verdict_of(rec: fleet_records.RolloutRecord, host: str) -> dict[str, Any]:
    hr = rec.host(host)
    assert hr is not None and hr.verdict is not None, host
    return hr.verdict


def test_a_bake_rolls_back_a_canary_whose_errors_rise_only_under_live_traffic(
        door: LabFrontDoor, errors_under_traffic: str) -> None:
    with traffic_and_sampler(door) as (report, sampler):
        r, rec = baked_rollout(errors_under_traffic)
    assert r.status == fleet_records.FAILED, r.error
    canary, rest = r.hosts[0], r.hosts[1:]
    assert canary.status == fleet_records.ROLLED_BACK and canary.after_tag == canary.before_tag, (
        canary
    )
    # Its gate passed out of rotation; the bake under users' traffic failed it, with the numbers.
    assert "bake fail" in (canary.error or "") and "bake_errors" in (canary.error or ""), (
        canary.error
    )
    phases = [p.phase for p in rec.phases if p.host == canary.host]
    assert phases.index("done") < phases.index("baking") < phases.index("rolling-back"), phases
    bake = verdict_of(rec, canary.host)
    assert bake["outcome"] == "fail" and any(c["name"] == "bake_errors" and c["outcome"] == "fail"
                                             for c in bake["checks"]), bake
    # In rotation on the new version for the bake only, drained before its rollback, back after it.
    assert sampler.course(canary.host) == ["ready", "drain", "ready", "drain", "ready"], (
        sampler.course(canary.host)
    )
    assert all(sampler.course(h.host) == ["ready"] for h in rest)
    assert all(h.status == fleet_records.PENDING for h in rest)
    assert report["failed"] > 0, (
        report
    )  # users saw the errors the bake caught (and no more after it)


def test_a_bake_passes_a_healthy_rollout_and_fleetctl_watch_passes_its_hosts(
    door: LabFrontDoor,
) -> None:
    with traffic_and_sampler(door) as (report, _sampler):
        r, rec = baked_rollout(NEW)
        watch = subprocess.run(
            [
                FLEETCTL,
                "watch",
                "--limit",
                ",".join(BAKED),
                "--duration",
                "4s",
                "--interval",
                "1s",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.status == fleet_records.COMPLETED, r.error
    for h in r.hosts:
        assert verdict_of(rec, h.host)["bake"]["outcome"] == "pass", verdict_of(rec, h.host)
        assert "baking" in [p.phase for p in rec.phases if p.host == h.host]
    # The canary was compared with the host still on the old version; the last wave had none left.
    assert verdict_of(rec, r.hosts[0].host)["bake"]["traffic"]["old"]
    assert not verdict_of(rec, r.hosts[-1].host)["bake"]["traffic"]["old"]
    assert report["failed"] == 0, report
    assert watch.returncode == 0, watch.stdout[-2000:] + watch.stderr[-2000:]
    verdicts = json.loads(watch.stdout)["verdicts"]
    assert sorted(v["target"] for v in verdicts) == sorted(h.host for h in r.hosts)
    assert all(v["outcome"] == "pass" and v["levels"][0]["requests"] >= 4 for v in verdicts)
