"""``fleetctl watch --remediate``'s remediation and circuit breaker on the simulated fleet
(tests/rollout/sim.py) behind a real HAProxy on loopback (tests/frontdoor/servers.py): what is
drained, restarted, rolled back or parked, what the door and the ledger say after, and that an hour
of breaches (a fake clock) keeps the remediator's memory bounded."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl import inventory, paths
from fleetctl.progress import Recorder
from fleetctl.remediate import heal, policy
from fleetctl.remediate.record import KIND
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options
from fleetctl.rollout.session import Seams
from fleetctl.state import records as fleet_records
from tests.frontdoor.servers import loopback_pool
from tests.rollout.sim import NAME, OK, SOAKFAIL, SimFleet, SimGates

HOSTS = ["spark-01", "spark-02", "spark-03"]
OLD, NEW = "v0.23.0", "v0.24.0"
CAUSE = "engine wedged on {}: the canary request got no token for 5s while /health answered 200"


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def inv_dir(tmp_path: Path) -> Iterator[Path]:
    """The example inventory with the three hosts behind a real HAProxy (the door)."""
    with loopback_pool(tmp_path, HOSTS) as pool:
        d = tmp_path / "inventory"
        shutil.copytree(paths.project_root() / "inventory" / "example", d)
        (d / "group_vars" / "all" / "frontdoor.yml").write_text(
            f"fleetctl_front_door: {{type: haproxy, socket: {pool.socket}, backend: vllm}}\n"
            "fleetctl_drain_timeout: 5\nfleetctl_readmit_timeout: 10\n")
        yield d


def _engine(fleet: SimFleet, inv_dir: Path, state: Path, progress: Recorder) -> Engine:
    return Engine(inventory.load(inv_dir / "hosts.yml"), progress, state_dir=state, secrets={},
                  seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))


def _remediator(eng: Engine, clock: Clock, pages: list[tuple[str, str, str]],
                dry_run: bool = False, **kw: object) -> heal.Remediator:
    p = policy.from_mapping({"remediate": True, "breaker": 2, "window": "10m", "gate": 0, **kw},
                            "sim")
    r = heal.Remediator(eng, HOSTS, lambda _r: p, progress=eng.progress,
                        page=lambda h, k, m: pages.append((h, k, m)), dry_run=dry_run,
                        clock=clock)
    r.in_flight = lambda h, recipe: 0
    return r


def _admin(eng: Engine, host: str) -> str:
    assert eng.session.door is not None
    return eng.session.door.state(eng.inv.hosts[host]).admin


def _history(eng: Engine) -> list[fleet_records.RolloutRecord]:
    return [r for r in eng.ledger.history(200) if r.kind == KIND]


def test_a_wedged_host_is_drained_restarted_regated_and_readmitted(
    tmp_path: Path, inv_dir: Path
) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, NEW), {OLD: OK, NEW: OK})
    rec = Recorder()
    eng = _engine(fleet, inv_dir, tmp_path / "state", rec)
    pages: list[tuple[str, str, str]] = []
    try:
        before = fleet.hosts["spark-02"].containers[NAME].id
        r = _remediator(eng, Clock(), pages).remediate("spark-02", "liveness",
                                                       CAUSE.format("spark-02"))
        assert (r.action, r.result) == (heal.RESTART, heal.HEALED), r
        # The same container, started again (a restart, not a redeploy), serving the same version.
        c = fleet.hosts["spark-02"].containers[NAME]
        assert c.id == before and c.running and c.tag == NEW
        assert [p for p in fleet.points if ":" in p] == ["spark-02:stop", "spark-02:start-again"]
        assert _admin(eng, "spark-02") == "ready" and eng.ledger.out_of_rotation() == {}
        phases = [e.phase for e in rec.events if e.host == "spark-02"]
        assert phases.index("drained") < phases.index("restarted") < phases.index("remediation")
        (h,) = _history(eng)
        assert h.status == fleet_records.COMPLETED and h.options["check"] == "liveness"
        assert h.options["action"] == heal.RESTART and "no token" in h.options["cause"]
        assert [p.phase for p in h.phases if p.host == "spark-02"] == [
            "breach", "drained", "stopped", "started", "gated", "in-rotation", heal.HEALED]
        assert pages == []
        # The other hosts were never touched.
        assert {n: fleet.hosts[n].containers[NAME].id for n in ("spark-01", "spark-03")} == {
            n: fleet.hosts[n].containers[NAME].id for n in ("spark-01", "spark-03")}
        assert all(_admin(eng, n) == "ready" for n in HOSTS)
    finally:
        eng.close()


def test_dry_run_says_what_it_would_do_and_touches_nothing(tmp_path: Path, inv_dir: Path) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, NEW), {OLD: OK, NEW: OK})
    eng = _engine(fleet, inv_dir, tmp_path / "state", Recorder())
    clock, pages = Clock(), []  # type: ignore[var-annotated]
    try:
        fixer = _remediator(eng, clock, pages, dry_run=True)
        said = [fixer.remediate("spark-01", "liveness", "wedged").detail for _ in range(3)]
        assert said[0].startswith("would drain spark-01, restart spark-01")
        assert said[2].startswith("would roll spark-01 back to its last known-good")
        assert fleet.points == [] and _history(eng) == [] and _admin(eng, "spark-01") == "ready"
    finally:
        eng.close()


def _roll_out_new(fleet: SimFleet, inv_dir: Path, state: Path) -> None:
    """OLD then a gated rollout to NEW: OLD is each host's known-good to go back to."""
    eng = _engine(fleet, inv_dir, state, Recorder())
    try:
        r = eng.rollout(Options(tag=NEW, limit=",".join(HOSTS), waves="100%", soak=1.0,
                                max_unavailable="1"))
        assert r.status == fleet_records.COMPLETED, r.error
    finally:
        eng.close()


