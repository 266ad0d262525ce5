"""The rollout engine with a real HAProxy as the fleet's front door: the simulated fleet's hosts
are the servers of a real haproxy on loopback (tiny HTTP backends standing for their vLLM), driven
through its
admin socket. What each host looked like to the door is recorded at every host operation."""

from __future__ import annotations

import re
import shutil
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, paths
from fleetctl.frontdoor.haproxy import HAProxy
from fleetctl.inventory import Host
from fleetctl.progress import NULL, Event, Progress
from fleetctl.recipes import Recipe
from fleetctl.rollout import host as remote
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RollbackOptions, RolloutResult
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records
from tests.frontdoor.servers import Backend, Pool, loopback_pool

from .sim import OK, SOAKFAIL, Killed, SimFleet, SimGates, SimOps, digest_of

HOSTS = ["spark-01", "spark-02", "spark-03"]
A, B, SOAKBAD = "v1", "v2", "v-soakfail"
CHANGES = ("retire", "start", "restore", "swap", "kill")


@dataclass
class Door:
    haproxy: HAProxy
    backends: dict[str, Backend]
    port: int
    inv_dir: Path
    #: (host, op, the door's admin state of that host then, requests running on it then)
    seen: list[tuple[str, str, str, int]]
    pool: Pool | None = None

    def admin(self, name: str) -> str:
        return self.haproxy.state(Host(name, "127.0.0.1")).admin


@pytest.fixture
def door(tmp_path: Path) -> Iterator[Door]:
    with loopback_pool(tmp_path, HOSTS) as pool:
        inv_dir = tmp_path / "inventory"
        shutil.copytree(paths.project_root() / "inventory" / "example", inv_dir)
        (inv_dir / "group_vars" / "all" / "frontdoor.yml").write_text(
            f"fleetctl_front_door: {{type: haproxy, socket: {pool.socket}, backend: vllm}}\n"
            "fleetctl_drain_timeout: 30\nfleetctl_readmit_timeout: 30\n")
        yield Door(pool.door, pool.backends, pool.port, inv_dir, [], pool)


class Watched(SimOps):
    """SimOps that notes the door's view of the host at every change, and can die at one."""

    door: Door
    die_at: tuple[str, str] | None = None

    def _note(self, op: str) -> None:
        if (self.host.name, op) == type(self).die_at:
            type(self).die_at = None
            self.fleet.dead = True
            raise Killed(op)
        backend = self.door.backends.get(self.host.name)
        self.door.seen.append((self.host.name, op, self.door.admin(self.host.name),
                               backend.running if backend is not None else 0))

    def retire(self, name: str, rollout_id: str, target_digest: str, grace: int = 30) -> Any:
        self._note("retire")
        return super().retire(name, rollout_id, target_digest, grace)

    def start(self, req: remote.StartRequest) -> Any:
        self._note("start")
        return super().start(req)

    def restore(self, name: str) -> Any:
        self._note("restore")
        return super().restore(name)

    def swap(self, name: str) -> Any:
        self._note("swap")
        return super().swap(name)


def _in_flight(d: Door) -> Callable[[Host, Recipe], int | None]:
    """What the fake door's backends hold in flight, standing in for each vLLM's /metrics."""
    return lambda h, recipe: d.backends[h.name].running if h.name in d.backends else 0


def _engine(fleet: SimFleet, d: Door, state: Path, progress: Progress = NULL) -> Engine:
    Watched.door = d
    inv = inventory.load(d.inv_dir / "hosts.yml")
    eng = Engine(inv, progress, state_dir=state, secrets={},
                 seams=Seams(ops=lambda h: Watched(h, fleet), gates=SimGates(fleet),
                             resolve=fleet.resolve))
    eng.door.in_flight = _in_flight(d)
    return eng


def _rollout(
    fleet: SimFleet, d: Door, state: Path, tag: str, progress: Progress = NULL
) -> RolloutResult:
    eng = _engine(fleet, d, state, progress)
    try:
        return eng.rollout(Options(tag=tag, limit=",".join(HOSTS), waves="1,100%", soak=1.0))
    finally:
        eng.close()


