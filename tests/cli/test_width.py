"""Every table of every command, rendered at 80 columns (a CI log): no line wider, no cell over two
lines.

Each table is drawn by the command's own render function (or the command
itself, through click, where it reads a ledger or an inventory) with values as
long as real ones: full tags, long errors, long host names.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from fleetctl import inventory, recipes
from fleetctl.ansible import HostResult, PlaybookResult
from fleetctl.cli import lab as lab_cli
from fleetctl.cli import stage as stage_cli
from fleetctl.cli.main import cli
from fleetctl.cli.output import Col, _LiveTable, fit_table
from fleetctl.cli.provision import render_result as render_provision
from fleetctl.cli.rollout import render_plan, render_result
from fleetctl.cli.status import render_status
from fleetctl.container import Container
from fleetctl.lab import LabNode, LabStatus
from fleetctl.lab.nodes import InnerContainer
from fleetctl.progress import Event
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.results import HostOutcome, RolloutResult
from fleetctl.stage import HostStage, SetOutcome, StageResult
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records
from fleetctl.status import HostStatus

WIDTH = 80
HOSTS = ("spark-01", "spark-02", "spark-03", "spark-04")
TAG, OLD_TAG = "2026-07-01-v0.24.0-dflashfix", "2026-06-18-v0.23.0-dflashfix"
DIGEST = "sha256:" + "4eb9270da69ef0" * 4
LONG_ERROR = (
    "soak fail: crash: the server died at concurrency 32 (exit 1) after 14 s of the sweep; "
    "stream errors 12 of 40; /health 503 then connection refused"
)
EXAMPLE_INVENTORY = Path(__file__).resolve().parents[2] / "inventory" / "example" / "hosts.yml"


def render(draw: Callable[[Console], None]) -> str:
    out = io.StringIO()
    draw(Console(file=out, width=WIDTH, soft_wrap=True, color_system=None))
    return out.getvalue()


def assert_fits(text: str, rows: int) -> None:
    """Every table line within WIDTH, and exactly one body line per row (a wrapped cell adds
    lines)."""
    table = [ln for ln in text.splitlines() if re.match(r"^[┏┃┡│└]", ln)]
    assert table, text
    too_wide = [ln for ln in table if len(ln) > WIDTH]
    assert not too_wide, "\n".join(too_wide)
    body = [ln for ln in table if ln.startswith("│")]
    assert len(body) == rows, text


def outcome(host: str, status: str, error: str | None = None) -> HostOutcome:
    return HostOutcome(
        host,
        0,
        status,
        "rolled-back" if error else "done",
        OLD_TAG,
        DIGEST,
        TAG,
        DIGEST,
        verdict="pass: 412 tok/s at c=32, acceptance 61 %",
        error=error,
    )


def test_rollout_result_and_plan_fit() -> None:
    r = RolloutResult(
        "ro-20260701-120000-3f9a",
        "rollout",
        "failed",
        "qwen36-35b-heretic",
        TAG,
        DIGEST,
        "img",
        tuple(
            outcome(
                h,
                "rolled-back" if h == "spark-01" else "pending",
                LONG_ERROR if h == "spark-01" else None,
            )
            for h in HOSTS
        ),
        error=LONG_ERROR,
    )
    text = render(lambda con: render_result(r, con))
    assert_fits(text, len(HOSTS))
    assert LONG_ERROR in text  # cut in the table, whole below it
    p = wave_plan.Plan(
        "qwen36-35b-heretic",
        "registry/aeon-vllm-ultimate",
        "v0.24.0",
        TAG,
        DIGEST,
        "ref",
        (HOSTS[:1], HOSTS[1:]),
        1,
        0,
        tuple(wave_plan.HostPlan(h, 0, i, OLD_TAG, DIGEST, "deploy") for i, h in enumerate(HOSTS)),
    )
    assert_fits(render(lambda con: render_plan(p, con)), len(HOSTS))


def test_history_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path))
    with fleet_ledger.open_ledger(tmp_path) as led:
        for i in range(3):
            rid = f"ro-20260701-12000{i}-3f9a"
            led.create(
                rid,
                kind="rollout",
                recipe="qwen36-35b-heretic",
                requested="v0.24.0",
                tag=TAG,
                digest=DIGEST,
                image="img",
                options={},
                command="fleetctl rollout --tag v0.24.0 --yes",
                waves=[list(HOSTS)],
                hosts=[
                    {
                        "host": h,
                        "wave": 0,
                        "step": 0,
                        "status": fleet_records.PENDING,
                        "before_tag": OLD_TAG,
                        "before_digest": DIGEST,
                        "target_tag": TAG,
                        "target_digest": DIGEST,
                    }
                    for h in HOSTS
                ],
            )
            led.host_phase(
                rid,
                "spark-01",
                "rolled-back",
                LONG_ERROR,
                status=fleet_records.ROLLED_BACK,
                error=LONG_ERROR,
            )
            led.set_status(rid, fleet_records.FAILED, LONG_ERROR)
    runner = CliRunner()
    r = runner.invoke(cli, ["-i", str(EXAMPLE_INVENTORY), "history"], env={"COLUMNS": str(WIDTH)})
    assert r.exit_code == 0, r.output
    assert_fits(r.output, 3)
    assert "ro-20260701-120002-3f9a" in r.output  # the id, whole: it is copied into `history ID`
    r = runner.invoke(cli, ["-i", str(EXAMPLE_INVENTORY), "history", "ro-20260701-120001-3f9a"],
                      env={"COLUMNS": str(WIDTH)})
    assert r.exit_code == 0, r.output
    assert_fits(r.output, len(HOSTS))


def test_recipes_fit() -> None:
    r = CliRunner().invoke(
        cli, ["-i", str(EXAMPLE_INVENTORY), "recipes"], env={"COLUMNS": str(WIDTH)}
    )
    assert r.exit_code == 0, r.output
    assert_fits(r.output, len(recipes.load_recipes(inventory.load(str(EXAMPLE_INVENTORY)))))
    assert "(default)" in r.output


def test_status_fits_with_an_unreachable_host() -> None:
    c = Container("vllm", running=True, status="running", tag=TAG, digest=DIGEST,
                  image=f"registry/aeon-vllm-ultimate:{TAG}",
                  labels={"fleetctl.recipe": "qwen36-35b-heretic"})
    sts = {
        h: HostStatus(
            h,
            "10.78.12.11",
            True,
            0.4,
            gpu="NVIDIA GB10",
            driver="580.95.05",
            toolkit="1.18.0",
            docker="28.5.1",
            container=c,
            health=200,
            uptime_s=86400.0 * 12,
        )
        for h in HOSTS
    }
    sts["spark-04"] = HostStatus("spark-04", "10.78.12.14", False, 5.0,
                                 error="cannot reach 10.78.12.14:22 over SSH (timed out)")
    text = render(render_status(sts))
    assert_fits(text, len(HOSTS))
    assert "cannot reach" in text  # the cause of an unreachable host survives the narrow table


def test_lab_status_fits() -> None:
    node = LabNode(
        "spark-01",
        "10.78.12.11",
        "root",
        Path("/k"),
        Path("/kh"),
        "running",
        "NVIDIA GB10",
        "580.95.05",
        {"disk_gb": 30, "paused": False},
        (InnerContainer("vllm", f"10.78.12.1:5000/aeon-vllm-ultimate:{TAG}", "Up 3 minutes"),),
    )
    st = LabStatus(
        Path("/var/tmp/lab-recovery-lock"),
        "10.78.12.0/24",
        "10.78.12.1",
        True,
        "unix:///x",
        "r",
        "h",
        "a",
        "k",
        "w",
        Path("/i"),
        Path("/k"),
        Path("/kh"),
        nodes=tuple(LabNode(f"spark-0{i}", f"10.78.12.1{i}", *vars_of(node)) for i in range(1, 5)),
    )
    assert_fits(render(lab_cli._render_status(st)), 4)


def vars_of(node: LabNode) -> list[Any]:
    return [
        node.ssh_user,
        node.key_path,
        node.known_hosts,
        node.state,
        node.gpu,
        node.driver,
        node.faults,
        node.containers,
    ]


def test_stage_fits() -> None:
    sets = (
        SetOutcome("body", "AEON-7/Qwen3.6-35B-A3B-heretic", "main", "/srv/w/body", "staged"),
        SetOutcome("drafter", "AEON-7/Qwen3.6-35B-A3B-dflash", "main", "/srv/w/drafter", "current"),
    )
    hosts = {
        h: HostStage(
            h,
            "ok",
            True,
            sets,
            bytes_copied=21_000_000_000,
            seconds=60.0,
            seed=h == "spark-01",
            message="verified 2 sets by sha256 against the source's manifest",
        )
        for h in HOSTS
    }
    r = StageResult(
        "st-1", "qwen36-35b-heretic", "http://10.78.12.1:8080/weights", hosts, 62.0, Path("/a")
    )
    assert_fits(render(stage_cli._render_stage(r)), len(HOSTS))


def test_live_progress_table_fits() -> None:
    live = _LiveTable(
        "rollout", ("wave", "phase", "tag", "health", "tok/s", "acceptance", "message")
    )
    for h in HOSTS:
        live.rows[h] = {"wave": "2", "phase": "soak", "tag": TAG, "health": "ready", "tok/s": "412",
                        "acceptance": "61 %", "message": LONG_ERROR}
    assert_fits(render(lambda con: con.print(live.render())), len(HOSTS))


def test_live_progress_of_a_fleet_taller_than_the_terminal_shows_the_busy_hosts() -> None:
    live = _LiveTable(
        "rollout", ("wave", "phase", "tag", "health", "tok/s", "acceptance", "message")
    )
    for i in range(256):
        phase = (
            "soak" if i % 16 == 5 else "failed" if i == 200 else "done" if i < 100 else "planned"
        )
        live(
            Event(
                phase, LONG_ERROR, f"sim-{i + 1:03d}", {"wave": "3", "tag": TAG, "health": "ready"}
            )
        )
    live(Event("wave", "wave 3 of 3"))
    out = io.StringIO()
    con = Console(file=out, width=WIDTH, height=24, soft_wrap=True, color_system=None)

    class _Live:
        console = con

    live.live = _Live()  # type: ignore[assignment]
    con.print(live.render())
    text = out.getvalue()
    lines = text.splitlines()
    assert len(lines) <= 24 and all(len(ln) <= WIDTH for ln in lines), text
    # Every host being soaked and the failed one are shown; the quiet ones are counted.
    shown = {m.group(0) for m in re.finditer(r"sim-\d{3}", text)}
    assert {f"sim-{i + 1:03d}" for i in range(256) if i % 16 == 5} | {"sim-201"} <= shown
    assert re.search(r"\d+ more hosts: \d+ (planned|done), \d+ (planned|done)", text), text


def test_live_progress_events_do_not_render_the_table() -> None:
    live = _LiveTable("rollout", ("phase", "message"))

    def boom() -> None:
        raise AssertionError("rendered on an event")

    live.render = boom  # type: ignore[method-assign,assignment]
    for i in range(50):
        live(Event("soak", "c=4", f"h{i}"))
    assert len(live.rows) == 50


def test_fit_table_drops_highest_first_and_cuts_free_text() -> None:
    t = fit_table(40, ["a", Col("b", drop=1), Col("c", drop=2), Col("why", flex=True)],
                  [["x" * 8, "y" * 8, "z" * 8, "w" * 60]])
    text = render(lambda con: con.print(t))
    assert "yyyyyyyy" in text and "zzzz" not in text and "…" in text
    assert all(len(ln) <= 40 for ln in text.splitlines())


def test_provision_fits() -> None:
    hosts = {
        h: HostResult(
            h,
            ok=41,
            changed=3,
            failed=0,
            unreachable=0,
            warnings=(
                "the next kernel 6.11.0-1016-nvidia has no nvidia module: reboot would lose "
                "the GPU until DKMS builds it",
            ),
            reports={"preflight": {"gpu": {"name": "NVIDIA GB10", "driver": "580.95.05"}}},
        )
        for h in HOSTS
    }
    r = PlaybookResult(
        "pv-20260701-120000",
        "provision.yml",
        Path("/var/tmp/state/runs/pv-20260701-120000"),
        hosts,
        84.2,
        "successful",
        0,
    )
    assert_fits(render(render_provision(r, False)), len(HOSTS))


def test_completed_with_failures_names_the_failed_and_the_skipped_hosts() -> None:
    skipped = HostOutcome("spark-04", -1, "skipped", "skipped", OLD_TAG, DIGEST, None, None,
                          verdict="skipped: first deploy: nothing served before it (leave it, or "
                                  "`fleetctl rollout` a version)")
    hosts = (outcome("spark-01", "done"), outcome("spark-02", "rolled-back", LONG_ERROR),
             outcome("spark-03", "done"), skipped)
    r = RolloutResult(
        "ro-20260701-120000-3f9a",
        "rollout",
        "completed-with-failures",
        "qwen36-35b-heretic",
        TAG,
        DIGEST,
        "img",
        hosts,
    )
    text = render(lambda con: render_result(r, con))
    assert_fits(text, len(hosts))
    assert (
        "spark-04: skipped: first deploy: nothing served before it" in text
    )  # whole, below the table
    assert f"`fleetctl rollout --tag {TAG} --limit spark-02`" in text
    assert "(rolled back, or down as said above): spark-02\n" in text


def test_soak_summary_fits() -> None:
    from fleetctl.cli.soak import _summary
    from fleetctl.soak.verdict import CheckResult, LevelSummary, Outcome, Verdict

    def verdict(host: str, outcome: Outcome) -> Verdict:
        checks = (CheckResult("crash", outcome, LONG_ERROR),) if outcome is not Outcome.PASS else ()
        return Verdict(f"soak-{host}", host, f"http://{host}:8000", outcome, "all checks passed",
                       "2026-07-01T12:00:00", "2026-07-01T12:05:00", 300.0, tag=TAG, checks=checks,
                       levels=(LevelSummary("sweep", "c=32", 32, 640, 3, 60.0, tok_s=4123.5),))

    vs = [verdict(h, Outcome.FAIL if h == "spark-02" else Outcome.PASS) for h in HOSTS]
    assert_fits(render(_summary(vs)), len(HOSTS))


def test_the_controller_raises_its_open_files_limit_within_the_hard_one() -> None:
    import resource

    from fleetctl.cli.main import raise_fd_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        want = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
        assert raise_fd_limit(4096) == want
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (want, hard)
        # Never lowered: a limit already above the wish stays.
        assert raise_fd_limit(128) == want
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_plan_shows_the_floor_the_steps_and_the_expected_time_in_80_columns() -> None:
    hosts = [f"spark-{i:03d}" for i in range(1, 101)]
    p = wave_plan.build(
        wave_plan.Desired("qwen36-35b-heretic", "registry/aeon-vllm-ultimate", "v0.24.0", TAG,
                          DIGEST, "ref"),
        hosts,
        {h: (OLD_TAG, "sha256:" + "0" * 64) for h in hosts},
    ).with_estimate(240, 600)
    text = render(lambda con: render_plan(p, con))
    assert_fits(text, len(hosts))
    head = [ln for ln in text.splitlines() if not re.match(r"^[┏┃┡│└]", ln)]
    assert all(len(ln) <= WIDTH for ln in head[2:]), (
        head
    )  # the digest line is whole, the others fit
    assert "25 at a time, 75 of 100 kept serving (--min-available 75%, default)" in text
    # The canary, then 4 steps; each waits a 4 min load and a 10 min soak.
    assert "steps: 1, 3 x 25, 24 host(s)" in text
    assert "expected 1h 10m: 5 step(s) x (4m 00s load + 10m 00s soak), after the pulls" in text
    assert "(load: recipe's load_time; soak: sustained only, no past soaks)" in text
