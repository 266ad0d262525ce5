"""On the lab: a rollout driven through tmux in an 80x30 terminal, its screen read mid-soak (the
phase, the soak's progress and the time left), the question answered at its prompt, and the web view
loaded in headless chromium during the same rollout (every host's phase, no console errors), served
by the rollout itself (``--ui PORT``); the same run's ``--events`` stream (its schema, the pulls'
bytes) and the per-host
progress its webhook posted to a loopback receiver."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, registry, ssh
from tests.frontdoor.servers import free_port
from tests.plugins.serving import BASE_TAG, engine, serve
from tests.plugins.webhook import Receiver

pytestmark = pytest.mark.lab

TMUX = shutil.which("tmux")
CHROMIUM = shutil.which("chromium")
FLEETCTL = str(Path(sys.executable).with_name("fleetctl"))
SESSION = f"fleetctl-live-{os.getpid()}"


def screen() -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", SESSION], capture_output=True, text=True, check=True
    ).stdout


def wait_for(pattern: str, deadline: float) -> str:
    """The screen once it matches ``pattern`` (a regex), or a failure with the last screen."""
    text = ""
    while time.monotonic() < deadline:
        text = screen()
        if re.search(pattern, text, re.M):
            return text
        time.sleep(0.5)
    raise AssertionError(f"never saw {pattern!r}; the screen was:\n{text}")


@pytest.fixture
def webhook(receiver: Receiver) -> Iterator[tuple[str, Receiver]]:
    """A loopback receiver, and the lab inventory allowing its plain-http URL for the test's
    length."""
    allow = inventory.load(None).path.parent / "group_vars" / "all" / "zz-test-webhook.yml"
    allow.write_text("fleetctl_webhook_allow_http: true\n")
    try:
        yield f"http://127.0.0.1:{receiver.server_port}/hook/T0KEN-s3cr3t-0123456789", receiver
    finally:
        allow.unlink(missing_ok=True)


def drop_image(tag: str) -> None:
    """Remove ``tag``'s image from every node where no container uses it, so that the rollout pulls
    its bytes."""
    eng = engine()
    try:
        image = eng.recipe(None).image
        ref = registry.pull_ref(
            image, registry.resolve(image, tag, eng.mirrors).digest, eng.mirrors
        )
        for h in eng.inv.hosts.values():
            ssh.docker(h, f"docker rmi {shlex.quote(ref)} >/dev/null 2>&1; true", timeout=120)
    finally:
        eng.close()
        ssh.close_all()


#: Two hosts (spark-02 asks a vaulted sudo password): the canary, then one step measured for the
#: time left.
LIMIT = "spark-01,spark-02"


@pytest.mark.skipif(TMUX is None, reason="needs tmux")
def test_a_rollout_on_an_80_column_terminal_and_in_the_browser(
    serving: Any, tmp_path: Path, webhook: tuple[str, Receiver]
) -> None:
    del serving
    done = tmp_path / "rc"
    events = tmp_path / "events.jsonl"
    port = free_port()
    hook_url, receiver = webhook
    cmd = (
        f"{FLEETCTL} rollout --tag v0.24.0 --limit {LIMIT} --max-unavailable 1 --soak 30s --ui "
        f"{port} --events {events}; echo $? > {done};"
        " sleep 600"
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", SESSION, "-x", "80", "-y", "30", cmd],
        check=True,
        env={**os.environ, "TERM": "xterm-256color", "FLEETCTL_WEBHOOK_URL": hook_url},
    )
    ui = subprocess.Popen(
        [FLEETCTL, "ui", "--port", "0", "--json"], stdout=subprocess.PIPE, text=True
    )
    drop_image("v0.24.0")
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
        later = wait_for(r"^rollout\s+\S+\s+\d+/2 hosts done.*~\S+ left", end)
        print(later)
        # The web view at the same moment: `fleetctl ui`'s, and the one the rollout serves itself.
        assert ui.stdout is not None
        text = ""
        for line in ui.stdout:
            text += line
            if line.rstrip() == "}":
                break
        url = json.loads(text)["url"]
        # The second host may still be starting when the header first shows the time left: wait for
        # its soak.
        while True:
            live = json.loads(urllib.request.urlopen(url + "api/live", timeout=30).read())
            if any(h["phase"] == "soak" for h in live["hosts"]) or time.monotonic() > end:
                break
            time.sleep(0.5)
        assert any(h["phase"] == "soak" for h in live["hosts"]), live
        own = f"http://127.0.0.1:{port}/"
        mine = json.loads(urllib.request.urlopen(own + "api/live", timeout=30).read())
        assert mine["log"] == live["log"] and any(h["phase"] == "soak" for h in mine["hosts"]), mine
        if CHROMIUM is not None:
            r = subprocess.run(
                [
                    CHROMIUM,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--enable-logging=stderr",
                    "--v=0",
                    "--virtual-time-budget=3000",
                    "--dump-dom",
                    own,
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert not [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln], r.stderr[-2000:]
            for h in live["hosts"]:
                assert f'data-host="{h["host"]}"' in r.stdout
        while not done.exists() and time.monotonic() < end:
            time.sleep(1)
        # The --events stream: a header with its schema, every event in the documented shape, the
        # end.
        head, *lines, tail = [json.loads(ln) for ln in events.read_text().splitlines()]
        assert head["schema"] == 1 and head["title"] == "rollout" and tail["ended"] is True
        assert all(set(ln) == {"t", "phase", "message", "host", "data"} for ln in lines)
        pulls = [
            ln["data"]
            for ln in lines
            if ln["phase"] == "pull" and ln["host"] and "bytes_total" in ln["data"]
        ]
        assert pulls and all(p["bytes_total"] > 1_000_000 for p in pulls), (
            "the registry's layer sizes"
        )
        assert any(p["bytes"] == p["bytes_total"] for p in pulls), (
            "each pull ends with all its bytes"
        )
        # A role-driven step streams its Ansible tasks into the host's row.
        assert any(ln["phase"] == "deploying" and ln["data"].get("task") for ln in lines), (
            "the role's tasks"
        )
        # The webhook: the coarse events, and the hosts' progress batched (no token anywhere in a
        # body).
        kinds = [b["event"] for b in receiver.bodies]
        assert "start" in kinds and ("completion" in kinds or "failure" in kinds), kinds
        progress = [h for b in receiver.bodies if b["event"] == "progress" for h in b["hosts"]]
        assert "soak" in {h["phase"] for h in progress}, progress
        assert {h["host"] for h in progress} == {h["host"] for h in live["hosts"]}, progress
        assert "T0KEN-s3cr3t" not in json.dumps(receiver.bodies)
        # Last: a gate may fail on a loaded machine (exit 1); the stream and the receiver are
        # checked first.
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
            subprocess.run(
                [FLEETCTL, "rollout", "abort", "--yes"], capture_output=True, check=False
            )
        subprocess.run(["tmux", "kill-session", "-t", SESSION], check=False)
        serve(BASE_TAG)
