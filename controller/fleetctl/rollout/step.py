"""One host's step of a rollout: stop, start by digest, readiness, the soak gate; a failure after the stop
restores the previous container first."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.rollout import deploy, gate
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout.door import DoorSteps
from fleetctl.rollout.results import Options
from fleetctl.rollout.session import (
    RECOVERABLE,
    same_version,
)
from fleetctl.serving import container_name
from fleetctl.state import hoststate
from fleetctl.state import ledger as fleet_ledger


def recoverable_why(e: BaseException, full: bool = True) -> str:
    """What a step that raised ``e`` (one of ``RECOVERABLE``) records as the cause: the FleetError's message
    (``full``) or cause, Ctrl-C as such, else the exception's type and text."""
    if isinstance(e, FleetError):
        return e.message() if full else e.cause
    return "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}"


class HostSteps(DoorSteps):
    """One host's step of a rollout: stop, start, readiness, gate; and its undo when it fails.

    The bookkeeping of a step's outcome (:meth:`_passed`, :meth:`_paused`, :meth:`_after_restore`), the
    fix a failed restore names (:meth:`_fix_for`) and the check of a restored version
    (:meth:`_check_restored`) are per host, and a unit's step (``rollout/unit_step.py``) calls them for
    each member; a rollback's undo (``rollout/rollback.py``) too.
    """

    def _fix_for(self, rid: str, names: Sequence[str]) -> str:
        """The command that puts ``names`` back by hand: a rollback to the one version they served before
        this run (the ledger's), else a rollout of a version that works."""
        recs = [self.ledger.host_record(rid, n) for n in names]
        tags = {r.before_tag for r in recs if r is not None and r.before_tag}
        if len(tags) == 1 and all(r is not None and r.before_tag for r in recs):
            return f"`fleetctl rollback --to {next(iter(tags))} --limit {','.join(names)}`"
        return f"`fleetctl rollout --tag TAG --limit {','.join(names)}` with a version that works"

    def _check_restored(self, rid: str, recipe: Recipe, h: Host, tag: str | None, show: Mapping[str, Any],
                        phase: str, t: dict[str, float] | None = None, smoke: bool = True,
                        since: float | None = None) -> None:
        """The version restored on ``h`` (a unit's head) ready, and its smoke test passed; raises FleetError.
        ``t`` gets the rollback's timings, counted from ``since`` (the restore's start; default now)."""
        t0 = time.monotonic() if since is None else since
        cfg = gate.config(recipe, None, h)
        ready = self.gates.wait(h, recipe, tag or "", cfg, None, self._forward(h, show, phase, cancellable=False))
        if t is not None:
            t["rollback_healthy"] = time.monotonic() - t0
            t["rollback_ready"] = ready.seconds
        if not ready.ready:
            raise FleetError(f"the restored {tag or 'version'} did not become ready: {ready.message}", host=h.name)
        if not smoke:
            return
        v = self.gates.smoke(h, recipe, tag or "", cfg, self._artifacts(rid, h) / "rollback")
        if t is not None:
            t["rollback"] = time.monotonic() - t0
        if v.outcome.value != "pass":
            raise FleetError(f"the restored {tag} failed its smoke test: {gate.failed_checks_text(v)}", host=h.name)

    def _keep_known_good(self, rid: str, recipe: Recipe, p: wave_plan.Plan, h: Host,
                         now: remote.Container | None) -> None:
        """``p``'s version passed on ``h``: a known-good of the host (with the container's settings)."""
        self.ledger.add_known_good(h.name, tag=p.tag, digest=p.digest, fingerprint=remote.fingerprint(recipe),
                                   settings=now.settings if now else None, source="gate", rollout_id=rid)

    def _passed(self, rid: str, recipe: Recipe, p: wave_plan.Plan, h: Host, detail: str, show: Mapping[str, Any],
                verdict: Any, summary: Mapping[str, Any], now: remote.Container | None) -> None:
        """``h`` passed its gate: known-good first, then done (a kill between them leaves a host to re-check,
        never a lost intent), and its state file's last known-good."""
        self._keep_known_good(rid, recipe, p, h, now)
        self._phase(rid, h, "done", detail, {**show, "health": "ok"}, status=fleet_ledger.DONE, after_tag=p.tag,
                    after_digest=p.digest, verdict=summary, artifacts=verdict.artifacts_dir)
        if self.held is not None:
            self.held.record(h.name, last_known_good=hoststate.Version(p.tag, p.digest, rid, time.time()))

    def _paused(self, rid: str, h: Host, detail: str, show: Mapping[str, Any], verdict: Any,
                summary: Mapping[str, Any]) -> None:
        """``h``'s gate was inconclusive and the rollout pauses on it (``--on-inconclusive pause``)."""
        self._phase(rid, h, "paused", detail, {**show, "health": "?"}, status=fleet_ledger.HOST_PAUSED,
                    verdict=summary, artifacts=verdict.artifacts_dir,
                    error=f"soak inconclusive: {gate.failed_checks_text(verdict)}")

    def _after_restore(self, rid: str, h: Host, why: str, detail: str, back: Mapping[str, Any], judged: bool,
                       prev: remote.Container | None, prev_tag: str | None,
                       summary: Mapping[str, Any]) -> None:
        """``h`` serves its previous version again: rolled back (a verdict), or restored and left pending for
        --resume (``judged`` False: Ctrl-C is no verdict on the version)."""
        if not judged:
            self._phase(rid, h, "restored", f"{why}; {detail}", {**back, "health": "ok"}, status=fleet_ledger.PENDING,
                        error=None, verdict=None)
            return
        self._phase(rid, h, "rolled-back", detail, {**back, "health": "ok"}, status=fleet_ledger.ROLLED_BACK,
                    after_tag=prev.tag if prev else prev_tag, after_digest=prev.digest if prev else None, error=why,
                    verdict=summary)

    def _batch(self, rid: str, recipe: Recipe, step: Sequence[Host]) -> deploy.StepBatch | None:
        """The step's deploys through the deployer (one run for its hosts deployed via Ansible), or None."""
        members = [h.name for h in step if deploy.deploy_via(h) == deploy.VIA_ANSIBLE]
        if self.deployer is None or not members:
            return None
        return deploy.StepBatch(self.deployer, members, self._container_secrets(recipe),
                                paths.private_dir(self.state_dir / "runs" / rid), self.ops)

    def _host_step(self, rid: str, recipe: Recipe, opts: Options, p: wave_plan.Plan, h: Host, wave: int,
                   batch: deploy.StepBatch | None = None) -> None:
        """Deploy the target on one host and gate it; any failure after the stop restores the previous container.

        With a ``batch``, the retire and the start are the host's part of the step's one deploy run
        (the vllm_serve role); the worker leaves the batch as soon as it knows it will not deploy,
        so that the others' run never waits for its soak."""
        if batch is not None and h.name not in batch.members:
            batch = None
        try:
            self._host_step_on(rid, recipe, opts, p, h, wave, batch)
        finally:
            if batch is not None:
                batch.leave(h.name)

    def _host_step_on(self, rid: str, recipe: Recipe, opts: Options, p: wave_plan.Plan, h: Host, wave: int,
                      batch: deploy.StepBatch | None) -> None:
        name = container_name(h)
        ops = self.ops(h)
        show = {"wave": wave + 1, "tag": p.tag, "digest": p.digest}
        t: dict[str, float] = {}
        rec = self.ledger.host_record(rid, h.name)
        before_tag = rec.before_tag if rec is not None else None
        if rec is not None and rec.phase == "rolling-back":
            if batch is not None:
                batch.leave(h.name)
            # Killed while undoing a failed gate: finish that, never re-gate the failed version.
            self._fail_host(rid, recipe, h, rec.error or "the gate failed before the controller died", None, show, t,
                            resumed=True)
            return
        self._check_cancel()
        cur = ops.inspect(name)
        if (rec is not None and rec.phase == "out-of-rotation" and cur is not None and cur.running
                and cur.rollout == rid and cur.digest == p.digest):
            if batch is not None:
                batch.leave(h.name)
            self._readmit_gated(rid, recipe, p, h, show, t)
            return
        # Out of rotation before anything changes, and for the whole gate (a resumed host too).
        self._door_out(rid, h, recipe, show, t)
        if not (cur is not None and cur.running and cur.rollout == rid and cur.digest == p.digest):
            if batch is not None:
                # Retire and start in the step's one run; `start` below then only reports how it went.
                ops = deploy.BatchedHostOps(ops, batch, deploy.DeployRequest(
                    h, name, recipe, p.pull_ref, p.tag, p.digest, rid, cache_key=self.cache_key(h, recipe, p.digest)))
            self._phase(rid, h, "stopping", cur.tag if cur else None, show, status=fleet_ledger.IN_PROGRESS)
            t0 = time.monotonic()
            before = ops.retire(name, rid, p.digest)
            if rec is not None and rec.before_digest is None and before is not None and before.digest != p.digest:
                # A container that was stopped at plan time: it is still the version to go back to.
                before_tag = before.tag
                self.ledger.host_phase(rid, h.name, "stopping", "recorded the stopped container as the previous version",
                                       before_tag=before.tag, before_digest=before.digest, before=before.settings)
            t["stop" if batch is None else "deploy"] = time.monotonic() - t0
        else:
            if batch is not None:
                batch.leave(h.name)
            self._phase(rid, h, "loading", "already running this rollout's container: gating it", show,
                        status=fleet_ledger.IN_PROGRESS)
        try:
            self._deploy_and_gate(rid, recipe, opts, p, h, ops, cur, show, t, before_tag)
        except RECOVERABLE as e:
            # Ctrl-C is no verdict on the version: the host is restored and left pending for --resume.
            self._fail_host(rid, recipe, h, recoverable_why(e), None, show, t, judged=not isinstance(e, KeyboardInterrupt))
            if isinstance(e, KeyboardInterrupt):
                raise

    def _readmit_gated(self, rid: str, recipe: Recipe, p: wave_plan.Plan, h: Host, show: Mapping[str, Any],
                       t: dict[str, float]) -> None:
        """A host that passed its gate but the door did not take back (a paused run, resumed): still
        serving this rollout's container and ready, it is re-admitted without a new gate."""
        self._phase(rid, h, "readmitting", "passed its gate before; checking readiness, then re-admitting", show)
        cfg = gate.config(recipe, None, h)
        ready = self.gates.wait(h, recipe, p.tag, cfg, self.readmit_timeout, self._forward(h, show, "loading"))
        why = None if ready.ready else f"not ready ({ready.message})"
        why = why or self._door_in_or_record(rid, h, t)
        if why is not None:
            self._phase(rid, h, "out-of-rotation", why, {**show, "health": "out"}, status=fleet_ledger.HOST_PAUSED,
                        error=f"passed its gate, but {why}")
            return
        self._phase(rid, h, "done", "passed its gate; back in rotation", {**show, "health": "ok"},
                    status=fleet_ledger.DONE)
        if self.held is not None:
            self.held.record(h.name, last_known_good=hoststate.Version(p.tag, p.digest, rid, time.time()))

    def _deploy_and_gate(self, rid: str, recipe: Recipe, opts: Options, p: wave_plan.Plan, h: Host, ops: remote.HostOps,
                         cur: remote.Container | None, show: Mapping[str, Any], t: dict[str, float],
                         before_tag: str | None) -> None:
        """Start the target (unless already this rollout's), wait for it, soak it; record the verdict."""
        if not (cur is not None and cur.running and cur.rollout == rid and cur.digest == p.digest):
            self._check_cancel()
            self._phase(rid, h, "starting", None, show)
            t0 = time.monotonic()
            ops.start(recipe, p.pull_ref, tag=p.tag, digest=p.digest, rollout_id=rid, secrets=self._container_secrets(recipe),
                      cache_key=self.cache_key(h, recipe, p.digest))
            t["start"] = time.monotonic() - t0
        self._check_cancel()
        cfg = gate.config(recipe, opts.soak, h)
        self._phase(rid, h, "loading", "waiting for /health", {**show, "health": "loading"})
        t0 = time.monotonic()
        ready = self.gates.wait(h, recipe, p.tag, cfg, opts.ready_timeout, self._forward(h, show, "loading"))
        t["ready"] = time.monotonic() - t0
        if not ready.ready:
            self._fail_host(rid, recipe, h, f"readiness {ready.outcome.value}: {ready.message}", None, show, t)
            return
        self._check_cancel()
        self._phase(rid, h, "soak", f"{cfg.sustained_duration:.0f}s sustained",
                    {**show, "health": "ready", "sustained_s": round(cfg.sustained_duration)})
        t0 = time.monotonic()
        art = self._artifacts(rid, h)
        verdict = self.gates.soak(h, recipe, p.tag, cfg, self.ledger, before_tag, art, f"{rid}/{art.name}",
                                  self._forward(h, show, "soak"))
        t["soak"] = time.monotonic() - t0
        summary = gate.summarise(verdict, t, cfg.sustained_duration)
        figures = gate.figures(verdict)
        if verdict.outcome.value == "pass":
            door_error = self._door_in_or_record(rid, h, t)
            summary["timings"] = dict(t)
            now = ops.inspect(container_name(h))
            if door_error is not None:
                self._keep_known_good(rid, recipe, p, h, now)
                # A good version the door does not take back: the host stays out (recorded) and the rollout
                # pauses here; `--resume` re-admits it (no new gate) once the door is fixed.
                self._phase(rid, h, "out-of-rotation", door_error, {**show, "health": "out", **figures},
                            status=fleet_ledger.HOST_PAUSED, after_tag=p.tag, after_digest=p.digest, verdict=summary,
                            artifacts=verdict.artifacts_dir, error=f"passed its gate, but {door_error}")
                return
            self._passed(rid, recipe, p, h, verdict.summary, {**show, **figures}, verdict, summary, now)
        elif verdict.outcome.value == "inconclusive" and opts.on_inconclusive == "pause":
            self._paused(rid, h, verdict.summary, {**show, **figures}, verdict, summary)
        else:
            self._fail_host(rid, recipe, h, f"soak {verdict.outcome.value}: {gate.failed_checks_text(verdict)}",
                            verdict, {**show, **figures}, t)


    def _fail_host(self, rid: str, recipe: Recipe, h: Host, why: str, verdict: Any,
                   show: Mapping[str, Any], t: dict[str, float], judged: bool = True, resumed: bool = False) -> None:
        """Kill the failed container, restore the previous one on ``h``, verify it (readiness + smoke), record why.

        A host that cannot be restored is recorded as failed (down) with the command that fixes it.
        ``resumed``: finishing the rollback of a controller that died in it, whose restore may
        already have happened: a host that runs its previous version again is checked, not touched
        (restoring again would remove it, with no ``.prev`` left to start).
        """
        name = container_name(h)
        ops = self.ops(h)
        summary = gate.summarise(verdict, t) if verdict is not None else {
            "outcome": "fail", "summary": why, "failed_checks": [why], "timings": dict(t)}
        self._phase(rid, h, "rolling-back", why, {**show, "health": "failed"}, error=why, verdict=summary,
                    artifacts=verdict.artifacts_dir if verdict is not None else None)
        self._save_logs(rid, h, ops, name)
        rec = self.ledger.host_record(rid, h.name)
        fix = self._fix_for(rid, [h.name])
        t0 = time.monotonic()
        back = dict(show)
        try:
            prev = None
            if resumed and rec is not None and rec.before_digest:
                cur = ops.inspect(name)
                before_fp = ((rec.before or {}).get("labels") or {}).get(remote.LABEL_FINGERPRINT)
                if cur is not None and cur.running and cur.rollout != rid and same_version(
                        rec.before_digest, before_fp, cur.digest or "", cur.fingerprint):
                    prev = cur
            prev = prev or ops.restore(name)
            if prev is None:
                ops.kill(name)
                self._phase(rid, h, "failed", f"{why}; there was no previous version to return to",
                            {**show, "health": "down"}, status=fleet_ledger.HOST_FAILED,
                            error=f"{why}; nothing serves (no previous version); fix: {fix}")
                return
            back = {**show, "tag": prev.tag or "?"}
            self._phase(rid, h, "rolling-back", f"restored {prev.tag}; waiting for /health", {**back, "health": "loading"})
            try:
                self._check_restored(rid, recipe, h, prev.tag, back, "rolling-back", t, since=t0)
            finally:
                summary["timings"] = dict(t)
        except Exception as e:
            cause = e.cause if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            self._phase(rid, h, "failed", f"{why}; rollback failed: {cause}", {**show, "health": "down"},
                        status=fleet_ledger.HOST_FAILED, error=f"{why}; rollback failed: {cause}; fix: {fix}", verdict=summary)
            return
        # Back in rotation only now: the version it serves again passed readiness and smoke.
        door_error = self._door_in_or_record(rid, h, t)
        door_note = f"; {door_error}" if door_error else ""
        self._after_restore(rid, h, why, f"serving {prev.tag} again{door_note}", back, judged, prev, prev.tag, summary)
