"""A rollout's or rollback's ledger record as JSON: what ``fleetctl history --json`` prints and what
``fleetctl ui`` shows (one shape for both)."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from fleetctl.rollout.rejected import from_records
from fleetctl.state import records as fleet_records


def history_json(
    rec: fleet_records.RolloutRecord, units: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``units``: host -> its unit's name today (the inventory's; a host of no unit is left out)."""
    units = units or {}
    rejected = from_records([rec])
    return {
        "id": rec.id,
        "kind": rec.kind,
        "what": what(rec),
        "status": rec.status,
        "recipe": rec.recipe,
        "requested": rec.requested,
        "tag": rec.tag,
        "digest": rec.digest,
        "image": rec.image,
        "parent": rec.parent,
        "started_by": rec.started_by,
        "command": rec.command,
        "started_at": _iso(rec.started_at),
        "finished_at": _iso(rec.finished_at),
        "error": rec.error,
        "options": rec.options,
        # The digest this rollout's full gate rejected (later rollouts of the recipe refuse it).
        "rejected": {"digest": rejected[0].digest, "tag": rejected[0].tag,
                     "host": rejected[0].host, "why": rejected[0].why} if rejected else None,
        **({"remediation": remediation(rec)} if rec.kind == "remediate" else {}),
        "waves": [
            {"wave": w.idx + 1, "hosts": list(w.hosts), "status": w.status} for w in rec.waves
        ],
        "hosts": [
            {
                "host": h.host,
                "unit": units.get(h.host),
                "wave": h.wave + 1 if h.wave >= 0 else None,
                "status": h.status,
                "phase": h.phase,
                "recipe": h.recipe,
                "before_recipe": h.before_recipe,
                "switch": h.switch,
                "before": {"tag": h.before_tag, "digest": h.before_digest},
                "after": {"tag": h.after_tag, "digest": h.after_digest},
                "error": h.error,
                "verdict": h.verdict,
                "artifacts": h.artifacts,
                "started_at": _iso(h.started_at),
                "finished_at": _iso(h.finished_at),
            }
            for h in rec.hosts
        ],
    }


#: What a record is, as ``history`` names it.
ROLLBACK, ABORT, REMEDIATION = "rollback", "abort", "remediation"


def what(rec: fleet_records.RolloutRecord) -> str:
    """The ledger's kind, an abort told from a rollback (both are kind ``rollback``): by the
    ``abort`` note an abort leaves, or, in a record older than that note, by its command line."""
    if rec.kind == "remediate":
        return REMEDIATION
    if rec.kind == ROLLBACK and (
        any(p.host is None and p.phase == ABORT for p in rec.phases)
        or re.search(r"\brollout\s+abort\b", rec.command or "")
    ):
        return ABORT
    return rec.kind


def remediation(rec: fleet_records.RolloutRecord) -> dict[str, Any]:
    """A remediation's host, check, cause, action (the last one taken) and result."""
    o = rec.options or {}
    host = o.get("host")
    phases = [p.phase for p in rec.phases if p.host == host]
    action = ("park" if "parked" in phases else "rollback" if "rolling-back" in phases
              else o.get("action"))
    return {"host": host, "check": o.get("check"), "cause": o.get("cause"), "action": action,
            "result": phases[-1] if phases else rec.status}


def remediation_cell(rec: fleet_records.RolloutRecord) -> str:
    """A remediation in one cell of ``history``'s list: host, cause, action and result."""
    r = remediation(rec)
    cause = " ".join(str(r["cause"] or "").split())[:60]
    return f"{r['host']}: {r['check']} ({cause}) -> {r['action']}: {r['result']}"


def _iso(ts: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else None
