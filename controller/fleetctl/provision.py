"""Provision hosts: run ``playbooks/provision.yml`` (preflight, docker, container_toolkit).

The core of ``fleetctl provision``: a thin layer over :func:`fleetctl.ansible.run_playbook`
that names the playbook's variables and reads back what the roles reported.
Partial failure is data: the returned :class:`~fleetctl.ansible.PlaybookResult`
holds every host, the failed ones with the preflight's own message.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from fleetctl.ansible import HostResult, PlaybookResult, run_playbook
from fleetctl.inventory import Inventory
from fleetctl.progress import NULL, Progress

#: The playbook in ``fleetctl.paths.playbooks_dir()``.
PLAYBOOK = "provision"


def provision(
    inventory: Inventory,
    *,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    strict: bool = False,
    progress: Progress = NULL,
    extravars: Mapping[str, Any] | None = None,
    tags: Collection[str] | None = None,
    timeout: int | None = None,
) -> PlaybookResult:
    """Provision the hosts matching ``limit``; ``strict`` makes a next kernel without an nvidia module an error.

    ``check``/``diff`` are Ansible's ``--check``/``--diff``: with ``check``
    nothing on the hosts changes and ``changed`` counts what would. ``tags``
    picks roles by name (``("preflight",)`` only checks the hosts).
    """
    return run_playbook(
        PLAYBOOK, inventory, limit=limit, check=check, diff=diff, progress=progress,
        extravars={**(extravars or {}), "preflight_strict": strict}, tags=tags, timeout=timeout,
    )


@dataclass(frozen=True)
class HostFacts:
    """What the preflight role read on a host (None where the host did not get that far)."""

    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    compute_cap: str | None = None
    docker: str | None = None
    kernel: str | None = None
    next_kernel: str | None = None
    next_kernel_has_nvidia: bool | None = None
    disk_free_gb: float | None = None
    toolkit: str | None = None


def host_facts(host: HostResult) -> HostFacts:
    """The preflight facts of one host's result (``fleetctl_report.preflight``)."""
    raw = host.reports.get("preflight")
    if not isinstance(raw, dict):
        return HostFacts()
    gpu = raw.get("gpu") or {}
    kernel = raw.get("kernel") or {}
    docker = raw.get("docker") or {}
    disk = raw.get("disk") or {}
    toolkit = host.reports.get("container_toolkit")
    return HostFacts(
        gpu=gpu.get("name"), driver=gpu.get("driver"), cuda=gpu.get("cuda"), compute_cap=gpu.get("compute_cap"),
        docker=docker.get("version"), kernel=kernel.get("running"), next_kernel=kernel.get("next"),
        next_kernel_has_nvidia=kernel.get("next_has_nvidia"), disk_free_gb=disk.get("free_gb"),
        toolkit=(toolkit.get("version") if isinstance(toolkit, dict) else None) or raw.get("toolkit_version"),
    )
