"""The lab's front door: a real HAProxy (Debian's package) before the nodes' vLLM port, as a fleet
that serves users has one.

It listens on ``<gateway>:8100`` and balances over every node's ``:8000`` (``leastconn``, health
check ``GET /health`` every second), with its runtime API on the admin socket
``<lab>/run/haproxy.sock``.
``fleetctl lab up`` starts it (and rewrites its config when the nodes change), ``down`` stops it.

Rollouts use it only when the lab's inventory says so: :func:`use_in_inventory` writes (or removes)
``group_vars/all/frontdoor.yml`` with ``fleetctl_front_door`` pointing at this HAProxy, so that the
same traffic can be measured with and without fleetctl driving the door (see docs/frontdoor.md).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from fleetctl.errors import FleetError
from fleetctl.lab import procs
from fleetctl.lab.layout import Layout
from fleetctl.progress import NULL, Event, Progress

#: The port of the front door on the lab's gateway address.
FRONT_DOOR_PORT = 8100
#: The nodes' serving port (every lab recipe's ``port``).
NODE_PORT = 8000
#: HAProxy's backend whose servers are the nodes (named as the inventory names them).
BACKEND = "vllm"


class LabFrontDoor:
    """The lab's HAProxy process and its config."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.dir = layout.root / "frontdoor"
        self.config = self.dir / "haproxy.cfg"
        self.socket = layout.run_dir / "haproxy.sock"
        self.pidfile = layout.run_dir / "haproxy.pid"
        self.log = layout.log_dir / "haproxy.log"

    @property
    def url(self) -> str:
        """Where users' requests go: ``http://<gateway>:8100``."""
        return f"http://{self.layout.gateway}:{FRONT_DOOR_PORT}"

    def running(self) -> bool:
        return procs.read_pid(self.pidfile, str(self.config)) is not None

    def render(self, nodes: Sequence[str]) -> str:
        lay = self.layout
        servers = "\n".join(
            f"  server {n} {lay.node_address(lay.node_index(n))}:{NODE_PORT} check" for n in nodes
        )
        return f"""# Written by `fleetctl lab up` (fleetctl/lab/frontdoor.py); rewritten when the nodes change.
global
  stats socket {self.socket} mode 600 level admin
  stats timeout 30s
  maxconn 4096

defaults
  mode http
  timeout connect 3s
  timeout client 600s
  timeout server 600s
  timeout queue 30s
  # A connection refused by a server that is stopping or loading is tried again on another one.
  option redispatch
  retries 2
  # Servers see users' requests as forwarded (the emulator's EMU_FORWARDED_ERROR_RATE keys on it).
  option forwardfor

frontend fleet
  bind {lay.gateway}:{FRONT_DOOR_PORT}
  default_backend {BACKEND}

backend {BACKEND}
  balance leastconn
  option httpchk GET /health
  http-check expect status 200
  default-server inter 1s fall 2 rise 2
{servers}
"""  # noqa: E501 (data: lines as the program reads them)

    def start(self, nodes: Sequence[str], progress: Progress = NULL) -> None:
        """Start HAProxy before ``nodes`` unless it runs with this config; restart it when the
        nodes changed."""
        exe = shutil.which("haproxy") or (
            "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
        )
        if exe is None:
            raise FleetError("haproxy is not installed (the lab's front door)",
                             fix="run scripts/bootstrap.sh (apt-get install haproxy)")
        text = self.render(nodes)
        self.dir.mkdir(parents=True, exist_ok=True)
        if (
            self.running()
            and self.config.exists()
            and self.config.read_text() == text
            and self.socket.exists()
        ):
            return
        self.stop()
        self.config.write_text(text)
        checked = subprocess.run(
            [exe, "-c", "-f", str(self.config)], capture_output=True, text=True, check=False
        )
        if checked.returncode != 0:
            raise FleetError(f"the lab's HAProxy config {self.config} is refused: "
                             f"{(checked.stderr or checked.stdout).strip()[-300:]}",
                             fix="report it: fleetctl/lab/frontdoor.py renders this config")
        self.socket.unlink(missing_ok=True)
        progress(Event("frontdoor", f"starting HAProxy on {self.url} before {len(nodes)} node(s)"))
        pid = procs.spawn([exe, "-f", str(self.config), "-db"], self.pidfile, self.log)
        procs.wait_until(self.socket.exists, timeout=30, what=f"the lab's HAProxy ({self.url})",
                         fix=f"see {self.log} (`haproxy -c -f {self.config}` checks the config)",
                         alive=lambda: procs.alive(pid))

    def stop(self) -> None:
        procs.stop(self.pidfile, str(self.config))
        self.socket.unlink(missing_ok=True)

    def settings(self) -> dict[str, object]:
        """``fleetctl_front_door`` for the lab's inventory."""
        return {"type": "haproxy", "socket": str(self.socket), "backend": BACKEND}

    def inventory_file(self) -> Path:
        return self.layout.inventory_dir / "group_vars" / "all" / "frontdoor.yml"

    def use_in_inventory(self, on: bool) -> Path:
        """Make rollouts on the lab drive this HAProxy (``on``) or leave it alone; returns the vars
        file."""
        import yaml

        f = self.inventory_file()
        if not on:
            f.unlink(missing_ok=True)
            return f
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f.name + ".tmp")
        tmp.write_text(
            "# Written by fleetctl.lab.frontdoor: rollouts drain and re-admit hosts at the lab's "
            "HAProxy.\n"
            + yaml.safe_dump({"fleetctl_front_door": self.settings()}, sort_keys=False)
        )
        tmp.replace(f)
        return f