def _resume(fleet: SimFleet, d: Door, state: Path) -> RolloutResult:
    eng = _engine(fleet, d, state)
    try:
        return eng.resume(Options())
    finally:
        eng.close()


def _out_of_rotation(state: Path) -> dict[str, Any]:
    with fleet_ledger.open_ledger(state) as led:
        return dict(led.out_of_rotation())


def test_every_host_is_drained_before_its_stop_and_back_in_rotation_after(
    tmp_path: Path, door: Door
) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    # Two requests in flight on the canary when the rollout begins: its stop waits for them.
    door.haproxy.drain(Host("spark-02", "x"))
    door.haproxy.drain(Host("spark-03", "x"))
    answers: list[int] = []

    def hold() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{door.port}/hold", timeout=60) as r:
            answers.append(r.status)

    holds = [threading.Thread(target=hold) for _ in range(2)]
    for t in holds:
        t.start()
    import time
    deadline = time.monotonic() + 30
    while door.backends["spark-01"].running < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    door.haproxy.readmit(Host("spark-02", "x"))
    door.haproxy.readmit(Host("spark-03", "x"))
    in_flight_at_drain: list[int] = []

    def release_once_drained() -> None:
        # The requests are still open when the canary leaves rotation; they end only then.
        while door.admin("spark-01") != "drain":
            time.sleep(0.02)
        in_flight_at_drain.append(door.backends["spark-01"].running)
        time.sleep(0.3)
        door.backends["spark-01"].release.set()

    threading.Thread(target=release_once_drained, daemon=True).start()

    r = _rollout(fleet, door, tmp_path / "state", B)
    for t in holds:
        t.join(30)
    assert r.status == fleet_records.COMPLETED, r.error
    assert answers == [200, 200]
    assert set(fleet.serving_tags().values()) == {B}
    changes = [s for s in door.seen if s[1] in ("retire", "start")]
    assert {s[0] for s in changes} == set(HOSTS)
    # Every stop and start happened out of rotation, with no request left on the host.
    assert all(admin == "drain" and running == 0 for _, _, admin, running in changes), changes
    assert [door.admin(n) for n in HOSTS] == ["ready"] * 3
    assert _out_of_rotation(tmp_path / "state") == {}
    timings = {h.host: h.timings for h in r.hosts}
    assert all("drain" in t and "readmit" in t for t in timings.values()), timings
    assert in_flight_at_drain == [2]  # the stop came after the two requests ended


def test_a_canary_failing_its_gate_is_never_readmitted_on_the_bad_version(
    tmp_path: Path, door: Door
) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, SOAKBAD: SOAKFAIL})
    r = _rollout(fleet, door, tmp_path / "state", SOAKBAD)
    assert r.status == fleet_records.FAILED
    canary = [s for s in door.seen if s[0] == "spark-01"]
    assert [op for _, op, _, _ in canary] == ["retire", "start", "restore"]
    assert all(admin == "drain" for _, _, admin, _ in canary), canary
    assert fleet.serving_tags()["spark-01"] == A and door.admin("spark-01") == "ready"
    assert not [s for s in door.seen if s[0] != "spark-01"]
    assert _out_of_rotation(tmp_path / "state") == {}


@pytest.mark.parametrize("then", ["resume", "abort", "rollback"])
def test_a_controller_killed_while_a_host_is_drained_is_recorded_and_the_next_command_readmits_it(
    tmp_path: Path, door: Door, then: str
) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    state = tmp_path / "state"
    Watched.die_at = ("spark-01", "retire")
    with pytest.raises(Killed):
        _rollout(fleet, door, state, B)
    fleet.revive()
    assert door.admin("spark-01") == "drain"
    assert list(_out_of_rotation(state)) == ["spark-01"]
    eng = _engine(fleet, door, state)
    try:
        if then == "resume":
            r = eng.resume(Options())
        elif then == "abort":
            r = eng.abort()
        else:
            r = eng.rollback(RollbackOptions(limit="spark-01"))
    finally:
        eng.close()
    assert r.status in (fleet_records.COMPLETED, fleet_records.ABORTED), r.error
    assert [door.admin(n) for n in HOSTS] == ["ready"] * 3
    assert _out_of_rotation(state) == {}
    expected = B if then == "resume" else A
    assert fleet.serving_tags()["spark-01"] == expected
    assert fleet.serving_digest("spark-01") == digest_of(expected)


