"""The weights role's tree fan-out planner (roles/weights/filter_plugins/weights_tree.py), for
1..300 hosts."""

from __future__ import annotations

import math

import pytest

from tests.role_modules import load_role_file

tree = load_role_file("weights", "filter_plugins/weights_tree.py")


def _simulate(
    n: int,
    fanout: int,
    *,
    bad: frozenset[str] = frozenset(),
    units: dict[str, str] | None = None,
    attempts: int = 3,
) -> tuple[int, dict[str, int], dict[str, str], set[str]]:
    """Run the planner round by round as the role does; ``bad`` sources fail every copy they serve.

    Returns (rounds, uploads per source, receiver -> its source, hosts given up)."""
    hosts = [f"h{i:03d}" for i in range(n)]
    ready = [hosts[0]]
    have = {hosts[0]}
    failed: dict[str, list[str]] = {h: [] for h in hosts}
    uploads: dict[str, int] = {}
    got: dict[str, str] = {}
    rounds = 0
    for _ in tree.weights_tree_rounds(hosts, fanout, attempts):
        pending = [h for h in hosts if h not in have and len(failed[h]) < attempts]
        plan = tree.plan_round(ready, pending, fanout, units=units, failed=failed)
        if not plan:
            continue
        rounds += 1
        per_source: dict[str, int] = {}
        for r, s in plan.items():
            assert s in have and r not in have and s not in failed[r]
            per_source[s] = per_source.get(s, 0) + 1
            uploads[s] = uploads.get(s, 0) + 1
        assert max(per_source.values()) <= fanout
        for r, s in plan.items():
            if s in bad:
                failed[r].append(s)
            else:
                have.add(r)
                got[r] = s
        ready += [r for r in plan if r in have]  # a host serves from the round after it verified
        # The bad sources keep serving (they verified; their sshd is what fails).
    given_up = {h for h in hosts if h not in have}
    return rounds, uploads, got, given_up


@pytest.mark.parametrize(
    ("fanout", "sizes"), [(2, range(1, 301)), (1, range(1, 301, 7)), (3, range(1, 301, 11))]
)
def test_every_fleet_from_1_to_300_hosts_is_served_in_log_rounds_with_bounded_uploads(
    fanout: int, sizes: range
) -> None:
    for n in sizes:
        rounds, uploads, got, given_up = _simulate(n, fanout)
        assert not given_up and len(got) == n - 1, n
        expected = 0 if n == 1 else math.ceil(math.log(n) / math.log(fanout + 1) - 1e-9)
        assert rounds == tree.rounds_for(n, fanout) == expected, (n, fanout, rounds)
        # The seed uploads at most fanout a round: O(log N), where one seed serving all uploaded N
        # - 1 times.
        assert uploads.get("h000", 0) <= fanout * rounds
        assert all(u <= fanout * rounds for u in uploads.values())


def test_300_hosts_take_6_rounds_and_the_seed_12_uploads_at_the_default_fanout() -> None:
    rounds, uploads, _, _ = _simulate(300, 2)
    assert rounds == 6 and uploads["h000"] <= 12  # one seed alone: 299 uploads


@pytest.mark.parametrize("n", [3, 8, 17, 100, 300])
def test_a_failing_source_costs_retries_from_other_sources_not_the_run(n: int) -> None:
    # h001 verifies in round 1 and then every copy from it fails (its sshd, its network).
    hosts = [f"h{i:03d}" for i in range(n)]
    rounds, _, got, given_up = _simulate(n, 2, bad=frozenset({"h001"}))
    assert not given_up, given_up
    assert "h001" not in got.values()
    assert rounds <= tree.rounds_for(n, 2) + 2
    assert set(got) | {"h000"} == set(hosts) - {"h001"} | ({"h001"} if "h001" in got else set())


