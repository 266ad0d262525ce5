"""A unit of two lab nodes through the rollout engine, each outcome checked on the members over SSH.

"Checked over SSH": the ``vllm`` container on each member runs, with the image ID of the expected
tag's digest on that node, and with its own rank's command line (the worker ``--headless``);
independently of the ledger. The unit is `lab up --units`' (tests/plugins/units.py makes one, once a
session, when the lab has none).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, registry, ssh
from fleetctl import lab as fleetlab
from fleetctl.lab.scenarios import STOCK_REPOSITORY
from fleetctl.state import records as fleet_records

pytestmark = pytest.mark.lab

FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
PAIR = "qwen35-35b-bf16-pair"
BASE = "cu130-nightly"
#: Tags of the pair's image pushed for these tests: a healthy newer version, one whose answers are
#: garbage, and one whose head logs NCCL's RDMA error and wedges a second after its first request
#: (the hang under load).
NEW, BAD, HANG = "unit-v2", "unit-garbage", "unit-nccl-hang"
SOAK = "3s"


@pytest.fixture(scope="module")
def unit(lab_unit: tuple[str, tuple[str, ...]]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """The session's lab unit (tests/plugins/units.py: made and provisioned once), its weights
    staged,
    serving BASE, and the test tags pushed."""
    name, members = lab_unit
    try:
        code, doc = fleetctl("stage", "--recipe", PAIR, "--limit", ",".join(members))
        assert code == 0, doc
        fleetlab.add_image(
            NEW,
            {"EMU_VERSION": "0.25.1", "EMU_LOAD_SECONDS": "3"},
            repository=STOCK_REPOSITORY,
            cmd=["vllm", "serve"],
        )
        fleetlab.add_image(
            BAD,
            {"EMU_VERSION": "0.25.2", "EMU_LOAD_SECONDS": "3", "EMU_GARBAGE": "1"},
            repository=STOCK_REPOSITORY,
            cmd=["vllm", "serve"],
        )
        fleetlab.add_image(
            HANG,
            {"EMU_VERSION": "0.25.3", "EMU_LOAD_SECONDS": "3", "EMU_NCCL_HANG_AFTER_SECONDS": "1"},
            repository=STOCK_REPOSITORY,
            cmd=["vllm", "serve"],
        )
        code, doc = rollout(BASE, ",".join(members), "--max-unavailable", "100%")
        assert code == 0, doc
        yield name, members
    finally:
        ssh.close_all()


def fleetctl(*argv: str) -> tuple[int, Any]:
    r = subprocess.run(
        [FLEETCTL, *argv, "--json"], capture_output=True, text=True, timeout=900, env=os.environ
    )
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        return r.returncode, {"stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:]}


def rollout(tag: str, limit: str, *more: str) -> tuple[int, Any]:
    return fleetctl(
        "rollout", "--tag", tag, "--recipe", PAIR, "--limit", limit, "--soak", SOAK, "--yes", *more
    )


def image_id(host: str, tag: str) -> str | None:
    """The local image ID of ``tag``'s resolved digest on ``host`` (None if it lacks it)."""
    inv = inventory.load(None)
    img = registry.resolve(f"{STOCK_REPOSITORY}", tag, inv.vars.get("fleetctl_registry_mirrors"))
    ref = registry.pull_ref(img.image, img.digest, inv.vars.get("fleetctl_registry_mirrors"))
    r = ssh.docker(
        inv.host(host), ["docker", "image", "inspect", "--format", "{{.Id}}", ref], timeout=30
    )
    return r.stdout.strip() if r.ok else None


def serving(host: str) -> dict[str, Any]:
    """The member's ``vllm`` container as docker sees it: running, image ID, its args."""
    r = ssh.docker(
        inventory.load(None).host(host), "docker inspect vllm --format '{{json .}}'", timeout=30
    )
    if r.rc != 0:
        return {"running": False, "image": None, "args": []}
    c = json.loads(r.stdout)
    return {"running": c["State"]["Running"], "image": c["Image"], "args": c["Args"]}


def back_to(tag: str, limit: str, recipe: str = PAIR) -> None:
    """Hosts ``limit`` serving ``tag`` (a smoke-gated ``rollback --to``), whatever an earlier test
    left."""
    code, doc = fleetctl(
        "rollback",
        "--to",
        tag,
        "--recipe",
        recipe,
        "--limit",
        limit,
        "--max-unavailable",
        "100%",
        "--yes",
    )
    assert code == 0, doc


def assert_unit_serves(members: tuple[str, ...], tag: str) -> None:
    for rank, m in enumerate(members):
        s = serving(m)
        assert s["running"], (m, s)
        assert s["image"] == image_id(m, tag), (m, tag, s["image"])
        args = s["args"]
        assert args[args.index("--node-rank") + 1] == str(rank), args
        assert ("--headless" in args) == (rank > 0), args


