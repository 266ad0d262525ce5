"""A rejected build stays rejected (rollout/rejected.py), on the simulated fleet: a digest whose
full gate failed for a recipe is refused by the next rollout of that recipe before any host
changes, named with the rollout that rejected it and why; ``--retry-rejected`` gates it again;
``history`` carries the rejected digest."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.cli.history import history_json
from fleetctl.errors import FleetError
from fleetctl.rollout.rejected import rejections
from fleetctl.rollout.results import Options
from fleetctl.state import ledger as fleet_ledger

from .sim import SimFleet, digest_of
from .test_gates_sim import DECAY, HOSTS, NEW, OLD, TAGS, _container_ids, _engine


def test_a_rejected_digest_is_refused_before_any_host_changes_unless_retried(
    tmp_path: Path,
) -> None:
    fleet = SimFleet(dict.fromkeys(HOSTS, NEW), TAGS)
    eng = _engine(fleet, tmp_path)
    try:
        first = eng.rollout(Options(tag=DECAY, limit=",".join(HOSTS), soak=1.0))
    finally:
        eng.close()
    assert first.status == "failed" and first.id is not None
    before = _container_ids(fleet)
    eng = _engine(fleet, tmp_path)
    try:
        with pytest.raises(FleetError) as e:
            eng.rollout(Options(tag=DECAY, limit=",".join(HOSTS), soak=1.0))
    finally:
        eng.close()
    msg = e.value.message()
    assert "rejected before" in msg and first.id in msg and "spark-01" in msg
    assert "decode tok/s dropped 60%" in msg and "--retry-rejected" in msg
    assert _container_ids(fleet) == before  # no host touched
    with fleet_ledger.open_ledger(tmp_path) as led:
        (rj,) = rejections(led)
        assert rj.digest == digest_of(DECAY) and rj.rollout_id == first.id
        data = history_json(led.get(first.id))
        assert data["rejected"]["digest"] == digest_of(DECAY)
        assert len(led.ids(kind="rollout")) == 1  # the refused one left no record
    # Another build of the recipe is not held back, and the operator may retry the rejected one.
    eng = _engine(fleet, tmp_path)
    try:
        other = eng.rollout(Options(tag=OLD, limit="spark-01", soak=1.0))
        again = eng.rollout(Options(tag=DECAY, limit=",".join(HOSTS), soak=1.0,
                                    retry_rejected=True))
    finally:
        eng.close()
    assert other.status == "completed", other
    assert again.status == "failed" and again.hosts[0].status == "rolled-back", again
