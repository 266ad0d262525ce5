"""``fleetctl watch`` against loopback servers: the emulator passes, a server that goes bad fails
and pages."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from fleetctl.cli.main import cli
from fleetctl.soak.checks.watching import WatchSettings
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.verdict import Outcome, Remedied
from fleetctl.soak.watch import WatchTarget, run_watch
from tests.plugins.webhook import Receiver
from tests.soak.conftest import Served
from tests.soak.fakevllm import FakeVLLM, answer_for, good_chat, prompt_of, serve, stream_tokens


def test_a_healthy_emulator_passes_a_watch_of_a_few_intervals(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    served = emulator()
    cfg = load_config({}, profile="lab", served_model_names=("qwen36-35b-heretic",))
    events: list[str] = []
    [v] = run_watch(
        [WatchTarget(served.target, cfg, tmp_path / "run", "watch-1")],
        WatchSettings(duration=3.5, interval=1.0, min_draft_tokens=40),
        lambda e: events.append(e.phase),
    )
    assert v.outcome is Outcome.PASS, v.summary
    assert v.levels[0].requests >= 6 and v.levels[0].errors == 0
    outcomes = {c.name: c.outcome for c in v.checks}
    assert outcomes["canary"] is Outcome.PASS and outcomes["server_errors"] is Outcome.PASS
    # The emulator drafts: acceptance is judged over blocks of >= 40 drafted tokens, the first the
    # reference.
    assert outcomes["acceptance"] is Outcome.PASS and "first block" in v.check("acceptance").message
    # The soak's artifacts: samples streamed to disk, every scrape, the verdict.
    assert (
        len((tmp_path / "run" / "samples.jsonl").read_text().splitlines()) == v.levels[0].requests
    )
    assert json.loads((tmp_path / "run" / "verdict.json").read_text())["outcome"] == "pass"
    assert len(list((tmp_path / "run" / "scrapes").iterdir())) >= 3
    assert "done" in events


def test_a_server_that_goes_bad_fails_the_watch_and_pages_the_webhook(
    receiver: Receiver, tmp_path: Path
) -> None:
    """After its first answers the server changes its canaries' greedy answers and fails streams."""
    served: list[int] = []

    async def going_bad(f: FakeVLLM, r: Any, body: dict[str, Any]) -> Any:
        served.append(1)
        if len(served) <= 6:  # the first three intervals: every canary answers its reference
            return await good_chat(f, r, body)
        right = answer_for(prompt_of(body))
        if right is not None:  # still right, but not the same greedy answer as before
            return await stream_tokens(
                f, r, body, [w + " " for w in f"Hmm. {right} I think.".split()]
            )
        from aiohttp import web

        return web.Response(status=500, text='{"error": "engine broke"}')

    inv = tmp_path / "inventory" / "hosts.yml"
    inv.parent.mkdir()
    inv.write_text("all:\n  vars:\n    fleetctl_webhook_allow_http: true\n  hosts: {}\n")
    with serve(FakeVLLM(chat=going_bad)) as fake:
        r = CliRunner().invoke(
            cli,
            [
                "-i",
                str(inv),
                "watch",
                "--endpoint",
                fake.url,
                "--model",
                "fake-model",
                "--profile",
                "lab",
                "--duration",
                "7s",
                "--interval",
                "1s",
                "--json",
                "--json-report",
                str(tmp_path / "report.json"),
                "--webhook",
                f"http://127.0.0.1:{receiver.server_port}/page",
            ],
            env={"FLEETCTL_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "80"},
        )
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)
    assert out["outcome"] == "fail"
    [v] = out["verdicts"]
    checks = {c["name"]: c for c in v["checks"]}
    assert (
        checks["canary"]["outcome"] == "fail"
        and "changed its greedy answer" in checks["canary"]["message"]
    )
    assert checks["probes"]["outcome"] == "fail" and "HTTP 500" in checks["probes"]["message"]
    pages = [b for b in receiver.bodies if b["event"] == "breach"]
    assert {p["check"] for p in pages} == {"canary", "probes"}
    assert all(p["host"] == fake.url.split("://")[1] for p in pages)
    assert json.loads((tmp_path / "report.json").read_text())["outcome"] == "fail"


def test_watch_options_are_checked_before_anything_runs() -> None:
    r = CliRunner().invoke(
        cli, ["watch", "--endpoint", "http://127.0.0.1:9", "--duration", "5s", "--interval", "10s"]
    )
    assert r.exit_code == 2 and "--interval 10s must be > 0 and at most --duration 5s" in r.output
    r = CliRunner().invoke(cli, ["soak", "--watch"])
    assert r.exit_code == 2 and "fleetctl watch" in r.output


