"""Rollouts and rollbacks on the lab's 4 nodes, each checked against the nodes' real state over SSH.

"Real state" is read with ``fleetctl.ssh`` + ``docker inspect`` on every node,
independently of the ledger and of fleetctl's labels: the image ID the
``vllm`` container runs must be the image ID of ``<mirror>/<repo>@<digest>``
on that node, and the container must be running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, paths, registry, ssh
from fleetctl import lab as fleetlab
from fleetctl.errors import FleetError
from fleetctl.progress import Event
from fleetctl.recipes import STAGED_MARKER as MARKER
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RolloutResult
from fleetctl.soak import baselines
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records
from tests.plugins.serving import LAB_SOAK, engine, serve

pytestmark = pytest.mark.lab

NEW = "v0.24.0"
OLD = "v0.23.0"
CRASH = "2026-06-11-pr41703"
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")


def resolve(tag: str) -> registry.ResolvedImage:
    inv = inventory.load(None)
    eng = Engine(inv)
    try:
        return registry.resolve(eng.recipe().image, tag, eng.mirrors)
    finally:
        eng.close()


def real_state() -> dict[str, dict[str, Any]]:
    """Per node: is ``vllm`` running, its image ID, its container ID and start time (docker inspect
    over SSH)."""
    inv = inventory.load(None)
    out: dict[str, dict[str, Any]] = {}
    for h in inv.hosts.values():
        r = ssh.docker(h, "docker inspect vllm --format '{{json .}}'", timeout=30)
        if r.rc != 0:
            out[h.name] = {"running": False, "image_id": None, "id": None, "started": None}
            continue
        c = json.loads(r.stdout)
        out[h.name] = {"running": c["State"]["Running"], "image_id": c["Image"], "id": c["Id"],
                       "started": c["State"]["StartedAt"], "labels": c["Config"]["Labels"] or {}}
    return out


def image_ids(tag: str) -> dict[str, str | None]:
    """Per node: the local image ID of the resolved digest of ``tag`` (None if the node lacks
    it)."""
    img = resolve(tag)
    inv = inventory.load(None)
    ref = registry.pull_ref(img.image, img.digest, inv.vars.get("fleetctl_registry_mirrors"))
    out: dict[str, str | None] = {}
    for h in inv.hosts.values():
        r = ssh.docker(h, ["docker", "image", "inspect", "--format", "{{.Id}}", ref], timeout=30)
        out[h.name] = r.stdout.strip() if r.ok else None
    return out


def serving_tag(tag: str) -> dict[str, bool]:
    """Per node: does its running vllm container run exactly the bytes of ``tag``?"""
    ids = image_ids(tag)
    state = real_state()
    return {n: bool(s["running"] and ids[n] and s["image_id"] == ids[n]) for n, s in state.items()}


def ledger() -> fleet_ledger.Ledger:
    return fleet_ledger.open_ledger(paths.state_dir(inventory.load(None).path))


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLEETCTL, *args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy()
    )


def run_rollout(
    tag: str, progress: Callable[[Event], None] | None = None, **kw: Any
) -> RolloutResult:
    eng = engine(progress) if progress else engine()
    kw.setdefault("soak", LAB_SOAK)
    try:
        return eng.rollout(Options(tag=tag, **kw))
    finally:
        eng.close()
        ssh.close_all()


@pytest.fixture(scope="module", autouse=True)
def own_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A ledger and baselines of this module's own: soak baselines measured by other tests (or
    under other CPU load on this shared machine) must not decide these gates' throughput checks."""
    d = tmp_path_factory.mktemp("rollout-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEETCTL_STATE_DIR", str(d))
        yield d


@pytest.fixture
def at_new(serving: RolloutResult) -> Iterator[None]:
    """The fleet serving v0.24.0 first (the scenario tests roll away from it)."""
    del serving
    serve(NEW)
    assert all(serving_tag(NEW).values())
    yield


# -- planning refusals: nothing changes ---------------------------------------------------------


