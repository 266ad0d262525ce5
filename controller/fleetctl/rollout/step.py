"""One host's step of a rollout: stop, start by digest, readiness, the soak gate; a failure after
the stop restores the previous container first."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from fleetctl import paths
from fleetctl.container import LABEL_FINGERPRINT, Container
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.rollout import deploy, gate, outcome
from fleetctl.rollout import host as remote
from fleetctl.rollout.door import DoorSteps
from fleetctl.rollout.outcome import fix_for, recoverable_why
from fleetctl.rollout.run import Failure, Group, Row, Run, Step
from fleetctl.rollout.session import RECOVERABLE, Session, same_version
from fleetctl.rollout.unit_step import UnitStep
from fleetctl.serving import container_name
from fleetctl.soak import baselines
from fleetctl.state import records as fleet_records


class HostStep:
    """One host's step of a rollout: stop, start, readiness, gate; and its undo when it fails. The
    front door drains it before the stop and re-admits it after the gate
    (:class:`~.door.DoorSteps`)."""

    def __init__(self, session: Session, door: DoorSteps) -> None:
        self.s = session
        self.door = door

    def batch(self, run: Run, recipe: Recipe, step: Sequence[Host]) -> deploy.StepBatch | None:
        """The step's deploys through the deployer (one run for its hosts deployed via Ansible), or
        None."""
        members = [h.name for h in step if deploy.deploy_via(h) == deploy.VIA_ANSIBLE]
        if self.s.deployer is None or not members:
            return None
        return deploy.StepBatch(self.s.deployer, members, self.s.container_secrets(recipe),
                                paths.private_dir(self.s.state_dir / "runs" / run.id), self.s.ops)

    def step(self, run: Run, group: Group, h: Host, wave: int,
             batch: deploy.StepBatch | None = None) -> None:
        """Deploy the target on one host and gate it; any failure after the stop restores the
        previous container.

        With a ``batch``, the retire and the start are the host's part of the step's one deploy run
        (the vllm_serve role); the worker leaves the batch as soon as it knows it will not deploy,
        so that the others' run never waits for its soak."""
        if batch is not None and h.name not in batch.members:
            batch = None
        p = group.p
        step = Step(run, group.recipe, h, Row(wave + 1, p.tag, p.digest), p)
        try:
            self._step(step, batch)
        finally:
            if batch is not None:
                batch.leave(h.name)

    def _step(self, step: Step, batch: deploy.StepBatch | None) -> None:
        run, p, h = step.run, step.p, step.host
        rid = run.id
        name = container_name(h)
        ops = self.s.ops(h)
        rec = run.record(h.name)
        before_tag = rec.before_tag if rec is not None else None
        if rec is not None and rec.phase == "rolling-back":
            if batch is not None:
                batch.leave(h.name)
            # Killed while undoing a failed gate: finish that, never re-gate the failed version.
            self.fail(step, Failure(rec.error or "the gate failed before the controller died",
                                    resumed=True))
            return
        self.s.check_cancel()
        cur = ops.inspect(name)
        if (rec is not None and rec.phase == "out-of-rotation" and cur is not None and cur.running
                and cur.rollout == rid and cur.digest == p.digest):
            if batch is not None:
                batch.leave(h.name)
            self._readmit_gated(step)
            return
        # Out of rotation before anything changes, and for the whole gate (a resumed host too).
        self.door.out(step)
        joined: deploy.BatchedDeploy | None = None
        if not (cur is not None and cur.running and cur.rollout == rid and cur.digest == p.digest):
            joined, before_tag = self._stop(step, ops, cur, batch, rec)
        else:
            if batch is not None:
                batch.leave(h.name)
            step.phase("loading", "already running this rollout's container: gating it",
                       status=fleet_records.IN_PROGRESS)
        try:
            self._deploy_and_gate(step, ops, cur, before_tag, joined)
        except RECOVERABLE as e:
            # Ctrl-C is no verdict on the version: the host is restored and left pending for
            # --resume.
            self.fail(step, Failure(recoverable_why(e),
                                    judged=not isinstance(e, KeyboardInterrupt)))
            if isinstance(e, KeyboardInterrupt):
                raise

    def _stop(self, step: Step, ops: remote.ServingOps, cur: Container | None,
              batch: deploy.StepBatch | None,
              rec: fleet_records.HostRecord | None
              ) -> tuple[deploy.BatchedDeploy | None, str | None]:
        """Retire what the host serves (kept as ``.prev``); with a ``batch``, the retire and the
        start are the step's one deploy run. The host's part of that run (None: over ``ops``),
        and the tag to go back to."""
        run, recipe, p, h = step.run, step.recipe, step.p, step.host
        name = container_name(h)
        # Retire and start in the step's one run; the start then only reports how it went.
        joined = None if batch is None else deploy.BatchedDeploy(batch, deploy.DeployRequest(
            h, name, recipe, p.pull_ref, p.tag, p.digest, run.id,
            cache_key=self.s.cache_key(h, recipe, p.digest)))
        step.phase("stopping", cur.tag if cur else None, status=fleet_records.IN_PROGRESS)
        t0 = time.monotonic()
        before = ops.retire(name, run.id, p.digest) if joined is None else joined.retire()
        before_tag = rec.before_tag if rec is not None else None
        if (rec is not None and rec.before_digest is None and before is not None
                and before.digest != p.digest):
            # A container that was stopped at plan time: it is still the version to go back to.
            before_tag = before.tag
            run.ledger.host_phase(run.id, h.name, "stopping",
                                  "recorded the stopped container as the previous "
                                  "version", before_tag=before.tag, before_digest=before.digest,
                                  before=before.settings)
        step.timings["stop" if batch is None else "deploy"] = time.monotonic() - t0
        return joined, before_tag

    def _readmit_gated(self, step: Step) -> None:
        """A host that passed its gate but the door did not take back (a paused run, resumed): still
        serving this rollout's container and ready, it is re-admitted without a new gate."""
        run, recipe, p, h = step.run, step.recipe, step.p, step.host
        step.phase("readmitting", "passed its gate before; checking readiness, then re-admitting")
        cfg = gate.config(recipe, None, h)
        ready = self.s.gates.wait(h, recipe, p.tag, cfg, self.s.readmit_timeout,
                                  step.live("loading"))
        why = None if ready.ready else f"not ready ({ready.message})"
        why = why or self.door.back_in_or_record(run, h, step.timings)
        if why is not None:
            step.phase("out-of-rotation", why, step.row.at("out"),
                       status=fleet_records.HOST_PAUSED, error=f"passed its gate, but {why}")
            return
        step.phase("done", "passed its gate; back in rotation", step.row.at("ok"),
                   status=fleet_records.DONE)
        run.known_good_on_host(h, p.tag, p.digest)

    def _deploy_and_gate(self, step: Step, ops: remote.ServingOps, cur: Container | None,
                         before_tag: str | None, joined: deploy.BatchedDeploy | None) -> None:
        """Start the target (unless already this rollout's; through the step's deploy run when
        ``joined``), wait for it, soak it; record the verdict."""
        run, recipe, p, h, t = step.run, step.recipe, step.p, step.host, step.timings
        if not (cur is not None and cur.running and cur.rollout == run.id
                and cur.digest == p.digest):
            self.s.check_cancel()
            step.phase("starting")
            t0 = time.monotonic()
            if joined is not None:
                joined.start()
            else:
                ops.start(remote.StartRequest(recipe, p.pull_ref, p.tag, p.digest, run.id,
                                              self.s.container_secrets(recipe),
                                              self.s.cache_key(h, recipe, p.digest)))
            t["start"] = time.monotonic() - t0
        self.s.check_cancel()
        cfg = gate.config(recipe, run.opts.soak, h)
        step.phase("loading", "waiting for /health", step.row.at("loading"))
        t0 = time.monotonic()
        ready = self.s.gates.wait(h, recipe, p.tag, cfg, run.opts.ready_timeout,
                                  step.live("loading"))
        t["ready"] = time.monotonic() - t0
        if not ready.ready:
            self.fail(step, Failure(f"readiness {ready.outcome.value}: {ready.message}"))
            return
        self.s.check_cancel()
        step.phase("soak", f"{cfg.sustained_duration:.0f}s sustained",
                   step.row.at("ready", sustained_s=round(cfg.sustained_duration)))
        t0 = time.monotonic()
        art = run.artifacts(h)
        # The recipe's own window on this host (another model's figures are none of this one's).
        key = baselines.host_key(h.name, recipe.name, self.s.inv.vars.get("fleetctl_recipe"))
        verdict = self.s.gates.soak(gate.Judged(h, recipe, p.tag, cfg),
                                    gate.Baseline(run.ledger, before_tag, key), art,
                                    f"{run.id}/{art.name}", step.live("soak"))
        t["soak"] = time.monotonic() - t0
        summary = gate.summarise(verdict, t, cfg.sustained_duration)
        judged = step.shown(step.row.at(**gate.figures(verdict)))
        if verdict.outcome.value == "pass":
            door_error = self.door.back_in_or_record(run, h, t)
            summary["timings"] = dict(t)
            now = ops.inspect(container_name(h))
            if door_error is not None:
                outcome.keep_known_good(step, now)
                # A good version the door does not take back: the host stays out (recorded) and the
                # rollout pauses here; `--resume` re-admits it (no new gate) once the door is fixed.
                judged.phase("out-of-rotation", door_error, judged.row.at("out"),
                             status=fleet_records.HOST_PAUSED, after_tag=p.tag,
                             after_digest=p.digest, verdict=summary,
                             artifacts=verdict.artifacts_dir,
                             error=f"passed its gate, but {door_error}")
                return
            outcome.passed(judged, verdict.summary, verdict, summary, now)
        elif verdict.outcome.value == "inconclusive" and run.opts.on_inconclusive == "pause":
            outcome.paused(judged, verdict.summary, verdict, summary)
        else:
            self.fail(judged, Failure(
                f"soak {verdict.outcome.value}: {gate.failed_checks_text(verdict)}", verdict))

    def fail(self, step: Step, failure: Failure) -> None:
        """Kill the failed container, restore the previous one on the step's host, verify it
        (readiness + smoke), record why.

        A host that cannot be restored is recorded as failed (down) with the command that fixes it.
        ``failure.resumed``: finishing the rollback of a controller that died in it, whose restore
        may already have happened: a host that runs its previous version again is checked, not
        touched (restoring again would remove it, with no ``.prev`` left to start).
        """
        run, h, t = step.run, step.host, step.timings
        why, verdict = failure.why, failure.verdict
        name = container_name(h)
        ops = self.s.ops(h)
        summary = outcome.fail_summary(failure, t)
        step.phase("rolling-back", why, step.row.at("failed"), error=why, verdict=summary,
                   artifacts=verdict.artifacts_dir if verdict is not None else None)
        run.save_logs(h, ops, name)
        rec = run.record(h.name)
        fix = fix_for(run, [h.name])
        t0 = time.monotonic()
        try:
            prev = None
            if failure.resumed and rec is not None and rec.before_digest:
                cur = ops.inspect(name)
                before_fp = ((rec.before or {}).get("labels") or {}).get(LABEL_FINGERPRINT)
                if cur is not None and cur.running and cur.rollout != run.id and same_version(
                        rec.before_digest, before_fp, cur.digest or "", cur.fingerprint):
                    prev = cur
            prev = prev or ops.restore(name)
            if prev is None:
                ops.kill(name)
                step.phase("failed", f"{why}; there was no previous version to return to",
                           step.row.at("down"), status=fleet_records.HOST_FAILED,
                           error=f"{why}; nothing serves (no previous version); fix: {fix}")
                return
            back = step.shown(step.row.showing(prev.tag or "?"))
            back.phase("rolling-back", f"restored {prev.tag}; waiting for /health",
                       back.row.at("loading"))
            try:
                outcome.check_restored(back, prev.tag, "rolling-back", since=t0)
            finally:
                summary["timings"] = dict(t)
        except Exception as e:
            cause = e.cause if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            step.phase("failed", f"{why}; rollback failed: {cause}", step.row.at("down"),
                       status=fleet_records.HOST_FAILED,
                       error=f"{why}; rollback failed: {cause}; fix: {fix}", verdict=summary)
            return
        # Back in rotation only now: the version it serves again passed readiness and smoke.
        door_error = self.door.back_in_or_record(run, h, t)
        door_note = f"; {door_error}" if door_error else ""
        outcome.after_restore(back, failure, f"serving {prev.tag} again{door_note}", prev,
                              prev.tag, summary)


@dataclass(frozen=True)
class Steps:
    """What a wave's slots go through: the front door's steps, a single host's step and a unit's
    (the forward path's waves and the bake's undo)."""

    door: DoorSteps
    hosts: HostStep
    units: UnitStep
