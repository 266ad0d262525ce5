"""A rollout with the default plan keeps the capacity floor on the lab: never more nodes out of
service than ``fleetctl_min_available`` allows, as seen over SSH on every node while the rollout
runs; and its later steps start warm from the canary's compile cache, while a stale cache is
ignored.

The floor comes from the inventory (no --max-unavailable, no --min-available): 50 % of the lab's 4
nodes, so the canary goes alone, then two nodes at a time. A watcher asks every node, over and over
during the rollout, whether its serving container runs and answers /health; the most nodes it ever
saw out at once must be within the floor.

Warm start (docs/warm-start.md), in the same rollout: before it, every node's cache directory for
the target's key holds a *stale* compile (made for another key). The canary must ignore it (a cold
compile, its gate passes); the nodes after it must get the canary's cache (the ledger says warm, the
manifest read from the node names the key) and the emulator on them must log a compile-cache hit for
that key.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl import inventory, registry, ssh, warmcache
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe, recipe_for
from fleetctl.rollout import host as remote
from fleetctl.rollout import imagetree
from fleetctl.rollout.plan import MIN_AVAILABLE_VAR
from fleetctl.rollout.results import RolloutResult
from fleetctl.serving import container_name
from tests.plugins.serving import serve
from tests.rollout.test_rollout_lab import NEW, OLD, ledger, run_rollout, serving_tag

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module", autouse=True)
def own_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A ledger of this module's own: its gates compare throughput with no baseline measured under
    other load
    (two soaks at once and the watcher's SSH on two shared cores are slower than one soak alone)."""
    d = tmp_path_factory.mktemp("capacity-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEETCTL_STATE_DIR", str(d))
        yield d


@pytest.fixture
def floor_in_inventory(serving: RolloutResult) -> Iterator[Path]:
    """``fleetctl_min_available: 50%`` in the lab inventory's group_vars for this test only, and
    the image tree from 2 hosts and any size (its defaults: 4 hosts needing the image, 512 MB; the
    lab's is
    112 MB)."""
    del serving
    f = inventory.load(None).path.parent / "group_vars" / "all" / "capacity-test.yml"
    f.write_text(f"{MIN_AVAILABLE_VAR}: 50%\n{imagetree.VAR}: {{min_hosts: 2, min_mb: 0}}\n")
    try:
        yield f
    finally:
        f.unlink(missing_ok=True)


class Watcher:
    """Counts, over SSH, the nodes whose serving container is not running or does not answer /health
    (docker as the admin user may run it: the docker group, or sudo)."""

    def __init__(self) -> None:
        inv = inventory.load(None)
        self.hosts = list(inv.hosts.values())
        port = recipe_for(inv, None).port
        self.cmd = {
            h.name: f"docker inspect -f '{{{{.State.Running}}}}' {container_name(h)} | grep -qx "
                    "true && "
            f"curl -sf -m 3 -o /dev/null http://127.0.0.1:{port}/health"
            for h in self.hosts
        }
        self.most_out = 0
        self.rounds = 0
        self.seen_out: set[str] = set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            outs = ssh.fan_out(
                self.hosts, lambda h: ssh.docker(h, self.cmd[h.name], timeout=20).rc, timeout=30
            )
            down = {n for n, o in outs.items() if o.error is not None or o.value != 0}
            self.seen_out |= down
            self.most_out = max(self.most_out, len(down))
            self.rounds += 1
            self._stop.wait(
                0.3
            )  # a breath between rounds: the controller and the soaks share two cores

    def __enter__(self) -> Watcher:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(timeout=60)


def _in_cache(h: Host, recipe: Recipe, ref: str, script: str) -> str:
    """Run python ``script`` in a throw-away container of ``ref`` with the node's recipe cache root
    at /c."""
    r = ssh.docker(
        h,
        shlex.join(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "none",
                "--entrypoint",
                "python3",
                "-v",
                f"{warmcache.ROOT}/{recipe.name}:/c",
                ref,
                "-c",
                script,
            ]
        ),
        timeout=120,
    )
    r.check("cache script")
    return r.stdout


def _forget_image(hosts: list[Host], ref: str) -> None:
    """No node holds ``ref`` (a kept ``.prev`` container of it goes too): the rollout's prefetch
    must fetch it."""

    def forget(h: Host) -> None:
        prev = container_name(h) + remote.PREV_SUFFIX
        ssh.docker(
            h,
            f"s=$(docker inspect -f '{{{{.Image}}}}' {prev} 2>/dev/null); "
            f"i=$(docker image inspect -f '{{{{.Id}}}}' {ref} 2>/dev/null); "
            f'if [ -n "$i" ] && [ "$s" = "$i" ]; then docker rm -f {prev} >/dev/null; fi; '
            f"docker image rm {ref} >/dev/null 2>&1; true",
            timeout=60,
        ).check("forget the image")
        assert ssh.docker(h, ["docker", "image", "inspect", ref], timeout=30).rc != 0, h.name

    outs = ssh.fan_out(hosts, forget, timeout=120)
    assert all(o.error is None for o in outs.values()), outs


