"""Rollout planning from data: Ansible-serial waves, max-unavailable steps, failure budget, skips."""

from __future__ import annotations

from dataclasses import replace

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
    args: dict[str, object] = dict(recipe="r", image="ghcr.io/x/y", requested="v2", tag="t-v2", digest=D_NEW,
                                   pull_ref=f"m/x/y@{D_NEW}", hosts=HOSTS[:4],
                                   current={h: ("t-v1", D_OLD) for h in HOSTS[:4]})
    args.update(kw)
    return plan.build(**args)  # type: ignore[arg-type]


def test_default_plan_is_canary_then_rest_one_at_a_time() -> None:
    p = build()
    assert p.waves == (("s01",), ("s02", "s03", "s04"))
    assert p.max_unavailable == 1 and p.failure_budget == 0
    assert [(h.host, h.wave, h.step) for h in p.hosts] == [("s01", 0, 0), ("s02", 1, 0), ("s03", 1, 1), ("s04", 1, 2)]
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
        ("s01", "skip", "already there"), ("s02", "deploy", "settings"), ("s03", "deploy", "settings"),
        ("s04", "skip", "already there")]
    assert p.waves == (("s02",), ("s03",))


def test_fingerprint_is_pure_and_follows_every_rendered_setting() -> None:
    r = recipe_for(inventory.load(paths.project_root() / "inventory" / "example"), None)
    assert fingerprint(r) == fingerprint(replace(r))
    assert len(fingerprint(r)) == 64
    for change in ({"docker_args": (*r.docker_args, "--shm-size=32g")}, {"env": {**r.env, "X": "1"}},
                   {"vllm_args": (*r.vllm_args, "--max-num-seqs", "8")}, {"secret_env": (*r.secret_env, "K")}):
        assert fingerprint(replace(r, **change)) != fingerprint(r), change  # type: ignore[arg-type]
    assert fingerprint(replace(r, image="other/image")) == fingerprint(r), "the image is the digest's business"
