"""The scheduled-soak workflow handed to operators: no expression pasted into a shell, actions
pinned."""

from __future__ import annotations

import re
from typing import Any

import yaml

from fleetctl import paths

WORKFLOW = paths.project_root() / "docs" / "ci" / "soak-schedule.yml"


def _steps() -> list[dict[str, Any]]:
    wf = yaml.safe_load(WORKFLOW.read_text())
    return [s for job in wf["jobs"].values() for s in job["steps"]]


def test_no_expression_is_pasted_into_a_shell_script() -> None:
    # ${{ }} is substituted into the script text before bash parses it: inputs go through env.
    for step in _steps():
        assert "${{" not in step.get("run", ""), step.get("name")


def test_every_action_is_pinned_by_commit_sha() -> None:
    uses = [s["uses"] for s in _steps() if "uses" in s]
    assert uses
    for u in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u), u


def test_the_token_is_read_only() -> None:
    wf = yaml.safe_load(WORKFLOW.read_text())
    assert wf["permissions"] == {"contents": "read"}
