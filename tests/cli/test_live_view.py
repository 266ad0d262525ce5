"""The rollout's live view drawn from a recorded event stream (tests/cli/fixtures), at 80 and 200
columns: nothing wraps or overflows, the message keeps at least 30 cells, short tags, the soak's
phase k of n and its running figures, a header with the time so far and the time left; a tall fleet
shows its failed and
busy hosts first."""

from __future__ import annotations

import io
import json
import re
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fleetctl import inventory
from fleetctl.cli import live, livemodel
from fleetctl.cli.output import Ctx
from fleetctl.errors import FleetError
from fleetctl.progress import Event, EventLog, event_from_json

FIXTURE = Path(__file__).parent / "fixtures" / "rollout-events.jsonl"
FULL_TAG = "2026-07-01-v0.24.0-dflashfix"


def lines_until(t: float) -> list[str]:
    return [ln for ln in FIXTURE.read_text().splitlines() if json.loads(ln)["t"] <= t]


def draw(model: livemodel.LiveModel, width: int, height: int = 40) -> str:
    out = io.StringIO()
    Console(file=out, width=width, height=height, color_system=None).print(
        live.render(model.snapshot(), width, height))
    return out.getvalue()


def table_rows(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("│")]


def column_width(text: str, name: str) -> int:
    head = next(ln for ln in text.splitlines() if ln.startswith("┃"))
    cell = next(c for c in head.split("┃") if c.strip() == name)
    return len(cell) - 2


@pytest.mark.parametrize("width", [80, 200])
def test_the_recorded_rollout_fits_and_says_what_is_happening(width: int) -> None:
    text = draw(livemodel.replay(FIXTURE.read_text().splitlines(), "rollout"), width)
    assert all(len(ln) <= width for ln in text.splitlines()), text
    rows = table_rows(text)
    assert [r.split("│")[1].strip() for r in rows] == [
        "spark-01",
        "spark-02",
        "spark-03",
        "spark-04",
    ], text
    assert column_width(text, "message") >= live.MESSAGE_MIN
    # The header: elapsed since the start, hosts done and failed, an estimate of what is left.
    head = text.splitlines()[0]
    assert re.match(r"rollout\s+4m29s\s+1/4 hosts done, 1 failed\s+~\d+m\d\ds left", head), head
    soaking = next(r for r in rows if "spark-02" in r)
    assert "8/8 8/12s" in soaking, "phase 8 of 8, the sustained phase's seconds of its length"
    assert "c=4 0/136 err" in soaking, "the gate's running figures come first in the message"
    assert FULL_TAG not in "\n".join(rows)
    if width == 200:
        assert "v0.24.0" in soaking and "4eb9270da69e" in soaking and "█████" in soaking
        assert "520 tok/s (100% base) acc 23%" in soaking
        failed = next(r for r in rows if "spark-03" in r)
        assert "rolled-back" in failed and "5 of 40 requests failed at c=8" in failed
    else:
        assert "█" not in soaking, "at 80 columns the figures stay, the bar goes"


def test_readiness_shows_what_it_waited_of_its_timeout_and_the_step_is_not_yet_measured() -> None:
    # 20 s into spark-01's wait for /health: no step finished, no soak yet.
    text = draw(livemodel.replay(lines_until(73.5), "rollout"), 80)
    canary = next(r for r in table_rows(text) if "spark-01" in r)
    assert "loading" in canary and "20/600s" in canary, text
    assert "time left: after the first step" in text.splitlines()[0]


def test_the_time_left_comes_from_the_soak_before_any_step_has_finished() -> None:
    early = livemodel.replay(lines_until(100.0), "rollout").snapshot()
    assert early["hosts_done"] == 0 and early["left"] is not None and early["left"] > 0
    later = livemodel.replay(lines_until(170.0), "rollout").snapshot()
    assert later["hosts_done"] == 1
    # 3 hosts to go, one at a time so far, each taking what the canary took.
    canary = next(h for h in later["hosts"] if h["host"] == "spark-01")
    assert later["left"] == pytest.approx(3 * (canary["finished"] - canary["started"]), abs=1)


