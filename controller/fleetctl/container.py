"""The serving container as ``docker inspect`` shows it: one model and one parser.

The rollout (its current container and the ``.prev`` it keeps), the soak (the container behind an
endpoint, before and after) and ``fleetctl status`` (what each host serves) all read the same
container, so they read it through :func:`from_inspect` into one :class:`Container`. The inspect
object comes from ``docker inspect`` over SSH (:func:`fleetctl.serving.inspect`) or from the facts
probe, which sends it with the env values removed (``roles/preflight/files/spark_facts.py``).
Standard library only: every consumer imports it without pulling in SSH or Ansible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

LABEL_RECIPE, LABEL_TAG, LABEL_DIGEST, LABEL_ROLLOUT, LABEL_IMAGE, LABEL_FINGERPRINT = (
    "fleetctl.recipe",
    "fleetctl.tag",
    "fleetctl.digest",
    "fleetctl.rollout",
    "fleetctl.image",
    "fleetctl.fingerprint",
)


@dataclass(frozen=True)
class Container:
    """A container as Docker sees it (env values never kept); unknown tag, digest, start: None."""

    name: str
    running: bool = False
    #: Docker's ``State.Status`` (``running``, ``exited``, ``restarting``, ...; ``absent``: none).
    status: str = ""
    #: The image reference it was started from (``repo@sha256:...`` when fleetctl started it).
    image: str = ""
    #: The tag it serves: its ``fleetctl.tag`` label, else the reference's ``:tag`` (see image_tag).
    tag: str | None = None
    #: The registry digest (``sha256:...``): ``fleetctl.digest``, else a RepoDigest, else the ref's.
    digest: str | None = None
    #: Docker's container ID: a container replaced under the same name has another.
    id: str = ""
    #: How many times Docker's restart policy restarted it (``RestartCount``).
    restart_count: int = 0
    started_at: str | None = None
    #: The exit code of a container that is not running, else None.
    exit_code: int | None = None
    #: Its ``fleetctl.*`` labels (recipe, tag, digest, rollout, image, fingerprint).
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Redacted settings: image, entrypoint, cmd, env NAMES, binds, network/ipc mode, gpus, restart
    #: policy and every label (what the ledger records of a version it may go back to).
    settings: dict[str, Any] = field(default_factory=dict)
    #: False only for the soak's look at a container that is gone (the rollout and status say None).
    exists: bool = True

    @property
    def recipe(self) -> str | None:
        """The recipe it serves (its ``fleetctl.recipe`` label)."""
        return self.labels.get(LABEL_RECIPE)

    @property
    def rollout(self) -> str | None:
        """The rollout that started it (its ``fleetctl.rollout`` label)."""
        return self.labels.get(LABEL_ROLLOUT)

    @property
    def fingerprint(self) -> str | None:
        """Its ``fleetctl.fingerprint`` label (None on a container fleetctl did not start)."""
        return self.labels.get(LABEL_FINGERPRINT)


def absent(name: str) -> Container:
    """The soak's answer for a container that does not exist."""
    return Container(name=name, status="absent", exists=False)


def is_running(state: Mapping[str, Any]) -> bool:
    """Whether a container whose ``docker inspect`` ``.State`` is ``state`` serves.

    Docker counts a container waiting out its restart policy's back-off as Running, but it serves
    nothing: it crashed, and is not running here.
    """
    return bool(state.get("Running")) and not state.get("Restarting")


def image_tag(image: str, labels: Mapping[str, str]) -> str | None:
    """The tag a container serves: its ``fleetctl.tag`` label, else the ref's ``:tag``.

    The reference is ``repo[:tag][@digest]``; fleetctl starts containers by digest, so the image
    reference alone has no tag (and naive ``:`` splitting would take the
    digest's hex for one); the label records the tag the rollout resolved.
    """
    if labels.get(LABEL_TAG):
        return labels[LABEL_TAG]
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[1] if ":" in name else None


def image_digest(image: str, labels: Mapping[str, str], probed: str | None) -> str | None:
    """The registry digest: ``fleetctl.digest``, else the image reference's, else ``probed``
    (the image's first RepoDigest)."""
    if labels.get(LABEL_DIGEST):
        return labels[LABEL_DIGEST]
    if "@" in image:
        return image.split("@", 1)[1]
    return probed or None


def from_inspect(c: Mapping[str, Any], repo_digests: Sequence[str] = ()) -> Container:
    """One element of ``docker inspect``'s JSON array as a :class:`Container`.

    ``repo_digests``: the ``RepoDigests`` of its image (``repo@sha256:...``), for a container
    started by tag. Env values are dropped here (only their names are kept), whatever was sent.
    """
    cfg = c.get("Config") or {}
    hc = c.get("HostConfig") or {}
    state = c.get("State") or {}
    all_labels = {str(k): str(v) for k, v in (cfg.get("Labels") or {}).items()}
    image = str(cfg.get("Image") or "")
    probed = next((str(d).split("@", 1)[1] for d in repo_digests if "@" in str(d)), None)
    running = is_running(state)
    exit_code = state.get("ExitCode")
    settings = {
        "image": image,
        "entrypoint": cfg.get("Entrypoint"),
        "cmd": cfg.get("Cmd"),
        "env_names": sorted(str(e).split("=", 1)[0] for e in cfg.get("Env") or []),
        "binds": hc.get("Binds"),
        "network_mode": hc.get("NetworkMode"),
        "ipc_mode": hc.get("IpcMode"),
        "gpus": bool(hc.get("DeviceRequests")),
        "restart": (hc.get("RestartPolicy") or {}).get("Name") or "no",
        "labels": all_labels,
    }
    return Container(
        name=str(c.get("Name") or "").lstrip("/"),
        running=running,
        status=str(state.get("Status") or ""),
        image=image,
        tag=image_tag(image, all_labels),
        digest=image_digest(image, all_labels, probed),
        id=str(c.get("Id") or ""),
        restart_count=int(c.get("RestartCount") or 0),
        started_at=state.get("StartedAt") or None,
        exit_code=int(exit_code) if exit_code is not None and not running else None,
        labels={k: v for k, v in all_labels.items() if k.startswith("fleetctl.")},
        settings=settings,
    )