def test_after_n_remediations_in_the_window_the_host_is_rolled_back_to_its_known_good(
    tmp_path: Path, inv_dir: Path
) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, OLD), {OLD: OK, NEW: OK})
    state = tmp_path / "state"
    _roll_out_new(fleet, inv_dir, state)
    eng = _engine(fleet, inv_dir, state, Recorder())
    clock, pages = Clock(), []  # type: ignore[var-annotated]
    try:
        fixer = _remediator(eng, clock, pages)
        results = []
        for _ in range(3):  # the engine wedges again after every start
            results.append(fixer.remediate("spark-03", "liveness", CAUSE.format("spark-03")))
            clock.now += 60
        assert [(x.action, x.result) for x in results] == [
            (heal.RESTART, heal.HEALED), (heal.RESTART, heal.HEALED),
            (heal.ROLLBACK, heal.ROLLED_BACK)], results
        assert fleet.serving_tags() == {"spark-01": NEW, "spark-02": NEW, "spark-03": OLD}
        assert all(_admin(eng, n) == "ready" for n in HOSTS)
        assert eng.ledger.out_of_rotation() == {}
        assert "2 remediations in 600s" in results[2].detail and pages == []
        # A rollback resets the host's count: its next breach is a restart again.
        clock.now += 60
        assert fixer.remediate("spark-03", "liveness", "wedged").action == heal.RESTART
        # Outside the window the count starts over.
        clock.now += 601
        assert fixer.remediate("spark-01", "canary", "changed").action == heal.RESTART
    finally:
        eng.close()


def test_with_no_known_good_the_host_is_parked_and_paged_and_the_others_keep_serving(
    tmp_path: Path, inv_dir: Path
) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, NEW), {OLD: OK, NEW: OK})
    state = tmp_path / "state"
    eng = _engine(fleet, inv_dir, state, Recorder())
    clock, pages = Clock(), []  # type: ignore[var-annotated]
    try:
        fixer = _remediator(eng, clock, pages)
        for _ in range(2):
            assert fixer.remediate("spark-01", "liveness", "wedged").result == heal.HEALED
            clock.now += 30
        r = fixer.remediate("spark-01", "liveness", "wedged")
        assert (r.action, r.result) == (heal.PARK, heal.PARKED), r
        assert "no rollback" in r.detail and "known-good" in r.detail
        assert _admin(eng, "spark-01") in ("drain", "maint")
        assert eng.ledger.out_of_rotation()["spark-01"].reason.startswith(heal.PARKED_REASON)
        assert [p[:2] for p in pages] == [("spark-01", heal.PARKED)]
        assert {n: _admin(eng, n) for n in ("spark-02", "spark-03")} == dict.fromkeys(
            ("spark-02", "spark-03"), "ready")
        assert _history(eng)[0].status == fleet_records.FAILED
        # Parked stays parked, paged once, also for a watch started later.
        assert fixer.remediate("spark-01", "liveness", "wedged").result == heal.PARKED
        again = _remediator(eng, clock, pages)
        assert again.remediate("spark-01", "probes", "down").result == heal.PARKED
        assert len(pages) == 1
    finally:
        eng.close()


