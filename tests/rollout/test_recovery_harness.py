"""Fault injection for the rollout engine's state machine, on a simulated fleet
(tests/rollout/sim.py).

The controller is killed at every ledger transition and after every remote
side effect of a run; a new controller then runs ``--resume``, ``abort`` or
``rollback``, and for every kill point each host must serve a known version
(what it served before, or a new tag that passed its gate), the ledger must
hold no active record, and a later rollout must start and complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl import inventory, paths
from fleetctl.container import LABEL_FINGERPRINT
from fleetctl.errors import ExitCode
from fleetctl.progress import Recorder
from fleetctl.rollout import host as remote
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RollbackOptions, RolloutResult
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

from .sim import (
    BEHAVIOUR_LABEL,
    EXIT1,
    NOSTART,
    OK,
    SOAKFAIL,
    Container,
    Killed,
    SimFleet,
    SimGates,
    active,
    assert_not_wedged,
    digest_of,
    recover,
    run_command,
)

INV = paths.project_root() / "inventory" / "example"
HOSTS = ["spark-01", "spark-02", "spark-03"]
A, B, BAD, EXIT, SOAKBAD, C = "v1", "v2", "v-nostart", "v-exit1", "v-soakfail", "v3"
TAGS = {A: OK, B: OK, C: OK, BAD: NOSTART, EXIT: EXIT1, SOAKBAD: SOAKFAIL}


def _fleet() -> SimFleet:
    return SimFleet(dict.fromkeys(HOSTS, A), TAGS)


def _engine(fleet: SimFleet, state: Path) -> Engine:
    inv = inventory.load(INV)
    eng = Engine(inv, state_dir=state, secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve))
    fleet.watch(eng.ledger)
    return eng


def _opts(tag: str, **kw: str) -> Options:
    return Options(tag=tag, limit=",".join(HOSTS), waves=kw.get("waves", "1,100%"),
                   failure_budget=kw.get("failure_budget"), soak=1.0)


def _run(
    fleet: SimFleet, state: Path, what: str, tag: str | None = None, **kw: str
) -> RolloutResult:
    # Only a rollout takes the case's options; a resume reads them from its record.
    opts = _opts(tag or B, **kw) if what == "rollout" else _opts(tag or B)
    return run_command(_engine(fleet, state), what, opts, ",".join(HOSTS), to=tag)


def _assert_known(fleet: SimFleet, allowed: set[str], state: Path) -> None:
    """Every host serves an allowed version, or the ledger reports it down with the command that
    fixes it."""
    for n, h in fleet.hosts.items():
        d = fleet.serving_digest(n)
        if d in {digest_of(t) for t in allowed}:
            continue
        with fleet_ledger.open_ledger(state) as led:
            recs = [r.host(n) for r in led.history()]
        reported = [
            r
            for r in recs
            if r is not None and r.status == fleet_records.HOST_FAILED and "fix:" in (r.error or "")
        ]
        assert reported, f"{n} serves {d} ({h.containers}) and is not reported down with a fix"


def _clean_points(what: str, **kw: str) -> int:
    """How many points an uninterrupted run of ``what`` goes through."""
    fleet = _fleet()
    with tempfile.TemporaryDirectory() as d:
        _run(fleet, Path(d), what, **kw)
    return len(fleet.points)


N_GOOD = _clean_points("rollout", tag=B)
N_FAILING = _clean_points("rollout", tag=SOAKBAD)


def _kill_then(fleet: SimFleet, state: Path, k: int, tag: str) -> None:
    fleet.kill_at = k
    with pytest.raises(Killed):
        _run(fleet, state, "rollout", tag=tag)
    fleet.revive()


def _recover(fleet: SimFleet, state: Path, how: str) -> None:
    recover(lambda what: _run(fleet, state, what), state, how)


def _not_wedged(fleet: SimFleet, state: Path) -> None:
    """No active record, and a later rollout starts and takes every host to C."""
    assert_not_wedged(fleet, state, lambda tag: _run(fleet, state, "rollout", tag=tag), C)


KILL_POINTS = [(B, k) for k in range(1, N_GOOD + 1)] + [
    (SOAKBAD, k) for k in range(1, N_FAILING + 1)
]


@pytest.mark.parametrize("how", ["resume", "abort", "rollback"])
@pytest.mark.parametrize(("tag", "k"), KILL_POINTS)
def test_kill_anywhere_in_a_rollout(tmp_path: Path, tag: str, k: int, how: str) -> None:
    """A good rollout (v2), and one whose canary fails its soak (never left serving: it did not
    pass)."""
    fleet = _fleet()
    _kill_then(fleet, tmp_path, k, tag)
    _recover(fleet, tmp_path, how)
    _assert_known(fleet, {A, B} if tag == B else {A}, tmp_path)
    if how == "resume" and tag == B:
        assert set(fleet.serving_tags().values()) == {B}
    _not_wedged(fleet, tmp_path)


@pytest.mark.parametrize("k", range(1, 40))
def test_kill_anywhere_in_a_rollback_to_an_unstartable_image(tmp_path: Path, k: int) -> None:
    fleet = _fleet()
    fleet.kill_at = k
    with contextlib.suppress(Killed):
        _run(fleet, tmp_path, "rollback", tag=BAD)
    fleet.revive()
    if active(tmp_path):
        _run(fleet, tmp_path, "resume" if k % 2 else "abort")
    _assert_known(fleet, {A}, tmp_path)
    _not_wedged(fleet, tmp_path)


@pytest.mark.parametrize(("tag", "why"), [(BAD, "device driver"), (EXIT, "readiness")])
def test_a_canary_that_cannot_start_or_become_ready_is_undone(
    tmp_path: Path, tag: str, why: str
) -> None:
    fleet = _fleet()
    r = _run(fleet, tmp_path, "rollout", tag=tag)
    assert r.status == fleet_records.FAILED and r.exit_code == ExitCode.FAILED
    assert why in (r.error or "")
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, A)
    canary = next(h for h in r.hosts if h.status != fleet_records.PENDING)
    assert canary.status == fleet_records.ROLLED_BACK and canary.after_digest == digest_of(A)
    _not_wedged(fleet, tmp_path)


def test_ssh_lost_after_the_stop_reports_the_host_down_with_its_fix(tmp_path: Path) -> None:
    fleet = _fleet()
    fleet.hosts["spark-01"].ssh_down_after = "retire"
    r = _run(fleet, tmp_path, "rollout", tag=B)
    assert r.status == fleet_records.FAILED
    h1 = next(h for h in r.hosts if h.host == "spark-01")
    assert h1.status == fleet_records.HOST_FAILED
    assert f"fleetctl rollback --to {A} --limit spark-01" in (h1.error or "")
    assert fleet.serving_tags()["spark-02"] == A and fleet.serving_tags()["spark-03"] == A
    # The stopped v1 was kept: once SSH is back, the rollback the message names brings it back.
    fleet.hosts["spark-01"].ssh_down = False
    assert fleet.hosts["spark-01"].containers["vllm.prev"].digest == digest_of(A)
    rb = _run(fleet, tmp_path, "rollback", tag=A)
    assert rb.status == fleet_records.COMPLETED
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, A)


def test_rollback_to_an_unstartable_image_leaves_every_host_as_it_was(tmp_path: Path) -> None:
    fleet = _fleet()
    _run(fleet, tmp_path, "rollout", tag=B)
    r = _run(fleet, tmp_path, "rollback", tag=BAD)
    assert r.status == fleet_records.FAILED and r.exit_code == ExitCode.FAILED
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)
    assert {h.status for h in r.hosts} == {fleet_records.ROLLED_BACK}


def test_rollback_of_a_rollback(tmp_path: Path) -> None:
    fleet = _fleet()
    _run(fleet, tmp_path, "rollout", tag=B)
    assert _run(fleet, tmp_path, "rollback").status == fleet_records.COMPLETED
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, A)
    assert _run(fleet, tmp_path, "rollback").status == fleet_records.COMPLETED
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)


def test_budgeted_failures_complete_with_failures(tmp_path: Path) -> None:
    fleet = _fleet()
    fleet.hosts["spark-03"].behaviour[digest_of(B)] = SOAKFAIL
    r = _run(fleet, tmp_path, "rollout", tag=B, failure_budget="1")
    assert r.status == fleet_records.COMPLETED_WITH_FAILURES
    assert r.exit_code == ExitCode.COMPLETED_WITH_FAILURES
    assert fleet.serving_tags() == {"spark-01": B, "spark-02": B, "spark-03": A}


def test_failure_budget_is_carried_across_resumes(tmp_path: Path) -> None:
    fleet = _fleet()
    fleet.hosts["spark-02"].behaviour[digest_of(B)] = SOAKFAIL
    fleet.hosts["spark-03"].behaviour[digest_of(B)] = SOAKFAIL
    # Die right after spark-02 was rolled back (its failure used the whole budget of 1).
    probe = _fleet()
    probe.hosts["spark-02"].behaviour[digest_of(B)] = SOAKFAIL
    probe.hosts["spark-03"].behaviour[digest_of(B)] = SOAKFAIL
    with tempfile.TemporaryDirectory() as d:
        _run(probe, Path(d), "rollout", tag=B, waves="1,1,1", failure_budget="1")
    k = next(i for i, p in enumerate(probe.points, 1) if p == "ledger.host_phase:rolled-back")
    fleet.kill_at = k
    with pytest.raises(Killed):
        _run(fleet, tmp_path, "rollout", tag=B, waves="1,1,1", failure_budget="1")
    fleet.revive()
    r = _run(fleet, tmp_path, "resume")
    assert r.status == fleet_records.FAILED, (
        "the second failure is over the budget carried from before the kill"
    )
    assert fleet.serving_tags() == {"spark-01": B, "spark-02": A, "spark-03": A}


def test_ctrl_c_restores_the_current_host_then_stops(tmp_path: Path) -> None:
    fleet = _fleet()
    fleet.ctrl_c_in_soak = "spark-01"
    with pytest.raises(KeyboardInterrupt):
        _run(fleet, tmp_path, "rollout", tag=B)
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, A)
    with fleet_ledger.open_ledger(tmp_path) as led:
        assert led.holder() is None, "the lock is released only after every worker stopped"
        rec = led.latest()
        assert rec is not None and rec.status == fleet_records.PAUSED
    r = _run(fleet, tmp_path, "resume")
    assert r.status == fleet_records.COMPLETED
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)


def test_the_next_rollout_never_removes_the_last_good_container(tmp_path: Path) -> None:
    fleet = _fleet()
    # Left by a failed start: a dead container in the serving name, the good v1 kept as .prev.
    h = fleet.hosts["spark-01"]
    good = h.containers.pop("vllm")
    good.name, good.running, good.status = "vllm.prev", False, "exited"
    h.containers["vllm.prev"] = good
    h.containers["vllm"] = Container("vllm", digest_of(BAD), BAD, "ro-old", False, "created")
    r = _run(fleet, tmp_path, "rollout", tag=SOAKBAD)
    assert r.status == fleet_records.FAILED
    assert fleet.serving_tags()["spark-01"] == A


def iter_points() -> Iterator[str]:
    """The points of a clean good rollout (for a reader of a failing kill test)."""
    fleet = _fleet()
    with tempfile.TemporaryDirectory() as d:
        _run(fleet, Path(d), "rollout", tag=B)
    yield from fleet.points


def _skips(r: RolloutResult) -> dict[str, str]:
    return {h.host: h.verdict or "" for h in r.hosts if h.status == fleet_records.SKIPPED}


def test_rollback_goes_to_the_last_known_good_not_the_newest_record(tmp_path: Path) -> None:
    fleet = _fleet()
    _run(fleet, tmp_path, "rollout", tag=B)
    assert _run(fleet, tmp_path, "rollback", tag=C).status == fleet_records.COMPLETED
    # v3 came by --to (no full gate): the last known-good is v2, not v1 from the older rollout.
    assert _run(fleet, tmp_path, "rollback").status == fleet_records.COMPLETED
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)


def test_rollback_after_a_canary_failure_names_every_host_already_there(tmp_path: Path) -> None:
    fleet = _fleet()
    assert _run(fleet, tmp_path, "rollout", tag=SOAKBAD).status == fleet_records.FAILED
    r = _run(fleet, tmp_path, "rollback")
    assert r.status == fleet_records.COMPLETED and r.exit_code == ExitCode.OK
    assert set(_skips(r)) == set(HOSTS)
    assert all("already there" in why for why in _skips(r).values())
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, A)


def test_rollback_skips_a_first_deploy_and_hosts_not_in_the_last_rollout(tmp_path: Path) -> None:
    fleet = SimFleet({"spark-01": A, "spark-02": A, "spark-03": A, "spark-04": A}, TAGS)
    del fleet.hosts["spark-03"].containers["vllm"]
    eng = _engine(fleet, tmp_path)
    try:
        assert (
            eng.rollout(Options(tag=B, limit="spark-01,spark-02,spark-03", soak=1.0)).status
            == fleet_records.COMPLETED
        )
        r = eng.rollback()
    finally:
        eng.close()
    assert r.status == fleet_records.COMPLETED
    skips = _skips(r)
    assert "first deploy" in skips["spark-03"]
    assert "not in the last rollout" in skips["spark-04"]
    assert fleet.serving_tags() == {"spark-01": A, "spark-02": A, "spark-03": B, "spark-04": A}


def test_a_recipe_only_change_rolls_out_through_the_canary_and_gates(tmp_path: Path) -> None:
    fleet = _fleet()
    assert _run(fleet, tmp_path, "rollout", tag=B).status == fleet_records.COMPLETED
    again = _run(fleet, tmp_path, "rollout", tag=B)
    assert {h.status for h in again.hosts} == {fleet_records.SKIPPED}, (
        "same image, same settings: nothing to do"
    )
    eng = _engine(fleet, tmp_path)
    changed = dataclasses.replace(
        eng.recipe(), docker_args=(*eng.recipe().docker_args, "--shm-size=32g")
    )
    eng.session.recipe = lambda name=None: changed  # type: ignore[method-assign]
    fleet.hosts["spark-01"].behaviour[digest_of(B)] = (
        SOAKFAIL  # the new settings fail the canary's soak
    )
    try:
        r = eng.rollout(_opts(B))
    finally:
        eng.close()
    assert r.plan is not None and [h.reason for h in r.plan.hosts] == ["settings"] * 3
    assert r.status == fleet_records.FAILED
    assert fleet.hosts["spark-01"].containers["vllm"].labels[
        LABEL_FINGERPRINT
    ] == remote.fingerprint(_engine(fleet, tmp_path).recipe()), (
        "the canary is back on the old settings"
    )
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)


def test_what_served_when_a_rollout_moved_a_host_away_is_known_good(tmp_path: Path) -> None:
    fleet = _fleet()
    assert _run(fleet, tmp_path, "rollback", tag=C).status == fleet_records.COMPLETED
    assert _run(fleet, tmp_path, "rollout", tag=B).status == fleet_records.COMPLETED
    assert _run(fleet, tmp_path, "rollback").status == fleet_records.COMPLETED
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, C)
    with fleet_ledger.open_ledger(tmp_path) as led:
        assert [(k.tag, k.source) for k in led.known_good("spark-01")] == [
            (B, "gate"),
            (C, "served"),
            (A, "found"),
        ]


def _with_recipe_change(fleet: SimFleet, state: Path) -> tuple[Engine, str, str]:
    """An engine whose recipe adds a docker arg; the old and the new settings' fingerprints."""
    eng = _engine(fleet, state)
    old = eng.recipe()
    changed = dataclasses.replace(old, docker_args=(*old.docker_args, "--shm-size=32g"))
    eng.session.recipe = lambda name=None: changed  # type: ignore[method-assign]
    return eng, remote.fingerprint(old), remote.fingerprint(changed)


