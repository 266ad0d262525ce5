"""What every host is doing now: reachable, GPU, driver, toolkit, Docker, serving container,
/health.

:func:`probe_fleet` opens one SSH session per host, in parallel, and runs ONE
composite probe there (the facts probe, :mod:`fleetctl.facts`, with ``--serving``:
the same script the preflight role runs, fed on stdin to ``python3 -``), so a
host costs one round trip whatever it reports. A host that does not answer
within the timeout is reported unreachable and never delays the others.
The rollout reuses :func:`probe_fleet` to read what each host serves.

A member of a serving unit gets a second round trip on the same connection: the fabric probe
(``fleetctl.fabric.member_probe_script``), judged by the fabric checks, and once every member
answered, the unit's parity (driver, kernel, DGX OS, Docker, toolkit, image digest against the
head).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetctl import bandwidth, fabric, facts, frontdoor, paths, ssh
from fleetctl.container import Container
from fleetctl.errors import FleetError
from fleetctl.fabric import Finding
from fleetctl.inventory import Host, Inventory, Unit
from fleetctl.progress import NULL, Event, Progress
from fleetctl.state import hoststate
from fleetctl.state import ledger as fleet_ledger

#: Seconds a host gets to answer the whole probe. A dead or frozen host is found sooner: the
#: SSH connection (TCP and banner) has its own bound, ``fleetctl.ssh.DEFAULT_CONNECT_TIMEOUT``.
#: Generous because a loaded host (or a loaded lab machine) can take seconds to run the probe.
DEFAULT_TIMEOUT = 20.0
#: The port vLLM serves on when the host's recipe does not say.
DEFAULT_PORT = 8000


@dataclass(frozen=True)
class FabricStatus:
    """A unit member's fabric and parity as probed: every failed check (none: as the inventory
    says)."""

    findings: tuple[Finding, ...] = ()
    #: Why the fabric probe could not run (the host answered its status probe, not this one).
    error: str | None = None
    #: The unit's last measured all_reduce bus bandwidth (``fleetctl.bandwidth``: busbw_gbs,
    #: floor_gbs, at, method, image, links, findings), None when it was never measured; measured by
    #: a rollout's preflight.
    bandwidth: Mapping[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """The probe ran and every check passed."""
        return self.error is None and not self.findings


@dataclass(frozen=True)
class HostStatus:
    """One host's state as probed; when ``reachable`` is False only ``error`` and ``seconds`` say
    anything."""

    name: str
    address: str
    reachable: bool
    seconds: float
    error: str | None = None
    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    compute_cap: str | None = None
    toolkit: str | None = None
    docker: str | None = None
    docker_running: bool | None = None
    kernel: str | None = None
    next_kernel: str | None = None
    next_kernel_has_nvidia: bool | None = None
    disk_free_gb: float | None = None
    uptime_s: float | None = None
    dgx_release: str | None = None
    container: Container | None = None
    #: HTTP status of ``GET /health`` on the serving port, None when nothing answered.
    health: int | None = None
    health_error: str | None = None
    port: int = DEFAULT_PORT
    #: Facts the probe could not read: name -> reason.
    problems: Mapping[str, str] = field(default_factory=dict)
    #: Who holds the host's fleetctl lock (``rollout ro-... by user@machine (pid N), ...``), None
    #: when free.
    lock: str | None = None
    #: The host's recorded last known-good tag (from its state file), None when none is recorded.
    last_known_good: str | None = None
    #: The serving unit the host is a member of (``fleetctl_unit``), None for a single host.
    unit: str | None = None
    #: Its rank in the unit (0: the head), None for a single host.
    unit_rank: int | None = None
    #: The fabric and parity checks of a unit member (None for a single host or when unreachable).
    fabric: FabricStatus | None = None
    #: The host as the fleet's front door sees it (``admin``, ``healthy``, ``in_flight``,
    #: ``detail``,
    #: ``held_by``: the rollout that drained it and has not re-admitted it); None: no front door.
    front_door: Mapping[str, Any] | None = None
    #: The recipe the host is configured to serve (its ``fleetctl_recipe``).
    recipe: str | None = None
    #: The recipe its container serves as far as it tells: its ``fleetctl.recipe`` label, else
    #: the recipe whose served names its ``/v1/models`` lists; None when neither says.
    served_recipe: str | None = None
    #: The model ids its ``/v1/models`` lists (None: not read; why in ``models_error``).
    served_models: tuple[str, ...] | None = None
    models_error: str | None = None
    #: Why the host serves another recipe than its configured one (None: no drift found).
    drift: str | None = None

    @property
    def healthy(self) -> bool:
        """True when the serving port's ``/health`` answered 200."""
        return self.health == 200


