"""``fleetctl status`` on the lab: every node as it is, a serving container, a paused node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from fleetctl import inventory as inv
from fleetctl import lab as fleetlab
from fleetctl import ssh
from fleetctl.ansible import PlaybookResult
from fleetctl.status import probe_fleet

pytestmark = pytest.mark.lab

# A stand-in serving container: answers /health with 200 on :8000 of the host's network.
HEALTH_SERVER = (
    "import http.server\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200 if self.path == '/health' else 404); self.end_headers()\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer(('0.0.0.0', 8000), H).serve_forever()\n"
)


def _fleetctl_containers(host: inv.Host) -> dict[str, bool]:
    """The host's fleetctl-labelled containers, read with the docker CLI: name -> running."""
    out = (
        ssh.docker(
            host,
            [
                "docker",
                "ps",
                "-a",
                "--filter",
                "label=fleetctl.recipe",
                "--format",
                "{{.Names}} {{.State}}",
            ],
            timeout=60,
        )
        .check("listing the fleetctl containers")
        .stdout
    )
    return {
        name: state == "running"
        for name, state in (line.split() for line in out.splitlines() if line.strip())
    }


def _health_code(host: inv.Host) -> int | None:
    """What :8000/health answers on the host itself (None when nothing answers)."""
    out = ssh.run(
        host,
        "curl -s -o /dev/null -m 5 -w '%{http_code}' http://127.0.0.1:8000/health || true",
        timeout=30,
    ).stdout.strip()
    return int(out) if out.isdigit() and out != "000" else None


@pytest.fixture
def serving_stand_in(
    provisioned: PlaybookResult, lab: fleetlab.LabStatus
) -> Iterator[tuple[str, str]]:
    """A labelled container on the last node serving /health; removed afterwards. Yields (host,
    image ref).

    A lab reused from earlier work (a demo, a rollback, a killed session) may serve on that
    node already: its running fleetctl containers are stopped for the test (the port is the
    host's) and started again afterwards, so the node is left as it was found.
    """
    inventory = inv.load(lab.inventory)
    host = inventory.host(list(provisioned.hosts)[-1])
    image = str(inventory.vars["container_toolkit_verify_image"])
    name = "fleetctl-status-test"
    ssh.docker(host, ["docker", "rm", "-f", name], timeout=60)
    paused = [n for n, running in _fleetctl_containers(host).items() if running]
    if paused:
        ssh.docker(host, ["docker", "stop", "-t", "10", *paused], timeout=120).check(
            "stopping the node's own serving"
        )
    try:
        ssh.docker(host, [
            "docker", "run", "-d", "--name", name, "--network", "host",
            "--label", "fleetctl.recipe=status-test", "--label", "fleetctl.tag=test-tag",
            "--label", "fleetctl.digest=sha256:" + "ab" * 32, "--label", "fleetctl.rollout=r-test",
            image, "python3", "-c", HEALTH_SERVER,
        ], timeout=120).check("starting the stand-in serving container")
        ssh.run(
            host,
            "for i in $(seq 50); do curl -fsS -o /dev/null http://127.0.0.1:8000/health && exit 0; "
            "sleep 0.2; done; exit 1",
            timeout=30,
        ).check("waiting for the stand-in's /health")
        yield host.name, image
    finally:
        ssh.docker(host, ["docker", "rm", "-f", name], timeout=60)
        if paused:
            ssh.docker(host, ["docker", "start", *paused], timeout=120).check(
                "starting the node's own serving again"
            )


def test_status_shows_every_node_as_it_is(provisioned: PlaybookResult, lab: fleetlab.LabStatus,
                                          serving_stand_in: tuple[str, str]) -> None:
    inventory = inv.load(lab.inventory)
    statuses = probe_fleet(inventory, [inventory.host(n) for n in provisioned.hosts])
    assert list(statuses) == list(provisioned.hosts)
    serving_host, image = serving_stand_in
    for name, st in statuses.items():
        assert st.reachable, st.error
        assert (st.gpu, st.driver, st.cuda, st.compute_cap) == (
            "NVIDIA GB10",
            "580.95.05",
            "13.0",
            "12.1",
        )
        assert st.toolkit == "1.18.0-1"
        assert st.docker is not None and int(st.docker.split(".")[0]) >= 25 and st.docker_running
        assert st.uptime_s is not None and st.uptime_s > 0
        assert st.dgx_release == "NVIDIA DGX Spark"
        if name == serving_host:
            c = st.container
            assert c is not None and c.running and c.name == "fleetctl-status-test"
            # The rollout's fleetctl.tag label names the served tag (containers run by digest have
            # none in their reference); it wins over the reference's own :tag.
            assert c.image == image and c.tag == "test-tag" != image.rsplit(":", 1)[1]
            assert (
                c.recipe == "status-test"
                and c.rollout == "r-test"
                and c.labels["fleetctl.tag"] == "test-tag"
            )
            assert c.digest == "sha256:" + "ab" * 32
            assert st.health == 200 and st.healthy
        else:
            # The other nodes are as the session found them: nothing, or what a rollout left.
            host = inventory.host(name)
            found = _fleetctl_containers(host)
            if not found:
                assert st.container is None
            else:
                c = st.container
                assert c is not None and c.name in found
                # The running one is the serving one; only when none runs is a stopped one shown.
                assert c.running == any(found.values()) == found[c.name]
            code = _health_code(host)
            assert st.health == code and (code is not None or st.health_error)


def test_a_paused_node_is_unreachable_and_does_not_hold_up_the_others(
        provisioned: PlaybookResult, lab: fleetlab.LabStatus,
        lab_fault: Callable[..., AbstractContextManager[fleetlab.LabNode]]) -> None:
    inventory = inv.load(lab.inventory)
    hosts = [inventory.host(n) for n in provisioned.hosts]
    paused = hosts[1].name
    ssh.close_all()
    with lab_fault(paused, paused=True):
        # The frozen node is found by the SSH connect bound (5 s), not by this overall timeout,
        # which is generous so that a loaded CI machine never makes a healthy node look dead.
        statuses = probe_fleet(inventory, hosts, timeout=30.0)
    assert not statuses[paused].reachable and statuses[paused].error
    assert all(st.reachable for n, st in statuses.items() if n != paused)


def test_status_cli_prints_json(provisioned: PlaybookResult, lab: fleetlab.LabStatus) -> None:
    env = {**os.environ, "FLEETCTL_INVENTORY": str(lab.inventory)}
    names = list(provisioned.hosts)
    p = subprocess.run(
        [sys.executable, "-m", "fleetctl.cli.main", "status", "--json", "--limit", ",".join(names)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert list(data) == names
    assert all(v["reachable"] and v["gpu"] == "NVIDIA GB10" for v in data.values())