def kill_mid_step(tag: str, limit: str, member: str) -> None:
    """Start a rollout of ``tag`` and SIGKILL the controller once ``member`` is starting or loading
    the new
    version (the unit's members stopped, the new ones starting): the middle of the unit's step."""
    from fleetctl import paths
    from fleetctl.state import ledger as fleet_ledger

    p = subprocess.Popen(
        [
            FLEETCTL,
            "rollout",
            "--tag",
            tag,
            "--recipe",
            PAIR,
            "--limit",
            limit,
            "--soak",
            SOAK,
            "--yes",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    led = fleet_ledger.open_ledger(paths.state_dir(inventory.load(None).path))
    try:
        while True:
            assert p.poll() is None, "the rollout ended before it could be killed"
            rec = led.latest(kind="rollout", statuses=(fleet_records.RUNNING,))
            h = rec.host(member) if rec is not None and rec.tag == tag else None
            if h is not None and h.phase in ("starting", "loading"):
                break
            time.sleep(0.1)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        led.close()
        if p.poll() is None:
            p.kill()
    ssh.close_all()


def test_a_killed_step_aborted_then_a_killed_step_resumed_then_a_rollback(
    unit: tuple[str, tuple[str, ...]],
) -> None:
    """The recovery kill point inside a unit's step: the controller SIGKILLed while the members
    start the new version, then `rollout abort` (both back on BASE); again, then `rollout --resume`
    (both on NEW,
    gated); then `rollback`: the members always end on one version, checked by image ID over SSH."""
    name, members = unit
    back_to(BASE, ",".join(members))
    assert_unit_serves(members, BASE)
    kill_mid_step(NEW, members[1], members[0])
    code, doc = fleetctl("rollout", "abort", "--yes")
    assert code == 0, doc
    assert_unit_serves(members, BASE)
    kill_mid_step(NEW, members[1], members[0])  # one member selected: the whole unit is stepped
    code, doc = fleetctl("rollout", "--resume", "--yes")
    assert code == 0, doc
    assert {h["host"]: h["status"] for h in doc["hosts"]} == dict.fromkeys(members, "done"), doc
    assert_unit_serves(members, NEW)
    code, doc = fleetctl("rollback", "--limit", members[0], "--yes")
    assert code == 0, doc
    assert {h["host"]: (h["status"], h["after_tag"]) for h in doc["hosts"]} == dict.fromkeys(
        members, ("done", BASE)
    )
    assert_unit_serves(members, BASE)
    code, hist = fleetctl("history")
    assert code == 0
    last = hist[0]
    assert last["kind"] == "rollback" and {h["host"] for h in last["hosts"]} >= set(members), last
    assert {h["host"]: h["unit"] for h in last["hosts"] if h["host"] in members} == dict.fromkeys(
        members, name
    )


def test_a_failed_gate_puts_both_members_back(unit: tuple[str, tuple[str, ...]]) -> None:
    _name, members = unit
    back_to(BASE, ",".join(members))
    assert_unit_serves(members, BASE)
    code, doc = rollout(BAD, ",".join(members))
    assert code == 1, doc
    rows = {h["host"]: h for h in doc["hosts"]}
    assert {m: rows[m]["status"] for m in members} == dict.fromkeys(members, "rolled-back"), rows
    assert all("soak fail" in (rows[m]["error"] or "") for m in members), rows
    assert_unit_serves(members, BASE)


def test_an_nccl_hang_fails_the_gate_quoting_the_heads_nccl_line(
    unit: tuple[str, tuple[str, ...]],
) -> None:
    """The head wedges under load after NCCL's RDMA completion error: the gate fails (no token on
    the head, or the worker that lost the head's heartbeat exits and restarts: whichever the soak
    sees first), the cause
    quotes NCCL's line from the head's log, and both members go back."""
    _name, members = unit
    back_to(BASE, ",".join(members))
    code, doc = rollout(HANG, ",".join(members))
    assert code == 1, doc
    rows = {h["host"]: h for h in doc["hosts"]}
    assert {m: rows[m]["status"] for m in members} == dict.fromkeys(members, "rolled-back"), rows
    error = rows[members[0]]["error"] or ""
    assert error.startswith("soak fail: "), error
    cause = error.split("; cause in the members' logs: ", 1)[-1]
    assert cause != error, error
    quoted = next((q for q in cause.split(" | ") if q.startswith(f"{members[0]}: ")
                   and "NET/IB : Got completion from peer" in q), None)
    assert quoted is not None and "IBV_WC_RETRY_EXC_ERR(12)" in quoted, error
    assert_unit_serves(members, BASE)


def test_two_single_hosts_and_a_unit_in_one_rollout(unit: tuple[str, tuple[str, ...]]) -> None:
    """Two single hosts and the unit: three slots, each its own step (max-unavailable 1 counts the
    unit once),
    all on the pair's image (the singles serve the one-node recipe of the same image)."""
    _name, members = unit
    inv = inventory.load(None)
    singles = [n for n in inv.hosts if inv.unit_of(n) is None][:2]
    # the single hosts serve qwen35-35b-bf16 (--recipe), the unit its own two-node recipe of the
    # same image
    code, doc = fleetctl("stage", "--recipe", "qwen35-35b-bf16", "--limit", ",".join(singles))
    assert code == 0, doc
    back_to(BASE, ",".join(singles), "qwen35-35b-bf16")
    back_to(BASE, ",".join(members))
    code, doc = fleetctl(
        "rollout",
        "--tag",
        NEW,
        "--recipe",
        "qwen35-35b-bf16",
        "--limit",
        ",".join([*singles, *members]),
        "--soak",
        SOAK,
        "--waves",
        "1,100%",
        "--yes",
    )
    assert code == 0, doc
    rows = {h["host"]: h for h in doc["hosts"]}
    assert {n: rows[n]["status"] for n in [*singles, *members]} == dict.fromkeys(
        [*singles, *members], "done"
    ), rows
    assert rows[members[0]]["wave"] == rows[members[1]]["wave"], rows
    assert_unit_serves(members, NEW)
    for s in singles:
        got = serving(s)
        assert (
            got["running"] and got["image"] == image_id(s, NEW) and "--nnodes" not in got["args"]
        ), (s, got)
    code, doc = fleetctl("rollback", "--to", BASE, "--limit", ",".join(members), "--yes")
    assert code == 0, doc
    assert_unit_serves(members, BASE)


def test_a_worker_killed_mid_soak_is_caught_and_both_members_go_back(
    unit: tuple[str, tuple[str, ...]],
) -> None:
    """`lab node WORKER --kill-worker` once the unit's soak began: the head wedges (/health 200, no
    token),
    the gate fails, and both members serve BASE again."""
    _name, members = unit
    back_to(BASE, ",".join(members))
    assert_unit_serves(members, BASE)
    proc = subprocess.Popen(
        [
            FLEETCTL,
            "rollout",
            "--tag",
            NEW,
            "--recipe",
            PAIR,
            "--limit",
            ",".join(members),
            "--soak",
            "30s",
            "--yes",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ,
    )
    try:
        killed = False
        while proc.poll() is None and not killed:
            code, hist = fleetctl("history", "-n", "1")
            rows = (
                {h["host"]: h for h in hist[0]["hosts"]}
                if code == 0 and hist and hist[0]["tag"] == NEW
                else {}
            )
            if rows.get(members[1], {}).get("phase") == "soak":
                fleetlab.set_node(members[1], kill_worker=True)
                killed = True
        out, _ = proc.communicate(timeout=900)
    finally:
        if (
            proc.poll() is None
        ):  # the test failed first: Ctrl-C, so that the engine restores the unit
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=600)
    assert killed, "the rollout ended before its soak began"
    doc = json.loads(out)
    assert proc.returncode == 1, doc
    rows = {h["host"]: h for h in doc["hosts"]}
    assert {m: rows[m]["status"] for m in members} == dict.fromkeys(members, "rolled-back"), rows
    ssh.close_all()
    assert_unit_serves(members, BASE)


def test_a_units_weights_are_fetched_once_and_copied_between_its_members_over_the_fabric(
        unit: tuple[str, tuple[str, ...]]) -> None:
    """`fleetctl stage` on a unit whose members lost their weights: one member (the seed) fetches
    the set, the other copies it from that member over its fabric address (not the management
    network), and verifies it. (A member that already holds a verified set does not serve in a run:
    docs/units.md.)"""
    from fleetctl.recipes import STAGED_MARKER, load_recipes

    _name, members = unit
    path = load_recipes(inventory.load(None))[PAIR].weights[0].path
    for m in members:
        fleetlab.node_exec(m, ["rm", "-rf", path])
    code, doc = fleetctl("stage", "--recipe", PAIR, "--limit", ",".join(members))
    assert code == 0, doc
    hosts = doc["hosts"]
    seed = doc["seed"]
    assert seed in members and hosts[seed]["seed"], doc
    (other,) = (m for m in members if m != seed)
    assert hosts[other]["copied_from"] == seed and hosts[other]["via"] == "fabric", hosts[other]
    assert hosts[other]["bytes_copied"] > 0, hosts[other]
    for m in members:
        r = ssh.run(inventory.load(None).host(m), ["cat", f"{path}/{STAGED_MARKER}"], timeout=30)
        assert r.ok and json.loads(r.stdout)["repo"] == "Qwen/Qwen3.5-35B-A3B", (m, r.stdout)