def test_a_role_driven_step_streams_its_ansible_tasks_into_the_message() -> None:
    model = livemodel.LiveModel("rollout")
    model.fold(Event("stopping", "v0.23.0", "spark-01", {"wave": 1, "tag": FULL_TAG}), 1.0)
    model.fold(Event("deploying", "ansible: vllm_serve : pull the image (ok)", "spark-01",
                     {"task": "vllm_serve : pull the image", "ansible": "ok"}), 2.0)
    row = model.snapshot()["hosts"][0]
    assert (
        row["phase"] == "stopping"
        and row["cells"]["message"] == "ansible: vllm_serve : pull the image (ok)"
    )
    model.fold(Event("starting", "", "spark-01", {}), 3.0)
    assert model.snapshot()["hosts"][0]["cells"]["message"] == ""


def test_a_tall_fleet_shows_its_failed_and_busy_hosts_first_and_counts_the_rest() -> None:
    model = livemodel.LiveModel("rollout")
    for i in range(256):
        phase = (
            "soak"
            if i % 16 == 5
            else "rolled-back"
            if i == 200
            else "done"
            if i < 100
            else "planned"
        )
        model.fold(
            Event(phase, "x" * 120, f"sim-{i + 1:03d}", {"wave": 3, "tag": FULL_TAG}), float(i)
        )
    text = draw(model, 80, height=30)
    lines = text.splitlines()
    assert len(lines) <= 30 and all(len(ln) <= 80 for ln in lines), text
    rows = table_rows(text)
    assert "sim-201" in rows[0], "the failed host first"
    shown = {m.group(0) for m in re.finditer(r"sim-\d{3}", text)}
    assert {f"sim-{i + 1:03d}" for i in range(256) if i % 16 == 5} <= shown
    assert re.search(r"\d+ more hosts: \d+ (planned|done), \d+ (planned|done)", text), text


def test_the_event_log_replays_to_what_the_live_model_saw(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "run.jsonl")
    model = livemodel.LiveModel("rollout")
    for ln in FIXTURE.read_text().splitlines():
        t, event = event_from_json(json.loads(ln))
        log(event)
        model.fold(event, t)
    log.close()
    assert (tmp_path / "run.jsonl").stat().st_mode & 0o777 == 0o600
    replayed = livemodel.replay(
        [*(tmp_path / "run.jsonl").read_text().splitlines(), '{"t": 1, "pha'], "rollout"
    )
    def strip(s: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: h[k] for k in ("host", "phase", "message", "tag", "figures")}
                for h in s["hosts"]]

    assert strip(replayed.snapshot()) == strip(model.snapshot())


def test_watch_writes_the_event_log_and_prints_lines_without_a_terminal(tmp_path: Path) -> None:
    err = io.StringIO()
    ctx = Ctx(err=Console(file=err, width=80, color_system=None))
    with live.watch(ctx, "rollout", tmp_path) as prog:
        prog(Event("soak", "c=4 3/40 req", "spark-01", {"step": 6, "steps": 8}))
    logs = list(livemodel.events_dir(tmp_path).glob("rollout-*.jsonl"))
    assert len(logs) == 1
    first, event, last = (json.loads(ln) for ln in logs[0].read_text().splitlines())
    assert "started" in first and last["ended"] is True
    assert event["data"] == {"step": 6, "steps": 8}
    assert livemodel.replay(logs[0].read_text().splitlines(), "rollout").snapshot()["ended"] is True
    assert "spark-01: soak c=4 3/40 req" in err.getvalue()


def test_columns_nobody_has_anything_in_are_left_out() -> None:
    model = livemodel.LiveModel("rollback")
    for h in ("spark-01", "spark-02"):
        model.fold(Event("preflight", "ok", h), 1.0)
    head = next(ln for ln in draw(model, 80).splitlines() if ln.startswith("┃"))
    assert [c.strip() for c in head.strip("┃").split("┃")] == ["host", "phase", "message"]


