"""The image relay is bounded: where it listens, how long it lives, and who removes what is left.

Issue 32, finding 10: a plain-http, unauthenticated pull-through registry listened on 0.0.0.0:5555
of every relaying host for up to an hour, and a SIGKILLed controller (or a failed removal) left it
serving until the next tree prefetch on that host; ``rollback`` and ``rollout abort`` never removed
it. Now it listens on 127.0.0.1 (the host's own pull) and the host's fleet address (the peers'),
stops itself RELAY_LIFETIME after it started, and rollback/abort sweep it.

The start script runs here under sh with stand-ins for docker, getent and the registry (no Docker
daemon needed); the sweep and the rollback run on the simulated fleet.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from fleetctl import inventory
from fleetctl.inventory import Host
from fleetctl.rollout import imagetree
from fleetctl.state import records as fleet_records
from tests.rollout.sim import OK, Killed, SimFleet
from tests.rollout.sim_hostside import Relay
from tests.rollout.test_recovery_harness import HOSTS, INV, B, C, _fleet, _run

REGISTRY = "/fake/registry"
#: docker as the start script uses it: each call's argv in $LOG (words end in \x1f, calls in \x1e);
#: the image's entrypoint + command is the fake registry's; the relay is seen as exited, with a log.
FAKE_DOCKER = f"""#!/bin/sh
printf '%s\\037' "$@" >> "$LOG"; printf '\\036' >> "$LOG"
case "$1 $2" in
  "image inspect") [ "$3" = -f ] && echo "{REGISTRY} serve /etc/docker/registry/config.yml";;
  "inspect -f") echo false;;
  "logs --tail") echo "listen tcp: bind: address already in use";;
esac
exit 0
"""


def _start(tmp: Path, address: str, getent: str = "") -> tuple[subprocess.CompletedProcess[str],
                                                                list[list[str]]]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "getent").write_text(f"#!/bin/sh\nprintf '{getent}'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    log = tmp / "docker.log"
    log.write_text("")
    script = imagetree.start_script(5555, "docker.io/library/registry:2",
                                    "http://10.0.0.100:5000", address)
    r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                            "LOG": str(log)})
    calls = [c.rstrip("\x1f").split("\x1f") for c in log.read_text().split("\x1e") if c]
    return r, calls


def _run_call(calls: list[list[str]]) -> list[str]:
    return next(c for c in calls if c[0] == "run")


@pytest.mark.parametrize(("address", "getent", "bound"), [
    ("10.0.0.5", "", "10.0.0.5"),
    ("fd00::5", "", "[fd00::5]"),
    # a name is resolved on the host, its own name's 127.0.1.1 (Debian's /etc/hosts) passed over
    ("spark-05.lab", "127.0.1.1 STREAM spark-05.lab\\n10.0.0.7 STREAM\\n", "10.0.0.7"),
])
def test_the_relay_listens_on_loopback_and_the_fleet_address_only(
        tmp_path: Path, address: str, getent: str, bound: str) -> None:
    r, calls = _start(tmp_path, address, getent)
    run = _run_call(calls)
    assert not any("0.0.0.0" in w for w in run), run
    assert f"FLEETCTL_RELAY_ADDR={bound}" in run and "FLEETCTL_RELAY_PORT=5555" in run
    assert run[run.index("--network") + 1] == "host"
    # the container's command is SERVE over the image's own entrypoint and command
    i = run.index("--entrypoint")
    assert run[i + 1:i + 5] == ["/bin/sh", "docker.io/library/registry:2", "-c", imagetree.SERVE]
    assert run[i + 5:] == ["relay", REGISTRY, "serve", "/etc/docker/registry/config.yml"]
    # its life, and its expiry for whoever looks (docker ps --filter label=fleetctl.role=...)
    assert f"FLEETCTL_RELAY_LIFETIME={imagetree.RELAY_LIFETIME:.0f}" in run
    expires = int(next(w for w in run if w.startswith("fleetctl.relay-expires=")).split("=")[1])
    assert abs(expires - time.time() - imagetree.RELAY_LIFETIME) < 60
    # a relay that exits at once is one error with its log (the fake says it exited)
    assert r.returncode == 1 and "the relay exited:" in r.stderr
    assert "address already in use" in r.stderr


def test_a_name_resolving_to_loopback_only_starts_no_relay(tmp_path: Path) -> None:
    r, calls = _start(tmp_path, "spark-05", "127.0.1.1 STREAM spark-05\\n")
    assert r.returncode == 1 and not any(c[0] == "run" for c in calls)
    assert "its fleet address spark-05 resolves to no IPv4 address here but loopback" in r.stderr


FAKE_REGISTRY = """#!/bin/sh
echo "$REGISTRY_HTTP_ADDR $*" >> "$LOG"
case "$REGISTRY_HTTP_ADDR" in 10.9.9.9:*) exit 1;; esac
exec sleep 60
"""


def _serve(tmp: Path, address: str, lifetime: int) -> tuple[float, list[str]]:
    """SERVE as the container's first process runs it: seconds until it ended, registries run."""
    reg = tmp / "registry"
    reg.write_text(FAKE_REGISTRY)
    reg.chmod(0o755)
    log = tmp / "registry.log"
    log.write_text("")
    env = {**os.environ, "LOG": str(log), "FLEETCTL_RELAY_ADDR": address,
           "FLEETCTL_RELAY_PORT": "5555", "FLEETCTL_RELAY_LIFETIME": str(lifetime)}
    t0 = time.monotonic()
    subprocess.run(["/bin/sh", "-c", imagetree.SERVE, "relay", str(reg), "serve", "cfg.yml"],
                   env=env, timeout=30, check=False)
    return time.monotonic() - t0, log.read_text().splitlines()


