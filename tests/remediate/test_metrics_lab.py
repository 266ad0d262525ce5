"""A real Prometheus (Debian's ``prometheus``, started here on loopback with its own temp dir, a
free port and a 1 s scrape interval) scrapes ``fleetctl watch --remediate --metrics-port`` while a
lab node is wedged and healed; what it stored is read back through its HTTP query API: the host's
liveness check went fail -> pass and its remediation counter went up. The node is wedged and the
watch stopped as tests/remediate/test_remediate_lab.py does (its ``door`` fixture unwedges every
node after)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fleetctl.lab import wedge
from tests.remediate import test_remediate_lab as remediate_lab
from tests.rollout.test_frontdoor_lab import FLEETCTL

pytestmark = pytest.mark.lab

door = remediate_lab.door
INTERVAL = remediate_lab.INTERVAL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


class Prometheus:
    """A Prometheus server scraping ``target`` every second, its data in ``root``."""

    def __init__(self, root: Path, target: str) -> None:
        tool = shutil.which("prometheus")
        assert tool, "prometheus not found: scripts/bootstrap.sh installs Debian's package"
        root.mkdir(parents=True, exist_ok=True)
        config = root / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "fleetctl", "scrape_interval": "1s",
                                "scrape_timeout": "1s",
                                "static_configs": [{"targets": [target]}]}]}))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = (root / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [tool, f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                get(self.url + "/-/ready")
                break
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, (
                    (root / "prometheus.log").read_text()[-2000:])
                time.sleep(0.5)

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = json.loads(get(self.url + "/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr})))
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def query_range(self, expr: str, start: float, end: float) -> list[float]:
        """The values of ``expr`` (one series) a second apart from ``start`` to ``end``."""
        body = json.loads(get(self.url + "/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"})))
        assert body["status"] == "success", body
        (series,) = body["data"]["result"]
        return [float(v) for _t, v in series["values"]]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def test_prometheus_sees_a_wedged_host_fail_its_check_be_remediated_and_pass(
    door: Any, tmp_path: Path
) -> None:
    host = "spark-02"
    port = free_port()
    prom = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{port}")
    events, err = tmp_path / "events.jsonl", tmp_path / "watch.err"
    scrape = ""
    try:
        start = time.time()
        wedge.apply(host, wedge.WEDGE)
        with err.open("w") as e:
            watch = subprocess.Popen(
                [FLEETCTL, "watch", "--limit", host, "--remediate", "--interval", f"{INTERVAL}s",
                 "--duration", f"{12 * INTERVAL}s", "--gate", "2s", "--events", str(events),
                 "--json", "--metrics-port", str(port)],
                stdout=subprocess.DEVNULL, stderr=e, env=dict(os.environ))
        healed = f'fleetctl_remediations_total{{host="{host}",result="healed"}}'
        passing = f'fleetctl_check_status{{host="{host}",check="liveness",status="pass"}} == 1'
        # The ledger's figures are read at most LEDGER_TTL (5 s) apart: back in rotation after
        # the re-admission, a scrape or a few later.
        back = f'fleetctl_host_in_rotation{{host="{host}"}} == 1'
        # Until Prometheus has the remediation and, after it, a passing liveness check.
        deadline = time.monotonic() + 12 * INTERVAL + 120
        while watch.poll() is None and time.monotonic() < deadline:
            if prom.query(healed) and prom.query(passing) and prom.query(back):
                # A few more scrapes, so that the range read below (a point a second) has the
                # state seen here at its last points; read back to here: once the watch ends,
                # its series go stale.
                time.sleep(3)
                scrape = get(f"http://127.0.0.1:{port}/metrics")
                end = time.time()
                break
            time.sleep(1)
        watch.send_signal(signal.SIGTERM)  # as systemd stops it: it ends with its verdicts
        watch.wait(timeout=300)
        assert scrape, err.read_text()[-3000:]
        total = prom.query_range(f'sum(fleetctl_remediations_total{{host="{host}"}}) or '
                                 "vector(0)", start, end)
        fail = prom.query_range(f'max(fleetctl_check_status{{host="{host}",check="liveness",'
                                f'status="fail"}}) or vector(0)', start, end)
        ok = prom.query_range(f'max(fleetctl_check_status{{host="{host}",check="liveness",'
                              f'status="pass"}}) or vector(0)', start, end)
    finally:
        prom.stop()
    print(scrape)
    rs = [e for e in remediate_lab._events(events) if e["phase"] == "remediation"]
    assert rs and (rs[0]["data"]["action"], rs[0]["data"]["result"]) == ("restart", "healed"), rs
    # The counter went up: none before the remediation, one after.
    assert total[0] == 0 and total[-1] >= 1, total
    # The check went fail -> pass, the pass after the remediation was counted.
    failed_at = fail.index(1.0)
    passed_at = next((i for i in range(failed_at, len(ok)) if ok[i] == 1.0), None)
    assert passed_at is not None, (fail, ok, total)
    assert fail[passed_at] == 0.0 and total[passed_at] >= 1, (fail, ok, total)
    assert f'fleetctl_host_in_rotation{{host="{host}"}} 1.0' in scrape, scrape
