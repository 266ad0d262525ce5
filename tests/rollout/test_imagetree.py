"""The image tree's pure parts: the inventory's settings, a round's receiver -> source plan, its
depth."""

from __future__ import annotations

import math

import pytest

from fleetctl.errors import FleetError
from fleetctl.rollout import imagetree


def test_defaults_off_and_settings() -> None:
    assert imagetree.config(None, "inv") == imagetree.TreeConfig()
    assert imagetree.config(False, "inv").enabled is False
    c = imagetree.config({"min_hosts": 8, "min_mb": 0, "fanout": 3, "port": 6000,
                          "relay_image": "reg.lan:5000/registry:2.8"}, "inv")
    assert (c.enabled, c.min_hosts, c.min_mb, c.fanout, c.port, c.relay_image) == \
        (True, 8, 0, 3, 6000, "reg.lan:5000/registry:2.8")
    assert imagetree.config({"fanout": 1}, "inv") == imagetree.TreeConfig(fanout=1)


@pytest.mark.parametrize(("value", "says"), [
    ("yes", "must be false or a mapping"),
    ({"fan_out": 2}, "unknown key(s) fan_out"),
    ({"fanout": 0}, "fleetctl_image_tree.fanout in inv must be a whole number from 1 to 16"),
    ({"port": 80}, "fleetctl_image_tree.port in inv must be a whole number from 1024"),
    ({"min_hosts": True}, "fleetctl_image_tree.min_hosts"),
    ({"min_mb": -1}, "fleetctl_image_tree.min_mb in inv must be a whole number from 0"),
    ({"relay_image": "registry@sha256:abc"}, "relay_image in inv must be an image name"),
])
def test_bad_settings_are_refused_naming_the_variable(value: object, says: str) -> None:
    with pytest.raises(FleetError) as e:
        imagetree.config(value, "inv")
    assert says in str(e.value) and e.value.fix


def test_each_source_serves_at_most_fanout_newest_first() -> None:
    plan = imagetree.assign(["seed", "a", "b"], ["c", "d", "e", "f", "g", "h", "i"], 2)
    assert plan == {"c": "b", "d": "a", "e": "seed", "f": "b", "g": "a", "h": "seed"}  # "i" waits
    assert imagetree.assign([], ["x"], 2) == {}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9, 10, 16, 100, 256, 300])
def test_rounds_grow_with_the_log_of_the_fleet(n: int) -> None:
    # Simulate the rounds with assign(): nothing fails, every receiver becomes a source.
    have, pending, rounds, seed_uploads = ["h0"], [f"h{i}" for i in range(1, n)], 0, 0
    while pending:
        plan = imagetree.assign(have, pending, 2)
        seed_uploads += sum(1 for s in plan.values() if s == "h0")
        have += list(plan)
        pending = [h for h in pending if h not in plan]
        rounds += 1
    assert (
        rounds == imagetree.rounds_for(n, 2) == (math.ceil(math.log(n, 3) - 1e-9) if n > 1 else 0)
    )
    assert seed_uploads <= 2 * rounds


def test_relay_reference_keeps_the_repository_and_digest() -> None:
    d = "sha256:" + "a" * 64
    assert (
        imagetree.relay_ref(5555, f"10.0.0.1:5000/aeon-7/vllm@{d}")
        == f"127.0.0.1:5555/aeon-7/vllm@{d}"
    )
    assert (
        imagetree.relay_ref(5555, f"ghcr.io/aeon-7/vllm@{d}") == f"127.0.0.1:5555/aeon-7/vllm@{d}"
    )
