"""A rollout with the default plan keeps the capacity floor on the lab: never more nodes out of service than
``fleetctl_min_available`` allows, as seen over SSH on every node while the rollout runs.

The floor comes from the inventory (no --max-unavailable, no --min-available): 50 % of the lab's 4 nodes, so
the canary goes alone, then two nodes at a time. A watcher asks every node, over and over during the
rollout, whether its serving container runs and answers /health; the most nodes it ever saw out at once
must be within the floor.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl import inventory, ssh
from fleetctl.recipes import recipe_for
from fleetctl.rollout.plan import MIN_AVAILABLE_VAR
from fleetctl.rollout.results import RolloutResult
from fleetctl.serving import container_name
from tests.plugins.serving import serve
from tests.rollout.test_rollout_lab import NEW, OLD, ledger, run_rollout, serving_tag

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module", autouse=True)
def own_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A ledger of this module's own: its gates compare throughput with no baseline measured under other load
    (two soaks at once and the watcher's SSH on two shared cores are slower than one soak alone)."""
    d = tmp_path_factory.mktemp("capacity-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEETCTL_STATE_DIR", str(d))
        yield d


@pytest.fixture
def floor_in_inventory(serving: RolloutResult) -> Iterator[Path]:
    """``fleetctl_min_available: 50%`` in the lab inventory's group_vars for this test only."""
    del serving
    f = inventory.load(None).path.parent / "group_vars" / "all" / "capacity-test.yml"
    f.write_text(f"{MIN_AVAILABLE_VAR}: 50%\n")
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
        self.cmd = {h.name: f"docker inspect -f '{{{{.State.Running}}}}' {container_name(h)} | grep -qx true && "
                            f"curl -sf -m 3 -o /dev/null http://127.0.0.1:{port}/health" for h in self.hosts}
        self.most_out = 0
        self.rounds = 0
        self.seen_out: set[str] = set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            outs = ssh.fan_out(self.hosts, lambda h: ssh.docker(h, self.cmd[h.name], timeout=20).rc, timeout=30)
            down = {n for n, o in outs.items() if o.error is not None or o.value != 0}
            self.seen_out |= down
            self.most_out = max(self.most_out, len(down))
            self.rounds += 1
            self._stop.wait(0.3)  # a breath between rounds: the controller and the soaks share two cores

    def __enter__(self) -> Watcher:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(timeout=60)


def test_the_default_plan_keeps_the_floor(floor_in_inventory: Path) -> None:
    serve(OLD)
    with Watcher() as w:
        before = w.rounds
        while w.rounds == before:  # every node answers before the rollout starts (the baseline of the count)
            threading.Event().wait(0.2)
        assert w.most_out == 0, "a node was out of service before the rollout"
        r = run_rollout(NEW)
    assert r.status == "completed", r.error
    assert all(serving_tag(NEW).values())
    with ledger() as led:
        rec = led.get(r.id)
    # The plan the inventory's floor made: 2 of 4 kept serving, so the canary, then steps of 2.
    assert rec.options["max_unavailable"] == 2, rec.options
    assert "2 of 4 kept serving" in rec.options["capacity"] and "in the inventory" in rec.options["capacity"]
    steps = sorted({(h.wave, h.step) for h in rec.hosts})
    assert [sum(1 for h in rec.hosts if (h.wave, h.step) == s) for s in steps] == [1, 2, 1]
    # What the nodes said over SSH while it ran: never more than 2 out at once.
    assert w.rounds > 1 and w.most_out <= 2, (w.most_out, w.seen_out)
    ssh.close_all()
    serve(OLD)
