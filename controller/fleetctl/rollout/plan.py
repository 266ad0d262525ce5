"""Planning a rollout: which hosts go in which wave, how many may be out of service at once.

Waves are given like Ansible's ``serial``: a list of sizes, each a count or a
percentage of the targeted hosts, the last one repeating until every host has
a wave (``1,25%,100%``). The first wave is the canary: a failure there always
stops the rollout, whatever the failure budget. Nothing here touches a host.

How many hosts a step restarts together is :func:`capacity`'s one rule: an explicit
``--max-unavailable``, else a floor of hosts kept serving (``--min-available``, else the
inventory's ``fleetctl_min_available``, else 75 % of the selected hosts), every step as
large as the floor allows (docs/decisions/0013-capacity-floor.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fleetctl.errors import FleetError

#: Canary first, then everybody else.
DEFAULT_WAVES = "1,100%"
#: Hosts kept serving during a rollout or rollback when neither flag nor inventory says otherwise
#: (Kubernetes' default rolling update keeps 75 % too: maxUnavailable 25 %).
DEFAULT_MIN_AVAILABLE = "75%"
#: The inventory variable (group ``all``) that overrides :data:`DEFAULT_MIN_AVAILABLE` for a fleet.
MIN_AVAILABLE_VAR = "fleetctl_min_available"


@dataclass(frozen=True)
class Size:
    """A count of hosts (``3``) or a share of the targeted hosts (``25%``)."""

    value: int
    percent: bool = False

    def of(self, total: int) -> int:
        """How many hosts this is out of ``total`` (a percentage rounds down, but is at least 1)."""
        if not self.percent:
            return self.value
        return max(1, math.floor(total * self.value / 100))

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


def parse_size(text: str, what: str = "size", allow_zero: bool = False) -> Size:
    """``"3"`` or ``"25%"`` -> :class:`Size`; anything else is a usage error naming ``what``."""
    t = str(text).strip()
    pct = t.endswith("%")
    digits = t[:-1] if pct else t
    if not digits.isdigit():
        raise FleetError(
            f"{what} {text!r} is not a count or a percentage", fix=f"write {what} as 3 or 25%"
        )
    v = int(digits)
    if (v == 0 and not allow_zero) or (pct and v > 100):
        raise FleetError(f"{what} {text!r} is out of range",
                         fix=f"use {'0' if allow_zero else '1'}..N hosts or 1..100%")
    return Size(v, pct)


def parse_waves(text: str | None) -> tuple[Size, ...]:
    """``"1,25%,100%"`` -> sizes; empty or None is the default (canary, then all)."""
    parts = [p for p in (text or DEFAULT_WAVES).replace(" ", "").split(",") if p]
    if not parts:
        raise FleetError("--waves is empty", fix=f"e.g. --waves {DEFAULT_WAVES}")
    return tuple(parse_size(p, "wave size") for p in parts)


@dataclass(frozen=True)
class Capacity:
    """How many of ``total`` selected hosts a step may take out of service at once, and why."""

    total: int
    #: Hosts restarted together in one step (at least 1).
    per_step: int
    #: Hosts kept serving while a step runs (``total - per_step``, never below 0).
    floor: int
    #: ``max-unavailable`` or ``min-available``: which rule set ``per_step``.
    rule: str
    #: The value as given (``2``, ``75%``).
    value: str
    #: Where the value came from: ``flag``, ``inventory`` or ``default``.
    source: str

    def describe(self) -> str:
        """One line for the plan: ``4 at a time, 12 of 16 kept serving (--min-available 75%,
        default)``."""
        origin = {
            "flag": f"--{self.rule} {self.value}",
            "default": f"--{self.rule} {self.value}, default",
            "inventory": f"{MIN_AVAILABLE_VAR} {self.value} in the inventory",
        }[self.source]
        return f"{self.per_step} at a time, {self.floor} of {self.total} kept serving ({origin})"


def capacity(total: int, *, max_unavailable: str | None = None, min_available: str | None = None,
             inventory_min_available: object = None) -> Capacity:
    """The one rule for how many hosts a step restarts together (rollout, rollback, and anything
    else that takes hosts of a fleet out of service in steps).

    ``--max-unavailable`` (a count or a share of ``total``) wins when given. Otherwise a floor of
    hosts stays serving: ``--min-available``, else the inventory's :data:`MIN_AVAILABLE_VAR`, else
    :data:`DEFAULT_MIN_AVAILABLE`; each step takes out as many hosts as the floor allows. A
    percentage floor rounds up (75 % of 10 keeps 8), and still lets one host go when it would keep
    every host (a fleet of 1-3 at 75 %): a rollout moves at least one host. A count floor is the
    operator's exact demand: one that keeps every selected host, or more, is refused. Both flags at
    once are refused.
    """
    if total < 1:
        raise FleetError("no hosts selected", fix="check --limit and the inventory")
    if max_unavailable is not None and min_available is not None:
        raise FleetError(
            f"--max-unavailable {max_unavailable} and --min-available {min_available} both given: "
            "they are two ways of saying the same limit",
            fix="give one: --max-unavailable N (hosts out at once) or --min-available N|P% "
            "(hosts kept serving)",
        )
    if max_unavailable is not None:
        mu = min(total, parse_size(max_unavailable, "--max-unavailable").of(total))
        return Capacity(
            total, mu, total - mu, "max-unavailable", str(max_unavailable).strip(), "flag"
        )
    if min_available is not None:
        text, source, what = str(min_available).strip(), "flag", "--min-available"
    elif inventory_min_available is not None and str(inventory_min_available).strip():
        text, source, what = (
            str(inventory_min_available).strip(),
            "inventory",
            f"inventory variable {MIN_AVAILABLE_VAR}",
        )
    else:
        text, source, what = DEFAULT_MIN_AVAILABLE, "default", "--min-available"
    size = parse_size(text, what)
    if size.percent:
        if size.value >= 100:
            raise FleetError(f"{what} {text} keeps every host serving: no host could be rolled",
                             fix=f"use at most 99% (the default is {DEFAULT_MIN_AVAILABLE})")
        floor = math.ceil(total * size.value / 100)
        per_step = max(1, total - floor)
    else:
        if size.value >= total:
            raise FleetError(
                f"{what} {text} keeps {size.value} host(s) serving, but only {total} are selected: "
                "no host could be rolled",
                fix=f"use at most {total - 1} or a percentage like {DEFAULT_MIN_AVAILABLE}"
                if total > 1
                else "with one host selected, use --max-unavailable 1",
            )
        per_step = total - size.value
    return Capacity(total, per_step, total - per_step, "min-available", text, source)


def check_options(waves: str | None, max_unavailable: str | None, failure_budget: str | None,
                  min_available: str | None = None, total: int | None = None,
                  inventory_min_available: object = None) -> None:
    """Refuse bad wave, unavailability or budget options (the same rules :func:`build` applies),
    before
    anything is resolved or any host is contacted (``total``: the selected hosts, when known)."""
    parse_waves(waves)
    if max_unavailable is not None:
        parse_size(max_unavailable, "--max-unavailable")
    parse_size(failure_budget or "0", "--failure-budget", allow_zero=True)
    if total is not None:
        capacity(total, max_unavailable=max_unavailable, min_available=min_available,
                 inventory_min_available=inventory_min_available)
    elif max_unavailable is not None and min_available is not None:
        capacity(1, max_unavailable=max_unavailable, min_available=min_available)


def split_waves(hosts: Sequence[str], sizes: Sequence[Size]) -> list[list[str]]:
    """Cut ``hosts`` (in order) into waves of the given sizes, the last size repeating."""
    out: list[list[str]] = []
    rest = list(hosts)
    i = 0
    while rest:
        n = sizes[min(i, len(sizes) - 1)].of(len(hosts))
        out.append(rest[:n])
        rest = rest[n:]
        i += 1
    return out


def split_steps(wave: Sequence[str], max_unavailable: int) -> list[list[str]]:
    """Cut a wave into steps of at most ``max_unavailable`` hosts restarted together."""
    n = max(1, max_unavailable)
    return [list(wave[i:i + n]) for i in range(0, len(wave), n)]


@dataclass(frozen=True)
class HostPlan:
    """One host in the plan: its wave and step, what it serves now, and what will happen to it."""

    host: str
    wave: int
    step: int
    current_tag: str | None
    current_digest: str | None
    #: ``deploy``; or ``skip`` when it already serves the target digest with the target settings.
    action: str
    #: Why it is deployed: ``image`` (another digest, or nothing serving) or ``settings`` (same
    #: image, another container-settings fingerprint: a recipe-only change).
    reason: str = "image"


@dataclass(frozen=True)
class Estimate:
    """The expected wall time of a plan's steps: each step waits for its hosts' load, then their
    soak
    (the hosts of one step go in parallel). Pulls come before the first step and are not counted."""

    #: The hosts of each step, in order (the canary's first).
    steps: tuple[tuple[str, ...], ...]
    #: Seconds a host takes from start to ready (the recipe's ``soak.load_time``).
    load_seconds: float
    #: Seconds of a host's soak gate (its sustained phase: ``--soak``, else the recipe's).
    soak_seconds: float
    #: One step (load, then soak) and the whole plan (step after step).
    step_seconds: float
    seconds: float
    #: Where the load and soak figures come from (:func:`learned`).
    basis: str = "load: recipe's load_time; soak: sustained only, no past soaks"


#: A host's step timings (``HostOutcome.timings``) counted as its load: from the drain to /health.
LOAD_TIMINGS = ("drain", "stop", "deploy", "start", "ready")
#: Passed steps needed before the measured medians replace the recipe's figures.
MIN_LEARNED = 3


def learned(verdicts: Sequence[Mapping[str, Any]], load_seconds: float, sustained_seconds: float
            ) -> tuple[float, float, str]:
    """The load and soak seconds a step is expected to take, and their basis.

    From the verdicts of steps that passed before (``Ledger.passed_steps``), when there are at least
    :data:`MIN_LEARNED`: the median load (:data:`LOAD_TIMINGS` added up), and the soak as this run's
    sustained seconds plus the median of what the soak took beyond the sustained seconds it was
    asked for then (readiness, smoke, classes, sweep, probes, the re-admission), so a shorter or
    longer ``--soak`` than last time still counts right. Else the recipe's ``load_time`` and the
    sustained seconds alone, which leave the soak's other phases out.
    """
    loads: list[float] = []
    fixed: list[float] = []
    for v in verdicts:
        t = v.get("timings") or {}
        if "ready" in t:
            loads.append(sum(float(t[k]) for k in LOAD_TIMINGS if k in t))
        if "soak" in t and isinstance(v.get("sustained_s"), (int, float)):
            fixed.append(
                max(0.0, float(t["soak"]) - float(v["sustained_s"])) + float(t.get("readmit", 0.0))
            )
    parts: list[str] = []
    if len(loads) >= MIN_LEARNED:
        load_seconds = statistics.median(loads)
        parts.append(f"load: median of {len(loads)} past steps")
    else:
        parts.append("load: recipe's load_time")
    soak_seconds = float(sustained_seconds)
    if len(fixed) >= MIN_LEARNED:
        soak_seconds += statistics.median(fixed)
        parts.append(f"soak: sustained + median extra of {len(fixed)}")
    else:
        parts.append("soak: sustained only, no past soaks")
    return float(load_seconds), soak_seconds, "; ".join(parts)


@dataclass(frozen=True)
class Plan:
    """A sound plan: the pinned image, the waves, the limits. Printed by ``--dry-run``."""

    recipe: str
    image: str
    requested: str
    tag: str
    digest: str
    pull_ref: str
    waves: tuple[tuple[str, ...], ...]
    max_unavailable: int
    failure_budget: int
    hosts: tuple[HostPlan, ...]
    #: The rule that set ``max_unavailable`` (None for a plan read back from an older ledger).
    capacity: Capacity | None = None
    estimate: Estimate | None = None

    def floor(self) -> int:
        """Hosts of the plan kept in rotation while a step runs: :func:`capacity`'s floor (for a
        plan read
        back from the ledger, which keeps only the step size: the hosts minus the step size)."""
        if self.capacity is not None:
            return self.capacity.floor
        return max(0, len(self.hosts) - self.max_unavailable)

    def steps(self) -> list[list[str]]:
        """Every step in order: the hosts of each wave, ``max_unavailable`` at a time."""
        return [step for w in self.waves for step in split_steps(w, self.max_unavailable)]

    def with_estimate(
        self, load_seconds: float, soak_seconds: float, basis: str | None = None
    ) -> Plan:
        """This plan with its expected wall time (``basis``: where the figures come from,
        :func:`learned`)."""
        steps = tuple(tuple(s) for s in self.steps())
        one = float(load_seconds) + float(soak_seconds)
        est = Estimate(steps, float(load_seconds), float(soak_seconds), one, one * len(steps))
        return replace(self, estimate=replace(est, basis=basis) if basis else est)

    def host(self, name: str) -> HostPlan:
        """The plan of one host."""
        for h in self.hosts:
            if h.host == name:
                return h
        raise KeyError(name)


@dataclass(frozen=True)
class Desired:
    """The container a plan moves its hosts to: the recipe, its image, the tag asked for and the
    one it resolved to, its digest and pull reference, and the fingerprint of the recipe's
    rendered container settings (None: the digest alone decides)."""

    recipe: str
    image: str
    requested: str
    tag: str
    digest: str
    pull_ref: str
    fingerprint: str | None = None


@dataclass(frozen=True)
class Pacing:
    """How a plan paces its hosts: ``--waves``, ``--max-unavailable``, ``--failure-budget``,
    ``--min-available``, and the inventory's floor (``fleetctl_min_available``)."""

    waves: str | None = None
    max_unavailable: str | None = None
    failure_budget: str | None = None
    min_available: str | None = None
    inventory_min_available: object = None