def test_without_a_front_door_nothing_changes(tmp_path: Path, door: Door) -> None:
    (door.inv_dir / "group_vars" / "all" / "frontdoor.yml").unlink()
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    r = _rollout(fleet, door, tmp_path / "state", B)
    assert r.status == fleet_records.COMPLETED, r.error
    assert all("drain" not in h.timings for h in r.hosts)


class PoolFile(Door):
    """The command hook's view: a host is drained while its name is in the pool's out-file."""

    def admin(self, name: str) -> str:
        out = self.inv_dir.parent / "pool.out"
        return "drain" if name in out.read_text().split() else "ready"


@pytest.mark.parametrize("reports_state", [True, False])
def test_the_command_hook_through_a_rollout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            reports_state: bool) -> None:
    """Also with a hook that prints nothing for `state`: the floor then counts its hosts in rotation
    unless fleetctl holds them, and a re-admission's exit status is the answer."""
    from tests.frontdoor.test_command_and_litellm import HOOK

    script = tmp_path / "pool.sh"
    hook = HOOK if reports_state else re.sub(r"\n  state\).*\n", "\n  state) ;;\n", HOOK)
    assert hook.count("state)") == 1 and (reports_state or "  state) ;;" in hook)
    script.write_text(hook)
    script.chmod(0o755)
    monkeypatch.setenv("POOL", str(tmp_path / "pool"))
    (tmp_path / "pool.out").write_text("")
    inv_dir = tmp_path / "inventory"
    shutil.copytree(paths.project_root() / "inventory" / "example", inv_dir)
    (inv_dir / "group_vars" / "all" / "frontdoor.yml").write_text(
        f"fleetctl_front_door: {{type: command, command: {script}}}\n")
    d = PoolFile(HAProxy("unused", "/nonexistent"), {}, 0, inv_dir, [])
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    r = _rollout(fleet, d, tmp_path / "state", B)
    assert r.status == fleet_records.COMPLETED, r.error
    changes = [s for s in d.seen if s[1] in ("retire", "start")]
    assert len(changes) == 6 and all(admin == "drain" for _, _, admin, _ in changes), changes
    log = (tmp_path / "pool.log").read_text().splitlines()
    assert [ln.split()[2] for ln in log] == ["drain", "readmit"] * 3
    assert (tmp_path / "pool.out").read_text().split() == []


def test_the_litellm_backend_through_a_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.frontdoor.test_command_and_litellm import FakeLiteLLM

    monkeypatch.setenv("LITELLM_MASTER_KEY", "sk-m")
    proxy = FakeLiteLLM("sk-m")
    inv_dir = tmp_path / "inventory"
    shutil.copytree(paths.project_root() / "inventory" / "example", inv_dir)
    inv = inventory.load(inv_dir / "hosts.yml")
    for n in HOSTS:
        base = f"http://{inv.host(n).address}:8000/v1"
        proxy.models.append(
            {
                "model_name": "qwen3",
                "litellm_params": {"model": "hosted_vllm/qwen3", "api_base": base},
                "model_info": {"id": f"dep-{n}"},
            }
        )
        proxy.healthy.add(base)
    (inv_dir / "group_vars" / "all" / "frontdoor.yml").write_text(
        f"fleetctl_front_door: {{type: litellm, url: '{proxy.url}', model_name: qwen3}}\n")

    class Deployed(Door):
        def admin(self, name: str) -> str:
            return (
                "ready"
                if any(m["model_info"]["id"] == f"dep-{name}" for m in proxy.models)
                else "maint"
            )

    d = Deployed(HAProxy("unused", "/nonexistent"), {}, 0, inv_dir, [])
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, SOAKBAD: SOAKFAIL})
    try:
        r = _rollout(fleet, d, tmp_path / "state", SOAKBAD)
    finally:
        proxy.server.shutdown()
        proxy.server.server_close()
    assert r.status == fleet_records.FAILED
    assert [(h, op, admin) for h, op, admin, _ in d.seen] == [
        ("spark-01", "retire", "maint"),
        ("spark-01", "start", "maint"),
        ("spark-01", "restore", "maint"),
    ]
    assert sorted(m["model_info"]["id"] for m in proxy.models) == [f"dep-{n}" for n in HOSTS]