def test_the_floor_a_running_rollout_and_the_recipe_breaker_hold_remediation_back(
    tmp_path: Path, inv_dir: Path
) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, NEW), {OLD: OK, NEW: OK})
    eng = _engine(fleet, inv_dir, tmp_path / "state", Recorder())
    clock, pages = Clock(), []  # type: ignore[var-annotated]
    try:
        # Floor: 3 of 3 hosts must stay in rotation, so none may be drained.
        r = _remediator(eng, clock, pages, floor="100%").remediate("spark-01", "liveness", "w")
        assert r.result == heal.WAITING and "floor 3" in r.detail, r
        assert fleet.points == [] and pages[-1][0] == "spark-01"
        # A rollout holding the host's lock excludes it.
        locks = eng.session.hold("ro-other", "rollout", [eng.inv.hosts["spark-02"]])
        try:
            r = _remediator(eng, clock, pages).remediate("spark-02", "liveness", "w")
            assert r.result == heal.EXCLUDED and "ro-other" in r.detail, r
        finally:
            locks.release()
        assert fleet.serving_tags() == dict.fromkeys(HOSTS, NEW)
        # The recipe's breaker: 2 remediations of its hosts in the window, then none.
        fixer = _remediator(eng, clock, pages, recipe_breaker=2)
        assert fixer.remediate("spark-01", "liveness", "w").result == heal.HEALED
        assert fixer.remediate("spark-02", "liveness", "w").result == heal.HEALED
        r = fixer.remediate("spark-03", "liveness", "w")
        assert r.result == heal.WAITING and "breaker is open" in r.detail
        # A check that a restart cannot heal is paged, not acted on.
        assert fixer.remediate("spark-03", "latency", "slow").result == heal.PAGED
    finally:
        eng.close()


