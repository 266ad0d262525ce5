"""The lab's controller-side services: its registry (<gw>:5000) and HTTP server (<gw>:8080).

Both are plain processes of the lab (not the distro's services), bound to the
lab network's gateway address only, so that labs on other subnets do not collide.
"""

from __future__ import annotations

import shutil
import socket
import sys
import urllib.error
import urllib.request

from fleetctl.errors import FleetError
from fleetctl.lab import procs
from fleetctl.lab.layout import HTTP_PORT, REGISTRY_PORT, Layout
from fleetctl.progress import NULL, Event, Progress


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(200 <= r.status < 300)
    except (urllib.error.URLError, OSError):
        return False


def _port_free(addr: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


class Registry:
    """Debian's docker-registry (distribution 2.8) with its own config and storage."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.pidfile = layout.run_dir / "registry.pid"
        self.config = layout.registry_dir / "config.yml"
        self.log = layout.log_dir / "registry.log"

    def running(self) -> bool:
        """True when our registry process is alive."""
        return procs.read_pid(self.pidfile, str(self.config)) is not None

    def start(self, progress: Progress = NULL) -> None:
        """Start the registry unless it runs, and wait until it answers ``/v2/``."""
        lay = self.layout
        url = f"http://{lay.registry}/v2/"
        if self.running() and _http_ok(url):
            return
        if shutil.which("docker-registry") is None:
            raise FleetError("docker-registry is not installed",
                             fix="run scripts/bootstrap.sh (apt-get install docker-registry)")
        if not self.running():
            if not _port_free(lay.gateway, REGISTRY_PORT):
                raise FleetError(
                    f"{lay.registry} is already taken by another process",
                    fix="stop it (`systemctl disable --now docker-registry`) or use another subnet",
                )
            (lay.registry_dir / "data").mkdir(parents=True, exist_ok=True)
            self.config.write_text(
                "version: 0.1\n"
                "log:\n  level: warn\n"
                "storage:\n"
                f"  filesystem:\n    rootdirectory: {lay.registry_dir / 'data'}\n"
                "  delete:\n    enabled: true\n"
                f"http:\n  addr: {lay.registry}\n"
                "  headers:\n    X-Content-Type-Options: [nosniff]\n"
            )
            progress(Event("registry", f"starting the lab registry on {lay.registry}"))
            pid = procs.spawn(
                ["docker-registry", "serve", str(self.config)], self.pidfile, self.log
            )
        else:
            pid = procs.read_pid(self.pidfile, str(self.config)) or 0
        procs.wait_until(
            lambda: _http_ok(url),
            timeout=30,
            what=f"the lab registry ({lay.registry})",
            fix=f"see {self.log}",
            alive=lambda: procs.alive(pid),
        )

    def stop(self) -> None:
        """Stop the registry process."""
        procs.stop(self.pidfile, str(self.config))


class WebServer:
    """The HTTP server of ``<lab>/www`` (apt repository and weights mirror)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.pidfile = layout.run_dir / "http.pid"
        self.log = layout.log_dir / "http.log"

    def running(self) -> bool:
        """True when our HTTP server process is alive."""
        return procs.read_pid(self.pidfile, str(self.layout.www)) is not None

    def start(self, progress: Progress = NULL) -> None:
        """Start the server unless it runs, and wait until it answers."""
        lay = self.layout
        url = f"{lay.http_base}/"
        if self.running() and _http_ok(url):
            return
        if not self.running():
            if not _port_free(lay.gateway, HTTP_PORT):
                raise FleetError(f"{lay.gateway}:{HTTP_PORT} is already taken by another process",
                                 fix="stop that process or use another FLEETCTL_LAB_SUBNET")
            lay.www.mkdir(parents=True, exist_ok=True)
            progress(Event("http", f"starting the lab's HTTP server on {lay.http_base}"))
            pid = procs.spawn(
                [sys.executable, "-m", "fleetctl.lab.webserver", "--bind", lay.gateway,
                 "--port", str(HTTP_PORT), "--root", str(lay.www)],
                self.pidfile, self.log,
            )
        else:
            pid = procs.read_pid(self.pidfile, str(self.layout.www)) or 0
        procs.wait_until(
            lambda: _http_ok(url),
            timeout=30,
            what=f"the lab's HTTP server ({lay.http_base})",
            fix=f"see {self.log}",
            alive=lambda: procs.alive(pid),
        )

    def stop(self) -> None:
        """Stop the HTTP server."""
        procs.stop(self.pidfile, str(self.layout.www))
