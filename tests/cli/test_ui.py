"""``fleetctl ui`` over real HTTP on loopback: the page and its assets from the package, the run in
progress from its event log (the same model as the terminal's view), the hosts, the history and a
soak report with
its charts; read-only, and nothing outside the state dir's run artifacts is served."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetctl import inventory
from fleetctl.cli import livemodel, ui
from fleetctl.errors import FleetError
from fleetctl.soak.verdict import CheckResult, Outcome, Verdict, to_dict
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_INVENTORY = ROOT / "inventory" / "example" / "hosts.yml"
FIXTURE = Path(__file__).parent / "fixtures" / "rollout-events.jsonl"
RID = "ro-20260701-120000-3f9a"
TAG, OLD_TAG = "2026-07-01-v0.24.0-dflashfix", "2026-06-18-v0.23.0-dflashfix"
DIGEST = "sha256:" + "4eb9270da69ef0" * 4
HOSTS = ("spark-01", "spark-02", "spark-03", "spark-04")


def make_state(state: Path) -> None:
    """A ledger with one rollout, the gate's verdict of spark-01, and the recorded run as the
    newest event log."""
    with fleet_ledger.open_ledger(state) as led:
        led.create(
            RID,
            kind="rollout",
            recipe="qwen36-35b-heretic",
            requested="v0.24.0",
            tag=TAG,
            digest=DIGEST,
            image="img",
            options={},
            command="fleetctl rollout --tag v0.24.0",
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
            RID,
            "spark-01",
            "done",
            "pass",
            status=fleet_records.DONE,
            after_tag=TAG,
            after_digest=DIGEST,
        )
    soak = state / "runs" / RID / "soak-spark-01"
    soak.mkdir(parents=True)
    v = Verdict(
        "soak-1",
        "spark-01",
        "http://10.0.0.1:8000",
        Outcome.PASS,
        "pass: 220 requests, 0 errors",
        "2026-07-01T12:00:00Z",
        "2026-07-01T12:01:00Z",
        60.0,
        tag=TAG,
        checks=(CheckResult("errors", Outcome.PASS, "0 of 220 requests failed"),),
    )
    (soak / "verdict.json").write_text(json.dumps(to_dict(v)))
    events = livemodel.events_dir(state)
    events.mkdir(parents=True)
    shutil.copy(FIXTURE, events / "rollout-20260701-120000-1.jsonl")


@dataclass
class Served:
    url: str
    state: Path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    make_state(tmp_path)
    server = ui.serve(ui.Fleet(inventory.load(str(EXAMPLE_INVENTORY)), tmp_path), "127.0.0.1", 0)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    try:
        yield Served(f"http://127.0.0.1:{server.server_address[1]}", tmp_path)
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def test_the_page_and_its_assets_come_from_the_package(served: Served) -> None:
    status, ctype, page = get(served.url + "/")
    assert status == 200 and ctype.startswith("text/html")
    assert '<script src="/app.js">' in page and "http" not in page.replace('"http-equiv', ""), (
        "no CDN"
    )
    assert get(served.url + "/app.js")[1].startswith("text/javascript")
    assert get(served.url + "/style.css")[1].startswith("text/css")


def test_the_run_in_progress_is_the_terminal_views_model(served: Served) -> None:
    status, ctype, body = get(served.url + "/api/live")
    assert status == 200 and ctype == "application/json"
    snap = json.loads(body)
    want = livemodel.replay(FIXTURE.read_text().splitlines(), "rollout").snapshot()
    assert snap["log"] == "rollout-20260701-120000-1.jsonl"
    assert [h["cells"] for h in snap["hosts"]] == [h["cells"] for h in want["hosts"]]
    assert (snap["hosts_done"], snap["hosts_failed"], snap["hosts_planned"]) == (1, 1, 4)
    soaking = next(h for h in snap["hosts"] if h["host"] == "spark-02")
    assert 0 < soaking["fraction"] <= 1 and soaking["cells"]["figures"] == "8/8 8/12s"


def test_hosts_history_and_a_soak_report(served: Served) -> None:
    hosts = json.loads(get(served.url + "/api/hosts")[2])
    assert [h["host"] for h in hosts] == list(inventory.load(str(EXAMPLE_INVENTORY)).hosts)
    first = next(h for h in hosts if h["host"] == "spark-01")
    assert (
        first["last"]["run"] == RID
        and first["last"]["status"] == fleet_records.DONE
        and first["last"]["tag"] == TAG
    )
    history = json.loads(get(served.url + "/api/history")[2])
    assert [r["id"] for r in history] == [RID] and len(history[0]["hosts"]) == 4
    status, ctype, page = get(f"{served.url}/report/{RID}/spark-01")
    assert (
        status == 200
        and ctype.startswith("text/html")
        and "fleetctl soak" in page
        and "spark-01" in page
    )
    assert get(f"{served.url}/report/{RID}/spark-02")[0] == 404, "no verdict: no report"
    assert get(f"{served.url}/report/ro-nope/spark-01")[0] == 404


def test_nothing_else_is_served_and_nothing_can_be_changed(served: Served) -> None:
    (served.state / "secret.txt").write_text("x")
    for path in ("/report/..%2F..%2Fsecret.txt/x", "/../secret.txt", "/api/nope", "/report/a/b/c"):
        assert get(served.url + path)[0] == 404, path
    conn = http.client.HTTPConnection("127.0.0.1", int(served.url.rsplit(":", 1)[1]), timeout=30)
    conn.request("POST", "/api/live", body=b"{}")
    assert conn.getresponse().status == 501
    conn.close()


def test_a_state_dir_without_runs_says_so(tmp_path: Path) -> None:
    assert ui.Fleet(inventory.load(str(EXAMPLE_INVENTORY)), tmp_path).live() == {"log": None}


def test_the_command_prints_its_url_as_json_and_serves_on_loopback(tmp_path: Path) -> None:
    make_state(tmp_path)
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleetctl.cli.main",
            "-i",
            str(EXAMPLE_INVENTORY),
            "ui",
            "--port",
            "0",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        text = b""
        for line in proc.stdout:  # the JSON document, printed before the server starts serving
            text += line
            if line.rstrip() == b"}":
                break
        out = json.loads(text)
        assert out["url"].startswith("http://127.0.0.1:")
        assert json.loads(get(out["url"] + "api/history")[2])[0]["id"] == RID
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_port_in_use_is_one_message_with_the_fix(tmp_path: Path) -> None:
    fleet = ui.Fleet(inventory.load(str(EXAMPLE_INVENTORY)), tmp_path)
    first = ui.serve(fleet, "127.0.0.1", 0)
    try:
        with pytest.raises(FleetError) as e:
            ui.serve(fleet, "127.0.0.1", first.server_address[1])
        assert "cannot listen on 127.0.0.1:" in e.value.cause and "--port" in (e.value.fix or "")
    finally:
        first.server_close()
