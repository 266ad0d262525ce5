"""The gate's one check type, the probes that gather its evidence, and the one registry of both.

As in Argo Rollouts' analysis, where every metric provider is one type behind one small
interface, a :class:`Check` is one object: its name, the probes whose evidence it reads, its
parameters (their kinds, and their defaults per soak profile; a recipe overrides them under
``soak.checks.<name>``, validated by ``soak/recipe_soak.py``) and ``evaluate(spec, ctx) ->
CheckResult``, where ``spec`` is the check's configured parameters and limits and ``ctx`` the
:class:`CheckContext` every check gets (the evidence, the config, the baseline, the known-good
reference, the label, the side-by-side answers). A check that ``fleetctl watch`` or the re-gate's
burst judges too gives ``watch`` / ``burst`` (soak/checks/watching.py).

THE registry, with the built-in checks in report order (one line per check), is
``soak/checks/registry.py``; a check registered later (:meth:`Registry.register`) is reported
after them. Adding a check: docs/design.md, "Adding a check".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fleetctl.soak.answerset import ReferenceSet
from fleetctl.soak.checks.evidence import Evidence
from fleetctl.soak.checks.watching import BurstJudge, WatchJudge
from fleetctl.soak.config import CheckSpec, SoakConfig
from fleetctl.soak.verdict import CheckResult, Verdict

#: The profile whose defaults a check's parameters take where it names no values for a profile.
BASE_PROFILE = "spark"


@dataclass(frozen=True)
class CheckContext:
    """What every check's ``evaluate`` reads besides its own spec: one soak's evidence and what it
    is compared with."""

    evidence: Evidence
    config: SoakConfig
    #: The last passing soak of the same recipe and fingerprint (None: none to compare with).
    baseline: Verdict | None = None
    #: Why there is no baseline to compare with, when one was set aside.
    baseline_note: str = ""
    #: The known-good version's reference set (None: a first deploy).
    reference: ReferenceSet | None = None
    #: The version under test, as messages name it (empty: the host's name).
    label: str = ""
    #: The same prompts' answers from a host still on the old version (a rollout's side by side).
    side: ReferenceSet | None = None

    def known_good_label(self) -> str:
        """The known-good version the answers are compared with, as messages name it (empty: a
        first deploy)."""
        known = self.reference or self.side
        return known.label() if known else ""


#: ``evaluate(spec, ctx)``: one check's result from its configured spec and the soak's context.
Evaluate = Callable[[CheckSpec, CheckContext], CheckResult]


@dataclass(frozen=True)
class Probe:
    """A piece of the soak that gathers evidence (a phase, a request set, a state read): it runs
    only when a registered, enabled check names it in ``needs``."""

    name: str
    #: What it gathers, for docs and ``--help``.
    doc: str = ""
    #: It runs whatever the checks need: the soak itself needs what it reads (the served model's
    #: name, its max_model_len).
    always: bool = False


@dataclass(frozen=True)
class Check:
    """One soak check: its name, the probes it needs, its parameters and how it judges."""

    name: str
    evaluate: Evaluate
    #: The probes whose evidence it reads (names of :class:`Probe` s in the registry).
    needs: tuple[str, ...] = ()
    #: Its own parameters and their kinds ("number", "count", "fraction", "counts", "levels",
    #: "classes", "bool", "duration"), beside the limits every check takes.
    params: Mapping[str, str] = field(default_factory=dict)
    #: Default values per profile (its own parameters and any of the common limits); a profile it
    #: does not name takes :data:`BASE_PROFILE`'s.
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Judged in a smoke-only soak (a rollback's quick check) too.
    smoke: bool = False
    #: Its judgement of ``fleetctl watch``'s intervals (None: the watch does not judge it).
    watch: WatchJudge | None = None
    #: Its judgement of the re-gate's burst of load (None: the burst does not judge it).
    burst: BurstJudge | None = None

    def defaults_for(self, profile: str) -> Mapping[str, Any]:
        """The check's default settings in ``profile``."""
        return self.defaults.get(profile, self.defaults.get(BASE_PROFILE, {}))


class Registry:
    """Checks and probes in report order: those it is made with, then those registered since."""

    def __init__(self, probes: Sequence[Probe] = (), checks: Sequence[Check] = ()) -> None:
        self._checks: dict[str, Check] = {}
        self._probes: dict[str, Probe] = {}
        for p in probes:
            self.register_probe(p)
        for c in checks:
            self.register(c)

    def register(self, check: Check) -> Check:
        """Add ``check`` after those registered so far (ValueError: its name is taken, or it
        needs a probe not registered)."""
        if check.name in self._checks:
            raise ValueError(f"soak check {check.name!r} is registered twice")
        missing = [n for n in check.needs if n not in self._probes]
        if missing:
            raise ValueError(f"soak check {check.name!r} needs unregistered probe(s) {missing}")
        self._checks[check.name] = check
        return check

    def register_probe(self, probe: Probe) -> Probe:
        """Add ``probe`` (ValueError: its name is taken)."""
        if probe.name in self._probes:
            raise ValueError(f"soak probe {probe.name!r} is registered twice")
        self._probes[probe.name] = probe
        return probe

    def unregister(self, name: str) -> None:
        """Remove the check ``name`` (KeyError when it is not registered)."""
        del self._checks[name]

    @contextmanager
    def added(self, check: Check, *probes: Probe) -> Iterator[Check]:
        """``check`` (and the new ``probes`` it needs) registered for the ``with`` block only."""
        for p in probes:
            self.register_probe(p)
        try:
            self.register(check)
            try:
                yield check
            finally:
                self.unregister(check.name)
        finally:
            for p in probes:
                del self._probes[p.name]

    def checks(self) -> tuple[Check, ...]:
        """Every registered check, in report order."""
        return tuple(self._checks.values())

    def names(self) -> tuple[str, ...]:
        """The registered checks' names, in report order."""
        return tuple(self._checks)

    def get(self, name: str) -> Check:
        """The check called ``name`` (KeyError when none is)."""
        return self._checks[name]

    def probes(self) -> tuple[Probe, ...]:
        """Every registered probe."""
        return tuple(self._probes.values())

    def needed(self, specs: Mapping[str, CheckSpec],
               judged: Callable[[Check], bool] = lambda c: True) -> frozenset[str]:
        """The probes to run: those the enabled checks of ``specs`` (those ``judged`` keeps)
        need, and those that always run."""
        return frozenset(
            p for c in self._checks.values()
            if c.name in specs and specs[c.name].enabled and judged(c)
            for p in c.needs
        ) | {p.name for p in self._probes.values() if p.always}