def _fingerprints(fleet: SimFleet) -> dict[str, str]:
    return {
        n: h.containers["vllm"].labels[LABEL_FINGERPRINT] for n, h in fleet.hosts.items()
    }


def _changed_everywhere(fleet: SimFleet, state: Path) -> tuple[str, str]:
    """B rolled out, then a recipe-only change of B that passed on every host; the old and new
    fingerprints."""
    assert _run(fleet, state, "rollout", tag=B).status == fleet_records.COMPLETED
    eng, old_fp, new_fp = _with_recipe_change(fleet, state)
    try:
        assert eng.rollout(_opts(B)).status == fleet_records.COMPLETED
    finally:
        eng.close()
    assert _fingerprints(fleet) == dict.fromkeys(HOSTS, new_fp)
    return old_fp, new_fp


def _rollback_changed(fleet: SimFleet, state: Path, limit: str = ",".join(HOSTS)) -> RolloutResult:
    eng, _old, _new = _with_recipe_change(fleet, state)
    try:
        return eng.rollback(RollbackOptions(limit=limit))
    finally:
        eng.close()


def test_rollback_of_a_recipe_only_change_restores_the_old_settings(tmp_path: Path) -> None:
    fleet = _fleet()
    old_fp, _new = _changed_everywhere(fleet, tmp_path)
    # Same image, other settings: the rollback is not "already there".
    r = _rollback_changed(fleet, tmp_path)
    assert r.status == fleet_records.COMPLETED, r
    assert {h.status for h in r.hosts} == {fleet_records.DONE}
    assert _fingerprints(fleet) == dict.fromkeys(HOSTS, old_fp)
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)


