"""The rollout's live view drawn from a recorded event stream (tests/cli/fixtures), at 80 and 200 columns:
nothing wraps or overflows, the message keeps at least 30 cells, short tags, the soak's phase k of n and
its running figures, a header with the time so far and the time left; a tall fleet shows its failed and
busy hosts first."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from fleetctl.cli import live
from fleetctl.cli.output import Ctx
from fleetctl.progress import Event, EventLog, event_from_json

FIXTURE = Path(__file__).parent / "fixtures" / "rollout-events.jsonl"
FULL_TAG = "2026-07-01-v0.24.0-dflashfix"


def lines_until(t: float) -> list[str]:
    return [ln for ln in FIXTURE.read_text().splitlines() if json.loads(ln)["t"] <= t]


def draw(model: live.LiveModel, width: int, height: int = 40) -> str:
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
    text = draw(live.replay(FIXTURE.read_text().splitlines(), "rollout"), width)
    assert all(len(ln) <= width for ln in text.splitlines()), text
    rows = table_rows(text)
    assert [r.split("│")[1].strip() for r in rows] == ["spark-01", "spark-02", "spark-03", "spark-04"], text
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
    text = draw(live.replay(lines_until(73.5), "rollout"), 80)
    canary = next(r for r in table_rows(text) if "spark-01" in r)
    assert "loading" in canary and "20/600s" in canary, text
    assert "time left: after the first step" in text.splitlines()[0]


def test_the_time_left_comes_from_the_soak_before_any_step_has_finished() -> None:
    early = live.replay(lines_until(100.0), "rollout").snapshot()
    assert early["hosts_done"] == 0 and early["left"] is not None and early["left"] > 0
    later = live.replay(lines_until(170.0), "rollout").snapshot()
    assert later["hosts_done"] == 1
    # 3 hosts to go, one at a time so far, each taking what the canary took.
    canary = next(h for h in later["hosts"] if h["host"] == "spark-01")
    assert later["left"] == pytest.approx(3 * (canary["finished"] - canary["started"]), abs=1)


def test_a_role_driven_step_streams_its_ansible_tasks_into_the_message() -> None:
    model = live.LiveModel("rollout")
    model.fold(Event("stopping", "v0.23.0", "spark-01", {"wave": 1, "tag": FULL_TAG}), 1.0)
    model.fold(Event("deploying", "ansible: vllm_serve : pull the image (ok)", "spark-01",
                     {"task": "vllm_serve : pull the image", "ansible": "ok"}), 2.0)
    row = model.snapshot()["hosts"][0]
    assert row["phase"] == "stopping" and row["cells"]["message"] == "ansible: vllm_serve : pull the image (ok)"
    model.fold(Event("starting", "", "spark-01", {}), 3.0)
    assert model.snapshot()["hosts"][0]["cells"]["message"] == ""


def test_a_tall_fleet_shows_its_failed_and_busy_hosts_first_and_counts_the_rest() -> None:
    model = live.LiveModel("rollout")
    for i in range(256):
        phase = "soak" if i % 16 == 5 else "rolled-back" if i == 200 else "done" if i < 100 else "planned"
        model.fold(Event(phase, "x" * 120, f"sim-{i + 1:03d}", {"wave": 3, "tag": FULL_TAG}), float(i))
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
    model = live.LiveModel("rollout")
    for ln in FIXTURE.read_text().splitlines():
        t, event = event_from_json(json.loads(ln))
        log(event)
        model.fold(event, t)
    log.close()
    assert (tmp_path / "run.jsonl").stat().st_mode & 0o777 == 0o600
    replayed = live.replay([*(tmp_path / "run.jsonl").read_text().splitlines(), '{"t": 1, "pha'], "rollout")
    strip = lambda s: [{k: h[k] for k in ("host", "phase", "message", "tag", "figures")} for h in s["hosts"]]  # noqa: E731
    assert strip(replayed.snapshot()) == strip(model.snapshot())


def test_watch_writes_the_event_log_and_prints_lines_without_a_terminal(tmp_path: Path) -> None:
    err = io.StringIO()
    ctx = Ctx(err=Console(file=err, width=80, color_system=None))
    with live.watch(ctx, "rollout", tmp_path) as prog:
        prog(Event("soak", "c=4 3/40 req", "spark-01", {"step": 6, "steps": 8}))
    logs = list(live.events_dir(tmp_path).glob("rollout-*.jsonl"))
    assert len(logs) == 1
    first, event, last = (json.loads(ln) for ln in logs[0].read_text().splitlines())
    assert "started" in first and last["ended"] is True
    assert event["data"] == {"step": 6, "steps": 8}
    assert live.replay(logs[0].read_text().splitlines(), "rollout").snapshot()["ended"] is True
    assert "spark-01: soak c=4 3/40 req" in err.getvalue()


def test_columns_nobody_has_anything_in_are_left_out() -> None:
    model = live.LiveModel("rollback")
    for h in ("spark-01", "spark-02"):
        model.fold(Event("preflight", "ok", h), 1.0)
    head = next(ln for ln in draw(model, 80).splitlines() if ln.startswith("┃"))
    assert [c.strip() for c in head.strip("┃").split("┃")] == ["host", "phase", "message"]


def test_before_any_step_is_measured_the_sustained_phase_bounds_the_time_left() -> None:
    model = live.LiveModel("rollout")
    for h in ("spark-01", "spark-02"):
        model.fold(Event("planned", "", h, {"wave": 1}), 0.0)
    model.fold(Event("stopping", "", "spark-01", {}), 1.0)
    model.fold(Event("soak", "600s sustained", "spark-01", {"sustained_s": 600}), 11.0)
    # Quick phases first: 4 of 8 phases done after 10 s says nothing of the 600 s sustained phase ahead.
    model.fold(Event("soak", "c=4", "spark-01", {"step": 5, "steps": 8, "level": "c=4", "requests": 4,
                                                   "planned_requests": 4, "soak_phase": "sweep"}), 21.0)
    left = model.snapshot()["left"]
    # spark-01: 20 s so far + 600 s to come; spark-02 then takes as long.
    assert left == pytest.approx(600 + 620, abs=2)
    model.fold(Event("soak", "sustained", "spark-01", {"step": 8, "steps": 8, "level": "sustained",
                                                        "level_elapsed": 300, "level_seconds": 600,
                                                        "planned_requests": 2000, "requests": 10}), 321.0)
    assert model.snapshot()["left"] == pytest.approx(300 + 620, abs=2)


def test_a_baking_wave_shows_a_bar_per_host_and_the_time_left_under_the_table() -> None:
    model = live.LiveModel("rollout")
    model.fold(Event("done", "pass", "spark-01", {"wave": 1, "tag": FULL_TAG, "health": "ok"}), 1.0)
    model.fold(Event("baking", "600s under live traffic, against 3 host(s) on the old version", "spark-01",
                     {"wave": 1, "health": "baking", "bake_s": 600}), 2.0)
    model.fold(Event("baking", "under live traffic, against 3 host(s) on the old version", "spark-01",
                     {"wave": 1, "health": "baking", "waited": 240, "timeout": 600}), 242.0)
    model.fold(Event("baking", "wave 1: 360s left under live traffic, against 3 host(s) on the old version"), 242.0)
    snap = model.snapshot()
    row = snap["hosts"][0]
    assert row["phase"] == "baking" and row["health"] == "baking" and row["fraction"] == pytest.approx(0.4)
    assert "240/600s" in row["cells"]["progress"]
    assert "360s left" in model.fleet_line