def test_a_door_that_refuses_the_drain_leaves_the_host_serving_untouched(
    tmp_path: Path, door: Door
) -> None:
    f = door.inv_dir / "group_vars" / "all" / "frontdoor.yml"
    f.write_text(
        f.read_text().replace("backend: vllm}", "backend: vllm, servers: {spark-01: nosuch}}")
    )
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    r = _rollout(fleet, door, tmp_path / "state", B)
    assert r.status == fleet_records.FAILED
    canary = r.hosts[0]
    assert canary.host == "spark-01" and "could not drain" in (canary.error or ""), canary
    assert "no server nosuch" in (canary.error or "") or "nosuch" in (canary.error or "")
    assert door.seen == [] and fleet.serving_tags() == dict.fromkeys(HOSTS, A)
    assert _out_of_rotation(tmp_path / "state") == {}


def _set_vars(d: Door, **values: object) -> None:
    f = d.inv_dir / "group_vars" / "all" / "frontdoor.yml"
    lines = [ln for ln in f.read_text().splitlines() if ln.split(":")[0] not in values]
    f.write_text("\n".join([*lines, *(f"{k}: {v}" for k, v in values.items())]) + "\n")


def test_a_host_the_door_does_not_see_healthy_after_its_gate_stays_out_and_resume_readmits_it(
        tmp_path: Path, door: Door) -> None:
    _set_vars(door, fleetctl_readmit_timeout=2, fleetctl_readmit_attempts=2)
    door.backends["spark-01"].close()  # HAProxy's health check of spark-01 now fails
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    events: list[Event] = []
    r = _rollout(fleet, door, tmp_path / "state", B, events.append)
    assert r.status == fleet_records.PAUSED, r.error
    canary = r.hosts[0]
    assert canary.status == fleet_records.HOST_PAUSED and canary.phase == "out-of-rotation", canary
    msg = canary.error or ""
    assert "passed its gate" in msg and "spark-01" in msg and "after 2 re-admission(s)" in msg, msg
    assert "health check" in msg and "fleetctl rollout --resume" in msg, msg
    assert [e.phase for e in events if e.host == "spark-01"].count("readmit-retry") == 1
    assert list(_out_of_rotation(tmp_path / "state")) == ["spark-01"]
    assert [h.status for h in r.hosts[1:]] == [fleet_records.PENDING] * 2
    # The door mended (the server's check passes again): --resume re-admits it without a new gate,
    # then goes on.
    door.seen.clear()
    door.pool.revive("spark-01")  # type: ignore[union-attr]
    r2 = _resume(fleet, door, tmp_path / "state")
    assert r2.status == fleet_records.COMPLETED, r2.error
    assert r2.hosts[0].status == fleet_records.DONE
    assert [s[1] for s in door.seen if s[0] == "spark-01"] == []  # never stopped or started again
    assert [door.admin(n) for n in HOSTS] == ["ready"] * 3 and _out_of_rotation(
        tmp_path / "state"
    ) == {}


