"""A rejected build stays rejected: a digest that failed a full gate for a recipe is refused by
later rollouts of that recipe before any host changes, unless the operator retries it
(``fleetctl rollout --retry-rejected``).

Nothing new is stored: a rejection is what the ledger already holds, a host of a rollout of the
recipe whose full gate (the soak after its deploy, or the bake under live traffic) failed on
that digest. :func:`rejections` reads the recent rollouts (bounded: :data:`LOOKBACK`);
``fleetctl history`` shows the rejected digests from the same records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleetctl.errors import FleetError
from fleetctl.state.ledger import Ledger
from fleetctl.state.records import RolloutRecord

#: Rollouts looked back through for a rejection (newest first).
LOOKBACK = 100
#: Characters of the failed gate's summary quoted.
WHY_CHARS = 240


@dataclass(frozen=True)
class Rejection:
    """One digest a recipe's gate failed: where, on which host, and why."""

    recipe: str
    digest: str
    tag: str
    rollout_id: str
    host: str
    why: str

    def describe(self) -> str:
        """One line: the digest, the run that rejected it, the host and the gate's reason."""
        return (f"{self.tag} ({self.digest[:19]}) failed the {self.recipe} gate in rollout "
                f"{self.rollout_id} on {self.host}: {self.why}")


def from_records(records: Iterable[RolloutRecord]) -> list[Rejection]:
    """Every rejection in ``records`` (newest rollout first, one per rollout and digest)."""
    out: list[Rejection] = []
    for r in records:
        if r.kind != "rollout" or not r.recipe:
            continue
        for h in r.hosts:
            v = h.verdict or {}
            digest = h.target_digest or r.digest or ""
            if v.get("outcome") == "fail" and digest and v.get("profile") != "smoke":
                why = str(v.get("summary") or h.error or "the gate failed")
                out.append(Rejection(r.recipe, digest, h.target_tag or r.tag or "?", r.id, h.host,
                                     why if len(why) <= WHY_CHARS else why[:WHY_CHARS - 1] + "…"))
                break
    return out


def rejections(ledger: Ledger, limit: int = LOOKBACK) -> list[Rejection]:
    """The rejections among the ledger's last ``limit`` rollouts."""
    return from_records(ledger.get(i) for i in ledger.ids(kind="rollout", limit=limit))


def refuse(ledger: Ledger, recipe: str, digest: str, tag: str, retry: bool) -> None:
    """Raise, before any host changes, when ``digest`` failed a full gate of ``recipe`` before
    (not with ``retry``)."""
    if retry:
        return
    for rj in rejections(ledger):
        if rj.recipe == recipe and rj.digest == digest:
            raise FleetError(
                f"{tag} ({digest[:19]}) was rejected before: {rj.describe()}; no host was changed",
                fix="roll out another build, or pass --retry-rejected to gate this one again "
                    f"(see `fleetctl history --rollout {rj.rollout_id}`)")