def test_the_forwarded_error_knob_fails_only_requests_that_came_through_a_proxy(
        emulator: Callable[..., Served]) -> None:
    """EMU_FORWARDED_ERROR_RATE: what a bake catches and a soak (direct, out of rotation) cannot
    see."""
    import urllib.error
    import urllib.request

    served = emulator(EMU_FORWARDED_ERROR_RATE="1")
    base = served.target.base_url

    def chat(forwarded: bool) -> int:
        body = json.dumps(
            {
                "model": "qwen36-35b-heretic",
                "max_tokens": 48,
                "stream": True,
                "messages": [{"role": "user", "content": "Describe a thunderstorm."}],
            }
        ).encode()
        headers = {
            "Content-Type": "application/json",
            **({"X-Forwarded-For": "10.0.0.7"} if forwarded else {}),
        }
        req = urllib.request.Request(base + "/v1/chat/completions", body, headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code
        return 500 if '"error"' in text else 200

    def errors() -> float:
        from fleetctl.soak import metrics

        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            return (
                metrics.parse(r.read().decode()).value(metrics.SUCCESS, finished_reason="error")
                or 0.0
            )

    assert [chat(False) for _ in range(3)] == [200, 200, 200] and errors() == 0
    assert [chat(True) for _ in range(3)] == [500, 500, 500] and errors() == 3


def test_a_breach_a_remediation_healed_passes_as_healed_and_a_parked_host_fails_the_watch(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    """Two wedged emulators: one's remediation heals it (a restart heals a wedge; SIGUSR2 is what
    the restart does to this process), the other's parks it. The first passes as healed (exit 0 on
    its own), the second fails the watch (exit 1)."""
    import signal
    from dataclasses import replace

    from rich.console import Console

    from fleetctl.cli.soak import _exit_code
    from fleetctl.cli.watch import _summary
    from fleetctl.remediate import heal
    from fleetctl.soak import report

    served = {name: emulator(spec=False) for name in ("spark-01", "spark-02")}
    for s in served.values():
        s.proc.send_signal(signal.SIGUSR1)  # wedged: no token, /health and /metrics answer
    cfg = load_config({"checks": {"liveness": {"token_timeout": 1}}}, profile="lab",
                      served_model_names=("qwen36-35b-heretic",))
    asked: list[tuple[str, str]] = []

    def remedy(host: str, check: str, message: str) -> tuple[Remedied, bool]:
        asked.append((host, check))
        if host == "spark-01":
            served[host].proc.send_signal(signal.SIGUSR2)
            r = heal.Remediation(host, check, message, heal.RESTART, heal.HEALED,
                                 "restarted and re-gated", "rm-spark-01-1")
        else:
            r = heal.Remediation(host, check, message, heal.PARK, heal.PARKED,
                                 "parked: no known-good to roll back to", "rm-spark-02-1")
        return r.remedied()

    pages: list[tuple[str, str]] = []
    healed, parked = run_watch(
        [WatchTarget(replace(s.target, name=n), cfg, tmp_path / n, f"watch-{n}")
         for n, s in served.items()],
        WatchSettings(duration=6.0, interval=1.0),
        on_breach=lambda h, c, _m: pages.append((h, c)),
        remedy=remedy,
    )
    assert ("spark-01", "liveness") in asked and ("spark-02", "liveness") in asked, asked
    # Healed: passes, its liveness failure kept (marked healed) but no longer judged.
    assert healed.outcome is Outcome.PASS and healed.healed, healed.summary
    assert healed.summary.startswith("healed: ") and "1 breach(es) healed" in healed.summary
    assert healed.check("remediation").outcome is Outcome.PASS
    live = healed.check("liveness")
    assert live.outcome is Outcome.PASS and "healed: " in live.message, live
    assert any(m.outcome is Outcome.FAIL and m.label.endswith("(healed)")
               for m in live.measurements)
    assert [(r.check, r.result, r.healed) for r in healed.remediations] == [
        ("liveness", "healed", True)]
    # Parked: fails, the remediation check says why.
    assert parked.outcome is Outcome.FAIL and not parked.healed
    rem = parked.check("remediation")
    assert rem.outcome is Outcome.FAIL and "not healed: liveness: park: parked" in rem.message
    assert parked.check("liveness").outcome is Outcome.FAIL
    # The exit codes: 0 when every breach was healed, 1 with a host parked.
    assert _exit_code(report.worst([healed])) == 0
    assert _exit_code(report.worst([healed, parked])) == 1
    out = json.loads(report.to_json([healed, parked]))
    assert out["outcome"] == "fail" and out["healed"] == ["spark-01"]
    assert out["verdicts"][0]["remediations"][0]["result"] == "healed"
    assert "healed" not in json.loads(report.to_json([parked]))
    # The summary table, at 80 columns: healed and fail side by side.
    con = Console(width=80, record=True)
    _summary([healed, parked])(con)
    rows = {n: ln for ln in con.export_text().splitlines() for n in ("spark-01", "spark-02")
            if ln.startswith("│ " + n)}
    assert "healed" in rows["spark-01"] and "fail" in rows["spark-02"], rows


def test_sigterm_ends_a_long_watch_with_the_verdicts_of_the_time_watched(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    """`fleetctl watch` as systemd or a CI job's limit stops it: the first SIGTERM ends the watch
    after the probe in flight, with its verdicts written and printed (a second one would interrupt
    at once)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    served = emulator()
    events = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("fleetctl")), "watch", "--endpoint",
         served.target.base_url, "--model", "qwen36-35b-heretic", "--profile", "lab",
         "--interval", "1s", "--duration", "1h", "--events", str(events), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FLEETCTL_STATE_DIR": str(tmp_path / "state")})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and '"interval": 2' not in (
                events.read_text() if events.exists() else ""):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    doc = json.loads(out)
    [v] = doc["verdicts"]
    assert doc["outcome"] == v["outcome"] == "pass" and v["seconds"] < 600, v
    assert "SIGTERM: ending the watch" in err
    lines = [json.loads(x) for x in events.read_text().splitlines() if x.strip()]
    assert any(e.get("phase") == "done" for e in lines)
