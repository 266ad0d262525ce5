"""The web view in a real browser (Debian's ``chromium``, headless): every host's phase is on the
page, the page updates itself as the run's event log grows, a screenshot is drawn, and the console
has no
errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory
from fleetctl.cli import livemodel, ui
from fleetctl.progress import Event, event_json

from .test_ui import EXAMPLE_INVENTORY, HOSTS, make_state

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (scripts/bootstrap.sh installs it)"
)


class MovingFleet(ui.Fleet):
    """The real Fleet; after the page's first look at the run, the run moves on: spark-04's step
    starts
    (one more line in the event log, as the rollout would write it)."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.looks = 0

    def live(self) -> dict[str, Any]:
        out = super().live()
        self.looks += 1
        if self.looks == 1:
            log = next(livemodel.events_dir(self.state_dir).glob("*.jsonl"))
            with log.open("a") as f:
                f.write(
                    json.dumps(
                        event_json(Event("stopping", "v0.23.0", "spark-04", {"wave": 2}), 300.0)
                    )
                    + "\n"
                )
        return out


@pytest.fixture
def page(tmp_path: Path) -> Iterator[tuple[str, MovingFleet]]:
    make_state(tmp_path)
    fleet = MovingFleet(inventory.load(str(EXAMPLE_INVENTORY)), tmp_path)
    server = ui.serve(fleet, "127.0.0.1", 0)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", fleet
    finally:
        server.shutdown()
        server.server_close()


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_page_shows_every_host_and_updates_as_the_run_moves(
    page: tuple[str, MovingFleet],
) -> None:
    url, fleet = page
    # Five seconds of the page's own time: it polls the run every second.
    r = chromium("--virtual-time-budget=5000", "--dump-dom", url)
    assert r.returncode == 0, r.stderr[-2000:]
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
    assert not console, "\n".join(console)
    dom = r.stdout
    assert fleet.looks >= 2, "the page looked at the run more than once"
    for host in HOSTS:
        assert f'data-host="{host}"' in dom, host
    row = dom.split('data-host="spark-04"', 1)[1].split("</tr>", 1)[0]
    assert ">stopping<" in row, "the page shows the phase the run moved on to"
    assert ">rolled-back<" in dom.split('data-host="spark-03"', 1)[1].split("</tr>", 1)[0]
    assert "8/8 8/12s" in dom and "1/4 hosts done, 1 failed" in dom
    assert "cannot reach fleetctl ui" not in dom


def test_a_screenshot_is_drawn(page: tuple[str, MovingFleet], tmp_path: Path) -> None:
    url, _ = page
    shot = tmp_path / "ui.png"
    r = chromium("--hide-scrollbars", "--window-size=1280,900", "--virtual-time-budget=3000",
                 f"--screenshot={shot}", url)
    assert r.returncode == 0, r.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, (
        "a page with content, not a blank one"
    )
