"""The rollout's deploy step through the vllm_serve role (fleetctl.rollout.deploy), on the
simulated fleet.

The deployer here is tests/rollout/sim.py's SimDeployer: the role module's own
retire decision and its docker steps one by one, each a kill point. The
controller is killed everywhere in a rollout that deploys this way (inside the
role's run too: after the retire and before the start, after the start), then
resumed, aborted or rolled back; every host must serve a known version, no
record stays active, and a later rollout completes. The steps of a wave are
deployed by one run each (two hosts together with --max-unavailable 2).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest
import yaml

from fleetctl import inventory, paths
from fleetctl.container import (
    LABEL_DIGEST,
    LABEL_FINGERPRINT,
    LABEL_RECIPE,
    LABEL_ROLLOUT,
    LABEL_TAG,
)
from fleetctl.errors import FleetError
from fleetctl.recipes import recipe_for
from fleetctl.rollout import deploy
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RolloutResult
from fleetctl.rollout.session import Seams
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

from .sim import (
    NAME,
    NOSTART,
    OK,
    PREV,
    SOAKFAIL,
    Container,
    Killed,
    SimDeployer,
    SimFleet,
    SimGates,
    digest_of,
    run_command,
)

INV = paths.project_root() / "inventory" / "example"
HOSTS = ["spark-01", "spark-02", "spark-03"]
A, B, C, BAD, SOAKBAD = "v1", "v2", "v3", "v-nostart", "v-soakfail"
TAGS = {A: OK, B: OK, C: OK, BAD: NOSTART, SOAKBAD: SOAKFAIL}


def _fleet() -> tuple[SimFleet, SimDeployer]:
    fleet = SimFleet(dict.fromkeys(HOSTS, A), TAGS)
    return fleet, SimDeployer(fleet)


def _run(fleet: SimFleet, dep: SimDeployer, state: Path, what: str, tag: str = B,
         budget: str | None = None) -> RolloutResult:
    eng = Engine(inventory.load(INV), state_dir=state, secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve,
                             deployer=dep))
    fleet.watch(eng.ledger)
    opts = Options(
        tag=tag,
        limit=",".join(HOSTS),
        waves="1,100%",
        max_unavailable="2",
        failure_budget=budget,
        soak=1.0,
    )
    return run_command(eng, what, opts, ",".join(HOSTS))


def _active(state: Path) -> list[str]:
    with fleet_ledger.open_ledger(state) as led:
        return led.ids(statuses=fleet_records.ACTIVE)


def _points(tag: str) -> list[str]:
    fleet, dep = _fleet()
    with tempfile.TemporaryDirectory() as d:
        _run(fleet, dep, Path(d), "rollout", tag)
    return list(fleet.points)


GOOD_POINTS = _points(B)
FAILING_POINTS = _points(SOAKBAD)


def test_a_wave_is_deployed_by_one_run_per_step_and_ends_on_the_new_version(tmp_path: Path) -> None:
    fleet, dep = _fleet()
    r = _run(fleet, dep, tmp_path, "rollout")
    assert r.status == fleet_records.COMPLETED, r.error
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)
    # The canary alone, then the two others of wave 2 together (--max-unavailable 2).
    assert dep.runs == [["spark-01"], ["spark-02", "spark-03"]]
    for h in fleet.hosts.values():
        assert h.containers[PREV].digest == digest_of(A)
    # The ledger went through the same phases as the controller's own deploy.
    with fleet_ledger.open_ledger(tmp_path) as led:
        rec = led.get(r.id or "")
        assert {h.status for h in rec.hosts} == {fleet_records.DONE}
    phases = [p.split(":", 1)[1] for p in GOOD_POINTS if p.startswith("ledger.host_phase:")]
    assert phases[:4] == ["stopping", "starting", "loading", "soak"]


@pytest.mark.parametrize("how", ["resume", "abort", "rollback"])
@pytest.mark.parametrize(("tag", "k"), [(B, k) for k in range(1, len(GOOD_POINTS) + 1)]
                         + [(SOAKBAD, k) for k in range(1, len(FAILING_POINTS) + 1)])
def test_kill_anywhere_in_a_rollout_deployed_by_the_role(
    tmp_path: Path, tag: str, k: int, how: str
) -> None:
    fleet, dep = _fleet()
    fleet.kill_at = k
    with pytest.raises(Killed):
        _run(fleet, dep, tmp_path, "rollout", tag)
    fleet.revive()
    if how == "rollback" or _active(tmp_path):
        _run(fleet, dep, tmp_path, how)
    allowed = {digest_of(A), digest_of(B)} if tag == B else {digest_of(A)}
    for n in HOSTS:
        assert fleet.serving_digest(n) in allowed, (n, fleet.hosts[n].containers)
    if how == "resume" and tag == B:
        assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)
    assert _active(tmp_path) == []
    later = _run(fleet, dep, tmp_path, "rollout", C)
    assert later.status == fleet_records.COMPLETED, later.error
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, C)


def _killed_at(what: str, state: Path) -> tuple[SimFleet, SimDeployer]:
    """A good rollout whose controller died right after the point ``what``."""
    fleet, dep = _fleet()
    fleet.kill_at = GOOD_POINTS.index(what) + 1
    with pytest.raises(Killed):
        _run(fleet, dep, state, "rollout")
    fleet.revive()
    return fleet, dep


@pytest.mark.parametrize("how", ["resume", "abort"])
def test_killed_inside_the_role_run_after_the_retire_before_the_start(
    tmp_path: Path, how: str
) -> None:
    fleet, dep = _killed_at("spark-01:retire", tmp_path)
    h = fleet.hosts["spark-01"]
    # The module stopped the old one and kept it as .prev, as the controller's retire does.
    assert NAME not in h.containers and h.containers[PREV].digest == digest_of(A)
    with fleet_ledger.open_ledger(tmp_path) as led:
        rec = led.get(led.ids()[0]).host("spark-01")
        assert rec is not None and (rec.phase, rec.before_digest) == ("stopping", digest_of(A))
    r = _run(fleet, dep, tmp_path, how)
    assert r.status == fleet_records.COMPLETED, r.error
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B if how == "resume" else A)


@pytest.mark.parametrize("how", ["resume", "abort"])
def test_killed_inside_the_role_run_after_the_start(tmp_path: Path, how: str) -> None:
    fleet, dep = _killed_at("spark-01:start", tmp_path)
    h = fleet.hosts["spark-01"]
    assert h.containers[NAME].digest == digest_of(B) and h.containers[PREV].digest == digest_of(A)
    runs = len(dep.runs)
    r = _run(fleet, dep, tmp_path, how)
    assert r.status == fleet_records.COMPLETED, r.error
    if how == "resume":
        # This rollout's container is gated where it runs, not deployed again.
        assert ["spark-01"] not in dep.runs[runs:]
        canary = next(o for o in r.hosts if o.host == "spark-01")
        assert canary.status == fleet_records.DONE
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B if how == "resume" else A)


def test_a_host_whose_start_fails_in_the_run_is_restored_the_other_goes_on(tmp_path: Path) -> None:
    fleet, dep = _fleet()
    fleet.hosts["spark-03"].behaviour[digest_of(B)] = NOSTART
    r = _run(fleet, dep, tmp_path, "rollout", budget="1")
    assert r.status == fleet_records.COMPLETED_WITH_FAILURES, r.error
    assert dep.runs == [["spark-01"], ["spark-02", "spark-03"]]
    assert fleet.serving_tags() == {"spark-01": B, "spark-02": B, "spark-03": A}
    o3 = next(o for o in r.hosts if o.host == "spark-03")
    assert o3.status == fleet_records.ROLLED_BACK and "device driver" in (o3.error or "")


@pytest.mark.parametrize("step", ["rm-prev", "stop"])
def test_a_retire_that_fails_in_the_run_restores_nothing_and_keeps_the_old_container(
    tmp_path: Path, step: str
) -> None:
    fleet, dep = _fleet()
    _run(
        fleet, dep, tmp_path, "rollout"
    )  # every host now has a .prev (A) to be removed by the next deploy
    dep.fail_at["spark-01"] = step
    r = _run(fleet, dep, tmp_path, "rollout", C)
    assert r.status == fleet_records.FAILED
    o1 = next(o for o in r.hosts if o.host == "spark-01")
    assert o1.status == fleet_records.HOST_FAILED and f"docker {step} failed" in (o1.error or "")
    assert "not retired by this deploy" in (o1.error or "")
    # Never stopped by this deploy: it still serves B, and its .prev is whatever the failed step
    # left.
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)


def test_ssh_lost_after_the_retire_in_the_run_reports_the_host_down_and_the_rollback_brings_it_back(
        tmp_path: Path) -> None:
    fleet, dep = _fleet()
    fleet.hosts["spark-01"].ssh_down_after = "retire"
    r = _run(fleet, dep, tmp_path, "rollout")
    assert r.status == fleet_records.FAILED
    o1 = next(o for o in r.hosts if o.host == "spark-01")
    assert o1.status == fleet_records.HOST_FAILED and "fix:" in (o1.error or "")
    fleet.hosts["spark-01"].ssh_down = False
    assert fleet.hosts["spark-01"].containers[PREV].digest == digest_of(A)
    assert _run(fleet, dep, tmp_path, "rollback").status == fleet_records.COMPLETED
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, A)


def test_the_deploy_run_gets_the_recipes_container_secrets(tmp_path: Path) -> None:
    fleet, dep = _fleet()
    inv = inventory.load(INV)
    eng = Engine(inv, state_dir=tmp_path, secrets={"VLLM_API_KEY": "k-0123456789"},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve,
                             deployer=dep))
    try:
        recipe = recipe_for(inv)
        want = {n: "k-0123456789" for n in recipe.secret_env if n == "VLLM_API_KEY"}
        eng.rollout(Options(tag=B, limit="spark-01", soak=1.0))
    finally:
        eng.close()
    assert dep.secrets == [want]


def _inventory_with(tmp_path: Path, host_vars: dict[str, dict[str, str]]) -> inventory.Inventory:
    """The example inventory with ``host_vars/<host>.yml`` added (Ansible's own precedence
    applies)."""
    d = tmp_path / "inv"
    shutil.copytree(INV, d)
    (d / "host_vars").mkdir(exist_ok=True)
    for n, v in host_vars.items():
        (d / "host_vars" / f"{n}.yml").write_text(yaml.safe_dump(v))
    return inventory.load(d)


def test_a_bad_deploy_via_is_refused_naming_the_host_before_any_change(tmp_path: Path) -> None:
    fleet, dep = _fleet()
    inv = _inventory_with(tmp_path, {"spark-02": {"fleetctl_deploy_via": "paramiko"}})
    eng = Engine(inv, state_dir=tmp_path / "state", secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve,
                             deployer=dep))
    try:
        with pytest.raises(FleetError) as e:
            eng.rollout(Options(tag=B, limit=",".join(HOSTS), soak=1.0))
    finally:
        eng.close()
    assert (
        e.value.host == "spark-02"
        and "fleetctl_deploy_via" in e.value.cause
        and "ansible" in (e.value.fix or "")
    )
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, A) and dep.runs == []


def test_hosts_set_to_ssh_deploy_with_the_controllers_commands(tmp_path: Path) -> None:
    fleet, dep = _fleet()
    inv = _inventory_with(tmp_path, {"spark-02": {"fleetctl_deploy_via": "ssh"}})
    eng = Engine(inv, state_dir=tmp_path / "state", secrets={},
                 seams=Seams(ops=fleet.ops, gates=SimGates(fleet), resolve=fleet.resolve,
                             deployer=dep))
    try:
        r = eng.rollout(Options(tag=B, limit=",".join(HOSTS), max_unavailable="2", soak=1.0))
    finally:
        eng.close()
    assert r.status == fleet_records.COMPLETED, r.error
    assert dep.runs == [["spark-01"], ["spark-03"]]
    assert fleet.serving_tags() == dict.fromkeys(HOSTS, B)


# ---- the step's barrier
# ------------------------------------------------------------------------------


class _Recorder:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.runs: list[list[str]] = []
        self.fail = fail

    def deploy(self, requests: list[deploy.DeployRequest], secrets: dict[str, str],
               run_dir: Path) -> dict[str, deploy.DeployOutcome]:
        self.runs.append(sorted(r.host.name for r in requests))
        if self.fail is not None:
            raise self.fail
        return {r.host.name: deploy.DeployOutcome(True) for r in requests}


def _req(name: str) -> deploy.DeployRequest:
    inv = inventory.load(INV)
    return deploy.DeployRequest(
        inv.hosts[name], NAME, recipe_for(inv), "img@" + digest_of(B), B, digest_of(B), "r-1"
    )


def test_the_batch_runs_once_when_every_member_joined_or_left(tmp_path: Path) -> None:
    fleet, _dep = _fleet()
    rec = _Recorder()
    batch = deploy.StepBatch(rec, HOSTS, {}, tmp_path, fleet.ops)
    results: dict[str, deploy.DeployOutcome] = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, batch.join(_req(n))))
               for n in HOSTS[:2]]
    for t in threads:
        t.start()
    batch.leave("spark-03")
    for t in threads:
        t.join()
    assert rec.runs == [["spark-01", "spark-02"]]
    assert all(o.retired for o in results.values())
    batch.leave("spark-01")  # after joining: a no-op
    assert rec.runs == [["spark-01", "spark-02"]]


def test_a_batch_everyone_left_never_runs(tmp_path: Path) -> None:
    fleet, _dep = _fleet()
    rec = _Recorder()
    batch = deploy.StepBatch(rec, HOSTS, {}, tmp_path, fleet.ops)
    for n in HOSTS:
        batch.leave(n)
    assert rec.runs == []


def test_a_deployer_that_breaks_leaves_each_host_judged_by_looking_at_it(tmp_path: Path) -> None:
    fleet, _dep = _fleet()
    batch = deploy.StepBatch(
        _Recorder(RuntimeError("runner crashed")), ["spark-01"], {}, tmp_path, fleet.ops
    )
    out = batch.join(_req("spark-01"))
    # Nothing was retired (spark-01 still serves v1): the failure is the retire's, nothing to
    # restore.
    assert not out.retired and out.error is not None and "runner crashed" in out.error.cause


def test_a_kill_inside_the_run_reaches_every_joiner(tmp_path: Path) -> None:
    fleet, _dep = _fleet()
    batch = deploy.StepBatch(_Recorder(Killed("in the run")), HOSTS[:2], {}, tmp_path, fleet.ops)
    caught: list[BaseException] = []

    def join(n: str) -> None:
        try:
            batch.join(_req(n))
        except Killed as e:
            caught.append(e)

    threads = [threading.Thread(target=join, args=(n,)) for n in HOSTS[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(caught) == 2


def test_the_modules_report_becomes_the_engines_serving() -> None:
    s = deploy.serving_from_report(
        {
            "name": "vllm.prev",
            "running": False,
            "status": "exited",
            "image": "reg/x@" + digest_of(A),
            "entrypoint": ["vllm"],
            "cmd": ["serve"],
            "env_names": ["A"],
            "binds": [],
            "network_mode": "host",
            "ipc_mode": "host",
            "gpus": True,
            "labels": {
                LABEL_DIGEST: digest_of(A),
                LABEL_TAG: A,
                LABEL_ROLLOUT: "r-0",
                LABEL_RECIPE: "q",
                LABEL_FINGERPRINT: "f" * 64,
            },
        }
    )
    assert s is not None
    assert (s.name, s.running, s.digest, s.tag, s.rollout, s.recipe, s.fingerprint) == (
        "vllm.prev", False, digest_of(A), A, "r-0", "q", "f" * 64)
    assert set(s.settings) == {
        "image",
        "entrypoint",
        "cmd",
        "env_names",
        "binds",
        "network_mode",
        "ipc_mode",
        "gpus",
        "labels",
    }
    assert deploy.serving_from_report(None) is None


@pytest.mark.parametrize(
    "cur", [None, "running", "stopped", "running-this-run", "stopped-this-run"]
)
@pytest.mark.parametrize("prev", [False, True])
def test_the_modules_retire_rule_is_the_controllers(cur: str | None, prev: bool) -> None:
    """Whatever the serving name and .prev hold, the module keeps and removes what the controller's
    retire does."""
    fleet, dep = _fleet()
    h = fleet.hosts["spark-01"]
    h.containers.clear()
    if cur is not None:
        mine = cur.endswith("this-run")
        h.containers[NAME] = Container(
            NAME,
            digest_of(B if mine else A),
            B if mine else A,
            "r-1" if mine else "r-0",
            cur.startswith("running"),
            "running" if cur.startswith("running") else "exited",
        )
    if prev:
        h.containers[PREV] = Container(PREV, digest_of(C), C, "r-old", False, "exited")
    before = {n: (c.digest, c.running) for n, c in h.containers.items()}
    inv = inventory.load(INV)
    fleet.ops(inv.hosts["spark-01"]).retire(NAME, "r-1", digest_of(B))
    controller = {n: c.digest for n, c in h.containers.items()}
    plan = dep.module.retire_plan(
        None if cur is None else cur.startswith("running"),
        None if cur is None else ("r-1" if cur.endswith("this-run") else "r-0"),
        None if cur is None else before[NAME][0],
        prev,
        "r-1",
        digest_of(B),
    )
    module = {n: d for n, (d, _r) in before.items()}
    if plan == "remove":
        module.pop(NAME)
    elif plan == "keep":
        module.pop(PREV, None)
        module[PREV] = module.pop(NAME)
    assert module == controller, plan
