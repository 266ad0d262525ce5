"""A unit in the planner (fleetctl.rollout.unit): one slot, expanded to every member; pure logic on
a real
inventory (the example's, with spark-03 and spark-04 as unit pair-a), no host."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from fleetctl import inventory
from fleetctl.errors import FleetError
from fleetctl.recipes import recipe_for
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout import unit
from fleetctl.state import records as fleet_records
from tests.cli.test_units_cli import fleet  # noqa: F401  (the fixture)

HOSTS = ["spark-01", "spark-02", "spark-03", "spark-04"]


def build(
    inv: inventory.Inventory, current: dict[str, tuple[str | None, str | None]], **kw: str
) -> wave_plan.Plan:
    r = recipe_for(inv, "qwen35-35b-bf16")
    fps: dict[str, str | None] = {}
    for h in current:
        u = inv.unit_of(h)
        fps[h] = f"fp-{(unit.unit_recipe(inv, u, r) if u is not None else r).name}"
    # every host runs its own recipe's settings (the unit: glm-pair's): nothing to change for
    # settings
    cur, fp = unit.slot_versions(inv, HOSTS, current, fps, r, lambda x: f"fp-{x.name}")
    assert fp["spark-03"] == "fp-qwen35-35b-bf16"
    p = wave_plan.build(
        wave_plan.Desired(r.name, r.image, "v2", "v2", "d2", "x@d2", "fp-qwen35-35b-bf16"),
        unit.slot_names(inv, HOSTS),
        cur,
        wave_plan.Pacing(**kw),
        fp,
    )
    return unit.expand(inv, p, HOSTS, current)


def test_a_unit_is_one_slot_in_waves_steps_and_budget(fleet: Callable[..., Path]) -> None:  # noqa: F811
    inv = inventory.load(fleet())
    assert unit.slot_names(inv, HOSTS) == ["spark-01", "spark-02", "spark-03"]
    assert [
        h.name for h in unit.whole_units(inv, [inv.host("spark-04"), inv.host("spark-01")])
    ] == ["spark-03", "spark-04", "spark-01"]
    p = build(inv, dict.fromkeys(HOSTS, ("v1", "d1")), waves="1,100%", max_unavailable="2")
    assert p.waves == (("spark-01",), ("spark-02", "spark-03", "spark-04"))
    assert p.max_unavailable == 2  # of 3 slots
    assert {h.host: (h.wave, h.step, h.action) for h in p.hosts} == {
        "spark-01": (0, 0, "deploy"), "spark-02": (1, 0, "deploy"), "spark-03": (1, 0, "deploy"),
        "spark-04": (1, 0, "deploy")}
    # two slots a step: spark-02 and the whole unit; one slot a step: the unit apart
    assert unit.split_steps(inv, ["spark-02", "spark-03", "spark-04"], 2) == [
        ["spark-02", "spark-03", "spark-04"]
    ]
    assert unit.split_steps(inv, ["spark-02", "spark-03", "spark-04"], 1) == [
        ["spark-02"],
        ["spark-03", "spark-04"],
    ]
    assert [h.name for h in unit.slots(inv, [inv.host("spark-04"), inv.host("spark-02")])] == [
        "spark-03",
        "spark-02",
    ]


def test_a_unit_needs_a_step_when_any_member_differs(fleet: Callable[..., Path]) -> None:  # noqa: F811
    inv = inventory.load(fleet())
    current = {
        "spark-01": ("v2", "d2"),
        "spark-02": ("v2", "d2"),
        "spark-03": ("v2", "d2"),
        "spark-04": ("v1", "d1"),
    }
    p = build(inv, current)
    assert {h.host: h.action for h in p.hosts} == {
        "spark-01": "skip",
        "spark-02": "skip",
        "spark-03": "deploy",
        "spark-04": "deploy",
    }
    assert p.host("spark-04").current_tag == "v1" and p.host("spark-03").current_tag == "v2"
    p = build(inv, dict.fromkeys(HOSTS, ("v2", "d2")))
    assert all(h.action == "skip" for h in p.hosts)


def test_failures_count_a_unit_once(fleet: Callable[..., Path]) -> None:  # noqa: F811
    inv = inventory.load(fleet())
    rec = fleet_records.HostRecord(
        "spark-03",
        0,
        0,
        "rolled-back",
        fleet_records.ROLLED_BACK,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        0.0,
        None,
    )
    recs = [
        rec,
        replace(rec, host="spark-04"),
        replace(rec, host="spark-01", status=fleet_records.HOST_FAILED),
        replace(rec, host="spark-02", status=fleet_records.DONE),
    ]
    assert unit.count_failed(inv, recs) == 2


def test_a_rollback_takes_every_member_to_one_version(fleet: Callable[..., Path]) -> None:  # noqa: F811
    inv = inventory.load(fleet())
    targets: dict[str, tuple[str | None, str, str]] = {"spark-03": ("v1", "d1", "x@d1")}
    skips = {"spark-04": "already there (serving its last known-good v1)"}
    fps: dict[str, str | None] = {"spark-03": "f"}
    unit.unit_targets(inv, HOSTS, targets, skips, fps)
    assert (
        targets["spark-04"] == ("v1", "d1", "x@d1")
        and "spark-04" not in skips
        and fps["spark-04"] == "f"
    )
    with pytest.raises(FleetError) as e:
        unit.unit_targets(
            inv, HOSTS, {"spark-03": ("v1", "d1", "r"), "spark-04": ("v0", "d0", "r")}, {}, {}
        )
    assert (
        e.value.host == "spark-03"
        and "different versions (spark-03 v1, spark-04 v0)" in e.value.cause
    )
    with pytest.raises(FleetError) as e:
        unit.unit_targets(
            inv, HOSTS, {"spark-03": ("v1", "d1", "r")}, {"spark-04": "first deploy: none"}, {}
        )
    assert e.value.host == "spark-04" and "cannot go back together" in e.value.cause


def test_a_failed_units_cause_quotes_the_members_nccl_lines() -> None:
    from fleetctl.rollout.unit_step import with_collective_errors

    logs = {
        "spark-03": "INFO serving\nNCCL WARN NET/IB : Got completion from peer 10.178.0.14<29501> "
                    "with "
        "status=IBV_WC_RETRY_EXC_ERR(12) opcode=0\n",
        "spark-04": "INFO NCCL INFO Channel 00 : 1[0] -> 0[0] via NET/IB/0\n",
        "spark-05": None,
    }
    why = with_collective_errors("soak fail: liveness: no token in 30 s", logs)
    assert why == (
        "soak fail: liveness: no token in 30 s; cause in the members' logs: spark-03: NCCL WARN "
        "NET/IB : "
        "Got completion from peer 10.178.0.14<29501> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=0"
    )
    assert with_collective_errors("soak fail", {"spark-04": "all good\n"}) == "soak fail"