def test_a_readmission_the_door_refuses_at_first_is_tried_again(tmp_path: Path, door: Door) -> None:
    _set_vars(door, fleetctl_readmit_timeout=3, fleetctl_readmit_attempts=3)
    door.backends["spark-01"].close()
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    events: list[Event] = []

    def progress(e: Event) -> None:
        events.append(e)
        if (
            e.phase == "readmit-retry"
            and e.host == "spark-01"
            and door.backends["spark-01"].server.socket.fileno() < 0
        ):
            door.pool.revive("spark-01")  # type: ignore[union-attr]

    r = _rollout(fleet, door, tmp_path / "state", B, progress)
    assert r.status == fleet_records.COMPLETED, r.error
    retries = [e.message for e in events if e.phase == "readmit-retry"]
    assert len(retries) == 1 and retries[0].startswith("re-admission 1 of 3 failed:"), retries
    assert [door.admin(n) for n in HOSTS] == ["ready"] * 3 and _out_of_rotation(
        tmp_path / "state"
    ) == {}


def test_a_step_waits_for_a_host_drained_outside_fleetctl_and_refuses_at_the_timeout(
        tmp_path: Path, door: Door) -> None:
    # 3 hosts, the default floor (75 %: one host out at a time, 2 kept in rotation); spark-03
    # drained by someone else.
    _set_vars(door, fleetctl_capacity_timeout=1)
    door.haproxy.drain(Host("spark-03", "x"))
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    events: list[Event] = []
    r = _rollout(fleet, door, tmp_path / "state", B, events.append)
    assert r.status == fleet_records.PAUSED, r.error
    waits = [e.message for e in events if e.phase == "capacity-wait"]
    # (a loaded machine can fail another server's health check for a moment: that host is then
    # named too)
    assert waits and all(w.startswith("waiting: ") and ", floor 2, 1 of them in this step; " in w
                         and "spark-03 drained outside fleetctl" in w for w in waits), waits
    assert waits[-1].startswith("waiting: 2 of 3 in rotation") or "health check" in waits[-1], waits
    assert "spark-01 not taken out" in (r.error or "") and "spark-03 drained outside fleetctl" in (
        r.error or ""
    )
    assert "--resume" in (r.error or "") and "--min-available" in (r.error or "")
    # Nothing was touched: no stop, no drain, the ledger holds no host out.
    assert door.seen == [] and fleet.serving_tags() == dict.fromkeys(HOSTS, A)
    assert [door.admin(n) for n in HOSTS] == ["ready", "ready", "drain"]
    assert _out_of_rotation(tmp_path / "state") == {}
    assert all(h.status == fleet_records.PENDING for h in r.hosts)
    # Back in rotation: --resume goes on.
    door.haproxy.readmit(Host("spark-03", "x"))
    r2 = _resume(fleet, door, tmp_path / "state")
    assert r2.status == fleet_records.COMPLETED, r2.error
    assert set(fleet.serving_tags().values()) == {B}


def test_a_step_goes_on_once_the_host_out_is_back(tmp_path: Path, door: Door) -> None:
    _set_vars(door, fleetctl_capacity_timeout=60)
    door.haproxy.maint(Host("spark-02", "x"))
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    events: list[Event] = []

    def progress(e: Event) -> None:
        events.append(e)
        if e.phase == "capacity-wait":
            door.haproxy.readmit(Host("spark-02", "x"))  # the other operator is done

    r = _rollout(fleet, door, tmp_path / "state", B, progress)
    assert r.status == fleet_records.COMPLETED, r.error
    waits = [e.message for e in events if e.phase == "capacity-wait"]
    assert (
        waits
        and "spark-02 in maintenance outside fleetctl" in waits[0]
        and ", floor 2, " in waits[0]
    ), waits
    went_on = [e.message for e in events if e.phase == "capacity"]
    assert len(went_on) == 1 and went_on[0].startswith(
        "3 of 3 in rotation, floor 2: going on after"
    ), went_on


# --- the bake: live traffic's /metrics stood for by scrapes the test writes
# -------------------------------