def test_unknown_tag_is_refused_before_any_change(serving: RolloutResult) -> None:
    serve(OLD)
    before = real_state()
    n = len(ledger().ids())
    r = cli("rollout", "--tag", "v9.9.9", "--yes")
    assert r.returncode == 2, r.stderr
    # The versions the lab's registry holds are named, whatever other test tags it holds.
    assert "no tag 'v9.9.9'" in r.stderr and "v0.24.0 (2026-07-01-v0.24.0)" in " ".join(
        r.stderr.split()
    )
    assert real_state() == before and len(ledger().ids()) == n


def test_wrong_gpu_node_and_unverified_weights_are_refused_before_any_change(
        serving: RolloutResult, lab_fault: Callable[..., AbstractContextManager[Any]]) -> None:
    serve(OLD)
    before = real_state()
    eng = engine()
    try:
        recipe = eng.recipe()
    finally:
        eng.close()
    w = recipe.weights[0]
    # spark-02 keeps its weights (config.json and all) but loses the stage's verification marker:
    # present-looking weights that were never verified must not be served.
    node2 = inventory.load(None).host("spark-02")
    marker = f"{w.path}/{MARKER}"
    ssh.run(node2, ["mv", marker, marker + ".away"], timeout=30, become=True).check(
        "hide the stage marker"
    )
    try:
        with lab_fault("spark-03", gpu="NVIDIA H100 80GB HBM3"), pytest.raises(FleetError) as e:
            run_rollout(NEW)
    finally:
        ssh.run(node2, ["mv", marker + ".away", marker], timeout=30, become=True).check(
            "restore the stage marker"
        )
    msg = e.value.message()
    assert "spark-03" in msg and "H100" in msg and "before any change" in msg
    assert f"spark-02: weight set {w.role}" in msg and MARKER in msg
    assert f"fleetctl stage --recipe {recipe.name} --limit spark-02" in msg
    assert "spark-01" not in msg
    assert real_state() == before