def test_abort_of_an_interrupted_recipe_only_change_restores_the_old_settings(
    tmp_path: Path,
) -> None:
    def change(fleet: SimFleet, state: Path, kill_at: int | None) -> None:
        assert _run(fleet, state, "rollout", tag=B).status == fleet_records.COMPLETED
        fleet.revive()
        fleet.kill_at = kill_at
        eng, _, _ = _with_recipe_change(fleet, state)
        try:
            eng.rollout(_opts(B))
        finally:
            eng.close()

    probe = _fleet()
    change(probe, tmp_path / "probe", None)
    # The controller dies right after the canary passed with the new settings.
    k = next(i for i, p in enumerate(probe.points, 1) if p == "ledger.host_phase:done")
    fleet = _fleet()
    with contextlib.suppress(Killed):
        change(fleet, tmp_path / "run", k)
    fleet.revive()
    eng, old_fp, new_fp = _with_recipe_change(fleet, tmp_path / "run")
    assert _fingerprints(fleet)["spark-01"] == new_fp
    try:
        r = eng.abort()
    finally:
        eng.close()
    assert r.status == fleet_records.COMPLETED, r
    assert _fingerprints(fleet) == dict.fromkeys(HOSTS, old_fp)


def test_a_known_good_whose_settings_are_gone_is_refused_and_the_host_left_alone(
    tmp_path: Path,
) -> None:
    fleet = _fleet()
    _old, new_fp = _changed_everywhere(fleet, tmp_path)
    for h in fleet.hosts.values():  # somebody cleaned up the kept containers
        h.containers.pop("vllm" + remote.PREV_SUFFIX, None)
    r = _rollback_changed(fleet, tmp_path)
    assert r.status == fleet_records.FAILED and r.exit_code != ExitCode.OK
    assert _fingerprints(fleet) == dict.fromkeys(HOSTS, new_fp), "no host was touched"
    for h in r.hosts:
        assert (
            h.error and "other container settings" in h.error and "fleetctl rollout" in h.error
        ), h.error


