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

from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.rollout import gate
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.run import Run
from fleetctl.state import ledger as fleet_ledger


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


def check_restored(run: Run, recipe: Recipe, h: Host, tag: str | None, show: Mapping[str, Any],
                   phase: str,
                   t: dict[str, float] | None = None, smoke: bool = True,
                   since: float | None = None) -> None:
    """The version restored on ``h`` (a unit's head) ready, and its smoke test passed; raises
    FleetError.
    ``t`` gets the rollback's timings, counted from ``since`` (the restore's start; default now)."""
    s = run.session
    t0 = time.monotonic() if since is None else since
    cfg = gate.config(recipe, None, h)
    ready = s.gates.wait(h, recipe, tag or "", cfg, None, s.live(h, show, phase, cancellable=False))
    if t is not None:
        t["rollback_healthy"] = time.monotonic() - t0
        t["rollback_ready"] = ready.seconds
    if not ready.ready:
        raise FleetError(f"the restored {tag or 'version'} did not become ready: {ready.message}",
                         host=h.name)
    if not smoke:
        return
    v = s.gates.smoke(h, recipe, tag or "", cfg, run.artifacts(h) / "rollback")
    if t is not None:
        t["rollback"] = time.monotonic() - t0
    if v.outcome.value != "pass":
        raise FleetError(f"the restored {tag} failed its smoke test: {gate.failed_checks_text(v)}",
                         host=h.name)


def keep_known_good(run: Run, recipe: Recipe, p: wave_plan.Plan, h: Host,
                    now: remote.Container | None) -> None:
    """``p``'s version passed on ``h``: a known-good of the host (with the container's settings)."""
    run.ledger.add_known_good(h.name, tag=p.tag, digest=p.digest,
                              fingerprint=remote.fingerprint(recipe),
                              settings=now.settings if now else None, source="gate",
                              rollout_id=run.id, recipe=recipe.name)


def passed(run: Run, recipe: Recipe, p: wave_plan.Plan, h: Host, detail: str,
           show: Mapping[str, Any],
           verdict: Any, summary: Mapping[str, Any], now: remote.Container | None) -> None:
    """``h`` passed its gate: known-good first, then done (a kill between them leaves a host to
    re-check, never a lost intent), and its state file's last known-good."""
    keep_known_good(run, recipe, p, h, now)
    run.phase(h, "done", detail, {**show, "health": "ok"}, status=fleet_ledger.DONE,
              after_tag=p.tag,
              after_digest=p.digest, verdict=summary, artifacts=verdict.artifacts_dir)
    run.known_good_on_host(h, p.tag, p.digest)


def paused(run: Run, h: Host, detail: str, show: Mapping[str, Any], verdict: Any,
           summary: Mapping[str, Any]) -> None:
    """``h``'s gate was inconclusive and the rollout pauses on it (``--on-inconclusive pause``)."""
    run.phase(h, "paused", detail, {**show, "health": "?"}, status=fleet_ledger.HOST_PAUSED,
              verdict=summary, artifacts=verdict.artifacts_dir,
              error=f"soak inconclusive: {gate.failed_checks_text(verdict)}")


def after_restore(run: Run, h: Host, why: str, detail: str, back: Mapping[str, Any], judged: bool,
                  prev: remote.Container | None, prev_tag: str | None,
                  summary: Mapping[str, Any]) -> None:
    """``h`` serves its previous version again: rolled back (a verdict), or restored and left
    pending for
    --resume (``judged`` False: Ctrl-C is no verdict on the version)."""
    if not judged:
        run.phase(h, "restored", f"{why}; {detail}", {**back, "health": "ok"},
                  status=fleet_ledger.PENDING,
                  error=None, verdict=None)
        return
    run.phase(h, "rolled-back", detail, {**back, "health": "ok"}, status=fleet_ledger.ROLLED_BACK,
              after_tag=prev.tag if prev else prev_tag, after_digest=prev.digest if prev else None,
              error=why,
              verdict=summary)


def fail_summary(why: str, verdict: Any, t: Mapping[str, float]) -> dict[str, Any]:
    """What the ledger keeps of a failed step: the gate's verdict, else ``why`` as its one failed
    check."""
    if verdict is not None:
        return gate.summarise(verdict, t)
    return {"outcome": "fail", "summary": why, "failed_checks": [why], "timings": dict(t)}
