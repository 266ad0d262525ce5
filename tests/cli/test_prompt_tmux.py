"""In a real terminal (tmux, 80x30): a question asked while the live view runs comes under what was
printed
before it, keeps its answer on screen, and the live view starts again below it (not over it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

SCRIPT = """
import sys
from pathlib import Path
from fleetctl.cli import live
from fleetctl.cli.output import Ctx
from fleetctl.progress import Event
ctx = Ctx()
with live.watch(ctx, "rollout", Path(sys.argv[1])) as prog:
    for i in range(4):
        prog(Event("preflight", "ok", f"spark-0{i + 1}"))
    ctx.live.refresh()
    ctx.err.print("PLAN LINE 1\\nPLAN LINE 2")
    ctx.ask("Roll out 4 host(s) to v0.24.0?")
    prog(Event("stopping", "v0.23.0", "spark-01"))
    ctx.live.refresh()
print("FINISHED", file=sys.stderr)
"""


def screen(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


def wait_for(session: str, text: str) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        s = screen(session)
        if text in s:
            return s
        time.sleep(0.2)
    raise AssertionError(f"never saw {text!r}:\n{screen(session)}")


def test_the_question_stays_between_the_plan_and_the_live_view(tmp_path: Path) -> None:
    session = f"fleetctl-ask-{os.getpid()}"
    (tmp_path / "ask.py").write_text(SCRIPT)
    cmd = f"{sys.executable} {tmp_path / 'ask.py'} {tmp_path / 'state'}; sleep 120"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "30", cmd],
        check=True,
        env={**os.environ, "TERM": "xterm-256color"},
    )
    try:
        wait_for(session, "[y/N]")
        subprocess.run(["tmux", "send-keys", "-t", session, "y", "Enter"], check=True)
        lines = wait_for(session, "FINISHED").splitlines()
        at = {
            name: next(i for i, ln in enumerate(lines) if ln.startswith(name))
            for name in (
                "PLAN LINE 1",
                "PLAN LINE 2",
                "Roll out 4 host(s) to v0.24.0? [y/N] y",
                "rollout ",
            )
        }
        assert list(at.values()) == sorted(at.values()), "\n".join(lines)
        assert sum(ln.startswith("rollout ") for ln in lines) == 1, (
            "one live view, none left behind"
        )
        assert any(ln.startswith("│ spark-01 │") and "stopping" in ln for ln in lines)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