def test_an_hour_of_breaches_keeps_the_remediators_memory_bounded(tmp_path: Path) -> None:
    """Every host breaching every 10 s for an hour of simulated time (no door): the counts the
    remediator keeps stay within hosts x breaker, whatever it did."""
    fleet = SimFleet(dict.fromkeys(HOSTS, NEW), {OLD: OK, NEW: OK})
    inv = paths.project_root() / "inventory" / "example"
    eng = Engine(inventory.load(inv), Recorder(), state_dir=tmp_path / "state", secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
    eng.progress = lambda e: None
    clock, pages = Clock(), []  # type: ignore[var-annotated]
    try:
        fixer = _remediator(eng, clock, pages, recipe_breaker=50, window="5m", floor=0)
        sizes, results = [], set()
        for _ in range(360):
            for n in HOSTS:
                results.add(fixer.remediate(n, "liveness", "wedged").result)
            clock.now += 10
            sizes.append(fixer.size())
        assert max(sizes) <= len(HOSTS) * 2 + 50 + 2 * len(HOSTS), max(sizes)
        assert results == {heal.HEALED, heal.PARKED}
        assert fixer.parked().keys() == set(HOSTS)  # none had a known-good: each parked once
        assert len(pages) <= 2 * 360 * len(HOSTS)
    finally:
        eng.close()


def test_the_policy_is_checked_field_by_field() -> None:
    from fleetctl.errors import FleetError

    with pytest.raises(FleetError, match=r"watch\.breaker is 0"):
        policy.from_mapping({"breaker": 0}, "r")
    with pytest.raises(FleetError, match="unknown watch field"):
        policy.from_mapping({"breakers": 2}, "r")
    with pytest.raises(FleetError, match=r"watch\.floor"):
        policy.from_mapping({"floor": "lots"}, "r")
    with pytest.raises(FleetError, match=r"watch\.gate is '1h', not at most 600s"):
        policy.from_mapping({"gate": "1h"}, "r")
    p = policy.from_mapping({"floor": "50%", "window": "10m"}, "r")
    assert p.floor_of(4) == 2 and p.window == 600 and not p.remediate
    # The re-gate's default: smoke and a few seconds of load.
    assert p.gate == policy.DEFAULT_GATE == 5.0
    assert policy.from_mapping({"gate": 0}, "r").gate == 0


def test_the_regates_load_catches_what_smoke_passes_and_the_host_is_not_readmitted(
    tmp_path: Path, inv_dir: Path
) -> None:
    """A version that passes smoke but fails under load (SOAKFAIL): with watch.gate the restart's
    re-gate fails it (then no known-good: parked); smoke only would have re-admitted it."""
    fleet = SimFleet(dict.fromkeys(HOSTS, NEW), {OLD: OK, NEW: SOAKFAIL})
    eng = _engine(fleet, inv_dir, tmp_path / "state", Recorder())
    clock, pages = Clock(), []  # type: ignore[var-annotated]
    try:
        r = _remediator(eng, clock, pages, gate=0).remediate("spark-01", "liveness", "w")
        assert (r.action, r.result) == (heal.RESTART, heal.HEALED), r
        r = _remediator(eng, clock, pages, gate="5s").remediate("spark-02", "liveness", "w")
        assert (r.action, r.result) == (heal.PARK, heal.PARKED), r
        assert "re-gate fail" in r.detail and _admin(eng, "spark-02") in ("drain", "maint")
        (rec,) = [h for h in _history(eng) if h.options["host"] == "spark-02"]
        gated = [x for x in rec.phases if x.phase == "gated"]
        assert gated and (gated[0].detail or "").startswith("fail"), gated
    finally:
        eng.close()




def test_history_lists_remediations_with_host_cause_action_and_result(
    tmp_path: Path, inv_dir: Path
) -> None:
    from click.testing import CliRunner

    from fleetctl.cli.main import cli

    fleet = SimFleet(dict.fromkeys(HOSTS, NEW), {OLD: OK, NEW: OK})
    state = tmp_path / "state"
    eng = _engine(fleet, inv_dir, state, Recorder())
    clock, pages = Clock(), []  # type: ignore[var-annotated]
    try:
        fixer = _remediator(eng, clock, pages)
        for _ in range(3):
            fixer.remediate("spark-02", "liveness", CAUSE.format("spark-02"))
    finally:
        eng.close()
    env = {"FLEETCTL_STATE_DIR": str(state), "COLUMNS": "200"}
    out = CliRunner().invoke(cli, ["-i", str(inv_dir / "hosts.yml"), "history", "--json"], env=env)
    assert out.exit_code == 0, out.output
    import json

    got = [r["remediation"] for r in json.loads(out.output) if r["kind"] == KIND]
    assert [(r["host"], r["check"], r["action"], r["result"]) for r in got] == [
        ("spark-02", "liveness", "park", heal.PARKED),
        ("spark-02", "liveness", "restart", heal.HEALED),
        ("spark-02", "liveness", "restart", heal.HEALED)]
    assert all("no token" in r["cause"] for r in got)
    table = CliRunner().invoke(cli, ["-i", str(inv_dir / "hosts.yml"), "history"], env=env)
    assert "spark-02: liveness (engine wedged on spark-02" in table.output, table.output


def test_a_watch_killed_mid_remediation_leaves_a_record_the_next_watch_finishes(
    tmp_path: Path, inv_dir: Path
) -> None:
    from tests.rollout.sim import Killed

    fleet = SimFleet(dict.fromkeys(HOSTS, NEW), {OLD: OK, NEW: OK})
    state = tmp_path / "state"
    eng = _engine(fleet, inv_dir, state, Recorder())
    fleet.kill_at = 1  # dies right after the container's stop, the host drained
    with pytest.raises(Killed):
        _remediator(eng, Clock(), []).remediate("spark-02", "liveness", "wedged")
    fleet.revive()
    eng = _engine(fleet, inv_dir, state, Recorder())
    try:
        assert not fleet.hosts["spark-02"].containers[NAME].running
        assert _admin(eng, "spark-02") == "drain"
        (left,) = _history(eng)
        assert left.status == "remediating"
        (r,) = _remediator(eng, Clock(), []).recover()
        assert r.result == heal.HEALED and r.id == left.id, r
        assert fleet.hosts["spark-02"].containers[NAME].running
        assert _admin(eng, "spark-02") == "ready" and eng.ledger.out_of_rotation() == {}
        assert eng.ledger.get(left.id).status == fleet_records.COMPLETED
        assert _remediator(eng, Clock(), []).recover() == []
    finally:
        eng.close()


def test_a_units_breach_restarts_every_member_stopped_first_then_started_in_launch_order(
    tmp_path: Path,
) -> None:
    from tests.rollout.test_unit_recovery_harness import HEAD, INV, UNIT, WORKER

    fleet = SimFleet(dict.fromkeys(["spark-01", *UNIT], NEW), {OLD: OK, NEW: OK})
    fleet.units = {HEAD: list(UNIT)}
    eng = Engine(inventory.load(INV), Recorder(), state_dir=tmp_path / "state", secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
    try:
        p = policy.from_mapping({"remediate": True, "gate": 0, "floor": 0}, "sim")
        fixer = heal.Remediator(eng, [HEAD], lambda _r: p, clock=Clock())
        r = fixer.remediate(WORKER, "liveness", "the unit's worker was lost: no token")
        assert (r.result, r.members) == (heal.HEALED, (HEAD, WORKER)), r
        assert fleet.points == [f"{HEAD}:stop", f"{WORKER}:stop", f"{HEAD}:start-again",
                                f"{WORKER}:start-again"], fleet.points
        assert fleet.serving_tags() == dict.fromkeys(["spark-01", *UNIT], NEW)
    finally:
        eng.close()
