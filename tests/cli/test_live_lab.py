"""On the lab: a rollout driven through tmux in an 80x30 terminal, its screen read mid-soak (the phase, the
soak's progress and the time left), the question answered at its prompt, and the web view loaded in
headless chromium during the same rollout (every host's phase, no console errors)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.serving import BASE_TAG, serve

pytestmark = pytest.mark.lab

TMUX = shutil.which("tmux")
CHROMIUM = shutil.which("chromium")
FLEETCTL = str(Path(sys.executable).with_name("fleetctl"))
SESSION = f"fleetctl-live-{os.getpid()}"


def screen() -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", SESSION], capture_output=True, text=True,
                          check=True).stdout


def wait_for(pattern: str, deadline: float) -> str:
    """The screen once it matches ``pattern`` (a regex), or a failure with the last screen."""
    text = ""
    while time.monotonic() < deadline:
        text = screen()
        if re.search(pattern, text, re.M):
            return text
        time.sleep(0.5)
    raise AssertionError(f"never saw {pattern!r}; the screen was:\n{text}")


@pytest.mark.skipif(TMUX is None, reason="needs tmux")
def test_a_rollout_on_an_80_column_terminal_and_in_the_browser(serving: Any, tmp_path: Path) -> None:
    del serving
    done = tmp_path / "rc"
    cmd = f"{FLEETCTL} rollout --tag v0.24.0 --soak 30s; echo $? > {done}; sleep 600"
    subprocess.run(["tmux", "new-session", "-d", "-s", SESSION, "-x", "80", "-y", "30", cmd], check=True,
                   env={**os.environ, "TERM": "xterm-256color"})
    ui = subprocess.Popen([FLEETCTL, "ui", "--port", "0", "--json"], stdout=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 900
        asked = wait_for(r"Roll out \d+ host\(s\) to v0\.24\.0\? \[y/N\]", end)
        assert "2026-" not in asked.splitlines()[-1], "the question names the short tag"
        subprocess.run(["tmux", "send-keys", "-t", SESSION, "y", "Enter"], check=True)
        # Mid-soak: a host in its soak with phase k of n and the gate's running figures.
        mid = wait_for(r"^│ \S+\s+│ soak\s+│.*\d/8 .*│ .*\d+/\d+ err \d+ tok/s", end)
        print(mid)  # the screens read, in the test's output
        lines = mid.splitlines()
        assert all(len(ln) <= 80 for ln in lines), mid
        head = [ln for ln in lines if ln.startswith("┃") and " message " in ln][-1]
        assert len(next(c for c in head.split("┃") if c.strip() == "message")) - 2 >= 30, mid
        view = lines[max(i for i, ln in enumerate(lines) if ln.startswith("rollout ")):]
        assert "2026-" not in "\n".join(view), "short tags in the live view"
        # Once the canary's step is measured, the header estimates the time left.
        later = wait_for(r"^rollout\s+\S+\s+\d+/4 hosts done.*~\S+ left", end)
        print(later)
        # The web view at the same moment.
        assert ui.stdout is not None
        text = ""
        for line in ui.stdout:
            text += line
            if line.rstrip() == "}":
                break
        url = json.loads(text)["url"]
        live = json.loads(urllib.request.urlopen(url + "api/live", timeout=30).read())
        assert any(h["phase"] == "soak" for h in live["hosts"]), live
        if CHROMIUM is not None:
            r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                                "--v=0", "--virtual-time-budget=3000", "--dump-dom", url],
                               capture_output=True, text=True, timeout=120, check=False)
            assert not [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln], r.stderr[-2000:]
            for h in live["hosts"]:
                assert f'data-host="{h["host"]}"' in r.stdout
        while not done.exists() and time.monotonic() < end:
            time.sleep(1)
        assert done.read_text().strip() in ("0", "5"), screen()
    finally:
        ui.terminate()
        ui.wait(timeout=30)
        if not done.exists():
            # Ctrl-C: the rollout restores the host it is changing and pauses; then it is undone.
            subprocess.run(["tmux", "send-keys", "-t", SESSION, "C-c"], check=False)
            stop = time.monotonic() + 300
            while not done.exists() and time.monotonic() < stop:
                time.sleep(1)
            subprocess.run([FLEETCTL, "rollout", "abort", "--yes"], capture_output=True, check=False)
        subprocess.run(["tmux", "kill-session", "-t", SESSION], check=False)
        serve(BASE_TAG)
