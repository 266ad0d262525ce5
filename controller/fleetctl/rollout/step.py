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


class HostSteps(DoorSteps):
    """One host's step of a rollout: stop, start, readiness, gate; and its undo when it fails."""

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
                ops = deploy.BatchedHostOps(ops, batch, deploy.DeployRequest(h, name, recipe, p.pull_ref, p.tag,
                                                                             p.digest, rid))
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
            why = e.message() if isinstance(e, FleetError) else (
                "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}")
            # Ctrl-C is no verdict on the version: the host is restored and left pending for --resume.
            self._fail_host(rid, recipe, h, why, None, show, t, judged=not isinstance(e, KeyboardInterrupt))
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
                         cur: remote.Serving | None, show: Mapping[str, Any], t: dict[str, float],
                         before_tag: str | None) -> None:
        """Start the target (unless already this rollout's), wait for it, soak it; record the verdict."""
        if not (cur is not None and cur.running and cur.rollout == rid and cur.digest == p.digest):
            self._check_cancel()
            self._phase(rid, h, "starting", None, show)
            t0 = time.monotonic()
            ops.start(recipe, p.pull_ref, tag=p.tag, digest=p.digest, rollout_id=rid, secrets=self._container_secrets(recipe))
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
        summary = gate.summarise(verdict, t)
        figures = gate.figures(verdict)
        if verdict.outcome.value == "pass":
            door_error = self._door_in_or_record(rid, h, t)
            summary["timings"] = dict(t)
            now = ops.inspect(container_name(h))
            # Known-good first, then done: a kill between them leaves a host to re-check, never a lost intent.
            self.ledger.add_known_good(h.name, tag=p.tag, digest=p.digest, fingerprint=remote.fingerprint(recipe),
                                       settings=now.settings if now else None, source="gate", rollout_id=rid)
            if door_error is not None:
                # A good version the door does not take back: the host stays out (recorded) and the rollout
                # pauses here; `--resume` re-admits it (no new gate) once the door is fixed.
                self._phase(rid, h, "out-of-rotation", door_error, {**show, "health": "out", **figures},
                            status=fleet_ledger.HOST_PAUSED, after_tag=p.tag, after_digest=p.digest, verdict=summary,
                            artifacts=verdict.artifacts_dir, error=f"passed its gate, but {door_error}")
                return
            self._phase(rid, h, "done", verdict.summary, {**show, "health": "ok", **figures}, status=fleet_ledger.DONE,
                        after_tag=p.tag, after_digest=p.digest, verdict=summary, artifacts=verdict.artifacts_dir)
            if self.held is not None:
                self.held.record(h.name, last_known_good=hoststate.Version(p.tag, p.digest, rid, time.time()))
        elif verdict.outcome.value == "inconclusive" and opts.on_inconclusive == "pause":
            self._phase(rid, h, "paused", verdict.summary, {**show, "health": "?", **figures}, status=fleet_ledger.HOST_PAUSED,
                        verdict=summary, artifacts=verdict.artifacts_dir,
                        error=f"soak inconclusive: {gate.failed_checks_text(verdict)}")
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
        fix = (f"`fleetctl rollback --to {rec.before_tag} --limit {h.name}`" if rec is not None and rec.before_tag
               else f"`fleetctl rollout --tag TAG --limit {h.name}` with a version that works")
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
            cfg = gate.config(recipe, None, h)
            ready = self.gates.wait(h, recipe, prev.tag or "", cfg, None,
                                    self._forward(h, back, "rolling-back", cancellable=False))
            t["rollback_healthy"] = time.monotonic() - t0
            if not ready.ready:
                raise FleetError(f"the restored {prev.tag} did not become ready: {ready.message}", host=h.name)
            smoke = self.gates.smoke(h, recipe, prev.tag or "", cfg, self._artifacts(rid, h) / "rollback")
            t["rollback"] = time.monotonic() - t0
            t["rollback_ready"] = ready.seconds
            summary["timings"] = dict(t)
            if smoke.outcome.value != "pass":
                raise FleetError(f"the restored {prev.tag} failed its smoke test: {gate.failed_checks_text(smoke)}",
                                 host=h.name)
        except Exception as e:
            cause = e.cause if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            self._phase(rid, h, "failed", f"{why}; rollback failed: {cause}", {**show, "health": "down"},
                        status=fleet_ledger.HOST_FAILED, error=f"{why}; rollback failed: {cause}; fix: {fix}", verdict=summary)
            return
        # Back in rotation only now: the version it serves again passed readiness and smoke.
        door_error = self._door_in_or_record(rid, h, t)
        door_note = f"; {door_error}" if door_error else ""
        if not judged:
            self._phase(rid, h, "restored", f"{why}; serving {prev.tag} again{door_note}", {**back, "health": "ok"},
                        status=fleet_ledger.PENDING, error=None, verdict=None)
            return
        self._phase(rid, h, "rolled-back", f"serving {prev.tag} again{door_note}", {**back, "health": "ok"},
                    status=fleet_ledger.ROLLED_BACK, after_tag=prev.tag, after_digest=prev.digest, error=why, verdict=summary)
