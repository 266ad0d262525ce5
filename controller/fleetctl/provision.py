"""Provision hosts: run ``playbooks/provision.yml`` (preflight, docker, container_toolkit).

The core of ``fleetctl provision``: a thin layer over :func:`fleetctl.ansible.run_playbook`
that names the playbook's variables and reads back what the roles reported.
Partial failure is data: the returned :class:`~fleetctl.ansible.PlaybookResult`
holds every host, the failed ones with the preflight's own message.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from fleetctl import facts
from fleetctl.ansible import HostResult, PlaybookResult, run_playbook
from fleetctl.facts import Facts
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
    """Provision the hosts matching ``limit``; ``strict`` makes a next kernel without an nvidia
    module an error.

    ``check``/``diff`` are Ansible's ``--check``/``--diff``: with ``check``
    nothing on the hosts changes and ``changed`` counts what would. ``tags``
    picks roles by name (``("preflight",)`` only checks the hosts).
    """
    return run_playbook(
        PLAYBOOK, inventory, limit=limit, check=check, diff=diff, progress=progress,
        extravars={**(extravars or {}), "preflight_strict": strict}, tags=tags, timeout=timeout,
    )


def host_facts(host: HostResult) -> Facts:
    """The facts the preflight role's probe read on a host (``fleetctl_report.preflight``), as
    :class:`~fleetctl.facts.Facts`; the toolkit as the container_toolkit role left it, when it ran.
    Every fact is None where the host did not get that far."""
    raw = host.reports.get("preflight")
    f = facts.from_json(host.name, raw) if isinstance(raw, dict) else Facts(host.name)
    toolkit = host.reports.get("container_toolkit")
    version = toolkit.get("version") if isinstance(toolkit, dict) else None
    return replace(f, toolkit=str(version)) if version else f
