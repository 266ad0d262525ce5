"""The alert rules shipped in docs/prometheus/: valid for Prometheus (``promtool check rules``),
each alert unit-tested (``promtool test rules``, Debian's ``prometheus`` package, which
scripts/bootstrap.sh installs), and every metric they read one that fleetctl exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "docs" / "prometheus" / "fleetctl-rules.yml"
RULE_TESTS = ROOT / "docs" / "prometheus" / "fleetctl-rules.test.yml"
EXPORTERS = (ROOT / "controller" / "fleetctl" / "cli" / "metrics.py",
             ROOT / "controller" / "fleetctl" / "cli" / "metrics_fleet.py")


def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool not found: scripts/bootstrap.sh installs Debian's prometheus package")
    return tool


def test_the_rules_are_valid() -> None:
    r = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 6 rules found" in r.stdout, r.stdout


def test_each_alert_fires_on_its_series_and_not_on_the_healthy_ones() -> None:
    r = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], capture_output=True,
                       text=True, timeout=300, check=False, cwd=RULE_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert tested == set(re.findall(r"alert: (\w+)", RULES.read_text()))


def test_the_rules_read_only_metrics_fleetctl_exports() -> None:
    exported = {m for p in EXPORTERS for m in re.findall(r'"(fleetctl_\w+)"', p.read_text())}
    read = set(re.findall(r"\b(fleetctl_\w+)", "\n".join(
        line.split("expr:", 1)[1] for line in RULES.read_text().splitlines() if "expr:" in line)))
    assert read and read <= exported, read - exported
