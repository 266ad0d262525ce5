"""What a host is, as the facts probe reads it: one probe, one parser, one :class:`Facts`.

The probe is the preflight role's own file, ``roles/preflight/files/spark_facts.py`` (Python 3
standard library, run on the host from stdin). The role runs it through Ansible for ``fleetctl
provision``; ``fleetctl status`` and the rollout's preflight send its text over SSH
(:func:`probe_script`), each with the options it needs. Whatever ran it, its JSON becomes a
:class:`Facts` here, so that provision, status and the rollout read a host the same way.
The file stays where the role ships it, its one copy: plain ``ansible-playbook`` and the
collection run the role without fleetctl. The controller reads it from the checkout's ``roles/``
(``$FLEETCTL_HOME``), as it finds the playbooks and roles it runs: without them no verb works, so
a second copy inside the package (or a link to keep valid) would buy nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from fleetctl import paths
from fleetctl.container import Container, from_inspect
from fleetctl.errors import FleetError


@dataclass(frozen=True)
class Facts:
    """One host's facts; a fact the probe could not read (or was not asked for) is None.

    Why a fact could not be read is in ``problems`` (the probe's ``errors``: fact -> reason).
    """

    host: str
    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    compute_cap: str | None = None
    gpu_count: int | None = None
    dgx_release: str | None = None
    kernel: str | None = None
    next_kernel: str | None = None
    next_kernel_has_nvidia: bool | None = None
    docker: str | None = None
    docker_running: bool | None = None
    toolkit: str | None = None
    #: Free GB under the probe's ``--path`` (``/opt``, where the weights go).
    disk_free_gb: float | None = None
    uptime_s: float | None = None
    #: The serving container (``--serving``: label ``fleetctl.recipe``, else ``--container``).
    serving: Container | None = None
    #: HTTP status of ``/health`` on the serving port (``--serving``), None when nothing answered.
    health: int | None = None
    health_error: str | None = None
    #: The model ids ``/v1/models`` lists (``--serving``, when /health answered 200); None when
    #: not asked or not answered (why: ``models_error``).
    served_models: tuple[str, ...] | None = None
    models_error: str | None = None
    #: The host's fleetctl state file as stored (``--state-file``), None when absent.
    fleetctl_state: str | None = None
    #: With ``--image``: the image is present; Docker's runtimes; free GB under Docker's root.
    has_image: bool | None = None
    runtimes: tuple[str, ...] | None = None
    image_free_gb: float | None = None
    #: With ``--weights``: weight path -> its stage marker (None: absent, a str: unreadable).
    weights: Mapping[str, object] = field(default_factory=dict)
    #: With ``--inspect``: container name -> the container, None when there is none.
    containers: Mapping[str, Container | None] = field(default_factory=dict)
    #: The container kept as ``.prev`` (the rollout's: from ``containers``), None when none.
    previous: Container | None = None
    #: Each weight set of the rollout's recipe not staged and verified (the rollout's judgement).
    missing_weights: tuple[str, ...] = ()
    problems: Mapping[str, str] = field(default_factory=dict)

    @property
    def nvidia_runtime(self) -> bool:
        """Docker has the ``nvidia`` runtime (the toolkit configured it); needs ``--image``."""
        return self.runtimes is not None and "nvidia" in self.runtimes

    @property
    def gpu_or_why(self) -> str:
        """The GPU's name, else why it could not be read (as a refusal names it)."""
        return self.gpu or f"(nvidia-smi failed: {self.problems.get('gpu', 'not found')})"


@cache
def probe_script() -> str:
    """The probe's source (the preflight role's file, which the role runs itself)."""
    path = paths.roles_dir() / "preflight" / "files" / "spark_facts.py"
    try:
        return path.read_text()
    except OSError as e:
        raise FleetError(
            f"the host probe {path} cannot be read: {e.strerror}",
            fix="reinstall fleetctl or set FLEETCTL_HOME to the checkout",
        ) from None


def _container(raw: object) -> Container | None:
    """A container as the probe sends it (``{"inspect": ..., "repo_digests": [...]}``), or None."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("inspect"), Mapping):
        return None
    return from_inspect(raw["inspect"], [str(d) for d in raw.get("repo_digests") or []])


def _float(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _str(v: object) -> str | None:
    return None if v is None else str(v)


def from_json(host: str, raw: Mapping[str, Any]) -> Facts:
    """The probe's JSON object, decoded (the preflight role's report is), as :class:`Facts`."""
    gpu = raw.get("gpu") or {}
    kernel = raw.get("kernel") or {}
    docker = raw.get("docker") or {}
    disk = raw.get("disk") or {}
    dgx = raw.get("dgx_release") or {}
    serving = raw.get("serving") or {}
    health = serving.get("health") or {}
    models = serving.get("models") or {}
    ids = models.get("ids")
    image = raw.get("image") or {}
    runtimes = image.get("runtimes")
    count = gpu.get("count")
    state = raw.get("fleetctl_state")
    return Facts(
        host=host,
        gpu=_str(gpu.get("name")),
        driver=_str(gpu.get("driver")),
        cuda=_str(gpu.get("cuda")),
        compute_cap=_str(gpu.get("compute_cap")),
        gpu_count=count if isinstance(count, int) else None,
        dgx_release=_str(dgx.get("DGX_PRETTY_NAME") or dgx.get("DGX_NAME")),
        kernel=_str(kernel.get("running")),
        next_kernel=_str(kernel.get("next")),
        next_kernel_has_nvidia=kernel.get("next_has_nvidia"),
        docker=_str(docker.get("version")),
        docker_running=docker.get("running"),
        toolkit=_str(raw.get("toolkit_version")),
        disk_free_gb=_float(disk.get("free_gb")),
        uptime_s=_float(raw.get("uptime_s")),
        serving=_container(serving.get("container")),
        health=health.get("status") if isinstance(health.get("status"), int) else None,
        health_error=_str(health.get("error")),
        served_models=tuple(str(i) for i in ids) if isinstance(ids, list) else None,
        models_error=_str(models.get("error")),
        fleetctl_state=state if isinstance(state, str) else None,
        has_image=bool(image["present"]) if "present" in image else None,
        runtimes=tuple(str(r) for r in runtimes) if isinstance(runtimes, list) else None,
        image_free_gb=_float((image.get("disk") or {}).get("free_gb")),
        weights=dict(raw.get("weights") or {}),
        containers={str(n): _container(c) for n, c in (raw.get("containers") or {}).items()},
        problems={str(k): str(v) for k, v in (raw.get("errors") or {}).items()},
    )


def parse(host: str, stdout: str) -> Facts:
    """The probe's output (its last line is the JSON) as :class:`Facts`; FleetError if none."""
    try:
        raw = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raw = None
    if not isinstance(raw, dict):
        raise FleetError(
            f"the facts probe printed no JSON: {stdout.strip()[:200]!r}",
            host=host,
            fix="check that python3 runs on the host",
        )
    return from_json(host, raw)


def argv(
    *,
    serving: tuple[str | None, int] | None = None,
    state_file: str | None = None,
    image: str | None = None,
    weights: Sequence[str] = (),
    marker: str | None = None,
    inspect: Sequence[str] = (),
) -> list[str]:
    """``python3 -`` and the probe's options (its text goes on stdin: :func:`probe_script`).

    ``serving``: (container name or None, port) for ``--serving``.
    """
    out = ["python3", "-"]
    if serving is not None:
        name, port = serving
        out += ["--serving", "--port", str(port)] + (["--container", name] if name else [])
    if state_file:
        out += ["--state-file", state_file]
    if image:
        out += ["--image", image]
    if marker:
        out += ["--marker", marker]
    for w in weights:
        out += ["--weights", w]
    for n in inspect:
        out += ["--inspect", n]
    return out