def test_the_relay_serves_both_addresses_and_stops_itself_at_its_lifetime(tmp_path: Path) -> None:
    took, started = _serve(tmp_path, "10.0.0.5", lifetime=3)
    assert sorted(started) == ["10.0.0.5:5555 serve cfg.yml", "127.0.0.1:5555 serve cfg.yml"]
    # No controller needed: the container's shell ends it (the run's own timeout is 30 s). It
    # counts whole seconds of `date +%s`: a lifetime of L ends after more than L - 1 seconds.
    assert took > 2, took
    # a fleet address that is loopback: one registry; one that fails: the relay ends at once
    assert _serve(tmp_path, "127.0.0.1", lifetime=1)[1] == ["127.0.0.1:5555 serve cfg.yml"]
    took, _ = _serve(tmp_path, "10.9.9.9", lifetime=60)
    assert took < 30, took  # ended long before its lifetime: it did not wait for it


SIM_HOSTS = [Host(f"spark-0{i}", f"10.0.0.{i}") for i in range(1, 5)]


def _leave_relay(fleet: SimFleet, h: Host) -> None:
    """A relay a SIGKILLed prefetch left on ``h``."""
    fleet.hosts[h.name].relay = Relay("http://10.0.0.100:5000", 5555)
    fleet.relays[(h.address, 5555)] = h.name


def test_sweep_relays_removes_every_relay_left_and_names_the_hosts_it_could_not_reach() -> None:
    fleet = SimFleet({h.name: "v1" for h in SIM_HOSTS}, {"v1": OK})
    for h in SIM_HOSTS[:3]:
        _leave_relay(fleet, h)
    fleet.hosts["spark-03"].ssh_down = True
    left = imagetree.sweep_relays(SIM_HOSTS, fleet.ops)
    assert list(left) == ["spark-03"] and "SSH session broke" in left["spark-03"]
    assert fleet.relays == {("10.0.0.3", 5555): "spark-03"}
    assert fleet.hosts["spark-01"].relay is None and fleet.hosts["spark-02"].relay is None
    assert imagetree.sweep_relays([], fleet.ops) == {}


@pytest.mark.parametrize("then", ["rollback", "abort", "rollout"])
def test_rollback_abort_and_the_next_rollout_remove_a_relay_a_killed_prefetch_left(
        tmp_path: Path, then: str) -> None:
    fleet = _fleet()
    assert _run(fleet, tmp_path, "rollout", tag=B).status == fleet_records.COMPLETED
    if then == "abort":  # a rollout to C killed halfway: abort has something to undo
        fleet.kill_at = len(fleet.points) + 20
        with pytest.raises(Killed):
            _run(fleet, tmp_path, "rollout", tag=C)
        fleet.revive()
    _leave_relay(fleet, inventory.load(INV).host(HOSTS[1]))
    r = _run(fleet, tmp_path, then, tag=C if then == "rollout" else None)
    assert r.status == fleet_records.COMPLETED, r
    assert fleet.hosts[HOSTS[1]].relay is None and fleet.relays == {}
    assert f"{HOSTS[1]}:relay-remove" in fleet.points


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(url: str, data: bytes | None = None, method: str = "GET") -> urllib.request.Request:
    return urllib.request.Request(url, data=data, method=method, headers={
        "Accept": MANIFEST, "Content-Type": MANIFEST if "/manifests/" in url else "application/x"})


MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


@pytest.mark.skipif(not shutil.which("docker-registry"), reason="needs docker-registry "
                    "(distribution 2.8: scripts/bootstrap.sh installs it)")
def test_the_peers_registry_serves_the_store_the_local_one_filled(tmp_path: Path) -> None:
    """SERVE with the real distribution: the host's relay fills through 127.0.0.1; a peer reading
    the fleet address (127.0.0.2 here) gets the same bytes from the same store, upstream unread."""
    up_port, port = _free_port(), _free_port()
    base = f"http://127.0.0.1:{up_port}/v2/r"
    cfg = tmp_path / "config.yml"
    cfg.write_text("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: /var/empty\n")
    env = {**os.environ, "REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY": str(tmp_path / "up"),
           "REGISTRY_HTTP_ADDR": f"127.0.0.1:{up_port}"}
    upstream = subprocess.Popen(["docker-registry", "serve", str(cfg)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    relay = None
    try:
        _wait(f"http://127.0.0.1:{up_port}/v2/")

        def push(data: bytes) -> tuple[str, int]:
            d = "sha256:" + hashlib.sha256(data).hexdigest()
            started = urllib.request.urlopen(_http(base + "/blobs/uploads/", b"", "POST"))
            loc = started.headers["Location"]
            loc = loc if loc.startswith("http") else f"http://127.0.0.1:{up_port}{loc}"
            sep = "&" if "?" in loc else "?"
            urllib.request.urlopen(_http(f"{loc}{sep}digest={d}", data, "PUT"))
            return d, len(data)

        layer, size = push(os.urandom(1 << 20))
        rootfs = {"rootfs": {"type": "layers", "diff_ids": [layer]}}
        conf, conf_size = push(json.dumps(rootfs).encode())
        manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST, "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json", "size": conf_size,
            "digest": conf}, "layers": [{"size": size, "digest": layer, "mediaType":
                                         "application/vnd.docker.image.rootfs.diff.tar.gzip"}]}
                              ).encode()
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        urllib.request.urlopen(_http(f"{base}/manifests/{digest}", manifest, "PUT"))
        env = {**os.environ, "REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY": str(tmp_path / "relay"),
               "REGISTRY_PROXY_REMOTEURL": f"http://127.0.0.1:{up_port}",
               "FLEETCTL_RELAY_ADDR": "127.0.0.2", "FLEETCTL_RELAY_PORT": str(port),
               "FLEETCTL_RELAY_LIFETIME": "60"}
        relay = subprocess.Popen(["/bin/sh", "-c", imagetree.SERVE, "relay", "docker-registry",
                                  "serve", str(cfg)], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        for addr in ("127.0.0.1", "127.0.0.2"):
            _wait(f"http://{addr}:{port}/v2/")
        # the host's fill (fill_script: each blob asked for once, through 127.0.0.1)
        urllib.request.urlopen(_http(f"http://127.0.0.1:{port}/v2/r/manifests/{digest}")).read()
        urllib.request.urlopen(_http(f"http://127.0.0.1:{port}/v2/r/blobs/{layer}")).read()
        h = layer.split(":")[1]
        _wait_for(tmp_path / f"relay/docker/registry/v2/blobs/sha256/{h[:2]}/{h}/data")
        time.sleep(0.5)
        upstream.terminate()  # from here on, nothing may need the upstream registry
        upstream.wait(timeout=10)
        peer = f"http://127.0.0.2:{port}/v2/r"
        assert json.loads(urllib.request.urlopen(_http(f"{peer}/manifests/{digest}")).read())
        got = urllib.request.urlopen(_http(f"{peer}/blobs/{layer}")).read()
        assert "sha256:" + hashlib.sha256(got).hexdigest() == layer
    finally:
        if relay is not None:
            os.killpg(relay.pid, signal.SIGTERM)
            relay.wait(timeout=10)
        upstream.kill()
        upstream.wait(timeout=10)


def _wait(url: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 15
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)
