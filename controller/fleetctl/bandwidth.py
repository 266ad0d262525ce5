"""A unit's measured all_reduce bus bandwidth: the probe run in the recipe's image on every member
at once.

:func:`measure` starts ``fleetctl/allreduce_probe.py`` in ``docker run --rm --network host --gpus
all`` from the recipe's image on each member of a unit, in parallel (each member's
``HostOps.bandwidth_probe``: one SSH session, bounded by ``ssh.fan_out``), with the member's fabric
environment as the serving container gets it (``Recipe.launch``: ``NCCL_SOCKET_IFNAME``,
``NCCL_IB_HCA``, ``VLLM_HOST_IP`` ...) and every rank's fabric address.
The head prints the NCCL tests' ``all_reduce_perf`` table (torch.distributed's NCCL all_reduce
where the image has torch and a GPU, else the same ring's traffic over TCP), which
``fleetctl.fabric.parse_all_reduce`` reads and ``check_bandwidth`` judges against the unit's floor
(``fleetctl_fabric_floor_gbs``, a Spark pair's reference by default).

Each measurement is kept per unit in the fleet's state directory (:func:`record`, :func:`last`), for
``fleetctl status`` (the last measured bandwidth of each unit, and when). A rollout's preflight
calls
:func:`measure_units` before any change (``rollout/preflight.py``).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from fleetctl import fabric, paths, ssh
from fleetctl.errors import FleetError
from fleetctl.fabric import Finding
from fleetctl.inventory import Host, Inventory, Unit
from fleetctl.recipes import Recipe

#: The port every rank's probe listens on (its fabric address; the serving container keeps its own
#: ports).
PROBE_PORT = 29590
#: Seconds one member's probe may take (the members wait up to a minute for each other).
PROBE_TIMEOUT = 150.0
#: Where the last measurement of each unit is kept, under the fleet's state directory.
RECORD = "fabric-bandwidth.json"


@dataclass(frozen=True)
class Measurement:
    """One unit's measured bus bandwidth against its floor, and what was found wrong."""

    unit: str
    #: The best bus bandwidth of the table (GB/s): the figure a link's reference is quoted in.
    busbw_gbs: float
    floor_gbs: float
    #: "nccl" (torch.distributed's NCCL all_reduce) or "tcp" (the ring's traffic over TCP).
    method: str
    image: str
    #: When it was measured (ISO 8601, UTC).
    at: str
    seconds: float
    #: Per link: (sender, receiver, GB/s), members by name, slowest first (the TCP probe's).
    links: tuple[tuple[str, str, float], ...] = ()
    findings: tuple[Finding, ...] = ()

    @property
    def ok(self) -> bool:
        """At or above the floor, nothing wrong."""
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; findings as their one-line messages and checks."""
        d = asdict(self)
        d["findings"] = [
            {"host": f.host, "check": f.check, "message": f.message()} for f in self.findings
        ]
        d["links"] = [{"from": a, "to": b, "gbs": g} for a, b, g in self.links]
        d["ok"] = self.ok
        return d


def probe_script() -> str:
    """The probe's source, passed to ``python3 -c`` in the image."""
    return (Path(str(resources.files("fleetctl"))) / "allreduce_probe.py").read_text()


def probe_command(unit: Unit, recipe: Recipe, ref: str, host: str, port: int = PROBE_PORT) -> str:
    """The shell command one member runs: any leftover probe container removed, then the probe as
    rank R."""
    launch = recipe.launch(unit, host)
    name = f"fleetctl-bandwidth-{unit.name}-{launch.rank}"
    argv = [
        "docker",
        "run",
        "--rm",
        "--name",
        name,
        "--network",
        "host",
        "--ipc",
        "host",
        "--gpus",
        "all",
    ]
    for k, v in launch.env.items():
        argv += ["-e", f"{k}={v}"]
    argv += ["--entrypoint", "python3", ref, "-c", probe_script(), "--rank", str(launch.rank),
             "--addrs", ",".join(unit.fabric[m].address for m in unit.members), "--port", str(port)]
    return f"docker rm -f {shlex.quote(name)} >/dev/null 2>&1; {shlex.join(argv)}"