def _plant_stale(hosts: list[Host], recipe: Recipe, ref: str, key: str) -> None:
    """Every node's cache directory for ``key`` holds the emulator's artefacts of another key."""
    d = f"/c/{key}/vllm/torch_compile_cache/fleetctl-emulator"
    script = (
        f"import os, shutil; shutil.rmtree('/c/{key}', ignore_errors=True); os.makedirs('{d}'); "
        f"open('{d}/kernels.bin', 'wb').write(b'old'); "
        f'open(\'{d}/compiled.json\', \'w\').write(\'{{"key": "stale", "sha256": "x"}}\')'
    )
    outs = ssh.fan_out(hosts, lambda h: _in_cache(h, recipe, ref, script), timeout=180)
    assert all(o.error is None for o in outs.values()), outs


def test_the_default_plan_keeps_the_floor(floor_in_inventory: Path) -> None:
    serve(OLD)
    inv = inventory.load(None)
    recipe = recipe_for(inv, None)
    mirrors = {str(k): str(v) for k, v in (inv.vars.get("fleetctl_registry_mirrors") or {}).items()}
    digest = registry.resolve(recipe.image, NEW, mirrors).digest
    ref = registry.pull_ref(recipe.image, digest, mirrors)
    key = warmcache.cache_key(digest, remote.fingerprint(recipe), remote.GB10)
    _plant_stale(list(inv.hosts.values()), recipe, ref, key)
    _forget_image(list(inv.hosts.values()), ref)
    with Watcher() as w:
        before = w.rounds
        while (
            w.rounds == before
        ):  # every node answers before the rollout starts (the baseline of the count)
            threading.Event().wait(0.2)
        assert w.most_out == 0, "a node was out of service before the rollout"
        r = run_rollout(NEW)
    assert r.status == "completed", r.error
    assert all(serving_tag(NEW).values())
    with ledger() as led:
        rec = led.get(r.id)
    # The plan the inventory's floor made: 2 of 4 kept serving, so the canary, then steps of 2.
    assert rec.options["max_unavailable"] == 2, rec.options
    assert (
        "2 of 4 kept serving" in rec.options["capacity"]
        and "in the inventory" in rec.options["capacity"]
    )
    steps = sorted({(h.wave, h.step) for h in rec.hosts})
    assert [sum(1 for h in rec.hosts if (h.wave, h.step) == s) for s in steps] == [1, 2, 1]
    # The prefetch went through the image tree: the seed from the registry, the other three through
    # relays.
    assert (
        sorted(r.pull_via.values())[-1].startswith("relay:")
        and list(r.pull_via.values()).count("registry") == 1
    ), r.pull_via
    assert any(
        p.phase == "prefetch" and "3 through relays" in (p.detail or "") for p in rec.phases
    ), rec.phases
    # What the nodes said over SSH while it ran: never more than 2 out at once.
    assert w.rounds > 1 and w.most_out <= 2, (w.most_out, w.seen_out)
    # Warm start: the canary compiled cold over the stale cache, every later node started warm on
    # its key.
    canary = rec.waves[0].hosts[0]
    warm = {p.host: json.loads(p.detail or "{}") for p in rec.phases
            if p.host and p.phase in ("warm-start", "cold-start")}
    later = sorted(h.host for h in rec.hosts if h.host != canary)
    assert sorted(warm) == later and all(v["warm"] and v["key"] == key and v["source"] == canary
                                         for v in warm.values()), warm
    check = (f"import json; print(json.load(open('/c/{key}/{warmcache.MANIFEST}'))['key'])")
    for h in inv.hosts.values():
        log = ssh.docker(
            h, f"docker logs {container_name(h)} 2>&1 | grep 'compile cache' | tail -1", timeout=30
        )
        if h.name == canary:
            assert (
                f"compile cache miss (key {key}): the cache was compiled for key stale"
                in log.stdout
            ), log.stdout
        else:
            assert f"compile cache hit (key {key})" in log.stdout, (h.name, log.stdout)
            assert _in_cache(h, recipe, ref, check).strip() == key
    ssh.close_all()
    serve(OLD)
