"""Silent corruption under load, against the emulator on loopback: each case fails the soak's
correctness check with the offending sample (host, level, excerpt) in the verdict, the reports
and the artifacts, while /health stays 200 and no request errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fleetctl.soak import report
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.run import run_soak
from fleetctl.soak.verdict import Outcome, Verdict

from .conftest import Served
from .test_engine_loopback import fast_config


def _caught(v: Verdict, tmp_path: Path) -> list[str]:
    """Assert the correctness check failed with a '!' sample everywhere it is reported; its
    labels."""
    assert v.outcome is Outcome.FAIL, v.summary
    corr = v.check("correctness")
    assert corr.outcome is Outcome.FAIL, corr.message
    assert "'!'" in corr.message and "emulator" in corr.message, corr.message
    bad = [m for m in corr.measurements if m.outcome is Outcome.FAIL]
    # A canary whose short answer turned mid-sentence shows only a few: 'The capital of France
    # is!!'.
    assert bad and all("!!" in str(m.measured) or "!!" in m.message for m in bad), [
        m for m in bad if "!!" not in m.message + str(m.measured)
    ]
    assert v.check("smoke").outcome is Outcome.PASS  # it passed the pre-flight probe
    report.write_junit(tmp_path / "r.xml", [v])
    report.write_html(tmp_path / "r.html", [v])
    assert (
        "!!!!" in (tmp_path / "r.xml").read_text() and "!!!!" in (tmp_path / "r.html").read_text()
    )
    assert v.artifacts_dir is not None
    samples = [
        json.loads(ln) for ln in (Path(v.artifacts_dir) / "samples.jsonl").read_text().splitlines()
    ]
    flagged = [s for s in samples if s["garbage"]]
    assert flagged and all("!!!!" in s["excerpt"] for s in flagged)
    return [m.label for m in bad]


def test_garbage_after_n_tokens_is_caught_under_load(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    # The smoke prompt and the canaries' references take ~30 tokens; the classes phase passes 300.
    served = emulator(EMU_GARBAGE_AFTER_TOKENS="300", EMU_SPEED="4")
    v = run_soak(served.target, fast_config(), None, artifacts_dir=tmp_path / "run")
    labels = _caught(v, tmp_path)
    assert "sustained" in labels and "long_decode" in labels
    assert v.check("errors").outcome is Outcome.PASS  # the server never failed a request


def test_bangs_after_seconds_of_uptime_with_health_200_are_caught(emulator: Callable[..., Served],
                                                                 tmp_path: Path) -> None:
    # The case: "!!!!" after some seconds of uptime passed a gate (878 requests, 0 errors).
    # The smoke prompt runs in the first second; the sustained phase alone outlasts the 6 s.
    served = emulator(EMU_GARBAGE_AFTER_SECONDS="6")
    cfg = fast_config(
        concurrency=[1, 4],
        classes=["coding"],
        sustained={"duration": 10, "concurrency": 4, "window": 2},
    )
    v = run_soak(served.target, cfg, None, artifacts_dir=tmp_path / "run")
    labels = _caught(v, tmp_path)
    assert "sustained" in labels
    assert v.check("errors").outcome is Outcome.PASS


def test_garbage_only_in_big_batches_is_caught_at_that_level(emulator: Callable[..., Served],
                                                             tmp_path: Path) -> None:
    served = emulator(EMU_GARBAGE_AT_CONCURRENCY="12", EMU_SPEED="4")
    v = run_soak(served.target, fast_config(), None, artifacts_dir=tmp_path / "run")
    labels = _caught(v, tmp_path)
    # c=1 and c=4, the classes, the long decode and the sustained phase at c=4 are clean.
    assert set(labels) == {"c=16"}, labels


def test_an_identity_failure_ends_the_soak_before_any_load(emulator: Callable[..., Served],
                                                           tmp_path: Path) -> None:
    served = emulator(EMU_SPEED="4")
    cfg = load_config({"readiness_timeout": 20}, profile="lab", served_model_names=("not-served",))
    v = run_soak(served.target, cfg, None, artifacts_dir=tmp_path / "run")
    assert v.outcome is Outcome.FAIL and v.check("identity").outcome is Outcome.FAIL
    assert "lacks not-served" in v.summary
    assert v.check("smoke").outcome is Outcome.SKIPPED and not v.levels
    assert not (tmp_path / "run" / "samples.jsonl").read_text().strip()
