"""Known-good reference sets in the fleet's ledger, beside the throughput baselines.

Each passing full soak records its reference set (``soak/answerset.py``: the greedy answers of the
fixed prompts, with the version, digest, tag, recipe and soak config that produced them) as its
recipe's newest known-good; the next soak of that recipe is compared with it
(``soak/checks/known_good.py``). Sets are per recipe, and per hardware class where a host's
``fleetctl_hardware`` says its hardware differs (greedy numerics differ between GPUs).

They live in the ledger's ``baselines`` table (either backend: the SQLite file, or the PostgreSQL
database a team shares) under the key ``refs:RECIPE`` (``refs:RECIPE@HARDWARE``) and the tag
:data:`TAG`: one row holding the last :data:`KEEP` sets, newest last, read and written in one
transaction like a baseline window, pinned and reset by ``fleetctl soak baseline`` the same way.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.soak.answerset import ReferenceSet
from fleetctl.soak.baselines import Store
from fleetctl.soak.verdict import Outcome, Verdict, from_dict, to_dict
from fleetctl.state.records import BaselineRow

#: The tag column of a reference-set row (a baseline row's holds an image tag).
TAG = "known-good answers"
#: Sets a row keeps (the newest is the known-good; older ones for `baseline show` and audits).
KEEP = 5
PREFIX = "refs:"


def key(recipe: str, hardware: str = "") -> str:
    """The ledger key of ``recipe``'s reference sets (on ``hardware``, when hosts differ)."""
    return f"{PREFIX}{recipe}" + (f"@{hardware}" if hardware else "")


def host_key(recipe: str, host_vars: Any) -> str:
    """The key for a host: its recipe's, on its ``fleetctl_hardware`` class if it names one."""
    hw = host_vars.get("fleetctl_hardware") if hasattr(host_vars, "get") else None
    return key(recipe, str(hw) if hw else "")


def _sets(row: BaselineRow | None) -> list[ReferenceSet]:
    out = []
    for d in row.runs if row else ():
        try:
            out.append(from_dict(ReferenceSet, d))
        except (TypeError, ValueError, KeyError):
            continue
    return out


def load(store: Store, ref_key: str) -> ReferenceSet | None:
    """The known-good set under ``ref_key`` (the newest recorded), or None: a first deploy."""
    sets = _sets(store.baseline(ref_key, TAG))
    return sets[-1] if sets else None


def history(store: Store, ref_key: str) -> tuple[list[ReferenceSet], bool]:
    """Every set kept under ``ref_key`` (oldest first) and whether the row is pinned."""
    row = store.baseline(ref_key, TAG)
    return _sets(row), bool(row and row.pinned)


def from_verdict(v: Verdict, recipe: str) -> ReferenceSet | None:
    """The reference set a verdict's answers make (None when it asked none)."""
    if not v.answers:
        return None
    return ReferenceSet(v.answers, version=v.version, tag=v.tag, digest=v.digest, recipe=recipe,
                        fingerprint=v.fingerprint, run_id=v.run_id, host=v.target,
                        recorded=v.finished or datetime.now(UTC).isoformat(timespec="seconds"))


def save(store: Store, ref_key: str, v: Verdict, recipe: str) -> ReferenceSet | None:
    """Record a passing full soak's set as the newest known-good; None when nothing was recorded
    (a failed or inconclusive soak, no answers, any answer failed, or the row is pinned)."""
    ref = from_verdict(v, recipe)
    if v.outcome is not Outcome.PASS or ref is None or not all(a.ok for a in ref.answers):
        return None

    def change(row: BaselineRow | None) -> BaselineRow | None:
        if row is not None and row.pinned:
            return None
        runs = [r for r in (row.runs if row else ()) if r.get("run_id") != ref.run_id]
        return BaselineRow(ref_key, TAG, False, tuple([*runs, to_dict(ref)][-KEEP:]))

    return ref if store.update_baseline(ref_key, TAG, change) is not None else None


def pin(store: Store, ref_key: str, pinned: bool = True) -> bool:
    """Pin (or unpin) the known-good under ``ref_key``: while pinned, passing soaks do not move
    it."""

    def change(row: BaselineRow | None) -> BaselineRow | None:
        if row is None or not row.runs:
            raise FleetError(f"no known-good reference set recorded for {ref_key} in "
                             f"{store.where}",
                             fix="a passing full soak (or rollout gate) of the recipe records one")
        return dataclasses.replace(row, pinned=pinned)

    return store.update_baseline(ref_key, TAG, change) is not None


def reset(store: Store, ref_key: str) -> bool:
    """Forget the sets under ``ref_key`` (the next soak is a first deploy); False when none."""
    return store.delete_baseline(ref_key, TAG)


def keys(store: Store) -> list[str]:
    """Every reference-set key the ledger holds."""
    return sorted({r.host for r in store.baselines() if r.tag == TAG and
                   r.host.startswith(PREFIX)})