def serving_target(host: Host) -> tuple[str | None, int]:
    """The container name and port the host's recipe serves on (recipe name, port; 8000 by
    default)."""
    recipe = host.vars.get("fleetctl_recipe")
    recipes = host.vars.get("fleetctl_recipes")
    port = DEFAULT_PORT
    if isinstance(recipe, str) and isinstance(recipes, Mapping):
        body = recipes.get(recipe)
        if isinstance(body, Mapping):
            try:
                port = int(body.get("port", DEFAULT_PORT))
            except (TypeError, ValueError):
                port = DEFAULT_PORT
    return (recipe if isinstance(recipe, str) else None), port


def _served_names(recipes: Mapping[str, Any], name: str) -> set[str]:
    body = recipes.get(name)
    names = body.get("served_model_names") if isinstance(body, Mapping) else None
    return {str(n) for n in names} if isinstance(names, list | tuple) else set()


def recipe_of_models(recipes: Mapping[str, Any], models: Sequence[str]) -> str | None:
    """The recipe whose served names ``models`` (a ``/v1/models`` list) share the most with; None
    when no recipe serves any of them."""
    scores = {name: len(_served_names(recipes, name) & set(models)) for name in recipes}
    best = max(scores, key=lambda n: scores[n], default=None)
    return best if best is not None and scores[best] else None


def recipe_drift(configured: str | None, recipes: Mapping[str, Any], container: Container | None,
                 models: Sequence[str] | None) -> tuple[str | None, str | None]:
    """(the recipe the host serves as far as its container tells, why that is not its configured
    one): the container's ``fleetctl.recipe`` label names another recipe, or its ``/v1/models``
    lists none of the configured recipe's served names. (x, None): no drift found (nothing
    serves, or nothing says otherwise)."""
    if container is None:
        return None, None
    label = container.recipe
    by_models = recipe_of_models(recipes, models) if models else None
    served = label or by_models
    if configured is None:
        return served, None
    listed = f"/v1/models: {', '.join(models[:4])}{', ...' if len(models) > 4 else ''}" \
        if models else ""
    if label and label != configured:
        return served, (f"serves {label} (its container's label{'; ' + listed if listed else ''})"
                        f", configured {configured}")
    wanted = _served_names(recipes, configured)
    if models and wanted and not wanted & set(models):
        what = f"serves {by_models}" if by_models else "serves another model"
        return served, f"{what} ({listed}, none of {configured}'s), configured {configured}"
    return served, None


def parse_probe(host: Host, stdout: str, seconds: float, port: int) -> HostStatus:
    """A :class:`HostStatus` from the probe's output (a malformed answer is a FleetError)."""
    return from_facts(host, facts.parse(host.name, stdout), seconds, port)


