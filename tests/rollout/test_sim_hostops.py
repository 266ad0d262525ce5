"""What the engine runs on hosts besides their containers, through HostOps on the simulated fleet.

The image tree's relays (who read from whom), the prefetch's image probe, the fleet's lock in each
host's state file, the warm start's cache copies and a unit's bandwidth probe: each through the
same operations ``SshHostOps`` runs over SSH, so that the simulated fleet sees every one of them.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl import bandwidth, inventory, warmcache
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.recipes import parse_recipes, recipe_for
from fleetctl.rollout import host as remote
from fleetctl.rollout import imagetree
from fleetctl.state import hoststate
from tests.rollout.sim import OK, Relay, SimFleet, digest_of

HOSTS = [Host(f"spark-0{i}", f"10.0.0.{i}", vars={warmcache.TRUST_DOMAIN: "fleet"})
         for i in range(1, 8)]
REF = f"10.0.0.100:5000/aeon-7/vllm@{digest_of('v2')}"


def _fleet() -> SimFleet:
    return SimFleet({h.name: "v1" for h in HOSTS}, {"v1": OK, "v2": OK})


def _tree(fleet: SimFleet, hosts: list[Host]) -> dict[str, Any]:
    cfg = imagetree.TreeConfig(min_hosts=1, fanout=2)
    relay = f"docker.io/library/registry@{digest_of('v1')}"
    tree = imagetree.Tree(cfg, imagetree.Source(REF, "http://10.0.0.100:5000", relay),
                          imagetree.Hands(ops=fleet.ops, pull=lambda h, r: fleet.ops(h).pull(r),
                                          direct=lambda h, r: fleet.ops(h).pull(r),
                                          emit=lambda kind, msg, host: None))
    return tree.run(hosts)


def test_the_tree_reads_the_registry_once_and_relays_host_to_host() -> None:
    fleet = _fleet()
    got = _tree(fleet, HOSTS)
    assert all(o.ok for o in got.values()), got
    via = {n: o.value.via for n, o in got.items()}
    # What each relay read, as the hosts' relays saw it, is what the tree says of each host.
    assert dict(fleet.relay_reads) == via
    assert [src for _, src in fleet.relay_reads].count("registry") == 1
    assert via["spark-01"] == "registry" and via["spark-02"] == via["spark-03"] == "spark-01"
    assert all(digest_of("v2") in h.images for h in fleet.hosts.values())
    # every relay removed
    assert all(h.relay is None for h in fleet.hosts.values()) and fleet.relays == {}
    assert {f"{h.name}:relay-remove" for h in HOSTS} <= set(fleet.points)


def test_a_seed_relay_that_does_not_start_leaves_every_host_pulling_from_the_registry() -> None:
    fleet = _fleet()
    fleet.relay_fails.add("spark-01")
    got = _tree(fleet, HOSTS[:4])
    assert all(o.ok and o.value.via is None for o in got.values()), got
    assert "port 5555 is taken" in (got["spark-01"].value.fallback or "")
    assert fleet.relay_reads == []
    assert all(digest_of("v2") in fleet.hosts[h.name].images for h in HOSTS[:4])


def test_the_image_probe_removes_a_relay_a_killed_controller_left() -> None:
    fleet = _fleet()
    fleet.hosts["spark-02"].relay = Relay("http://10.0.0.100:5000", 5555)
    fleet.relays[("10.0.0.2", 5555)] = "spark-02"
    assert not imagetree.holds_image(fleet.ops(HOSTS[1]), REF)
    assert fleet.hosts["spark-02"].relay is None and fleet.relays == {}
    assert imagetree.holds_image(fleet.ops(HOSTS[1]), f"x/vllm@{digest_of('v1')}")
    assert imagetree.remove_relays(HOSTS[:2], fleet.ops) == {}


def test_the_fleets_lock_is_written_in_each_hosts_state_file() -> None:
    fleet = _fleet()
    store = hoststate.OpsStore(fleet.ops)
    locks = hoststate.HostLocks(store, HOSTS[:2], "ro-20260701-120000-beef", "rollout")
    locks.claim()
    try:
        held = hoststate.read_all(store, HOSTS[:3])
        assert {n for n, s in held.items() if s.lock is not None} == {"spark-01", "spark-02"}
        assert '"ro-20260701-120000-beef"' in fleet.hosts["spark-01"].state
    finally:
        locks.release()
    assert all(s.lock is None for s in hoststate.read_all(store, HOSTS[:2]).values())


RECIPE = parse_recipes({"r": {
    "image": "vllm/vllm-openai", "served_model_names": ["m"], "vllm_args": ["--port", "8000"],
    "weights": [{"role": "body", "repo": "o/m", "revision": "main", "path": "/opt/m",
                 "mount": "/model", "format": "bf16"}],
    "compile_cache": [{"name": "vllm", "mount": "/root/.cache/vllm"}]}})["r"]


def test_the_canarys_compile_cache_is_copied_to_hosts_holding_the_image() -> None:
    fleet = _fleet()
    d = digest_of("v2")
    key = warmcache.cache_key(d, remote.fingerprint(RECIPE), remote.GB10)
    for h in HOSTS[:3]:
        fleet.ops(h).pull(REF)
    canary = fleet.ops(HOSTS[0])
    canary.kill("vllm")
    # a cold start compiles into its key directory
    canary.start(remote.StartRequest(RECIPE, REF, "v2", d, "ro-1", cache_key=key))
    out = warmcache.share(RECIPE, REF, HOSTS[0], key, {h: key for h in HOSTS[1:4]}, fleet.ops)
    assert out["spark-02"].warm and out["spark-03"].warm and out["spark-02"].files == 1
    # the cache script runs in the target image: a host without it starts cold
    assert not out["spark-04"].warm and "no image" in out["spark-04"].detail
    assert fleet.hosts["spark-02"].caches == fleet.hosts["spark-01"].caches
    assert warmcache.verify(RECIPE, REF, fleet.ops(HOSTS[1]), key) == (True, None)


def test_a_units_bandwidth_is_probed_on_every_member_in_the_image() -> None:
    from tests.rollout.test_unit_recovery_harness import INV, UNIT

    inv = inventory.load(INV)
    unit = inv.unit_of(UNIT[0])
    assert unit is not None
    recipe = recipe_for(inv, str(inv.host(unit.head).vars["fleetctl_recipe"]))
    fleet = SimFleet({m: "v1" for m in unit.members}, {"v1": OK, "v2": OK})
    m = bandwidth.measure(inv, unit, recipe, f"x/vllm@{digest_of('v1')}", fleet.ops)
    assert sorted(h for h, _, _ in fleet.probes) == sorted(unit.members)
    assert m.busbw_gbs == fleet.busbw_gbs and m.method == "tcp"
    with pytest.raises(FleetError, match="Unable to find image"):
        bandwidth.measure(inv, unit, recipe, f"x/vllm@{digest_of('v2')}", fleet.ops)
