"""Planning a rollout: which hosts go in which wave, how many may be out of service at once.

Waves are given like Ansible's ``serial``: a list of sizes, each a count or a
percentage of the targeted hosts, the last one repeating until every host has
a wave (``1,25%,100%``). The first wave is the canary: a failure there always
stops the rollout, whatever the failure budget. Nothing here touches a host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetctl.errors import FleetError

#: Canary first, then everybody else.
DEFAULT_WAVES = "1,100%"


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
        raise FleetError(f"{what} {text!r} is not a count or a percentage", fix=f"write {what} as 3 or 25%")
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


def check_options(waves: str | None, max_unavailable: str | None, failure_budget: str | None) -> None:
    """Refuse bad wave, unavailability or budget options (the same rules :func:`build` applies), before
    anything is resolved or any host is contacted."""
    parse_waves(waves)
    parse_size(max_unavailable or "1", "--max-unavailable")
    parse_size(failure_budget or "0", "--failure-budget", allow_zero=True)


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
    #: Why it is deployed: ``image`` (another digest, or nothing serving) or ``settings`` (same image,
    #: another container-settings fingerprint: a recipe-only change).
    reason: str = "image"


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

    def host(self, name: str) -> HostPlan:
        """The plan of one host."""
        for h in self.hosts:
            if h.host == name:
                return h
        raise KeyError(name)


def build(
    *,
    recipe: str,
    image: str,
    requested: str,
    tag: str,
    digest: str,
    pull_ref: str,
    hosts: Sequence[str],
    current: dict[str, tuple[str | None, str | None]],
    waves: str | None = None,
    max_unavailable: str | None = None,
    failure_budget: str | None = None,
    fingerprint: str | None = None,
    current_fingerprints: Mapping[str, str | None] | None = None,
) -> Plan:
    """The plan for ``hosts`` (inventory order), given what each serves now (tag, digest).

    A host needs a step when what it runs differs from the desired container:
    in image digest, or (when ``fingerprint`` is given) in the fingerprint of
    the recipe's rendered container settings (``current_fingerprints``: each
    host's ``fleetctl.fingerprint`` label, None when it has none). Hosts that
    already serve the desired container are kept in the plan as ``skip`` (so a
    resumed or repeated rollout is a no-op for them) but take no wave slot.
    """
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
    mu = parse_size(max_unavailable or "1", "--max-unavailable").of(total)
    budget = parse_size(failure_budget or "0", "--failure-budget", allow_zero=True)
    budget_n = 0 if budget.value == 0 else budget.of(total)
    wave_lists = split_waves(todo, parse_waves(waves))
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
    return Plan(recipe, image, requested, tag, digest, pull_ref, tuple(tuple(w) for w in wave_lists), mu,
                budget_n, tuple(plans))
