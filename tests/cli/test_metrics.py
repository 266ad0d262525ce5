"""Prometheus metrics (``--metrics-port``, ``fleetctl ui --metrics-port``): the run's events and the
ledger folded into metrics, served by prometheus_client over real HTTP on loopback, and the
exposition read back with prometheus_client's own parser."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from fleetctl import inventory
from fleetctl.cli import live, livemodel, metrics, metrics_fleet, ui
from fleetctl.cli.output import Ctx
from fleetctl.errors import FleetError
from fleetctl.progress import Event
from fleetctl.state import ledger as fleet_ledger
from tests.cli.test_ui import DIGEST, EXAMPLE_INVENTORY, HOSTS, RID, TAG, make_state

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, by name and sorted labels (prometheus_client's parser)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def scrape(*collectors: metrics.Collector) -> Samples:
    return parse(generate_latest(metrics.registry_of(*collectors)).decode())


def watch_events(run: metrics.RunMetrics) -> None:
    """A watch of spark-02: a pass, a wedge (liveness fails, a breach), a restart that healed it,
    a pass again."""
    ok = {c: "pass" for c in ("probes", "canary", "liveness", "server_errors")}
    run(Event("watch", "interval 1", host="spark-02", data={"interval": 1, "checks": ok}))
    run(Event("watch", "interval 2", host="spark-02",
              data={"interval": 2, "checks": {**ok, "liveness": "fail", "canary": "error"}}))
    run(Event("breach", "liveness: no token for 20s (prompt: tell me a secret)", host="spark-02"))
    run(Event("drained", "out of rotation", host="spark-02"))
    run(Event("remediation", "restart: healed: re-gated", host="spark-02",
              data={"host": "spark-02", "check": "liveness", "action": "restart",
                    "result": "healed", "detail": "free text with api key sk-123"}))
    run(Event("remediation", "failed: boom", host="spark-03"))


def test_a_watchs_checks_breaches_and_remediations() -> None:
    run = metrics.RunMetrics("watch", {"spark-02": "qwen"})
    watch_events(run)
    s = scrape(run)
    assert value(s, "fleetctl_check_status", host="spark-02", check="liveness", status="fail") == 1
    assert value(s, "fleetctl_check_status", host="spark-02", check="liveness", status="pass") == 0
    # error (a probe that could not measure) is inconclusive: three statuses, no more
    assert value(s, "fleetctl_check_status", host="spark-02", check="canary",
                 status="inconclusive") == 1
    assert value(s, "fleetctl_breaches_total", host="spark-02", check="liveness") == 1
    assert value(s, "fleetctl_remediations_total", host="spark-02", action="restart",
                 result="healed") == 1
    # the remedy that raised: no action, result error; its message is no label
    assert value(s, "fleetctl_remediations_total", host="spark-03", action="none",
                 result="error") == 1
    assert value(s, "fleetctl_breach_unhealed", host="spark-02") == 0
    run(Event("watch", "interval 3", host="spark-02", data={"checks": {"liveness": "pass"}}))
    s = scrape(run)
    assert value(s, "fleetctl_check_status", host="spark-02", check="liveness", status="pass") == 1
    assert run.remediated_since("spark-02", time.time() - 60) == 1
    text = generate_latest(metrics.registry_of(run)).decode()
    for secret in ("secret", "sk-123", "free text", "boom", "no token"):
        assert secret not in text


def test_a_breach_no_remediation_healed_stays_unhealed() -> None:
    run = metrics.RunMetrics("watch")
    run(Event("breach", "latency: TTFT p95 3.1s", host="spark-04"))
    run(Event("remediation", "park: parked", host="spark-04",
              data={"action": "park", "result": "parked"}))
    run(Event("breach", "a-check-nobody-knows: x", host="spark-04"))
    s = scrape(run)
    assert value(s, "fleetctl_breach_unhealed", host="spark-04") == 1
    assert value(s, "fleetctl_breaches_total", host="spark-04", check="other") == 1
    assert value(s, "fleetctl_remediations_total", host="spark-04", action="park",
                 result="parked") == 1


def test_a_rollouts_phases_hosts_steps_and_soak_figures() -> None:
    t = [0.0]
    run = metrics.RunMetrics("rollout", {"spark-01": "qwen", "spark-02": "qwen"})
    run.model.clock = lambda: t[0]
    for h in ("spark-01", "spark-02", "spark-03"):
        run(Event("planned", "", host=h, data={"wave": 1}))
    t[0] = 10.0
    run(Event("loading", "", host="spark-01"))
    t[0] = 20.0
    run(Event("soak", "c=4", host="spark-01",
              data={"step": 3, "steps": 9, "tok_s": 520.5, "baseline": 515.0,
                    "acceptance_rate": 0.23, "requests": 96, "errors": 0, "level": "c=4"}))
    t[0] = 50.0
    s = scrape(run)
    assert value(s, "fleetctl_run_phase", command="rollout", phase="running") == 1
    assert value(s, "fleetctl_run_hosts", command="rollout", state="pending") == 3
    assert value(s, "fleetctl_host_held", host="spark-01") == 1
    assert value(s, "fleetctl_host_held", host="spark-02") == 0
    assert value(s, "fleetctl_host_step_age_seconds", host="spark-01") == 40
    assert value(s, "fleetctl_host_phase_age_seconds", host="spark-01") == 30
    assert value(s, "fleetctl_host_phase", host="spark-01", phase="soak") == 1
    assert value(s, "fleetctl_soak_tokens_per_second", host="spark-01", recipe="qwen") == 520.5
    assert value(s, "fleetctl_soak_acceptance_ratio", host="spark-01", recipe="qwen") == 0.23
    run(Event("done", "pass", host="spark-01"))
    run(Event("paused", "inconclusive gate", host="spark-02"))
    s = scrape(run)
    assert value(s, "fleetctl_run_phase", command="rollout", phase="paused") == 1
    assert value(s, "fleetctl_run_hosts", command="rollout", state="done") == 1
    run(Event("a-phase-of-tomorrow", "", host="spark-03"))
    run(Event("loading", "resumed", host="spark-02"))
    run(Event("failed", "readiness timed out", host="spark-02"))
    s = scrape(run)
    assert value(s, "fleetctl_run_phase", command="rollout", phase="running") == 1
    run.ended = True
    s = scrape(run)
    assert value(s, "fleetctl_run_phase", command="rollout", phase="failed") == 1
    assert value(s, "fleetctl_host_phase", host="spark-03", phase="other") == 1


def test_the_ledgers_hosts_known_good_rotation_floors_and_rollout(tmp_path: Path) -> None:
    make_state(tmp_path)
    inv = inventory.load(str(EXAMPLE_INVENTORY))
    with fleet_ledger.open_ledger(tmp_path) as led:
        led.add_known_good("spark-01", tag=TAG, digest=DIGEST, fingerprint=None, settings=None,
                           source="gate",
                           rollout_id=RID)
        led.mark_out("spark-03", RID, "parked: no rollback: no known-good", {})
        led.mark_out("spark-04", RID, "drained for a restart", {})
    fleet = ui.Fleet(inv, tmp_path)
    s = scrape(metrics_fleet.FleetMetrics(inv, tmp_path, None, fleet.hosts))
    recipe = metrics_fleet.recipes_of(inv)["spark-01"]
    unit = inv.hosts["spark-01"].unit or ""
    assert value(s, "fleetctl_host_info", host="spark-01", recipe=recipe, tag=TAG, digest=DIGEST,
                 unit=unit) == 1
    assert value(s, "fleetctl_host_known_good_info", host="spark-01", tag=TAG, digest=DIGEST,
                 source="gate") == 1
    gate = value(s, "fleetctl_host_last_gate_timestamp_seconds", host="spark-01")
    assert gate is not None and abs(gate - time.time()) < 600
    assert value(s, "fleetctl_host_last_gate_timestamp_seconds", host="spark-02") is None
    assert value(s, "fleetctl_host_in_rotation", host="spark-02") == 1
    assert value(s, "fleetctl_host_in_rotation", host="spark-03") == 0
    assert value(s, "fleetctl_host_parked", host="spark-03") == 1
    assert value(s, "fleetctl_host_parked", host="spark-04") == 0
    pool = [h for h in HOSTS if metrics_fleet.recipes_of(inv).get(h) == recipe]
    assert value(s, "fleetctl_recipe_hosts", recipe=recipe) == len(pool)
    assert value(s, "fleetctl_recipe_hosts_in_rotation", recipe=recipe) == len(
        [h for h in pool if h not in ("spark-03", "spark-04")])
    assert value(s, "fleetctl_recipe_capacity_floor_hosts", recipe=recipe) is not None
    assert value(s, "fleetctl_rollout_status", kind="rollout", status="running") == 1
    assert value(s, "fleetctl_rollout_status", kind="rollout", status="failed") == 0


def test_served_over_http_with_the_parser_reading_it(tmp_path: Path) -> None:
    run = metrics.RunMetrics("watch")
    watch_events(run)
    server = metrics.metrics_server(metrics.registry_of(run), "127.0.0.1", 0)
    try:
        url = metrics.url_of(server)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        with urllib.request.urlopen(url, timeout=30) as r:
            s = parse(r.read().decode())
        assert value(s, "fleetctl_remediations_total", host="spark-02", action="restart",
                     result="healed") == 1
        with pytest.raises(FleetError) as e:
            metrics.metrics_server(metrics.registry_of(run), "127.0.0.1", server.server_port)
        assert "--metrics-port" in (e.value.fix or "")
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(FleetError):
        metrics.metrics_server(metrics.registry_of(run), " ", 0)


def test_the_ui_serves_the_newest_runs_and_the_ledgers_metrics(tmp_path: Path) -> None:
    make_state(tmp_path)
    env = {**os.environ, "FLEETCTL_STATE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetctl.cli.main", "-i", str(EXAMPLE_INVENTORY), "ui",
         "--port", "0", "--metrics-port", "0", "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("metrics on http://127.0.0.1:"), line
        with urllib.request.urlopen(line.split()[2], timeout=30) as r:
            s = parse(r.read().decode())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # The recorded rollout's event log, replayed as the page replays it.
    snap = livemodel.replay(
        next(livemodel.events_dir(tmp_path).glob("*.jsonl")).read_text().splitlines(),
        "rollout").snapshot()
    assert value(s, "fleetctl_run_hosts", command="rollout", state="done") == snap["hosts_done"]
    assert value(s, "fleetctl_host_in_rotation", host="spark-01") == 1


def test_a_long_commands_streams_serve_its_run_and_stop_with_it(tmp_path: Path) -> None:
    """``--metrics-port`` on rollout, rollback, soak, stage and watch: live.streams serves the
    run's metrics (and the fleet's) while the command runs, fed by the events it reports."""
    make_state(tmp_path)
    inv = inventory.load(str(EXAMPLE_INVENTORY))
    err = io.StringIO()
    ctx = Ctx(err=Console(file=err, width=200), metrics_port=0)
    with live.streams(ctx, "rollout", tmp_path, inv) as sink:
        url = err.getvalue().split()[2]
        sink(Event("planned", "", host="spark-01"))
        sink(Event("loading", "", host="spark-01", data={"tag": TAG}))
        with urllib.request.urlopen(url, timeout=30) as r:
            s = parse(r.read().decode())
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert value(s, "fleetctl_host_held", host="spark-01") == 1
    assert value(s, "fleetctl_run_hosts", command="rollout", state="pending") == 1
    assert value(s, "fleetctl_host_in_rotation", host="spark-02") == 1
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)
