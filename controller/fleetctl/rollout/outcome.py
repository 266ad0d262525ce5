"""How a host's step ends, recorded: passed, paused, restored or rolled back; the check of a
restored version; the fix a failed restore names.

A single host's step (``step.py``), a unit's (``unit_step.py``, once per member) and a rollback's
undo (``rollback.py``, ``rollback_unit.py``) all end through these, so that one host's outcome reads
the same in the ledger whoever changed it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from fleetctl.container import Container
from fleetctl.errors import FleetError
from fleetctl.rollout import gate
from fleetctl.rollout import host as remote
from fleetctl.rollout.run import Failure, Run, Step, live
from fleetctl.state import records as fleet_records


def recoverable_why(e: BaseException, full: bool = True) -> str:
    """What a step that raised ``e`` (one of ``RECOVERABLE``) records as the cause: the FleetError's
    message (``full``) or cause, Ctrl-C as such, else the exception's type and text."""
    if isinstance(e, FleetError):
        return e.message() if full else e.cause
    return "interrupted (Ctrl-C)" if isinstance(e,
                                                KeyboardInterrupt) else f"{type(e).__name__}: {e}"


def fix_for(run: Run, names: Sequence[str]) -> str:
    """The command that puts ``names`` back by hand: a rollback to the one version they served
    before this run (the ledger's), else a rollout of a version that works."""
    recs = [run.record(n) for n in names]
    tags = {r.before_tag for r in recs if r is not None and r.before_tag}
    if len(tags) == 1 and all(r is not None and r.before_tag for r in recs):
        return f"`fleetctl rollback --to {next(iter(tags))} --limit {','.join(names)}`"
    return f"`fleetctl rollout --tag TAG --limit {','.join(names)}` with a version that works"


def check_restored(step: Step, tag: str | None, phase: str, smoke: bool = True,
                   since: float | None = None, timed: bool = True) -> None:
    """The version restored on the step's host (a unit's head) ready, and its smoke test passed;
    raises FleetError. ``timed``: the step's timings get the rollback's, counted from ``since``
    (the restore's start; default now)."""
    s, h, recipe, t = step.session, step.host, step.recipe, step.timings
    t0 = time.monotonic() if since is None else since
    cfg = gate.config(recipe, None, h)
    ready = s.gates.wait(h, recipe, tag or "", cfg, None,
                         live(s, h, step.row, phase, cancellable=False))
    if timed:
        t["rollback_healthy"] = time.monotonic() - t0
        t["rollback_ready"] = ready.seconds
    if not ready.ready:
        raise FleetError(f"the restored {tag or 'version'} did not become ready: {ready.message}",
                         host=h.name)
    if not smoke:
        return
    v = s.gates.smoke(h, recipe, tag or "", cfg, step.run.artifacts(h) / "rollback")
    if timed:
        t["rollback"] = time.monotonic() - t0
    if v.outcome.value != "pass":
        raise FleetError(f"the restored {tag} failed its smoke test: {gate.failed_checks_text(v)}",
                         host=h.name)


def keep_known_good(step: Step, now: Container | None) -> None:
    """The plan's version passed on the step's host: a known-good of the host (with the
    container's settings)."""
    p, recipe = step.p, step.recipe
    step.run.ledger.add_known_good(step.host.name, tag=p.tag, digest=p.digest,
                                   fingerprint=remote.fingerprint(recipe),
                                   settings=now.settings if now else None, source="gate",
                                   rollout_id=step.run.id, recipe=recipe.name)


def passed(step: Step, detail: str, verdict: Any, summary: Mapping[str, Any],
           now: Container | None) -> None:
    """The step's host passed its gate: known-good first, then done (a kill between them leaves a
    host to re-check, never a lost intent), and its state file's last known-good."""
    p = step.p
    keep_known_good(step, now)
    step.phase("done", detail, step.row.at("ok"), status=fleet_records.DONE, after_tag=p.tag,
               after_digest=p.digest, verdict=summary, artifacts=verdict.artifacts_dir)
    step.run.known_good_on_host(step.host, p.tag, p.digest)


def paused(step: Step, detail: str, verdict: Any, summary: Mapping[str, Any]) -> None:
    """The step's gate was inconclusive and the rollout pauses on it (``--on-inconclusive
    pause``)."""
    step.phase("paused", detail, step.row.at("?"), status=fleet_records.HOST_PAUSED,
               verdict=summary, artifacts=verdict.artifacts_dir,
               error=f"soak inconclusive: {gate.failed_checks_text(verdict)}")


def after_restore(step: Step, failure: Failure, detail: str, prev: Container | None,
                  prev_tag: str | None, summary: Mapping[str, Any]) -> None:
    """The step's host serves its previous version again (the step's row shows it): rolled back
    (a verdict), or restored and left pending for --resume (``failure.judged`` False: Ctrl-C is no
    verdict on the version)."""
    why = failure.why
    if not failure.judged:
        step.phase("restored", f"{why}; {detail}", step.row.at("ok"), status=fleet_records.PENDING,
                   error=None, verdict=None)
        return
    step.phase("rolled-back", detail, step.row.at("ok"), status=fleet_records.ROLLED_BACK,
               after_tag=prev.tag if prev else prev_tag, after_digest=prev.digest if prev else None,
               error=why, verdict=summary)


def fail_summary(failure: Failure, t: Mapping[str, float]) -> dict[str, Any]:
    """What the ledger keeps of a failed step: the gate's verdict, else the failure's cause as its
    one failed check."""
    if failure.verdict is not None:
        return gate.summarise(failure.verdict, t)
    return {"outcome": "fail", "summary": failure.why, "failed_checks": [failure.why],
            "timings": dict(t)}
