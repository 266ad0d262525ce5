"""What a rollout command returns: its options, each host's outcome and the run's result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetctl.errors import ExitCode
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.groups import FleetPlan
from fleetctl.state import records as fleet_records


@dataclass(frozen=True)
class Options:
    """What the operator asked for (the CLI's flags)."""

    tag: str | None = None
    recipe: str | None = None
    limit: str | None = None
    waves: str | None = None
    max_unavailable: str | None = None
    #: Hosts kept serving (count or %); None: the inventory's fleetctl_min_available, else 75 %.
    min_available: str | None = None
    failure_budget: str | None = None
    #: Soak length override in seconds (None: the recipe's).
    soak: float | None = None
    #: ``pause`` or ``fail`` on an inconclusive gate.
    on_inconclusive: str = "pause"
    #: Seconds a server may take to become ready (None: the soak config's).
    ready_timeout: float | None = None
    webhook: str | None = None
    dry_run: bool = False
    #: Seconds each wave is watched under live traffic after it is back in rotation (None: the
    #: inventory's fleetctl_bake, else off); see rollout/bake.py.
    bake: float | None = None
    #: Gate a digest a full gate of the recipe rejected before (rollout/rejected.py) again.
    retry_rejected: bool = False
    #: Go on without the hosts of a recipe whose image has no such tag (they are left as they are).
    skip_missing: bool = False
    #: Let the run move hosts to another model than the one they serve (recorded as switches).
    switch_model: bool = False


@dataclass(frozen=True)
class RollbackOptions:
    """What the operator asked a rollback for (``fleetctl rollback``'s flags; an abort's)."""

    #: The tag every selected host goes to (None: each host's last known-good).
    to: str | None = None
    limit: str | None = None
    max_unavailable: str | None = None
    #: The recipe the hosts go back to (None: the one each served that version with).
    recipe_name: str | None = None
    webhook: str | None = None
    #: Only undo the paused or interrupted rollout or rollback (``rollout abort``).
    only_active: bool = False
    min_available: str | None = None


@dataclass(frozen=True)
class HostOutcome:
    """How one host came out of a rollout or rollback."""

    host: str
    wave: int
    status: str
    phase: str
    before_tag: str | None
    before_digest: str | None
    after_tag: str | None
    after_digest: str | None
    #: The gate's verdict in one line, and the checks that did not pass (name: message).
    verdict: str | None = None
    failed_checks: tuple[str, ...] = ()
    artifacts: str | None = None
    error: str | None = None
    #: Seconds spent in each phase (stop, start, ready, soak, rollback, ...).
    timings: Mapping[str, float] = field(default_factory=dict)
    #: The recipe of the host's step, and the one it served before (different: a model switch).
    recipe: str | None = None
    before_recipe: str | None = None


@dataclass(frozen=True)
class RolloutResult:
    """The result of ``rollout``, ``rollout --resume``, ``rollout abort`` or ``rollback``."""

    id: str | None
    kind: str
    status: str
    recipe: str
    tag: str | None
    digest: str | None
    image: str | None
    hosts: tuple[HostOutcome, ...]
    plan: wave_plan.Plan | None = None
    error: str | None = None
    #: Seconds of the whole run and of its prefetch.
    seconds: float = 0.0
    prefetch_seconds: float = 0.0
    #: Seconds each host's prefetch pull took (they run in parallel).
    pull_seconds: Mapping[str, float] = field(default_factory=dict)
    #: Where each host's prefetch got the image: ``registry``, ``relay:<host>`` (the image tree,
    #: through that host's relay), or ``present`` (it had it already).
    pull_via: Mapping[str, str] = field(default_factory=dict)
    wave_seconds: tuple[float, ...] = ()
    #: A dry run's plans of every recipe group, the hosts left out and the switches (``plan`` is
    #: its first group's).
    groups: FleetPlan | None = None

    @property
    def exit_code(self) -> ExitCode:
        """OK when completed (or a dry run); COMPLETED_WITH_FAILURES when failures within the
        budget;
        FAILED when a gate stopped it; INCONCLUSIVE when paused."""
        if self.status in (fleet_records.COMPLETED, "planned"):
            return ExitCode.OK
        if self.status == fleet_records.COMPLETED_WITH_FAILURES:
            return ExitCode.COMPLETED_WITH_FAILURES
        if self.status == fleet_records.PAUSED:
            return ExitCode.INCONCLUSIVE
        return ExitCode.FAILED



def host_outcome(h: fleet_records.HostRecord) -> HostOutcome:
    """A ledger host record as a result row."""
    v = h.verdict or {}
    return HostOutcome(
        host=h.host,
        wave=h.wave,
        status=h.status,
        phase=h.phase,
        before_tag=h.before_tag,
        before_digest=h.before_digest,
        after_tag=h.after_tag,
        after_digest=h.after_digest,
        verdict=v.get("summary"),
        failed_checks=tuple(v.get("failed_checks") or ()),
        artifacts=h.artifacts,
        error=h.error,
        timings=dict(v.get("timings") or {}),
        recipe=h.recipe,
        before_recipe=h.before_recipe,
    )
