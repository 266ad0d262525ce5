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
        r = ssh.docker(self.host, f"docker inspect --format {shlex.quote(INSPECT_FORMAT)} {shlex.quote(self.name)}",
                    timeout=self.timeout)
        if r.rc != 0:
            err = (r.stderr or r.stdout).strip()
            if "No such" in err or "no such" in err:
                return ContainerState(exists=False, status="absent")
            raise FleetError(f"docker inspect {self.name} failed: {err.splitlines()[-1] if err else r.rc}",
                             host=self.host.name, fix="check that docker runs on the host")
        return parse_inspect(r.stdout, self.host.name, self.name)


#: What ``docker inspect --format`` prints for :func:`parse_inspect`: state, restarts, image, labels.
INSPECT_FORMAT = "{{json .State}}\t{{.RestartCount}}\t{{.Config.Image}}\t{{json .Config.Labels}}"


def parse_inspect(stdout: str, host: str, name: str) -> ContainerState:
    """A :class:`ContainerState` from ``docker inspect --format INSPECT_FORMAT`` output."""
    try:
        raw_state, restarts, image, raw_labels = stdout.strip().split("\t")
        s = json.loads(raw_state)
        labels = json.loads(raw_labels) or {}
    except ValueError:
        raise FleetError(f"docker inspect {name} gave unreadable output: {stdout[:200]!r}", host=host) from None
    running = serving.is_running(s)
    return ContainerState(
        exists=True, running=running, status=str(s.get("Status", "")),
        exit_code=s.get("ExitCode") if not running else None,
        restart_count=int(restarts or 0), started_at=str(s.get("StartedAt", "")), image=image,
        # As `fleetctl status` names it: a digest-pinned container's tag is its fleetctl.tag label.
        tag=serving.image_tag(image, labels) or "", digest=serving.image_digest(image, labels, None) or "",
    )