def build(desired: Desired, hosts: Sequence[str],
          current: dict[str, tuple[str | None, str | None]], pacing: Pacing = Pacing(),
          current_fingerprints: Mapping[str, str | None] | None = None) -> Plan:
    """The plan for ``hosts`` (inventory order), given what each serves now (tag, digest).

    A host needs a step when what it runs differs from the desired container:
    in image digest, or (when ``desired.fingerprint`` is given) in the fingerprint of
    the recipe's rendered container settings (``current_fingerprints``: each
    host's ``fleetctl.fingerprint`` label, None when it has none). Hosts that
    already serve the desired container are kept in the plan as ``skip`` (so a
    resumed or repeated rollout is a no-op for them) but take no wave slot.

    The floor (:func:`capacity`) counts every selected host, skipped ones included: they keep
    serving.
    """
    digest, fingerprint = desired.digest, desired.fingerprint
    if not hosts:
        raise FleetError("no hosts to roll out to", fix="check --limit and the inventory")
    fps = current_fingerprints or {}
    reasons: dict[str, str] = {}
    for h in hosts:
        if current.get(h, (None, None))[1] != digest:
            reasons[h] = "image"
        elif fingerprint is not None and fps.get(h) != fingerprint:
            reasons[h] = "settings"
    todo = [h for h in hosts if h in reasons]
    total = len(hosts)
    cap = capacity(total, max_unavailable=pacing.max_unavailable,
                   min_available=pacing.min_available,
                   inventory_min_available=pacing.inventory_min_available)
    mu = cap.per_step
    budget = parse_size(pacing.failure_budget or "0", "--failure-budget", allow_zero=True)
    budget_n = 0 if budget.value == 0 else budget.of(total)
    wave_lists = split_waves(todo, parse_waves(pacing.waves))
    plans: list[HostPlan] = []
    for w, members in enumerate(wave_lists):
        for s, step in enumerate(split_steps(members, mu)):
            for h in step:
                tag_now, dig_now = current.get(h, (None, None))
                plans.append(HostPlan(h, w, s, tag_now, dig_now, "deploy", reasons[h]))
    for h in hosts:
        if h not in todo:
            tag_now, dig_now = current[h]
            plans.append(HostPlan(h, -1, -1, tag_now, dig_now, "skip", "already there"))
    order = list(hosts)
    plans.sort(key=lambda p: order.index(p.host))
    return Plan(
        desired.recipe,
        desired.image,
        desired.requested,
        desired.tag,
        digest,
        desired.pull_ref,
        tuple(tuple(w) for w in wave_lists),
        mu,
        budget_n,
        tuple(plans),
        capacity=cap,
    )
