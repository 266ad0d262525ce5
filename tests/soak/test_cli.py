"""``fleetctl soak`` end to end against loopback endpoints: exit codes and report files."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.cli.main import main

from .conftest import SERVED, Served, free_port


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))


def test_soak_an_endpoint_writes_reports_and_exits_0(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    served = emulator(EMU_SPEED="4")
    out = tmp_path / "out"
    code = main(
        [
            "soak",
            "--endpoint",
            served.target.base_url,
            "--profile",
            "lab",
            "--model",
            SERVED[0],
            "--model",
            SERVED[1],
            "--concurrency",
            "1,4",
            "--duration",
            "3s",
            "--json-report",
            str(out / "soak.json"),
            "--junit",
            str(out / "soak.xml"),
            "--html",
            str(out / "soak.html"),
        ]
    )
    data = json.loads((out / "soak.json").read_text())
    assert code == 0, data["verdicts"][0]["summary"]
    assert data["outcome"] == "pass"
    (v,) = data["verdicts"]
    assert [lv["label"] for lv in v["levels"] if lv["phase"] == "sweep"] == ["c=1", "c=4"]
    assert Path(v["artifacts_dir"], "verdict.json").is_file()
    assert Path(v["artifacts_dir"]).is_relative_to(tmp_path / "state" / "runs")
    suite = ET.parse(out / "soak.xml").getroot()
    assert suite.get("failures") == "0" and int(suite.get("tests", "0")) == len(v["checks"])
    assert "<svg" in (out / "soak.html").read_text()


def test_a_failing_soak_exits_1(emulator: Callable[..., Served], tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    """... and with ``--events - --json`` its stdout is JSON lines: the stream, then the result."""
    served = emulator(EMU_GARBAGE="1")
    code = main(
        [
            "soak",
            "--endpoint",
            served.target.base_url,
            "--profile",
            "lab",
            "--concurrency",
            "1",
            "--json-report",
            str(tmp_path / "r.json"),
            "--json",
            "--events",
            "-",
        ]
    )
    assert code == 1
    assert json.loads((tmp_path / "r.json").read_text())["verdicts"][0]["outcome"] == "fail"
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert lines[0]["schema"] == 1 and lines[0]["title"] == "soak"
    assert lines[-2]["ended"] is True and lines[-1]["result"]["outcome"] == "fail"
    assert any(ln.get("host") for ln in lines[1:-2]), "the soak's own events, per endpoint"


def test_an_endpoint_that_is_down_exits_2(tmp_path: Path) -> None:
    code = main(["soak", "--endpoint", f"http://127.0.0.1:{free_port()}", "--ready-timeout", "1s",
                 "--json-report", str(tmp_path / "r.json")])
    assert code == 2
    assert json.loads((tmp_path / "r.json").read_text())["outcome"] == "error"


def test_json_is_stdout_as_for_every_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["soak", "--endpoint", f"http://127.0.0.1:{free_port()}", "--ready-timeout", "1s",
                 "--json", "--smoke-only"])
    assert code == 2
    out = json.loads(capsys.readouterr().out)
    assert out["outcome"] == "error"
    assert not (tmp_path / "--smoke-only").exists() and {p.name for p in tmp_path.iterdir()} <= {
        "state"
    }


@pytest.mark.parametrize("args", [["--concurrency", "4,1"], ["--endpoint", "ftp://x"],
                                  ["--duration", "soon"]])
def test_bad_options_are_refused(args: list[str]) -> None:
    full = (
        ["soak", *args]
        if "--endpoint" in args
        else ["soak", "--endpoint", "http://127.0.0.1:9", *args]
    )
    assert main(full) in (2, 3)
