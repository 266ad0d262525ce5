"""The serving container on a host: its name, its log, and whether it really serves.

The rollout (``rollout/host.py``) and the soak (``soak/container.py``) both look at this container;
what it is called and how its state is read is decided here once. The copies that run ON the hosts
(the ``vllm_container`` Ansible module and the ``spark_facts`` probe) cannot import the controller
and keep their own, saying so.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from fleetctl import ssh
from fleetctl.inventory import Host

#: The serving container's name on every host (``fleetctl_container_name`` overrides it).
DEFAULT_CONTAINER = "vllm"


def container_name(host: Host) -> str:
    """The name of the serving container on ``host``."""
    return str(host.vars.get("fleetctl_container_name") or DEFAULT_CONTAINER)


def is_running(state: Mapping[str, Any]) -> bool:
    """Whether a container whose ``docker inspect`` ``.State`` is ``state`` serves.

    Docker counts a container waiting out its restart policy's back-off as Running, but it serves
    nothing: it crashed, and is not running here.
    """
    return bool(state.get("Running")) and not state.get("Restarting")


def logs_command(name: str, tail: int) -> str:
    """The shell printing the container's last ``tail`` log lines, stdout and stderr interleaved."""
    return f"docker logs --tail {int(tail)} {shlex.quote(name)} 2>&1"


def logs(host: Host, name: str, tail: int, timeout: float = 30.0) -> str:
    """The container's last ``tail`` log lines over SSH: the soak's own look
    (``soak/container.py``); the rollout reads them through its ``HostOps.logs``."""
    return ssh.docker(host, logs_command(name, tail), timeout=timeout).stdout


def image_tag(image: str, labels: Mapping[str, str]) -> str | None:
    """The tag a container serves: its ``fleetctl.tag`` label, else the ``:tag`` of ``repo[:tag][@digest]``.

    fleetctl starts containers by digest (``repo@sha256:...``), so the image
    reference alone has no tag (and naive ``:`` splitting would take the
    digest's hex for one); the label records the tag the rollout resolved.
    """
    if labels.get("fleetctl.tag"):
        return labels["fleetctl.tag"]
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[1] if ":" in name else None


def image_digest(image: str, labels: Mapping[str, str], probed: str | None) -> str | None:
    """The registry digest: the ``fleetctl.digest`` label, else the probed RepoDigest, else the reference's."""
    if labels.get("fleetctl.digest"):
        return labels["fleetctl.digest"]
    if probed:
        return probed
    return image.split("@", 1)[1] if "@" in image else None


def short_digest(digest: str | None) -> str:
    """``sha256:0123456789abcdef...`` -> ``0123456789ab`` (as ``fleetctl status`` shows a digest)."""
    return (digest or "").replace("sha256:", "")[:12]
