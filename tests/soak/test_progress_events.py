"""The soak's progress events carry what a live view needs: phase k of n, time so far, each level's
requests against its plan, errors, tok/s against the baseline's and acceptance (real emulator,
loopback)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleetctl.progress import Recorder
from fleetctl.soak.phases.soak_state import SOAK_PHASES, planned_phases
from fleetctl.soak.run import Against, run_soak
from fleetctl.soak.verdict import Outcome

from .conftest import Served
from .test_engine_loopback import fast_config


def test_events_say_phase_k_of_n_and_the_running_figures(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    served = emulator(EMU_SPEED="4")
    cfg = fast_config(concurrency=[1, 4])
    alone = Recorder()
    first = run_soak(served.target, cfg, None, alone, artifacts_dir=tmp_path / "a")
    assert first.outcome is Outcome.PASS, first.summary
    rec = Recorder()
    v = run_soak(served.target, cfg, Against(first), rec, artifacts_dir=tmp_path / "b")
    assert v.outcome is Outcome.PASS, v.summary
    plan = planned_phases(cfg)
    assert plan == tuple(p for p in SOAK_PHASES if p != "rate"), "no request rates in this config"
    stepped = [e for e in rec.events if "step" in e.data]
    assert {e.phase for e in stepped} == set(plan), "every planned phase is announced"
    assert all(
        e.data["steps"] == len(plan) and plan[e.data["step"] - 1] == e.phase for e in stepped
    )
    ks = [e.data["step"] for e in stepped]
    assert ks == sorted(ks), "phases come in their order"
    levels = [e for e in rec.events if "planned_requests" in e.data]
    assert {e.data["level"] for e in levels} >= {"c=1", "c=4", "sustained"}
    for e in levels:
        assert 0 <= e.data["requests"] <= e.data["planned_requests"]
        assert e.data["errors"] == 0 and e.data["level_elapsed"] <= e.data["level_seconds"] + 5
        assert f"{e.data['level']} c=" not in e.message or not e.data["level"].startswith("c="), (
            e.message
        )
    sus = [e for e in levels if e.data["level"] == "sustained"]
    assert sus[-1].data["level_seconds"] == 4
    # The baseline is the first run's figure for the same level.
    base = {lv.label: lv.tok_s for lv in first.levels}
    assert all(
        e.data["baseline"] == base[e.data["level"]] for e in levels if e.data["level"] in base
    )
    assert any(e.data["baseline"] for e in levels)
    assert any(e.data["acceptance_rate"] for e in levels), (
        "the emulator speculates: acceptance is measured"
    )
    # Without a baseline there is no figure to compare with (not a made-up one).
    assert not any(e.data.get("baseline") for e in alone.events)
    assert any("planned_requests" in e.data for e in alone.events)
