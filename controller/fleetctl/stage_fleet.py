"""``fleetctl stage`` without ``--recipe``: every selected host's OWN recipe staged, in one command.

A fleet that serves several models gives each host its recipe with ``fleetctl_recipe`` in its
host_vars or group_vars (a unit's in the unit's group). The hosts are grouped by that recipe and
each group is staged as ``fleetctl stage --recipe R`` stages it (:mod:`fleetctl.stage`): its own
seed fetching each set once, its own tree of copies among the group's hosts. Every recipe is
checked (it exists, its revisions are pinned, the source can serve it) before any host is touched;
the groups then run one after another under one hold of the fleet's lock, with one run id and
one progress stream, so that the controller's Ansible forks stay one run's. A group failing never
stops the next: each host's outcome is data in the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Inventory
from fleetctl.progress import NULL, Event, Progress
from fleetctl.recipes import hosts_by_recipe
from fleetctl.runids import new_run_id
from fleetctl.stage import (
    HostStage,
    SshStaging,
    StageJob,
    StageOptions,
    StageResult,
    StagingOps,
    fleet_lock,
    prepare,
    run_job,
)


@dataclass(frozen=True)
class FleetStage:
    """The outcome of ``fleetctl stage`` without ``--recipe``: one :class:`StageResult` per
    recipe (in the order of its first host)."""

    run_id: str
    recipes: Mapping[str, StageResult]
    elapsed: float

    @property
    def ok(self) -> bool:
        """True when every host has its own recipe's weights in place."""
        return all(r.ok for r in self.recipes.values())

    @property
    def hosts(self) -> dict[str, HostStage]:
        """Every host's staging, whichever its recipe."""
        return {n: h for r in self.recipes.values() for n, h in r.hosts.items()}

    @property
    def failed_hosts(self) -> list[str]:
        """The hosts whose weights are not (all) in place."""
        return [n for r in self.recipes.values() for n in r.failed_hosts]

    def recipe_of(self, host: str) -> str | None:
        """The recipe staged on ``host`` (None when it was not selected)."""
        return next((name for name, r in self.recipes.items() if host in r.hosts), None)


def plan(inventory: Inventory, hosts: list[Host], source: str | None = None,
         local_dir: str | Path | None = None) -> dict[str, tuple[StageJob, list[Host]]]:
    """Each recipe the hosts serve, checked, with its hosts; a recipe that cannot be staged is
    refused naming the hosts configured to serve it (nothing is touched)."""
    out: dict[str, tuple[StageJob, list[Host]]] = {}
    for name, members in hosts_by_recipe(inventory, hosts).items():
        try:
            job = prepare(inventory, name, source, local_dir)
        except FleetError as e:
            who = ", ".join(h.name for h in members[:8]) + (" ..." if len(members) > 8 else "")
            raise FleetError(f"{who} (fleetctl_recipe {name}): {e.cause}",
                             host=members[0].name, fix=e.fix) from None
        out[name] = (job, members)
    return out


def stage_each(
    inventory: Inventory,
    *,
    limit: str | None = None,
    source: str | None = None,
    local_dir: str | Path | None = None,
    headroom_gb: float | None = None,
    checksums: bool = False,
    progress: Progress = NULL,
    run_id: str | None = None,
    extravars: Mapping[str, Any] | None = None,
    timeout: int | None = None,
    ops: Callable[[Host], StagingOps] = SshStaging,
) -> FleetStage:
    """Stage each host matching ``limit`` with its own recipe (see the module's docstring); the
    options are :func:`fleetctl.stage.stage`'s, applied to every recipe."""
    hosts = inventory.select(limit)
    groups = plan(inventory, hosts, source, local_dir)
    run_id = run_id or new_run_id("stage")
    opts = StageOptions(headroom_gb, checksums, progress, extravars, timeout, ops)
    runs = paths.state_dir(inventory.path) / "runs" / run_id / "ansible"
    t0 = time.monotonic()
    out: dict[str, StageResult] = {}
    with fleet_lock(inventory, run_id) as keys:
        for i, (name, (job, members)) in enumerate(groups.items(), start=1):
            progress(Event("recipe", f"{name} on {len(members)} host(s) "
                                     f"({i} of {len(groups)} recipes)",
                           data={"recipe": name, "hosts": [h.name for h in members]}))
            out[name] = run_job(inventory, job, members, limit=",".join(h.name for h in members),
                                run_id=run_id, keys=keys, opts=opts,
                                artifacts_dir=runs / f"stage-{name}")
    return FleetStage(run_id=run_id, recipes=out, elapsed=round(time.monotonic() - t0, 3))


__all__ = ["FleetStage", "plan", "stage_each"]