def from_facts(host: Host, f: facts.Facts, seconds: float, port: int) -> HostStatus:
    """A :class:`HostStatus` of the host's :class:`~fleetctl.facts.Facts` and its state file."""
    problems = dict(f.problems)
    lock = known_good = None
    if f.fleetctl_state is not None:
        try:
            st = hoststate.HostState.from_json(f.fleetctl_state, host.name)
        except FleetError as e:
            problems["fleetctl_state"] = e.cause
        else:
            lock = st.lock.describe() if st.lock else None
            if st.last_known_good:
                known_good = st.last_known_good.tag or st.last_known_good.digest
    configured, _ = serving_target(host)
    recipes = host.vars.get("fleetctl_recipes")
    served, drift = recipe_drift(configured, recipes if isinstance(recipes, Mapping) else {},
                                 f.serving, f.served_models)
    return HostStatus(
        name=host.name, address=host.address, reachable=True, seconds=round(seconds, 3), gpu=f.gpu,
        driver=f.driver, cuda=f.cuda, compute_cap=f.compute_cap, toolkit=f.toolkit, docker=f.docker,
        docker_running=f.docker_running, kernel=f.kernel, next_kernel=f.next_kernel,
        next_kernel_has_nvidia=f.next_kernel_has_nvidia, disk_free_gb=f.disk_free_gb,
        uptime_s=f.uptime_s,
        dgx_release=f.dgx_release, container=f.serving, health=f.health,
        health_error=f.health_error,
        port=port, problems=problems, lock=lock, last_known_good=known_good, unit=host.unit,
        unit_rank=host.unit_rank, recipe=configured, served_recipe=served,
        served_models=f.served_models, models_error=f.models_error, drift=drift,
    )


def probe_host(host: Host, timeout: float = DEFAULT_TIMEOUT) -> HostStatus:
    """Probe one host over SSH (raises :class:`~fleetctl.errors.HostUnreachable` when it does not
    answer)."""
    name, port = serving_target(host)
    argv = facts.argv(serving=(name, port), state_file=hoststate.state_file(host))
    r = ssh.run(
        host,
        argv,
        timeout=timeout,
        connect_timeout=min(timeout, ssh.DEFAULT_CONNECT_TIMEOUT),
        stdin=facts.probe_script(),
        become=True,
    )
    r.check("the status probe", fix="check that python3 runs on the host")
    return parse_probe(host, r.stdout, r.seconds, port)


def probe_fleet(
    inventory: Inventory,
    hosts: Iterable[Host] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Progress = NULL,
) -> dict[str, HostStatus]:
    """Probe ``hosts`` (default: all) in parallel; host name -> :class:`HostStatus`, in inventory
    order.

    Never raises for a host: one that cannot be reached within ``timeout``
    seconds is ``reachable=False`` with the reason in ``error``.
    """
    chosen = list(hosts) if hosts is not None else inventory.select(None)
    facts.probe_script()  # fail once, early, if the probe itself is missing

    def one(h: Host) -> HostStatus:
        progress(Event("probing", host=h.name))
        st = probe_host(h, timeout)
        progress(Event("reachable", host=h.name))
        unit = inventory.unit_of(h.name)
        if unit is not None:
            st = replace(st, fabric=probe_fabric(h, unit, timeout))
        return st

    outcomes = ssh.fan_out(chosen, one, timeout=timeout + 1.0)
    out: dict[str, HostStatus] = {}
    for h in chosen:
        o = outcomes[h.name]
        if o.value is not None:
            out[h.name] = o.value
        else:
            cause = o.error.cause if o.error is not None else "no answer"
            progress(Event("unreachable", cause, host=h.name))
            out[h.name] = HostStatus(
                name=h.name,
                address=h.address,
                reachable=False,
                seconds=round(o.seconds, 3),
                error=cause,
                unit=h.unit,
                unit_rank=h.unit_rank,
                recipe=serving_target(h)[0],
            )
    return with_bandwidth(inventory, with_parity(inventory, out))


def with_bandwidth(
    inventory: Inventory, statuses: Mapping[str, HostStatus]
) -> dict[str, HostStatus]:
    """Each unit member's fabric status with its unit's last measured bandwidth (from the state
    directory)."""
    measured = bandwidth.last(inventory)
    out = dict(statuses)
    for name, st in statuses.items():
        unit = inventory.unit_of(name)
        if unit is not None and unit.name in measured and st.fabric is not None:
            out[name] = replace(st, fabric=replace(st.fabric, bandwidth=measured[unit.name]))
    return out


