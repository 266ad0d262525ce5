"""Text from servers and hubs is data, never markup or raw XML: a real boot failure whose log
carries ANSI colours and rich markup ends in valid JUnit and renders in every table; the CLI's error
handler prints a cause with ``[/x]`` in it literally."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from fleetctl.cli import main as cli_main
from fleetctl.cli.output import _LiveTable
from fleetctl.cli.soak import _summary
from fleetctl.progress import Event
from fleetctl.soak import report
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.run import run_soak
from fleetctl.soak.verdict import Outcome

from .conftest import SERVED, Served

#: What a failing engine prints: colour codes, a bell, and a hub file name that looks like markup.
CAUSE = "\x1b[31mValueError\x1b[0m: bad shard model-[/x]-00001.safetensors \x07[bold]"


def test_a_boot_failure_with_control_characters_gives_valid_junit_and_renders(
        emulator: Callable[..., Served], tmp_path: Path) -> None:
    served = emulator(wait=False, EMU_BOOT_FAIL=CAUSE)
    cfg = load_config({"readiness_timeout": 20}, profile="lab", served_model_names=SERVED)
    v = run_soak(served.target, cfg, None, artifacts_dir=tmp_path / "run")
    assert v.outcome is Outcome.FAIL and "[/x]" in v.summary and "\x1b" in v.summary
    text = report.to_junit([v])
    root = ET.fromstring(text)  # raised "not well-formed (invalid token)" before
    failure = root.find(".//testcase[@name='readiness']/failure")
    assert failure is not None and "[/x]" in failure.attrib["message"]
    assert "\\x1b[31mValueError" in failure.attrib["message"] and "\x1b" not in text
    report.write_junit(tmp_path / "junit.xml", [v])
    ET.parse(tmp_path / "junit.xml")
    out = io.StringIO()
    # Rendering is what raised MarkupError; the table may shorten the cell to fit.
    _summary([v])(Console(file=out, width=200))
    assert "emulator" in out.getvalue() and "fail" in out.getvalue()
    live = _LiveTable("soak", ("phase", "message"))
    live(Event("readiness", v.summary, "emulator"))
    live(Event("error", v.summary))
    out = io.StringIO()
    # Printed as Live prints it: built for the console's width, so a wide one shows the whole cause.
    Console(file=out, width=300).print(live)
    assert "[/x]" in out.getvalue()
    out = io.StringIO()
    Console(file=out, width=80).print(live)
    assert max(len(line) for line in out.getvalue().splitlines()) <= 80


def test_the_error_handler_prints_a_cause_with_markup_literally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "fleet-[/x]" / "hosts.yml"
    code = cli_main.main(["--inventory", str(missing), "status"])
    assert code == 2
    assert "fleet-[/x]" in capsys.readouterr().err
