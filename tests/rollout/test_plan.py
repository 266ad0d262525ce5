"""Rollout planning from data: Ansible-serial waves, max-unavailable steps, failure budget,
skips."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import pytest

from fleetctl import inventory, paths
from fleetctl.errors import FleetError
from fleetctl.recipes import recipe_for
from fleetctl.rollout import plan
from fleetctl.rollout.host import fingerprint

HOSTS = [f"s{i:02d}" for i in range(1, 11)]
D_NEW, D_OLD = "sha256:" + "b" * 64, "sha256:" + "a" * 64


@pytest.mark.parametrize(("waves", "expected"), [
    (None, [1, 9]),
    ("1,25%,100%", [1, 2, 7]),
    ("1,2", [1, 2, 2, 2, 2, 1]),
    ("30%", [3, 3, 3, 1]),
    ("1%", [1] * 10),
    ("100", [10]),
])
def test_waves_like_ansible_serial(waves: str | None, expected: list[int]) -> None:
    got = plan.split_waves(HOSTS, plan.parse_waves(waves))
    assert [len(w) for w in got] == expected
    assert [h for w in got for h in w] == HOSTS


@pytest.mark.parametrize("bad", ["0", "abc", "150%", "-1", ",", "1,,x"])
def test_bad_wave_sizes_are_refused(bad: str) -> None:
    with pytest.raises(FleetError):
        plan.parse_waves(bad)


def test_steps_respect_max_unavailable() -> None:
    assert plan.split_steps(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"], ["e"]]
    assert plan.split_steps(["a"], 3) == [["a"]]


def build(**kw: object) -> plan.Plan:
    args: dict[str, object] = dict(
        recipe="r",
        image="ghcr.io/x/y",
        requested="v2",
        tag="t-v2",
        digest=D_NEW,
        pull_ref=f"m/x/y@{D_NEW}",
        hosts=HOSTS[:4],
        current={h: ("t-v1", D_OLD) for h in HOSTS[:4]},
    )
    args.update(kw)
    return _build(**args)


def _build(hosts: list[str], current: dict[str, tuple[str | None, str | None]],
           current_fingerprints: dict[str, str | None] | None = None, **kw: Any) -> plan.Plan:
    """:func:`plan.build` from one set of keywords (those of Desired, Pacing and the hosts)."""
    fields = {f.name for f in dataclasses.fields(plan.Desired)}
    desired = plan.Desired(**{k: v for k, v in kw.items() if k in fields})
    pacing = plan.Pacing(**{k: v for k, v in kw.items() if k not in fields})
    return plan.build(desired, hosts, current, pacing, current_fingerprints)


def test_default_plan_is_canary_then_rest_one_at_a_time() -> None:
    p = build()
    assert p.waves == (("s01",), ("s02", "s03", "s04"))
    assert p.max_unavailable == 1 and p.failure_budget == 0
    assert [(h.host, h.wave, h.step) for h in p.hosts] == [
        ("s01", 0, 0),
        ("s02", 1, 0),
        ("s03", 1, 1),
        ("s04", 1, 2),
    ]
    assert all(h.current_tag == "t-v1" for h in p.hosts)


def test_max_unavailable_percent_and_failure_budget() -> None:
    p = build(max_unavailable="100%", failure_budget="25%")
    assert p.max_unavailable == 4 and p.failure_budget == 1
    assert {h.step for h in p.hosts} == {0}


def test_hosts_on_target_digest_are_skipped() -> None:
    cur = {h: ("t-v1", D_OLD) for h in HOSTS[:4]}
    cur["s01"] = ("t-v2", D_NEW)
    p = build(current=cur)
    assert p.host("s01").action == "skip" and p.host("s01").wave == -1
    assert p.waves == (("s02",), ("s03", "s04"))
    assert [h.host for h in p.hosts] == HOSTS[:4]


def test_hosts_serving_nothing_are_deployed_and_no_hosts_is_refused() -> None:
    p = build(current={})
    assert all(h.action == "deploy" and h.current_tag is None for h in p.hosts)
    with pytest.raises(FleetError, match="no hosts"):
        build(hosts=[])


def test_same_image_with_other_container_settings_is_deployed() -> None:
    cur = {h: ("t-v2", D_NEW) for h in HOSTS[:4]}
    fps = {"s01": "fp-new", "s02": "fp-old", "s03": None, "s04": "fp-new"}
    p = build(current=cur, fingerprint="fp-new", current_fingerprints=fps)
    assert [(h.host, h.action, h.reason) for h in p.hosts] == [
        ("s01", "skip", "already there"),
        ("s02", "deploy", "settings"),
        ("s03", "deploy", "settings"),
        ("s04", "skip", "already there"),
    ]
    assert p.waves == (("s02",), ("s03",))


def test_fingerprint_is_pure_and_follows_every_rendered_setting() -> None:
    r = recipe_for(inventory.load(paths.project_root() / "inventory" / "example"), None)
    assert fingerprint(r) == fingerprint(replace(r))
    assert len(fingerprint(r)) == 64
    for change in (
        {"docker_args": (*r.docker_args, "--shm-size=32g")},
        {"env": {**r.env, "X": "1"}},
        {"vllm_args": (*r.vllm_args, "--max-num-seqs", "8")},
        {"secret_env": (*r.secret_env, "K")},
    ):
        assert fingerprint(replace(r, **change)) != fingerprint(r), change  # type: ignore[arg-type]
    assert fingerprint(replace(r, image="other/image")) == fingerprint(r), (
        "the image is the digest's business"
    )


# The capacity floor: without --max-unavailable, a step takes out as many hosts as --min-available
# (default 75 % of the selected hosts) allows, after the canary.

def fleet(n: int) -> list[str]:
    return [f"h{i:03d}" for i in range(1, n + 1)]


@pytest.mark.parametrize(("n", "per_step", "steps"), [
    (1, 1, [1]),                      # one host: it goes (a rollout moves at least one)
    (4, 1, [1, 1, 1, 1]),             # 3 of 4 kept serving
    (16, 4, [1, 4, 4, 4, 3]),         # 12 of 16 kept: the canary, then 4 steps
    (100, 25, [1, 25, 25, 25, 24]),   # 75 of 100 kept
])
def test_default_steps_keep_75_percent(n: int, per_step: int, steps: list[int]) -> None:
    hosts = fleet(n)
    p = build(hosts=hosts, current={h: ("t-v1", D_OLD) for h in hosts})
    assert p.max_unavailable == per_step
    assert (
        p.capacity is not None
        and p.capacity.rule == "min-available"
        and p.capacity.source == "default"
    )
    assert [len(s) for s in p.steps()] == steps
    assert [h for s in p.steps() for h in s] == hosts
    # Never more hosts out at once than the floor allows (a fleet of one has no floor to keep).
    assert all(n - len(s) >= min(p.capacity.floor, n - 1) for s in p.steps())
    assert p.capacity.floor == (0 if n == 1 else n - per_step)


@pytest.mark.parametrize(("n", "floor", "per_step"), [
    (2, "75%", 1), (3, "75%", 1), (8, "75%", 2), (10, "75%", 2),  # a percentage floor rounds up
    (10, "50%", 5), (10, "1%", 9), (10, "99%", 1), (10, "3", 7), (10, "9", 1),
])
def test_floor_rounds_up_and_steps_are_as_large_as_it_allows(
    n: int, floor: str, per_step: int
) -> None:
    cap = plan.capacity(n, min_available=floor)
    assert cap.per_step == per_step and cap.floor == n - per_step and cap.source == "flag"


def test_inventory_floor_is_used_and_flags_win() -> None:
    assert plan.capacity(16, inventory_min_available="50%").per_step == 8
    assert plan.capacity(16, inventory_min_available=10).per_step == 6  # YAML gives an int
    assert plan.capacity(16, inventory_min_available="50%").source == "inventory"
    # Explicit flags win, even over a bad inventory value (it is not read).
    assert plan.capacity(16, min_available="15", inventory_min_available="nonsense").per_step == 1
    cap = plan.capacity(16, max_unavailable="2", inventory_min_available="nonsense")
    assert (cap.per_step, cap.rule, cap.floor) == (2, "max-unavailable", 14)
    assert plan.capacity(16, max_unavailable="50%").per_step == 8
    assert plan.capacity(4, max_unavailable="9").per_step == 4  # never more than the hosts


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"min_available": "0"}, "--min-available '0' is out of range"),
        ({"min_available": "120%"}, "--min-available '120%' is out of range"),
        ({"min_available": "100%"}, "keeps every host serving"),
        ({"min_available": "16"}, "keeps 16 host(s) serving, but only 16 are selected"),
        ({"min_available": "17"}, "keeps 17 host(s) serving, but only 16 are selected"),
        ({"min_available": "4", "max_unavailable": "4"}, "both given"),
        (
            {"inventory_min_available": "x%"},
            "inventory variable fleetctl_min_available 'x%' is not a count",
        ),
    ],
)
def test_bad_floors_are_refused_with_the_fix(kw: dict[str, str], says: str) -> None:
    with pytest.raises(FleetError) as e:
        plan.capacity(16, **kw)  # type: ignore[arg-type]
    assert says in e.value.cause and e.value.fix


def test_one_host_with_a_count_floor_is_told_to_use_max_unavailable() -> None:
    with pytest.raises(FleetError) as e:
        plan.capacity(1, min_available="1")
    assert e.value.fix == "with one host selected, use --max-unavailable 1"


def test_skipped_hosts_count_toward_the_floor() -> None:
    hosts = fleet(16)
    cur = {h: ("t-v1", D_OLD) for h in hosts}
    for h in hosts[:8]:
        cur[h] = ("t-v2", D_NEW)
    p = build(hosts=hosts, current=cur)
    assert p.max_unavailable == 4 and [len(s) for s in p.steps()] == [1, 4, 3]


def test_estimate_is_steps_times_load_and_soak() -> None:
    hosts = fleet(16)
    p = build(hosts=hosts, current={h: ("t-v1", D_OLD) for h in hosts}).with_estimate(240, 600)
    e = p.estimate
    assert e is not None
    assert [len(s) for s in e.steps] == [1, 4, 4, 4, 3]
    assert (e.step_seconds, e.seconds) == (840.0, 5 * 840.0)
    one = build(
        hosts=hosts, current={h: ("t-v1", D_OLD) for h in hosts}, max_unavailable="1"
    ).with_estimate(240, 600)
    assert one.estimate is not None and one.estimate.seconds == 16 * 840.0
    assert plan.Plan.__dataclass_fields__["estimate"].default is None  # a resumed plan has none


def test_the_estimate_learns_load_and_the_soaks_other_phases_from_passed_steps() -> None:
    def v(ready: float, soak: float, sustained: float, **more: float) -> dict[str, object]:
        return {
            "outcome": "pass",
            "timings": {"stop": 1.0, "start": 0.5, "ready": ready, "soak": soak, **more},
            "sustained_s": sustained,
        }

    # no history: the recipe's figures, the soak's sustained phase alone
    load, soak, basis = plan.learned([], 240, 600)
    assert (load, soak) == (
        240.0,
        600.0,
    ) and basis == "load: recipe's load_time; soak: sustained only, no past soaks"
    # two steps are not enough to trust
    assert plan.learned([v(10, 45, 5), v(12, 47, 5)], 240, 600)[:2] == (240.0, 600.0)
    # three: the median load (stop + start + ready), and this run's sustained seconds plus the
    # median of what the soaks took beyond the sustained seconds they were asked for (40, 42, 60; a
    # re-admission counts)
    hist = [v(10, 45, 5), v(12, 47, 5), v(30, 620, 560, readmit=0.5)]
    load, soak, basis = plan.learned(hist, 240, 600)
    assert load == 13.5 and soak == 600 + 42.0
    assert basis == "load: median of 3 past steps; soak: sustained + median extra of 3"
    # a verdict from before sustained_s was recorded teaches the load only
    load, soak, _ = plan.learned(
        [{"outcome": "pass", "timings": {"ready": 5.0, "soak": 50.0}}] * 3, 240, 10
    )
    assert (load, soak) == (5.0, 10.0)
    hosts = [f"s{i}" for i in range(8)]
    e = (
        build(hosts=hosts, current={h: ("t-v1", D_OLD) for h in hosts})
        .with_estimate(load, soak, basis)
        .estimate
    )
    assert e is not None and e.basis == basis
