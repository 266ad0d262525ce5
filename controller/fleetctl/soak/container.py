"""Container access over SSH: ``docker logs`` and ``docker inspect`` of the serving container.

The soak uses it to tell a boot failure from a slow load, to name a crash's cause
from the log and to notice a restart during the soak. The container is read as the
rollout and ``fleetctl status`` read it (:func:`fleetctl.serving.inspect`).
"""

from __future__ import annotations

from fleetctl import container, serving
from fleetctl.container import Container
from fleetctl.inventory import Host


class DockerOverSSH:
    """:class:`fleetctl.soak.verdict.ContainerAccess` for container ``name`` on ``host``."""

    def __init__(self, host: Host, name: str, timeout: float = 20.0) -> None:
        self.host = host
        self.name = name
        self.timeout = timeout

    def logs(self, tail: int = 50) -> str:
        """The container's last ``tail`` lines, stdout and stderr interleaved."""
        return serving.logs(self.host, self.name, tail, self.timeout)

    def state(self) -> Container:
        """The container's state (``exists=False`` when there is no such container)."""
        c = serving.inspect(self.host, self.name, self.timeout)
        return c if c is not None else container.absent(self.name)