class ProbeOps(Protocol):
    """The probe's run on one member: a slice of the rollout's ``HostOps`` (over SSH:
    :func:`probe_command` run there)."""

    @property
    def host(self) -> Host:
        """The host these operations act on."""
        ...

    def bandwidth_probe(self, unit: Unit, recipe: Recipe, ref: str, timeout: float) -> str:
        """Run this member's rank of the probe in ``ref``; what it printed (the head's: the table).
        Raises a FleetError naming the probe's own last line when it fails."""
        ...


def probe_failure(rc: int, stdout: str, stderr: str) -> str:
    """Why a probe failed, in one line: its last line that is no comment, else its exit status."""
    lines = [ln for ln in (stderr + "\n" + stdout).splitlines()
             if ln.strip() and not ln.startswith("#")]
    return lines[-1].strip()[:300] if lines else f"exit status {rc}"


def measure(inv: Inventory, unit: Unit, recipe: Recipe, ref: str, ops: Callable[[Host], ProbeOps],
            timeout: float = PROBE_TIMEOUT) -> Measurement:
    """Run the probe on every member of ``unit`` at once (``ops(host)``: the member's HostOps) and
    judge the head's table; a member whose probe fails raises one FleetError naming it and the
    probe's own last line."""
    members = [inv.host(m) for m in unit.members]
    t0 = time.monotonic()
    outs = ssh.fan_out(members, lambda h: ops(h).bandwidth_probe(unit, recipe, ref, timeout),
                       timeout=timeout + 10, max_workers=len(members))
    failed = []
    for h in members:
        o = outs[h.name]
        if o.error is not None or o.value is None:
            failed.append((h.name, o.error.cause if o.error is not None else "no answer"))
    if failed:
        who, why = failed[0]
        raise FleetError(
            f"the all_reduce bandwidth probe of unit {unit.name!r} failed in {ref}: {why}",
            host=who,
            fix="fix the member's fabric first (`fleetctl status` lists its findings); the probe "
                "waits "
            f"a minute for every member on port {PROBE_PORT} of its fabric address",
        )
    head = outs[unit.head].value
    assert head is not None
    result = fabric.parse_all_reduce(head)
    by_address = {f.address: m for m, f in unit.fabric.items()}
    return Measurement(
        unit=unit.name, busbw_gbs=round(result.peak_busbw_gbs, 3), floor_gbs=unit.busbw_floor_gbs,
        method="nccl" if "probe: NCCL" in head else "tcp", image=ref,
        at=datetime.now(UTC).isoformat(timespec="seconds"), seconds=round(time.monotonic() - t0, 2),
        links=tuple((by_address.get(a, a), by_address.get(b, b), g) for a, b, g in result.links),
        findings=tuple(fabric.check_bandwidth(unit, result)))


def measure_units(inv: Inventory, units: Sequence[Unit], recipes: Mapping[str, Recipe], ref: str,
                  ops: Callable[[Host], ProbeOps]) -> dict[str, Measurement | FleetError]:
    """:func:`measure` for each unit (``recipes``: unit name -> the recipe it serves), the units in
    parallel;
    each outcome recorded (:func:`record`) when it is a measurement."""
    by_head = {u.head: u for u in units}
    # one call per unit, keyed by its head (the fan-out's bound holds for units as for hosts)
    outs = ssh.fan_out([inv.host(h) for h in by_head],
                       lambda h: measure(inv, by_head[h.name], recipes[by_head[h.name].name], ref,
                                         ops),
                       timeout=PROBE_TIMEOUT + 20)
    got: dict[str, Measurement | FleetError] = {}
    for u in units:
        o = outs[u.head]
        if o.value is not None:
            got[u.name] = o.value
            record(inv, o.value)
        else:
            got[u.name] = o.error if o.error is not None else FleetError("no answer", host=u.head)
    return got


def _path(inv: Inventory) -> Path:
    return paths.state_dir(inv.path) / RECORD


def last(inv: Inventory) -> dict[str, dict[str, Any]]:
    """Unit name -> its last measurement (:meth:`Measurement.to_dict`), from the state directory."""
    try:
        data = json.loads(_path(inv).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def record(inv: Inventory, m: Measurement) -> None:
    """Keep ``m`` as its unit's last measurement."""
    data = last(inv)
    data[m.unit] = m.to_dict()
    paths.private_dir(_path(inv).parent)
    paths.write_private(_path(inv), json.dumps(data, indent=1, sort_keys=True) + "\n")