def test_dry_run_prints_the_plan_as_json(serving: RolloutResult) -> None:
    serve(OLD)
    r = cli("rollout", "--tag", NEW, "--dry-run", "--waves", "1,50%", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    plan = data["plan"]
    assert plan["tag"] == "2026-07-01-v0.24.0" and plan["digest"] == resolve(NEW).digest
    assert [len(w) for w in plan["waves"]] == [1, 2, 1]
    # By digest: the tag label is the name the deploy was given (the collection test deploys
    # "v0.23.0" by hand; fleetctl labels the registry's own tag of the digest).
    assert all(h["current_digest"] == resolve(OLD).digest for h in plan["hosts"]), plan["hosts"]


# -- the main path ---------------------------------------------------------------------------------


def test_rollout_completes_then_rollback_returns_every_node(serving: RolloutResult) -> None:
    serve(OLD)
    events: list[Event] = []
    r = run_rollout(NEW, events.append, max_unavailable="3")
    assert r.status == "completed", r.error
    assert all(serving_tag(NEW).values()), real_state()
    assert [h.status for h in r.hosts] == ["done"] * 4
    assert all(h.before_digest == resolve(OLD).digest and h.after_digest == resolve(NEW).digest
               for h in r.hosts), r.hosts
    # the live table filled in: every host went through the phases, with wave and tag columns
    for h in r.hosts:
        phases = [e.phase for e in events if e.host == h.host]
        assert (
            phases.index("stopping")
            < phases.index("loading")
            < phases.index("soak")
            < phases.index("done")
        )
    assert any(
        e.data.get("wave") == 2 and e.data.get("tag") == "2026-07-01-v0.24.0" for e in events
    )
    # each gate's artifacts are kept where the ledger says, and its pass is the new tag's baseline
    state = paths.state_dir(inventory.load(None).path)
    for h in r.hosts:
        art = state / "runs" / r.id / f"soak-{h.host}"
        assert h.artifacts == str(art)
        assert json.loads((art / "verdict.json").read_text())["outcome"] == "pass"
        assert (art / "samples.jsonl").stat().st_size > 0
        with fleet_ledger.open_ledger(state) as led:
            window = baselines.read(led, h.host, "2026-07-01-v0.24.0")
        assert window.runs and window.runs[-1].run_id == f"{r.id}/soak-{h.host}"
    labels = real_state()["spark-01"]["labels"]
    assert labels["fleetctl.rollout"] == r.id and labels["fleetctl.digest"] == resolve(NEW).digest

    rb = cli("rollback", "--max-unavailable", "100%", "--yes", "--json")
    assert rb.returncode == 0, rb.stderr
    assert json.loads(rb.stdout)["status"] == "completed"
    assert all(serving_tag(OLD).values()), real_state()

    hist = cli("history", "--json")
    assert hist.returncode == 0
    entries = json.loads(hist.stdout)
    assert [e["kind"] for e in entries[:2]] == ["rollback", "rollout"]
    assert entries[0]["parent"] == r.id and entries[1]["id"] == r.id
    assert {h["host"]: h["status"] for h in entries[1]["hosts"]} == {
        f"spark-0{i}": "done" for i in range(1, 5)
    }


# -- gates catch the bad tags on the canary ------------------------------------------------------
# One bad tag end to end on the real nodes (the crash at 32 concurrent streams). The engine's part
# of a boot failure, a failed soak and an inconclusive gate (pause, then abort) is
# tests/rollout/test_gates_sim.py; the soak's detection of each, tests/soak/test_engine_loopback.py
# and test_checks.py.


def _gate_fails_on_canary(tag: str, **kw: Any) -> RolloutResult:
    before = real_state()
    r = run_rollout(tag, **kw)
    assert r.status == "failed" and r.exit_code == 1
    canary, *others = r.hosts
    assert canary.host == "spark-01" and canary.status == "rolled-back", canary
    assert canary.after_tag == "2026-07-01-v0.24.0"
    assert all(h.status == "pending" for h in others)
    after = real_state()
    assert all(serving_tag(NEW).values()), after
    for n in ("spark-02", "spark-03", "spark-04"):  # never touched: same container, never restarted
        assert (after[n]["id"], after[n]["started"]) == (before[n]["id"], before[n]["started"])
    return r


def test_crash_at_32_tag_fails_on_canary(at_new: None) -> None:
    r = _gate_fails_on_canary(CRASH)
    assert r.error and "spark-01" in r.error
    assert any("32" in c or "crash" in c.lower() for c in r.hosts[0].failed_checks), r.hosts[0]


# -- crash safety and concurrency ------------------------------------------------------------------


def test_kill_9_mid_wave_then_resume_completes(serving: RolloutResult) -> None:
    serve(OLD)
    led = ledger()
    p = subprocess.Popen(
        [
            FLEETCTL,
            "rollout",
            "--tag",
            NEW,
            "--yes",
            "--soak",
            f"{LAB_SOAK:.0f}s",
            "--max-unavailable",
            "3",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    try:
        rec = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert p.poll() is None, "the rollout ended before it could be killed"
            rec = led.latest(kind="rollout", statuses=(fleet_records.RUNNING,))
            if rec is not None and any(
                h.wave == 1 and h.phase in ("starting", "loading", "soak") for h in rec.hosts
            ):
                break
            time.sleep(0.2)
        assert rec is not None
        # a second rollout while the first runs is refused, naming the first
        second = cli("rollout", "--tag", NEW, "--yes")
        assert second.returncode == 4 and rec.id in second.stderr, second.stderr
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    killed = led.get(rec.id)
    assert killed.status == fleet_records.RUNNING and any(
        h.status == fleet_records.IN_PROGRESS for h in killed.hosts
    )
    # a new rollout refuses to start over an interrupted one
    fresh = cli("rollout", "--tag", NEW, "--yes")
    assert fresh.returncode == 2 and "interrupted" in fresh.stderr and rec.id in fresh.stderr
    resumed = cli("rollout", "--resume", "--yes", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert all(serving_tag(NEW).values()), real_state()
    final = led.get(rec.id)
    assert final.status == fleet_records.COMPLETED and {h.status for h in final.hosts} == {
        fleet_records.DONE
    }
    assert {w.status for w in final.waves} == {fleet_records.DONE}
    assert any(ph.phase == "resumed" for ph in final.phases) and led.holder() is None
    led.close()


def _descendants(pid: int) -> dict[int, bytes]:
    """Every process below ``pid`` (ansible-runner's pexpect puts ansible-playbook in a session of
    its own, so the process group does not hold it): pid -> command line."""
    parent: dict[int, int] = {}
    cmd: dict[int, bytes] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
                cmd[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ")
            except (OSError, ValueError):
                continue
    out: dict[int, bytes] = {}
    frontier = [pid]
    while frontier:
        kids = [c for c, pp in parent.items() if pp in frontier and c not in out]
        out.update({c: cmd.get(c, b"") for c in kids})
        frontier = kids
    return out


def _role_run_of(pid: int) -> bool:
    """Is an ansible-playbook of deploy.yml running below the controller ``pid``?"""
    return any(b"ansible-playbook" in c and b"deploy.yml" in c for c in _descendants(pid).values())


def _power_loss(pid: int) -> None:
    """SIGKILL the controller and everything it started, at once."""
    for victim in [pid, *_descendants(pid)]:
        with suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def test_power_loss_inside_the_role_run_then_abort_puts_every_host_back(
    serving: RolloutResult,
) -> None:
    # The controller and its ansible-playbook die together (SIGKILL to both: a laptop losing
    # power), while the vllm_serve role is retiring and starting containers of a 3-host step.
    serve(OLD)
    before = real_state()
    led = ledger()
    p = subprocess.Popen(
        [
            FLEETCTL,
            "rollout",
            "--tag",
            NEW,
            "--yes",
            "--soak",
            f"{LAB_SOAK:.0f}s",
            "--waves",
            "1,100%",
            "--max-unavailable",
            "3",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 300
        rec = None
        while time.monotonic() < deadline:
            assert p.poll() is None, "the rollout ended before it could be killed"
            rec = led.latest(kind="rollout", statuses=(fleet_records.RUNNING,))
            if (
                rec is not None
                and any(h.wave == 1 and h.phase == "stopping" for h in rec.hosts)
                and _role_run_of(p.pid)
            ):
                break
            time.sleep(0.1)
        assert rec is not None and _role_run_of(p.pid), "no role run of wave 2 was seen"
        # Cut at the first change the role makes on a host of the step (its vllm stopped, renamed
        # or replaced): the moment a host has no serving container or a new, ungated one.
        step = [h.host for h in rec.hosts if h.wave == 1]
        inv = inventory.load(None)
        while True:
            assert _role_run_of(p.pid), "the role run ended before a change was seen"
            now = ssh.fan_out(
                [inv.host(n) for n in step],
                lambda h: (
                    ssh.run(
                        h,
                        "docker inspect vllm --format '{{.Id}} {{.State.Running}}' 2>/dev/null; "
                        "true",
                        timeout=10,
                    ).stdout
                ),
                timeout=15,
            )
            if any(
                o.value is not None and o.value.split() != [before[n]["id"], "true"]
                for n, o in now.items()
            ):
                break
        _power_loss(p.pid)
        p.wait(30)
    finally:
        if p.poll() is None:
            _power_loss(p.pid)
    ssh.close_all()
    killed = led.get(rec.id)
    assert killed.status == fleet_records.RUNNING, killed
    cut = real_state()  # what the cut left, for the message below
    ab = cli("rollout", "abort", "--yes", "--json")
    assert ab.returncode == 0, ab.stderr
    # Every host serves the version it served before the rollout: the canary is taken back too.
    assert all(serving_tag(OLD).values()), (cut, real_state())
    assert {h["status"] for h in json.loads(ab.stdout)["hosts"]} <= {"done", "skipped"}, ab.stdout
    final = led.get(rec.id)
    assert final.status == fleet_records.ABORTED and led.holder() is None
    led.close()


def test_node_that_stops_answering_stops_the_rollout(
        serving: RolloutResult, lab_fault: Callable[..., AbstractContextManager[Any]]) -> None:
    serve(OLD)
    with lab_fault("spark-04"):
        paused = {"done": False}

        def on_event(e: Event) -> None:
            if e.phase == "done" and e.host == "spark-01" and not paused["done"]:
                paused["done"] = True
                fleetlab.set_node("spark-04", paused=True)

        r = run_rollout(NEW, on_event, max_unavailable="100%", ready_timeout=60)
        assert paused["done"]
    assert r.status == "failed", r
    s4 = next(h for h in r.hosts if h.host == "spark-04")
    assert s4.status == "failed" and s4.error and "spark-04" in (r.error or "")
    ssh.close_all()
    state = serving_tag(OLD)
    assert state["spark-04"], real_state()  # never changed: still the old version, serving
