"""``fleetctl soak baseline show|pin|reset`` on a state dir whose ledger holds baselines (both
backends:
tests/soak/test_baselines.py)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from fleetctl import paths
from fleetctl.cli.main import cli
from fleetctl.errors import FleetError
from fleetctl.soak import baselines
from fleetctl.soak.verdict import LevelSummary, Outcome, Verdict
from fleetctl.state import ledger as fleet_ledger

INV = paths.project_root() / "inventory" / "example" / "hosts.yml"
TAG = "2026-07-01-v0.24.0-dflashfix-with-a-long-suffix"


def _run(tmp_path: Path, *argv: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["-i", str(INV), "soak", "baseline", *argv],
                           env={"FLEETCTL_STATE_DIR": str(tmp_path), "COLUMNS": "80"})
    if isinstance(r.exception, FleetError):  # main() prints these; the bare group raises them
        return 2, r.exception.message()
    return r.exit_code, r.output


def test_show_pin_and_reset(tmp_path: Path) -> None:
    for i, tok in enumerate((400.0, 410.0, 395.0)):
        v = Verdict(
            f"run-{i}",
            "spark-01",
            "http://x",
            Outcome.PASS,
            "pass",
            "t0",
            f"2026-07-0{i + 1}T12:00:00",
            1.0,
            tag=TAG,
            fingerprint="fp",
            levels=(LevelSummary("sweep", "c=32", 32, 64, 0, 9.0, tok_s=tok),),
        )
        with fleet_ledger.open_ledger(tmp_path) as led:
            baselines.save(led, "spark-01", TAG, v)
    code, out = _run(tmp_path, "show")
    assert code == 0, out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert "spark-01" in out and "400 (c=32)" in out
    code, out = _run(tmp_path, "show", "--json")
    shown = json.loads(out)
    assert shown == [
        {
            "host": "spark-01",
            "tag": TAG,
            "pinned": False,
            "runs": ["run-0", "run-1", "run-2"],
            "fingerprint": "fp",
            "levels": {"c=32": {"tok_s": 400.0, "spread": shown[0]["levels"]["c=32"]["spread"]}},
        }
    ]
    code, out = _run(tmp_path, "pin", "--limit", "spark-01", "--tag", TAG, "--json")
    assert code == 0 and json.loads(out)[0]["pinned"] is True, out
    code, out = _run(tmp_path, "pin", "--limit", "spark-02", "--tag", TAG)
    assert code != 0 and "spark-02: no baseline recorded" in out
    code, out = _run(tmp_path, "reset", "--limit", "spark-01", "--tag", TAG)
    assert code == 0 and "removed" in out
    with fleet_ledger.open_ledger(tmp_path) as led:
        assert baselines.load(led, "spark-01", TAG) is None


def test_known_good_reference_sets_show_pin_and_reset(tmp_path: Path) -> None:
    from fleetctl.soak import references
    from fleetctl.soak.answerset import Answer

    def verdict(run: str, tag: str) -> Verdict:
        a = Answer("canary:arithmetic", "canary", "What is 17 × 23?", "17 × 23 = 391.", "stop", 8,
                   1024, expect="391")
        return Verdict(run, "spark-01", "http://x", Outcome.PASS, "pass", "t0",
                       "2026-07-01T12:00:00", 1.0, tag=tag, digest="sha256:" + "c" * 64,
                       answers=(a,))

    with fleet_ledger.open_ledger(tmp_path) as led:
        assert references.save(led, references.key("qwen"), verdict("run-a", "v1"), "qwen")
    code, out = _run(tmp_path, "show", "--known-good", "qwen")
    assert code == 0 and "refs:qwen" in out and "known-good" in out and "1/1" in out, out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    code, out = _run(tmp_path, "pin", "--known-good", "qwen", "--json")
    assert code == 0 and json.loads(out)[0]["pinned"] is True, out
    with fleet_ledger.open_ledger(tmp_path) as led:  # pinned: a later pass does not move it
        assert references.save(led, references.key("qwen"), verdict("run-b", "v2"), "qwen") is None
        known = references.load(led, references.key("qwen"))
        assert known is not None and known.tag == "v1"
    code, out = _run(tmp_path, "reset", "--known-good", "qwen", "--json")
    assert code == 0 and json.loads(out) == {"refs:qwen": True}, out
    code, out = _run(tmp_path, "show", "--known-good", "all", "--json")
    assert json.loads(out) == []