def _bake_engine(fleet: SimFleet, d: Door, state: Path, errors: dict[str, int],
                 die: list[bool] | None = None) -> Engine:
    """An engine whose bake reads scrapes the test writes: each host finished 40 requests between
    the bake's two scrapes, ``errors[host]`` of them with reason error. ``die``: [True] kills the
    controller
    at the bake's first scrape (once)."""
    from fleetctl.soak import metrics

    def scrape(urls: Any, t: float) -> Any:
        if die and die[0]:
            die[0] = False
            fleet.dead = True
            raise Killed("bake")
        out = {}
        for h in urls:
            n, e = (40, errors.get(h, 0)) if t > 0 else (0, 0)
            out[h] = metrics.parse(
                f'vllm:request_success_total{{finished_reason="length"}} {n - e}\n'
                f'vllm:request_success_total{{finished_reason="error"}} {e}\n',
                t,
            )
        return out

    eng = _engine(fleet, d, state)
    eng.bake.scrape = scrape
    return eng


def test_a_bake_breach_drains_the_canary_rolls_it_back_readmits_it_and_stops(
    tmp_path: Path, door: Door
) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    eng = _bake_engine(fleet, door, tmp_path / "state", {"spark-01": 12})
    try:
        r = eng.rollout(Options(tag=B, limit=",".join(HOSTS), waves="1,100%", soak=1.0, bake=0.2))
        rec = eng.ledger.get(r.id or "")
    finally:
        eng.close()
    assert r.status == fleet_records.FAILED and "rolled back after its bake" in (r.error or ""), (
        r.error
    )
    assert "12 of 40 requests failed (30.0%)" in (r.error or "") and "old hosts 0.0%" in (
        r.error or ""
    )
    canary = [(op, admin) for h, op, admin, _ in door.seen if h == "spark-01"]
    # Out for its step, in rotation for the bake, out again for its rollback (the restore), back at
    # the end.
    assert canary == [("retire", "drain"), ("start", "drain"), ("restore", "drain")], canary
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, A)
    assert [door.admin(n) for n in HOSTS] == ["ready"] * 3 and _out_of_rotation(
        tmp_path / "state"
    ) == {}
    h1 = rec.host("spark-01")
    assert h1 is not None and h1.status == fleet_records.ROLLED_BACK and h1.verdict is not None
    assert h1.verdict["outcome"] == "fail" and h1.verdict["failed_checks"][0].startswith(
        "bake_errors"
    )
    phases = [p.phase for p in rec.phases if p.host == "spark-01"]
    assert (
        phases.index("done")
        < phases.index("baking")
        < phases.index("draining", phases.index("baking"))
        < phases.index("rolling-back")
        and phases[-1] == "rolled-back"
    ), phases
    assert all(rec.host(n).status == fleet_records.PENDING for n in HOSTS[1:])  # type: ignore[union-attr]


def test_a_controller_killed_mid_bake_leaves_the_wave_to_bake_again_on_resume(
    tmp_path: Path, door: Door
) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), {A: OK, B: OK})
    state = tmp_path / "state"
    eng = _bake_engine(fleet, door, state, {}, die=[True])
    with pytest.raises(Killed):
        eng.rollout(Options(tag=B, limit=",".join(HOSTS), waves="1,100%", soak=1.0, bake=0.2))
    fleet.revive()
    with fleet_ledger.open_ledger(state) as led:
        rec = led.latest(kind="rollout")
        assert rec is not None and rec.status == fleet_records.RUNNING
        assert rec.options["bake"] == 0.2
        h1 = rec.host("spark-01")
        assert h1 is not None and (h1.status, h1.phase) == (fleet_records.DONE, "baking")
        assert rec.waves[0].status != fleet_records.DONE
    assert door.admin("spark-01") == "ready"  # baked in rotation: nothing to re-admit
    eng = _bake_engine(fleet, door, state, {})
    try:
        r = eng.resume(Options())
        rec = eng.ledger.get(r.id or "")
    finally:
        eng.close()
    assert r.status == fleet_records.COMPLETED, r.error
    assert [p.phase for p in rec.phases if p.host == "spark-01"].count("baking") == 2
    assert all(
        (h := rec.host(n)) is not None
        and h.verdict is not None
        and h.verdict["bake"]["outcome"] == "pass"
        for n in HOSTS
    )
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)