def test_before_any_step_is_measured_the_sustained_phase_bounds_the_time_left() -> None:
    model = livemodel.LiveModel("rollout")
    for h in ("spark-01", "spark-02"):
        model.fold(Event("planned", "", h, {"wave": 1}), 0.0)
    model.fold(Event("stopping", "", "spark-01", {}), 1.0)
    model.fold(Event("soak", "600s sustained", "spark-01", {"sustained_s": 600}), 11.0)
    # Quick phases first: 4 of 8 phases done after 10 s says nothing of the 600 s sustained phase
    # ahead.
    model.fold(
        Event(
            "soak",
            "c=4",
            "spark-01",
            {
                "step": 5,
                "steps": 8,
                "level": "c=4",
                "requests": 4,
                "planned_requests": 4,
                "soak_phase": "sweep",
            },
        ),
        21.0,
    )
    left = model.snapshot()["left"]
    # spark-01: 20 s so far + 600 s to come; spark-02 then takes as long.
    assert left == pytest.approx(600 + 620, abs=2)
    model.fold(
        Event(
            "soak",
            "sustained",
            "spark-01",
            {
                "step": 8,
                "steps": 8,
                "level": "sustained",
                "level_elapsed": 300,
                "level_seconds": 600,
                "planned_requests": 2000,
                "requests": 10,
            },
        ),
        321.0,
    )
    assert model.snapshot()["left"] == pytest.approx(300 + 620, abs=2)


PULLS = Path(__file__).parent / "fixtures" / "pull-events.jsonl"


@pytest.mark.parametrize("width", [80, 200])
def test_a_recorded_pull_shows_its_bytes_done_of_the_images(width: int) -> None:
    lines = PULLS.read_text().splitlines()
    # Mid-pull: spark-04 has its bytes in and one layer of two extracted; spark-03 has not started
    # reporting.
    mid = [
        ln for ln in lines if json.loads(ln).get("t", 0) <= 9.59 and not json.loads(ln).get("ended")
    ]
    text = draw(livemodel.replay(mid, "rollout"), width)
    assert all(len(ln) <= width for ln in text.splitlines()), text
    assert column_width(text, "message") >= live.MESSAGE_MIN
    row = next(r for r in table_rows(text) if "spark-04" in r)
    assert "42.8 MB/42.9 MB" in row, text
    if width == 200:
        assert (
            "█████ 42.8 MB/42.9 MB" in row and "42.8 MB of 42.9 MB, 1/2 layers extracted" in row
        ), text
    snap = livemodel.replay(mid, "rollout").snapshot()
    pulled = {h["host"]: h for h in snap["hosts"]}
    assert pulled["spark-04"]["fraction"] == pytest.approx(42_811_397 / 42_851_403)
    assert pulled["spark-03"]["fraction"] is None and pulled["spark-03"]["state"] == "quiet"
    # Done: the whole image on both.
    done = draw(
        livemodel.replay([ln for ln in lines if json.loads(ln).get("t", 0) <= 10.4], "rollout"),
        width,
    )
    assert sum("42.9 MB/42.9 MB" in r for r in table_rows(done)) == 2, done


def test_bytes_in_but_layers_still_unpacking_say_extracting() -> None:
    model = livemodel.LiveModel("rollout")
    model.fold(
        Event(
            "pull", "", "spark-01", {"bytes": 10, "bytes_total": 10, "layers": 3, "layers_total": 7}
        ),
        1.0,
    )
    assert model.snapshot()["hosts"][0]["cells"]["progress"] == "█████ extracting 3/7"
    # A registry that gave no sizes: the layers alone.
    model.fold(
        Event(
            "pull",
            "",
            "spark-02",
            {"bytes": None, "bytes_total": None, "layers": 1, "layers_total": 4},
        ),
        2.0,
    )
    assert model.snapshot()["hosts"][1]["cells"]["figures"] == "1/4 layers"


EXAMPLE_INVENTORY = Path(__file__).resolve().parents[2] / "inventory" / "example" / "hosts.yml"