def test_a_rollback_to_old_settings_that_fail_is_undone_to_the_new_ones(tmp_path: Path) -> None:
    fleet = _fleet()
    _old, new_fp = _changed_everywhere(fleet, tmp_path)
    # The kept container with the old settings no longer starts (its mount went away, say).
    fleet.hosts["spark-01"].containers["vllm" + remote.PREV_SUFFIX].labels[BEHAVIOUR_LABEL] = (
        NOSTART
    )
    r = _rollback_changed(fleet, tmp_path, limit="spark-01")
    assert r.status == fleet_records.FAILED
    assert [h.status for h in r.hosts if h.host == "spark-01"] == [fleet_records.ROLLED_BACK]
    assert _fingerprints(fleet)["spark-01"] == new_fp, "back on the settings that served"


@pytest.mark.parametrize("how", ["resume", "abort"])
def test_killed_right_after_restoring_a_failed_canary_the_restored_version_is_kept(
    tmp_path: Path, how: str
) -> None:
    """The restore had happened (the host serves v1 again, no .prev left) when the controller died:
    finishing the rollback checks v1 where it runs; restoring again would remove it with nothing to
    start."""
    fleet = _fleet()
    probe = _fleet()
    with tempfile.TemporaryDirectory() as d:
        _run(probe, Path(d), "rollout", tag=SOAKBAD)
    _kill_then(fleet, tmp_path, probe.points.index("spark-01:restore") + 1, SOAKBAD)
    assert (
        fleet.serving_tags()["spark-01"] == A
        and "vllm.prev" not in fleet.hosts["spark-01"].containers
    )
    _recover(fleet, tmp_path, how)
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, A)
    if how == "resume":
        with fleet_ledger.open_ledger(tmp_path) as led:
            canary = led.get(led.ids()[-1]).host("spark-01")
        assert canary is not None and canary.status == fleet_records.ROLLED_BACK, canary
    _not_wedged(fleet, tmp_path)


def test_each_wave_is_announced_fleet_wide(tmp_path: Path) -> None:
    fleet = _fleet()
    eng = _engine(fleet, tmp_path)
    rec = Recorder()
    eng.progress = rec
    try:
        r = eng.rollout(_opts(B, waves="1,100%"))
    finally:
        eng.close()
    assert r.status == fleet_records.COMPLETED
    waves = [e.message for e in rec.events if e.phase == "wave" and e.host is None]
    assert waves == ["1 of 2: 1 host(s), 1 at a time", "2 of 2: 2 host(s), 1 at a time"]