def probe_fabric(host: Host, unit: Unit, timeout: float = DEFAULT_TIMEOUT) -> FabricStatus:
    """One member's fabric, probed over SSH (one round trip) and judged by
    :func:`fleetctl.fabric.check_member`."""
    r = ssh.run(
        host, ["sh", "-s"], timeout=timeout, stdin=fabric.member_probe_script(unit, host.name)
    )
    if not r.ok and "fleetctl-fabric" not in r.stdout:
        return FabricStatus(
            error=(r.stderr.strip().splitlines() or [f"exit status {r.rc}"])[-1][:200]
        )
    facts = fabric.parse_member_probe(r.stdout)
    return FabricStatus(
        tuple(fabric.check_member(unit, host.name, facts, mgmt_address=host.address))
    )


def parity_facts(st: HostStatus) -> dict[str, str | None]:
    """What members of a unit must agree on, as the status probe read it (see
    fleetctl.fabric.PARITY_FIELDS)."""
    return {
        "driver": st.driver,
        "kernel": st.kernel,
        "dgx_release": st.dgx_release,
        "docker": st.docker,
        "toolkit": st.toolkit,
        "image_digest": st.container.digest if st.container else None,
    }


def with_parity(inventory: Inventory, statuses: Mapping[str, HostStatus]) -> dict[str, HostStatus]:
    """Each probed unit member's fabric status, with the unit's parity findings about it added.

    Parity is judged once every member of the unit answered (an unreachable member makes it
    unknowable); a host without a container is not held to the head's image digest.
    """
    out = dict(statuses)
    for unit in inventory.units.values():
        members = [out[m] for m in unit.members if m in out]
        if len(members) != unit.size or not all(m.reachable for m in members):
            continue
        fields = [
            f
            for f in fabric.PARITY_FIELDS
            if f != "image_digest" or all(m.container for m in members)
        ]
        found = fabric.check_parity(unit, {m.name: parity_facts(m) for m in members}, fields)
        for m in members:
            mine = tuple(f for f in found if f.host == m.name)
            if mine:
                current = m.fabric or FabricStatus()
                out[m.name] = replace(m, fabric=replace(current, findings=current.findings + mine))
    return out


def front_door_view(
    inventory: Inventory, hosts: Iterable[Host]
) -> dict[str, dict[str, Any]] | None:
    """Each host as the inventory's front door sees it, and which ones a rollout holds out (from
    the ledger).

    None when no front door is configured. A door that can read its whole pool at once (HAProxy) is
    read once; another is asked one host at a time, each call bounded by the door's own timeout;
    once it fails, the other hosts get the same cause instead of a wait each.
    """
    door = frontdoor.from_inventory(inventory)
    if door is None:
        return None
    try:
        with fleet_ledger.open_for(inventory, paths.state_dir(inventory.path)) as led:
            held = led.out_of_rotation()
    except FleetError:
        held = {}
    out: dict[str, dict[str, Any]] = {}
    broken: str | None = None
    hosts = list(hosts)
    bulk: dict[str, frontdoor.DoorState] = {}
    if callable(getattr(door, "states", None)):
        # One read of the whole pool (HAProxy: two commands for hundreds of hosts,
        # bench/frontdoor.py floor).
        try:
            bulk = frontdoor.states_of(door, hosts)
        except FleetError as e:
            broken = e.message()
    for h in hosts:
        if broken is None:
            try:
                row = (bulk[h.name] if h.name in bulk else door.state(h)).to_dict()
            except FleetError as e:
                broken = e.message()
        if broken is not None:
            row = {
                "host": h.name,
                "admin": "?",
                "healthy": None,
                "in_flight": None,
                "detail": broken,
            }
        row["door"] = door.kind
        row["held_by"] = held[h.name].rollout_id if h.name in held else None
        out[h.name] = row
    return out
