"""Confirmation prompts read like other tools' (``Roll out 4 host(s) to v0.24.0? [y/N]``), default
to no,
and short tags replace the dated ones in what people read."""

from __future__ import annotations

import io

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from fleetctl.cli.output import Ctx, short_digest, short_tag
from fleetctl.cli.rollout import _rollback_question, render_result
from fleetctl.rollout.results import HostOutcome, RolloutResult
from fleetctl.state import records as fleet_records


@click.command()
def _asks() -> None:
    Ctx().ask("Roll out 4 host(s) to v0.24.0?")
    click.echo("went ahead")


@pytest.mark.parametrize(
    "answer, goes", [("y\n", True), ("yes\n", True), ("\n", False), ("n\n", False)]
)
def test_the_prompt_shows_its_default_and_only_yes_goes_ahead(answer: str, goes: bool) -> None:
    r = CliRunner().invoke(_asks, input=answer)
    assert "Roll out 4 host(s) to v0.24.0? [y/N] " in r.output
    assert ("went ahead" in r.output) is goes
    assert (r.exit_code == 0) is goes  # click's Abort: the caller's exit code says it did nothing


@pytest.mark.parametrize("tag, short", [
    ("2026-07-01-v0.24.0", "v0.24.0"),
    ("2026-06-18-v0.23.0-dflashfix", "v0.23.0"),
    ("v0.24.0", "v0.24.0"),
    ("2026-07-01-nightly", "nightly"),
    ("latest", "latest"),
    (None, "-"),
])
def test_short_tags(tag: str | None, short: str) -> None:
    assert short_tag(tag) == short


def test_short_digest() -> None:
    assert short_digest("sha256:" + "4eb9270da69ef0" * 4) == "4eb9270da69e"
    assert short_digest(None) == "-"


def test_rollback_question_names_the_hosts_and_the_target() -> None:
    one = {"spark-01": "2026-06-18-v0.23.0", "spark-02": "2026-06-18-v0.23.0"}
    assert _rollback_question(one, None) == "Roll back 2 host(s) (spark-01, spark-02) to v0.23.0?"
    mixed = {"spark-01": "2026-06-18-v0.23.0", "spark-02": "2026-05-02-v0.22.1"}
    assert _rollback_question(mixed, None).endswith("to their last known-good?")
    assert _rollback_question(mixed, "v0.21.0").endswith("to v0.21.0?")


def test_a_result_that_changed_no_host_says_nothing_to_do() -> None:
    hosts = tuple(
        HostOutcome(
            h,
            -1,
            fleet_records.SKIPPED,
            "skipped",
            "v1",
            None,
            None,
            None,
            verdict="skipped: already there (serving v1)",
        )
        for h in ("spark-01", "spark-02")
    )
    out = io.StringIO()
    render_result(
        RolloutResult("rb-1", "rollback", fleet_records.COMPLETED, "r", None, None, None, hosts),
        Console(file=out, width=80, color_system=None),
    )
    assert "rollback: nothing to do (2 host(s) skipped" in out.getvalue()
    assert "spark-02: skipped: already there (serving v1)" in out.getvalue()
