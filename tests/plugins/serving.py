"""The ``serving`` fixture: every lab node serves the v0.23.0 tag, deployed by a real rollout.

Built on ``staged`` (weights in place on every node). The rollout to v0.23.0
uses short soaks; a node already serving that digest is skipped, so a second
session on the same lab costs one plan. Tests that move the fleet elsewhere
call :func:`serve` to put it back (a smoke-gated ``rollback --to``, which is
fast), never by hand.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl import inventory, registry, ssh
from fleetctl.progress import NULL, Progress
from fleetctl.rollout import host as remote
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RollbackOptions, RolloutResult
from tests.plugins.lab import setup_slot

#: The version the fleet serves at the start of every rollout test.
BASE_TAG = "v0.23.0"
#: Sustained soak length in the lab (seconds): enough for three metric windows.
LAB_SOAK = 3.0


def engine(progress: Progress = NULL) -> Engine:
    """An engine on the lab's inventory (the caller closes it)."""
    return Engine(inventory.load(None), progress)


def serve(tag: str = BASE_TAG) -> RolloutResult | None:
    """Make every node serve ``tag`` (readiness + smoke), unless it already does; None if nothing
    to do."""
    eng = engine()
    try:
        recipe = eng.recipe(None)
        img = registry.resolve(recipe.image, tag, eng.mirrors)
        if all(
            (s := remote.inspect(h, remote.container_name(h))) is not None
            and s.running
            and s.digest == img.digest
            for h in eng.inv.hosts.values()
        ):
            return None
        return eng.rollback(
            RollbackOptions(to=tag, max_unavailable="100%", recipe_name=recipe.name))
    finally:
        eng.close()
        ssh.close_all()


@pytest.fixture(scope="session")
def serving(staged: Any) -> RolloutResult:
    """Every lab node serving v0.23.0 (the result of the run that made it so).

    On a fleet that serves nothing yet this is a real rollout (the first
    deploy, all nodes at once, soak-gated). On a lab reused from an earlier
    session, whatever it serves, it is a smoke-gated ``rollback --to``: a soak
    there would be compared with baselines measured under other load.
    """
    del staged
    eng = engine()
    with setup_slot():
        try:
            hosts = list(eng.inv.hosts.values())
            serving_now = [
                h
                for h in hosts
                if (s := remote.inspect(h, remote.container_name(h))) is not None and s.running
            ]
            if serving_now:
                # The inventory's recipe, named: the ledger's last run may be another's (a unit's on
                # its own recipe, when this worker ran the lab's other half first).
                r = eng.rollback(RollbackOptions(to=BASE_TAG, max_unavailable="100%",
                                                 recipe_name=eng.recipe(None).name))
            else:
                r = eng.rollout(
                    Options(tag=BASE_TAG, waves="100%", max_unavailable="100%", soak=LAB_SOAK)
                )
        finally:
            eng.close()
            ssh.close_all()
    assert r.status == "completed", f"putting {BASE_TAG} on every node failed: {r.error}"
    return r
