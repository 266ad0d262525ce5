"""The lab's own Docker engine: a dockerd with every path under the lab directory.

It never touches the machine's default socket, bridge or iptables, so that it
coexists with other labs and with a Docker the machine may already run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from fleetctl.errors import FleetError
from fleetctl.lab import procs
from fleetctl.lab.layout import TRUSTED_REGISTRIES, Layout
from fleetctl.progress import NULL, Event, Progress


class Dockerd:
    """Start, stop and talk to one lab's dockerd."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.dir = layout.engine_dir
        self.pidfile = self.dir / "docker.pid"
        self.log = layout.log_dir / "dockerd.log"

    def env(self) -> dict[str, str]:
        """Environment for the docker CLI: the lab's socket, the classic builder, no user config."""
        env = dict(os.environ)
        env["DOCKER_HOST"] = self.layout.docker_host
        # The Debian 20.10 daemon has no BuildKit front end the 28.x CLI could use.
        env["DOCKER_BUILDKIT"] = "0"
        env["DOCKER_CONFIG"] = str(self.dir / "cli")
        env.pop("DOCKER_CONTEXT", None)
        return env

    def docker(
        self,
        *args: str,
        check: bool = True,
        input: bytes | None = None,
        timeout: float | None = 300,
        what: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the docker CLI against the lab's engine; a FleetError naming ``what`` on failure."""
        try:
            proc = subprocess.run(
                ["docker", *args], env=self.env(), capture_output=True, timeout=timeout,
                input=input, check=False,
            )
        except subprocess.TimeoutExpired:
            raise FleetError(f"`docker {' '.join(args[:3])}` did not finish within {timeout:.0f}s",
                             fix=f"check the lab engine's log {self.log}") from None
        result = subprocess.CompletedProcess(
            proc.args,
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )
        if check and result.returncode != 0:
            detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
            raise FleetError(
                f"{what or 'docker ' + ' '.join(args[:2])} failed: "
                f"{detail[-1] if detail else result.returncode}",
                fix=f"see the lab engine's log {self.log}",
            )
        return result

    def pid(self) -> int | None:
        """The pid of the lab's dockerd if it runs."""
        return procs.read_pid(self.pidfile, str(self.dir))

    def answering(self) -> bool:
        """True when the engine answers on its socket."""
        if not self.layout.docker_sock.exists():
            return False
        try:
            return (
                self.docker(
                    "version", "--format", "{{.Server.Version}}", check=False, timeout=20
                ).returncode
                == 0
            )
        except FleetError:  # timed out: a busy machine, not a verdict
            return False

    def start(self, progress: Progress = NULL) -> None:
        """Start the dockerd if it is not running, and wait until it answers."""
        if self.pid() is not None and self.answering():
            return
        for tool in ("dockerd", "docker", "containerd", "runc"):
            if shutil.which(tool) is None:
                raise FleetError(
                    f"{tool} is not installed",
                    fix="run scripts/bootstrap.sh (apt-get install docker.io)",
                )
        self.layout.check()
        if self.pid() is None:
            (self.dir / "data").mkdir(parents=True, exist_ok=True)
            self.layout.exec_root.mkdir(parents=True, exist_ok=True)
            self.layout.docker_sock.unlink(missing_ok=True)
            progress(Event("engine", f"starting the lab's dockerd on {self.layout.docker_sock}"))
            pid = procs.spawn(self._argv(), self.pidfile, self.log)
        else:
            pid = self.pid() or 0
        procs.wait_until(
            self.answering, timeout=180, what=f"the lab's dockerd ({self.layout.docker_sock})",
            fix=f"see {self.log}", alive=lambda: procs.alive(pid),
        )

    def _argv(self) -> Sequence[str]:
        d = self.dir
        return [
            "dockerd",
            "--data-root", str(d / "data"),
            "--exec-root", str(self.layout.exec_root),
            "--pidfile", str(d / "dockerd.pid"),
            "-H", self.layout.docker_host,
            # The lab makes its own network; no docker0, no NAT, no firewall rules
            # that could disturb other labs or the machine.
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
            "--insecure-registry", TRUSTED_REGISTRIES,
            "--storage-driver", "overlay2",
            "--log-driver", "json-file",
            "--log-opt", "max-size=5m",
        ]

    def stop(self) -> None:
        """Remove every container of the engine, then stop it."""
        # A timeout here must not stop the shutdown: what is left is reported by down().
        with contextlib.suppress(FleetError):
            if self.answering():
                ids = self.docker("ps", "-aq", check=False).stdout.split()
                if ids:
                    self.docker("rm", "-f", "-v", *ids, check=False, timeout=180)
        procs.stop(self.pidfile, str(self.dir), timeout=30)

    def ensure_network(self) -> None:
        """Create the lab's bridge network with its fixed subnet, unless it exists."""
        lay = self.layout
        have = self.docker("network", "ls", "--format", "{{.Name}}").stdout.split()
        if lay.network in have:
            return
        if Path(f"/sys/class/net/{lay.bridge}").exists():
            raise FleetError(
                f"network interface {lay.bridge} for subnet {lay.subnet} already exists: another "
                "lab uses this subnet",
                fix="pick another FLEETCTL_LAB_SUBNET (e.g. 10.78.<k>.0/24) or `fleetctl lab down` "
                    "the other lab",
            )
        self.docker(
            "network", "create", "--driver", "bridge",
            "--subnet", str(lay.subnet), "--gateway", lay.gateway,
            "-o", f"com.docker.network.bridge.name={lay.bridge}",
            "-o", "com.docker.network.bridge.enable_ip_masquerade=false",
            lay.network, what=f"creating the lab network {lay.subnet}",
        )

    def image_exists(self, ref: str) -> bool:
        """True when the engine has image ``ref``."""
        return self.docker("image", "inspect", ref, check=False, timeout=30).returncode == 0