def test_a_receiver_is_given_up_after_its_attempts_and_never_retried_from_a_failed_source() -> None:
    plan = tree.plan_round(["a", "b", "c"], ["r"], 1, failed={"r": ["a", "b"]})
    assert plan == {"r": "c"}
    assert tree.plan_round(["a", "b"], ["r"], 1, failed={"r": ["a", "b"]}) == {}
    # Simulated with every source but the seed bad, at 1 attempt: the seed's receivers get it, the
    # rest give up.
    _, _, got, given_up = _simulate(
        9, 1, bad=frozenset({f"h{i:03d}" for i in range(1, 9)}), attempts=1
    )
    assert set(got.values()) == {"h000"} and given_up


def test_unit_members_copy_from_each_other_over_their_link() -> None:
    units = {"a1": "pair-a", "a2": "pair-a", "b1": "pair-b", "b2": "pair-b"}
    # a1 holds the set: a2 copies from it (same unit) even though the seed is less loaded.
    plan = tree.plan_round(["seed", "a1"], ["a2", "b1", "b2"], 2, units=units)
    assert plan["a2"] == "a1"
    assert plan["b1"] in ("seed", "a1") and plan["b2"] in ("seed", "a1")
    # Simulated on 40 hosts of 20 pairs: a member whose peer held the set before it copied from
    # that peer.
    units = {f"h{i:03d}": f"u{i // 2}" for i in range(40)}
    hosts = sorted(units)
    ready, have = ["h000"], {"h000"}
    peer_copies = 0
    while len(have) < 40:
        plan = tree.plan_round(ready, [h for h in hosts if h not in have], 2, units=units)
        for r, s in plan.items():
            peer = next(h for h in hosts if units[h] == units[r] and h != r)
            if peer in ready:
                assert s == peer, (r, s)
                peer_copies += 1
        have |= set(plan)
        ready += list(plan)
    assert peer_copies >= 1


def test_a_source_must_hold_every_set_the_receiver_needs() -> None:
    needs = {"r": ["body", "drafter"], "x": ["drafter"]}
    has = {"seed": ["body", "drafter"], "x": ["drafter"]}
    assert tree.plan_round(["x", "seed"], ["r"], 1, needs=needs, has=has) == {"r": "seed"}


def test_the_filter_reads_hostvars_and_copies_over_the_fabric_between_members() -> None:
    hv = {
        "s1": {
            "ansible_host": "10.0.0.1",
            "ansible_user": "nvidia",
            "_weights_serves": True,
            "_weights_have": True,
            "_weights_needs": ["body"],
            "_weights_holds": ["body"],
            "fleetctl_unit": "pair-a",
            "fleetctl_fabric": {"addresses": ["192.168.177.1"]},
        },
        "s2": {
            "ansible_host": "10.0.0.2",
            "ansible_port": 2222,
            "_weights_needs": ["body"],
            "fleetctl_unit": "pair-a",
            "fleetctl_fabric": {"addresses": ["192.168.177.2"]},
        },
        "s3": {"ansible_host": "10.0.0.3", "_weights_needs": ["body"], "_weights_failed_from": []},
        "s4": {
            "ansible_host": "10.0.0.4",
            "_weights_needs": ["body"],
            "_weights_failed_from": ["s1"],
        },
    }
    plan = tree.weights_tree_round(["s1", "s2", "s3", "s4"], hv, 2, 3)
    assert plan["s2"] == {
        "host": "s1",
        "address": "192.168.177.1",
        "via": "fabric",
        "host_key_alias": "10.0.0.1",
        "port": 22,
        "user": "nvidia",
    }
    assert plan["s3"] == {
        "host": "s1",
        "address": "10.0.0.1",
        "via": "lan",
        "host_key_alias": "",
        "port": 22,
        "user": "nvidia",
    }
    assert "s4" not in plan  # its only source failed it
    assert tree.weights_tree_addresses(["s2", "s3"], hv) == [
        "10.0.0.2",
        "192.168.177.2",
        "10.0.0.3",
    ]


def test_a_fanout_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="fanout must be at least 1"):
        tree.rounds_for(4, 0)
