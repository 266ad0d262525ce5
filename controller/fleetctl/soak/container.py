"""Container access over SSH: ``docker logs`` and ``docker inspect`` of the serving container.

The soak uses it to tell a boot failure from a slow load, to name a crash's
cause from the log and to notice a restart during the soak.
"""

from __future__ import annotations

import json
import shlex

from fleetctl import serving, ssh
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.soak.verdict import ContainerState


class DockerOverSSH:
    """:class:`fleetctl.soak.verdict.ContainerAccess` for container ``name`` on ``host``."""

    def __init__(self, host: Host, name: str, timeout: float = 20.0) -> None:
        self.host = host
        self.name = name
        self.timeout = timeout

    def logs(self, tail: int = 50) -> str:
        """The container's last ``tail`` lines, stdout and stderr interleaved."""
        return serving.logs(self.host, self.name, tail, self.timeout)

    def state(self) -> ContainerState:
        """The container's state (``exists=False`` when there is no such container)."""
        fmt = "{{json .State}}\t{{.RestartCount}}\t{{.Config.Image}}"
        r = ssh.docker(self.host, f"docker inspect --format {shlex.quote(fmt)} {shlex.quote(self.name)}",
                    timeout=self.timeout)
        if r.rc != 0:
            err = (r.stderr or r.stdout).strip()
            if "No such" in err or "no such" in err:
                return ContainerState(exists=False, status="absent")
            raise FleetError(f"docker inspect {self.name} failed: {err.splitlines()[-1] if err else r.rc}",
                             host=self.host.name, fix="check that docker runs on the host")
        try:
            raw_state, restarts, image = r.stdout.strip().split("\t")
            s = json.loads(raw_state)
        except ValueError:
            raise FleetError(f"docker inspect {self.name} gave unreadable output: {r.stdout[:200]!r}",
                             host=self.host.name) from None
        running = serving.is_running(s)
        return ContainerState(
            exists=True, running=running, status=str(s.get("Status", "")),
            exit_code=s.get("ExitCode") if not running else None,
            restart_count=int(restarts or 0), started_at=str(s.get("StartedAt", "")), image=image,
        )
