"""A remediation in the fleet's ledger: one record of kind ``remediate`` per remediation, its host
(and a unit's other members) with each step as a phase, so that ``fleetctl history`` lists it like
a rollout (host, cause, action, result) and ``history ID`` shows its steps.

Its status is ``remediating`` while it runs (not an active rollout's status: a remediation never
blocks a rollout, the host locks order them), then ``completed`` (healed or rolled back) or
``failed`` (parked, or held back). The cause, the check and the action are in its options.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.remediate.policy import Policy
from fleetctl.rollout.session import command_line
from fleetctl.runids import new_run_id
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

KIND = "remediate"
#: The status of a remediation under way.
REMEDIATING = "remediating"


class Record:
    """Writes remediations to ``ledger``."""

    def __init__(self, ledger: fleet_ledger.Ledger) -> None:
        self.ledger = ledger

    @staticmethod
    def new_id(host: str) -> str:
        """``rm-HOST-<UTC time>-<hex>``."""
        return new_run_id("rm", host)

    def start(self, rid: str, h: Host, members: Sequence[str], recipe: Recipe, tag: str,
              digest: str, check: str, cause: str, action: str, policy: Policy) -> None:
        """The remediation begins (before anything is touched)."""
        self.ledger.create(
            rid, kind=KIND, recipe=recipe.name, requested=None, tag=tag or None,
            digest=digest or None, image=recipe.image,
            options={"host": h.name, "check": check, "cause": cause[:500], "action": action,
                     "policy": policy.to_dict()},
            command=command_line(), waves=[list(members)],
            hosts=[{"host": m, "wave": 0, "step": 0, "before_tag": tag or None,
                    "before_digest": digest or None} for m in members],
            status=REMEDIATING)
        for m in members:
            self.ledger.host_phase(rid, m, "breach", cause[:500],
                                   status=fleet_records.IN_PROGRESS)

    def step(self, rid: str, hosts: Sequence[str], phase: str, detail: str) -> None:
        """``hosts`` entered ``phase``."""
        for m in hosts:
            self.ledger.host_phase(rid, m, phase, detail[:500])

    def finish(self, rid: str, result: str, detail: str, ok: bool) -> None:
        """The remediation ended with ``result``."""
        rec = self.ledger.get(rid)
        for hr in rec.hosts:
            self.ledger.host_phase(rid, hr.host, result, detail[:500],
                                   status=fleet_records.DONE if ok else fleet_records.HOST_FAILED,
                                   error=None if ok else detail[:500])
        self.ledger.set_status(rid, fleet_records.COMPLETED if ok else fleet_records.FAILED,
                               None if ok else f"{result}: {detail}"[:1000])
