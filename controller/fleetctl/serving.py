"""The serving container on a host: its name, its log, and whether it really serves.

The rollout (``rollout/host.py``) and the soak (``soak/container.py``) both look at this container;
what it is called and how it is read over SSH is decided here once; what ``docker inspect`` says is
parsed by :func:`fleetctl.container.from_inspect` (also for the facts probe's answer). The
``vllm_container`` Ansible module runs ON the hosts, cannot import the controller and keeps its own.
"""

from __future__ import annotations

import json
import shlex

from fleetctl import ssh
from fleetctl.container import Container, from_inspect
from fleetctl.errors import FleetError
from fleetctl.inventory import Host

#: The serving container's name on every host (``fleetctl_container_name`` overrides it).
DEFAULT_CONTAINER = "vllm"


def container_name(host: Host) -> str:
    """The name of the serving container on ``host``."""
    return str(host.vars.get("fleetctl_container_name") or DEFAULT_CONTAINER)


def logs_command(name: str, tail: int) -> str:
    """The shell printing the container's last ``tail`` log lines, stdout and stderr interleaved."""
    return f"docker logs --tail {int(tail)} {shlex.quote(name)} 2>&1"


def logs(host: Host, name: str, tail: int, timeout: float = 30.0) -> str:
    """The container's last ``tail`` log lines over SSH: the soak's own look
    (``soak/container.py``); the rollout reads them through its ``HostOps.logs``."""
    return ssh.docker(host, logs_command(name, tail), timeout=timeout).stdout


#: One round trip: inspect a container and its image's repo digests; prints JSON, or nothing when
#: there is no such container (any other failure, a stopped dockerd, exits 1 with docker's words).
_INSPECT = """c=$(docker inspect --type container {name} 2>&1) || {{ case "$c" in
  *"No such"*|*"no such"*) exit 0 ;; *) printf '%s\\n' "$c" >&2; exit 1 ;; esac; }}
img=$(printf '%s' "$c" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Image"])')
d=$(docker image inspect --format '{{{{json .RepoDigests}}}}' "$img" 2>/dev/null || echo '[]')
printf '{{"c": %s, "d": %s}}' "$c" "$d"
"""


def inspect(host: Host, name: str, timeout: float = 30.0) -> Container | None:
    """The container ``name`` on ``host`` (running or not), or None when there is none."""
    r = ssh.docker(host, _INSPECT.format(name=shlex.quote(name)), timeout=timeout)
    r.check(f"docker inspect {name}", fix="check that docker runs on the host")
    if not r.stdout.strip():
        return None
    try:
        data = json.loads(r.stdout)
        return from_inspect(data["c"][0], data["d"] or [])
    except (ValueError, KeyError, IndexError, TypeError):
        raise FleetError(f"docker inspect {name} gave unreadable output: {r.stdout[:200]!r}",
                         host=host.name) from None


def short_digest(digest: str | None) -> str:
    """``sha256:0123456789abcdef...`` -> ``0123456789ab`` (as ``fleetctl status`` shows a
    digest)."""
    return (digest or "").replace("sha256:", "")[:12]
