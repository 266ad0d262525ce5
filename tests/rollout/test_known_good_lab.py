"""Issue 31 on the lab's nodes: a healthy version, then a build whose long answers loop after ~100
words at any concurrency (the emulator's ``degenerate`` scenario).

The canary fails its gate for the loop with both texts in the verdict (against the known-good set
the healthy version's gate recorded in the ledger) and is back on the healthy version; a second
rollout of the same tag is refused before any host changes; a healthy new version still passes.
Each node's state is read over SSH (``docker inspect``), independently of the ledger.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl import lab as fleetlab
from fleetctl import ssh
from fleetctl.errors import FleetError
from fleetctl.lab.scenarios import scenario_env
from fleetctl.rollout.results import RolloutResult
from fleetctl.soak import references
from tests.plugins.serving import serve

from .test_rollout_lab import OLD, ledger, real_state, run_rollout, serving_tag

pytestmark = pytest.mark.lab

HEALTHY = "v0.24.0"
DEGEN = "2026-08-01-degenerate"
HEALTHY_NEXT = "2026-08-02-v0.24.1"
CANARY = "spark-01"


@pytest.fixture(scope="module", autouse=True)
def own_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A ledger of this module's own: no known-good set or rejection from another test."""
    d = tmp_path_factory.mktemp("known-good-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEETCTL_STATE_DIR", str(d))
        yield d


@pytest.fixture(scope="module")
def tags(serving: RolloutResult) -> tuple[str, str]:
    del serving
    fleetlab.add_image(DEGEN, scenario_env("degenerate", EMU_VERSION="0.24.1"))
    fleetlab.add_image(HEALTHY_NEXT, scenario_env("healthy", EMU_VERSION="0.24.1"))
    return DEGEN, HEALTHY_NEXT


def test_a_degenerate_build_fails_its_canary_stays_rejected_and_a_healthy_one_passes(
    tags: tuple[str, str],
) -> None:
    del tags
    serve(OLD)
    # The healthy version's gate on the canary records the recipe's known-good answers.
    good = run_rollout(HEALTHY, limit=CANARY)
    assert good.status == "completed", good.error
    with ledger() as led:
        recipe = led.get(good.id or "").recipe or ""
        known = references.load(led, references.key(recipe))
    assert known is not None and known.tag.endswith("v0.24.0") and known.answers

    bad = run_rollout(DEGEN, limit=CANARY)
    assert bad.status == "failed" and bad.exit_code == 1, bad
    (canary,) = bad.hosts
    assert canary.status == "rolled-back", canary
    assert serving_tag(HEALTHY)[CANARY], real_state()  # back on the healthy version
    with ledger() as led:
        rec = led.get(bad.id or "").host(CANARY)
    assert rec is not None and rec.verdict is not None
    said = f"{rec.verdict.get('summary')} {rec.error}"
    assert "known_good" in said and "a loop the known-good did not have" in said, said
    assert "I can help with that." in said and "known-good" in said

    before = real_state()
    with pytest.raises(FleetError) as e:
        run_rollout(DEGEN, limit=CANARY)
    assert "rejected before" in e.value.message() and (bad.id or "") in e.value.message()
    assert real_state() == before  # not a host touched

    nxt = run_rollout(HEALTHY_NEXT, limit=CANARY)
    with ledger() as led:
        passed = led.get(nxt.id or "").host(CANARY)
    assert passed is not None and passed.verdict is not None, nxt.error
    checks = {c["name"]: c for c in passed.verdict["checks"]}
    assert checks["known_good"]["outcome"] == "pass", checks["known_good"]
    assert "100.0% identical" in checks["known_good"]["message"]
    assert checks["correctness"]["outcome"] == "pass", checks["correctness"]
    # The rest of its gate is the lab's: on a shared 2-core machine a level's tok/s swings past the
    # lab profile's tolerance now and then (measured: -26% once); nothing else may fail.
    others = {n for n, c in checks.items() if c["outcome"] not in ("pass", "skipped")}
    assert others <= {"throughput", "latency"}, (others, nxt.error)
    assert nxt.status == "completed" or others, nxt.error
    ssh.close_all()