def test_a_run_without_a_terminal_streams_its_events_to_a_file_and_serves_its_page(
    tmp_path: Path,
) -> None:
    """--events FILE and --ui PORT: the same events as the run's event log, and the `fleetctl ui`
    page of this
    run on loopback while it runs (no terminal: a CI job)."""
    err = io.StringIO()
    ctx = Ctx(
        err=Console(file=err, width=80, color_system=None),
        events=str(tmp_path / "events.jsonl"),
        ui_port=0,
    )
    recorded = [event_from_json(json.loads(ln))[1] for ln in PULLS.read_text().splitlines()[1:-1]]
    with live.watch(ctx, "rollout", tmp_path, inventory.load(str(EXAMPLE_INVENTORY))) as prog:
        for e in recorded:
            prog(e)
        m = re.search(r"live view on (http://127\.0\.0\.1:(\d+)/)", err.getvalue())
        assert m is not None, err.getvalue()
        url = m.group(1)
        snap = json.loads(urllib.request.urlopen(url + "api/live", timeout=30).read())
        assert {h["host"]: h["phase"] for h in snap["hosts"]} == {
            "spark-03": "pulled",
            "spark-04": "pulled",
        }
        assert snap["log"].startswith("rollout-") and not snap["ended"]
        page = urllib.request.urlopen(url, timeout=30).read().decode()
        assert "<script" in page
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "api/live", timeout=5)  # the page goes with the command
    stream = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    log = next(livemodel.events_dir(tmp_path).glob("rollout-*.jsonl"))
    kept = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert (
        stream[0]["schema"] == 1 and stream[0]["title"] == "rollout" and stream[-1]["ended"] is True
    )
    def drop_t(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in ln.items() if k not in ("t", "started")} for ln in lines]

    assert drop_t(stream) == drop_t(kept), "one stream: the file holds what the event log holds"
    assert [(e["phase"], e["host"], e["data"]) for e in stream[1:-1]] == [
        (e.phase, e.host, e.data) for e in recorded
    ]
    assert (tmp_path / "events.jsonl").stat().st_mode & 0o777 == 0o600


def test_events_on_stdout_with_json_keep_every_line_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = Ctx(err=Console(file=io.StringIO(), width=80), json=True, events="-")
    with live.streams(ctx, "soak", tmp_path) as sink:
        sink(Event("soak", "c=4", "spark-01", {"step": 3, "steps": 8}))
    ctx.emit({"status": "completed"}, lambda con: None)
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert (
        lines[0]["schema"] == 1
        and lines[1]["data"] == {"step": 3, "steps": 8}
        and lines[2]["ended"] is True
    )
    assert lines[-1] == {"result": {"status": "completed"}}
    # --json alone is unchanged: one indented object.
    Ctx(json=True).emit({"status": "completed"}, lambda con: None)
    assert json.loads(capsys.readouterr().out) == {"status": "completed"}


def test_an_events_path_that_is_a_directory_is_refused_before_anything(tmp_path: Path) -> None:
    ctx = Ctx(err=Console(file=io.StringIO(), width=80), events=str(tmp_path))
    with (
        pytest.raises(FleetError, match="not a regular file"),
        live.watch(ctx, "rollout", tmp_path),
    ):
        pass
    assert not livemodel.events_dir(tmp_path).exists()


def test_a_ui_port_in_use_is_refused_before_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ctx = Ctx(err=Console(file=io.StringIO(), width=80), ui_port=taken.getsockname()[1])
        with (
            pytest.raises(FleetError, match=r"cannot listen on 127\.0\.0\.1"),
            live.watch(ctx, "rollout", tmp_path),
        ):
            pass
    assert not list(livemodel.events_dir(tmp_path).glob("*.jsonl"))


def test_a_baking_wave_shows_a_bar_per_host_and_the_time_left_under_the_table() -> None:
    model = livemodel.LiveModel("rollout")
    model.fold(Event("done", "pass", "spark-01", {"wave": 1, "tag": FULL_TAG, "health": "ok"}), 1.0)
    model.fold(
        Event(
            "baking",
            "600s under live traffic, against 3 host(s) on the old version",
            "spark-01",
            {"wave": 1, "health": "baking", "bake_s": 600},
        ),
        2.0,
    )
    model.fold(
        Event(
            "baking",
            "under live traffic, against 3 host(s) on the old version",
            "spark-01",
            {"wave": 1, "health": "baking", "waited": 240, "timeout": 600},
        ),
        242.0,
    )
    model.fold(
        Event(
            "baking", "wave 1: 360s left under live traffic, against 3 host(s) on the old version"
        ),
        242.0,
    )
    snap = model.snapshot()
    row = snap["hosts"][0]
    assert (
        row["phase"] == "baking"
        and row["health"] == "baking"
        and row["fraction"] == pytest.approx(0.4)
    )
    assert "240/600s" in row["cells"]["progress"]
    assert "360s left" in model.fleet_line
