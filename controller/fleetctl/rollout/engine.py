"""The rollout state machine: plan, preflight, prefetch, then per host stop -> start -> ready -> gate.

Each host goes ``planned -> stopping -> starting -> loading -> soak -> done``;
a failed gate goes ``-> rolling-back -> rolled-back`` (the previous container,
kept as ``<name>.prev``, is started again and checked with readiness + smoke).
Every phase is committed to the ledger before it is acted on, and every step
starts from the host's real state (``docker inspect`` over SSH), so that a
controller killed at any point leaves a ledger that ``--resume`` continues
from, or ``rollback`` undoes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl import paths, registry, secretenv, ssh
from fleetctl.errors import ExitCode, FleetError
from fleetctl.inventory import Host, Inventory
from fleetctl.progress import NULL, Event, Progress
from fleetctl.recipes import Recipe, recipe_for
from fleetctl.rollout import deploy, gate
from fleetctl.rollout import host as remote
from fleetctl.rollout import plan as P
from fleetctl.rollout.webhook import Webhook
from fleetctl.state import hoststate
from fleetctl.state import ledger as fleet_ledger

#: What a GB10 calls itself in ``nvidia-smi``; the images are built for sm_121a only.
GB10 = "NVIDIA GB10"
#: Free disk (GB) a host needs for an image it does not have yet (images are 9-22 GB).
DEFAULT_IMAGE_FREE_GB = 25.0


@dataclass(frozen=True)
class Options:
    """What the operator asked for (the CLI's flags)."""

    tag: str | None = None
    recipe: str | None = None
    limit: str | None = None
    waves: str | None = None
    max_unavailable: str | None = None
    failure_budget: str | None = None
    #: Soak length override in seconds (None: the recipe's).
    soak: float | None = None
    #: ``pause`` or ``fail`` on an inconclusive gate.
    on_inconclusive: str = "pause"
    #: Seconds a server may take to become ready (None: the soak config's).
    ready_timeout: float | None = None
    webhook: str | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class HostOutcome:
    """How one host came out of a rollout or rollback."""

    host: str
    wave: int
    status: str
    phase: str
    before_tag: str | None
    before_digest: str | None
    after_tag: str | None
    after_digest: str | None
    #: The gate's verdict in one line, and the checks that did not pass (name: message).
    verdict: str | None = None
    failed_checks: tuple[str, ...] = ()
    artifacts: str | None = None
    error: str | None = None
    #: Seconds spent in each phase (stop, start, ready, soak, rollback, ...).
    timings: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutResult:
    """The result of ``rollout``, ``rollout --resume``, ``rollout abort`` or ``rollback``."""

    id: str | None
    kind: str
    status: str
    recipe: str
    tag: str | None
    digest: str | None
    image: str | None
    hosts: tuple[HostOutcome, ...]
    plan: P.Plan | None = None
    error: str | None = None
    #: Seconds of the whole run and of its prefetch.
    seconds: float = 0.0
    prefetch_seconds: float = 0.0
    #: Seconds each host's prefetch pull took (they run in parallel).
    pull_seconds: Mapping[str, float] = field(default_factory=dict)
    wave_seconds: tuple[float, ...] = ()

    @property
    def exit_code(self) -> ExitCode:
        """OK when completed (or a dry run); COMPLETED_WITH_FAILURES when failures within the budget;
        FAILED when a gate stopped it; INCONCLUSIVE when paused."""
        if self.status in (fleet_ledger.COMPLETED, "planned"):
            return ExitCode.OK
        if self.status == fleet_ledger.COMPLETED_WITH_FAILURES:
            return ExitCode.COMPLETED_WITH_FAILURES
        if self.status == fleet_ledger.PAUSED:
            return ExitCode.INCONCLUSIVE
        return ExitCode.FAILED


#: What a failure after a host's stop is recovered from (the previous container restored first).
#: A controller that is killed outright (SIGKILL; in the tests a BaseException of its own) is not:
#: it leaves the ledger for ``--resume``, ``abort`` or ``rollback``.
_RECOVERABLE = (Exception, KeyboardInterrupt)
#: Concurrent host steps at most, whatever --max-unavailable allows: each is a thread, an SSH session
#: and a soak gate (an event loop with up to the largest level + 8 connections, its samples in
#: memory, bounded by sustained.max_requests); the soaks' streams, not the hosts, load the controller.
MAX_WORKERS = 32


class _Stop(Exception):
    """Raised inside the wave loop to end the rollout with a status."""

    def __init__(self, status: str, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


def _command_line() -> str:
    """The command that started this run, with option values that may be secret hidden."""
    argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]]
    out: list[str] = []
    hide = False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
        elif a == "--webhook":
            out.append(a)
            hide = True
        elif a.startswith("--webhook="):
            out.append("--webhook=***")
        else:
            out.append(a)
    return shlex.join(out)


class Engine:
    """Runs rollouts and rollbacks for one inventory, recording everything in its ledger."""

    def __init__(self, inventory: Inventory, progress: Progress = NULL, *,
                 secrets: Mapping[str, str] | None = None, state_dir: Path | None = None,
                 ops: Callable[[Host], remote.HostOps] | None = None, gates: gate.Gates | None = None,
                 resolve: Callable[[str, str, Mapping[str, str]], registry.ResolvedImage] | None = None,
                 take_over: bool = False, host_store: hoststate.Store | None = None,
                 deployer: deploy.Deployer | None = None) -> None:
        """``ops``, ``gates`` and ``resolve`` are the seams to the hosts, the soak gate and the registry
        (default: SSH, the soak engine, the registry's API); the unit tests pass a simulated fleet.
        ``host_store`` holds the hosts' lock files (default: on the hosts over SSH; in memory with ``ops``).
        ``deployer`` does a rollout's deploy step (retire + start) for the hosts whose
        ``fleetctl_deploy_via`` is ``ansible`` (the default), one run per step (default: the vllm_serve
        role through ansible-runner; none with a simulated fleet unless given): see :mod:`.deploy`."""
        self.inv = inventory
        self.secrets = dict(os.environ if secrets is None else secrets)
        #: Token services besides the registry's own host that may receive its credentials (https only).
        self.auth_hosts: tuple[str, ...] = tuple(str(h) for h in inventory.vars.get("fleetctl_registry_auth_hosts") or ())
        self.ops = ops or remote.SshHostOps
        self.gates: gate.Gates = gates or gate.SoakGates(self.secrets)
        self._resolve = resolve or functools.partial(registry.resolve, auth_hosts=self.auth_hosts)
        #: Set on Ctrl-C: every worker restores its host at its next phase boundary, then stops.
        self._cancel = threading.Event()
        self.progress = progress
        self.state_dir = state_dir or paths.state_dir(inventory.path)
        self.ledger = fleet_ledger.open_for(inventory, self.state_dir)
        self.mirrors: dict[str, str] = {str(k): str(v) for k, v in
                                        (inventory.vars.get("fleetctl_registry_mirrors") or {}).items()}
        self.deployer: deploy.Deployer | None = deployer or (
            deploy.AnsibleDeployer(inventory, self.mirrors) if ops is None else None)
        # The lock and intent on the hosts: the local lock only covers this state dir.
        self.take_over = take_over
        self.host_store: hoststate.Store = host_store or (hoststate.SSHStore() if ops is None
                                                          else hoststate.MemoryStore())
        self.held: hoststate.HostLocks | None = None

    def close(self) -> None:
        """Close the ledger and SSH connections."""
        self.ledger.close()

    # -- helpers ---------------------------------------------------------------------------

    def _emit(self, phase: str, message: str = "", host: str | None = None, **data: Any) -> None:
        self.progress(Event(phase, message, host, data))

    def _webhook(self, rid: str, url: str | None) -> Webhook:
        """The run's webhook; constructing it validates the URL (call it before touching any host)."""
        u = url or os.environ.get("FLEETCTL_WEBHOOK_URL") or self.inv.vars.get("fleetctl_webhook_url")
        allow_http = self.inv.vars.get("fleetctl_webhook_allow_http") is True
        return Webhook(str(u) if u else None, rid, str(self.inv.path), self.progress, allow_http=allow_http)

    def recipe(self, name: str | None = None) -> Recipe:
        """The recipe ``name`` (default: the inventory's ``fleetctl_recipe``)."""
        return recipe_for(self.inv, name)

    def _container_secrets(self, recipe: Recipe) -> dict[str, str]:
        """The values of the recipe's container secrets, from the environment or ``NAME_FILE``."""
        return secretenv.resolve(secretenv.container_secrets(recipe.secret_env), self.secrets)

    def _check_recipe(self, recipe: Recipe) -> None:
        """Refuse a recipe whose required secrets are missing; show its security warnings."""
        self._container_secrets(recipe)
        secretenv.api_key(recipe.secret_env, self.secrets, recipe=recipe.name)
        for w in recipe.warnings:
            self._emit("warning", w)

    def _hold(self, rid: str, kind: str, hosts: Sequence[Host]) -> None:
        """Claim ``hosts`` in their own state files, all or nothing (LockedError names the holder)."""
        locks = hoststate.HostLocks(self.host_store, hosts, rid, kind, take_over=self.take_over,
                                    stale_after=float(self.inv.vars.get("fleetctl_lock_stale_after",
                                                                        hoststate.STALE_AFTER)),
                                    notify=lambda msg, host: self._emit("lock", msg, host))
        locks.claim()
        self.held = locks

    def _unhold(self) -> None:
        if self.held is not None:
            self.held.release()
            self.held = None

    def _check_idle(self, allow: str | None = None) -> None:
        """Refuse when another rollout is running (live lock) or left active (paused, or killed)."""
        for rec_id in self.ledger.ids(statuses=fleet_ledger.ACTIVE, limit=5):
            if rec_id == allow:
                continue
            rec = self.ledger.get(rec_id)
            verb = "is paused" if rec.status == fleet_ledger.PAUSED else "was interrupted (its controller died)"
            raise FleetError(
                f"{rec.kind} {rec.id} to {rec.tag} {verb}",
                fix="`fleetctl rollout --resume` to continue it, or `fleetctl rollout abort` / `fleetctl rollback` to undo it",
            )

    # -- planning --------------------------------------------------------------------------

    def _preflight(self, hosts: Sequence[Host], recipe: Recipe, ref: str) -> dict[str, remote.Facts]:
        """Facts about every host; refuse the whole rollout (every host and cause) if one is unfit."""
        self._emit("preflight", f"checking {len(hosts)} host(s)")
        outcomes = ssh.fan_out(hosts, lambda h: self.ops(h).facts(recipe, ref), timeout=120)
        problems: list[str] = []
        out: dict[str, remote.Facts] = {}
        for h in hosts:
            o = outcomes[h.name]
            if o.error is not None or o.value is None:
                problems.append(f"{h.name}: {o.error.cause if o.error else 'no answer'}")
                continue
            f = o.value
            out[h.name] = f
            need = float(h.vars.get("fleetctl_image_free_gb", DEFAULT_IMAGE_FREE_GB))
            if f.gpu != GB10:
                problems.append(f"{h.name}: GPU is {f.gpu!r}, not {GB10}: the images are built for sm_121a only")
            if not f.nvidia_runtime:
                problems.append(f"{h.name}: Docker has no nvidia runtime (nvidia-container-toolkit missing)"
                                " - run `fleetctl provision`")
            for why in f.missing_weights:
                problems.append(f"{h.name}: {why} - run `fleetctl stage --recipe {recipe.name} --limit {h.name}`")
            if not f.has_image and f.free_gb < need:
                problems.append(f"{h.name}: {f.free_gb:.1f} GB free for the image, needs {need:.0f} GB")
            self._emit("preflight", "ok" if not problems else "checked", h.name)
        if problems:
            raise FleetError("preflight refused the rollout before any change:\n  " + "\n  ".join(problems),
                             fix="fix each host above, or leave it out with --limit '!NAME'")
        return out

    def plan(self, opts: Options) -> tuple[P.Plan, Recipe, dict[str, remote.Facts], list[Host]]:
        """Resolve the tag, preflight the hosts and cut the waves. Touches nothing."""
        if not opts.tag:
            raise FleetError("no tag given", fix="pass --tag, e.g. --tag v0.24.0")
        recipe = self.recipe(opts.recipe)
        self._check_recipe(recipe)
        hosts = self.inv.select(opts.limit)
        for h in hosts:
            deploy.deploy_via(h)  # a bad value is refused before anything is resolved or touched
        self._emit("resolve", f"{recipe.image}:{opts.tag}")
        img = self._resolve(recipe.image, opts.tag, self.mirrors)
        ref = registry.pull_ref(recipe.image, img.digest, self.mirrors)
        self._emit("resolve", f"{opts.tag} -> {img.tag} ({img.digest[:19]})")
        facts = self._preflight(hosts, recipe, ref)
        current = {n: (f.serving.tag, f.serving.digest) if f.serving and f.serving.running else (None, None)
                   for n, f in facts.items()}
        p = P.build(recipe=recipe.name, image=img.image, requested=opts.tag, tag=img.tag, digest=img.digest,
                    pull_ref=ref, hosts=[h.name for h in hosts], current=current, waves=opts.waves,
                    max_unavailable=opts.max_unavailable, failure_budget=opts.failure_budget,
                    fingerprint=remote.fingerprint(recipe),
                    current_fingerprints={n: f.serving.fingerprint if f.serving and f.serving.running else None
                                          for n, f in facts.items()})
        return p, recipe, facts, hosts

    # -- rollout ---------------------------------------------------------------------------

    def rollout(self, opts: Options) -> RolloutResult:
        """Plan, then (unless dry-run) prefetch and go wave by wave through the gates."""
        rid = fleet_ledger.new_id("rollout")
        t_start = time.monotonic()
        self._webhook(rid, opts.webhook)
        if opts.dry_run:
            p, recipe, _facts, _hosts = self.plan(opts)
            return RolloutResult(None, "rollout", "planned", recipe.name, p.tag, p.digest, p.image,
                                 tuple(HostOutcome(h.host, h.wave, h.action, "planned", h.current_tag,
                                                   h.current_digest, None, None) for h in p.hosts), plan=p)
        self.ledger.acquire(rid)
        try:
            self._check_idle()
            self._hold(rid, "rollout", self.inv.select(opts.limit))
            p, recipe, facts, hosts = self.plan(opts)
            options = {"waves": opts.waves or P.DEFAULT_WAVES, "max_unavailable": p.max_unavailable,
                       "failure_budget": p.failure_budget, "soak": opts.soak,
                       "on_inconclusive": opts.on_inconclusive, "ready_timeout": opts.ready_timeout,
                       "pull_ref": p.pull_ref}
            rows = []
            for hp in p.hosts:
                f = facts[hp.host]
                before = f.serving if f.serving and f.serving.running else None
                rows.append({"host": hp.host, "wave": hp.wave, "step": hp.step,
                             "status": fleet_ledger.SKIPPED if hp.action == "skip" else fleet_ledger.PENDING,
                             "before_tag": before.tag if before else None,
                             "before_digest": before.digest if before else None,
                             "before": before.settings if before else None,
                             "target_tag": p.tag, "target_digest": p.digest})
            for hp in p.hosts:
                b = facts[hp.host].serving
                if b is not None and b.running and b.digest and hp.action == "deploy":
                    # What a host serves when a rollout moves it away is known good to go back to
                    # (before fleetctl first touched it: ``found``).
                    first = not self.ledger.known_good(hp.host)
                    self.ledger.add_known_good(hp.host, tag=b.tag, digest=b.digest, fingerprint=b.fingerprint,
                                               settings=b.settings, source="found" if first else "served",
                                               rollout_id=None)
            self.ledger.create(rid, kind="rollout", recipe=recipe.name, requested=p.requested, tag=p.tag,
                               digest=p.digest, image=p.image, options=options, command=_command_line(),
                               waves=p.waves, hosts=rows)
            if self.held is not None:
                now = time.time()
                self.held.seed({hp.host: (hoststate.Version(p.tag, p.digest, rid, now) if hp.action == "deploy"
                                          else None,
                                          hoststate.Version(hp.current_tag, hp.current_digest, None, now)
                                          if hp.current_digest else None) for hp in p.hosts})
            return self._run(rid, recipe, opts, p, {h.name: h for h in hosts}, resume=False, t0=t_start)
        finally:
            self._unhold()
            self.ledger.release(rid)

    def resume(self, opts: Options) -> RolloutResult:
        """Continue the paused or interrupted rollout, from each host's real state."""
        t_start = time.monotonic()
        self._webhook("resume", opts.webhook)
        rec = self.ledger.latest(statuses=fleet_ledger.ACTIVE)
        if rec is None:
            raise FleetError("there is no paused or interrupted rollout to resume",
                             fix="see `fleetctl history`; start a new one with `fleetctl rollout --tag T`")
        stale = self.ledger.acquire(rec.id)
        try:
            if stale is not None:
                self._emit("resume", f"took over the lock of dead controller pid {stale.pid} ({stale.rollout_id})")
            self.ledger.note(rec.id, "resumed", _command_line())
            recipe = self.recipe(rec.recipe)
            self._hold(rec.id, rec.kind, [self.inv.host(h.host) for h in rec.hosts])
            self._check_recipe(recipe)
            if rec.kind == "rollback":
                self.ledger.set_status(rec.id, fleet_ledger.RUNNING)
                hook = self._webhook(rec.id, opts.webhook)
                try:
                    return self._rollback_run(rec.id, recipe, hook)
                finally:
                    hook.close()
            o = rec.options
            soak = opts.soak if opts.soak is not None else o.get("soak")
            ropts = dataclasses.replace(opts, tag=rec.tag, recipe=rec.recipe, soak=soak,
                                        on_inconclusive=opts.on_inconclusive or o.get("on_inconclusive", "pause"),
                                        ready_timeout=opts.ready_timeout or o.get("ready_timeout"))
            hosts = {h.host: self.inv.host(h.host) for h in rec.hosts}
            for hh in hosts.values():
                deploy.deploy_via(hh)  # refused before the record runs again, not in the middle of a wave
            p = P.Plan(recipe.name, rec.image or recipe.image, rec.requested or "", rec.tag or "", rec.digest or "",
                       str(o["pull_ref"]), tuple(w.hosts for w in rec.waves), int(o["max_unavailable"]),
                       int(o["failure_budget"]),
                       tuple(P.HostPlan(h.host, h.wave, h.step, h.before_tag, h.before_digest,
                                        "skip" if h.status == fleet_ledger.SKIPPED else "deploy") for h in rec.hosts))
            self.ledger.set_status(rec.id, fleet_ledger.RUNNING)
            return self._run(rec.id, recipe, ropts, p, hosts, resume=True, t0=t_start)
        finally:
            self._unhold()
            self.ledger.release(rec.id)

    def _parallel(self, hosts: Sequence[Host], fn: Callable[[Host], None]) -> dict[str, FleetError | None]:
        """Run ``fn`` on every host at once (bounded); what each raised, as data.

        Nothing returns before every worker has stopped, so that the lock is
        never released while a thread still changes a host. Ctrl-C in the
        main thread asks every worker to restore its host and stop (they check
        at each phase); a KeyboardInterrupt (or a kill) in a worker is raised
        here once the others are done.
        """
        out: dict[str, FleetError | None] = {}
        raised: list[BaseException] = []
        if not hosts:
            return out

        def call(h: Host) -> None:
            try:
                fn(h)
                out[h.name] = None
            except FleetError as e:
                out[h.name] = e
            except Exception as e:
                out[h.name] = FleetError(f"{type(e).__name__}: {e}", host=h.name)
            except BaseException as e:
                out[h.name] = FleetError(f"interrupted ({type(e).__name__})", host=h.name)
                raised.append(e)
                self._cancel.set()

        pool = ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(hosts)), thread_name_prefix="fleetctl-step")
        futures = [pool.submit(call, h) for h in hosts]
        interrupted = False
        while True:
            try:
                wait_futures(futures)
                break
            except KeyboardInterrupt:
                interrupted = True
                self._cancel.set()
                self._emit("interrupt", "Ctrl-C: restoring the hosts being changed, then stopping")
        pool.shutdown(wait=True)
        kills = [e for e in raised if not isinstance(e, KeyboardInterrupt)]
        if kills:
            raise kills[0]
        if interrupted or raised:
            raise KeyboardInterrupt
        return {h.name: out.get(h.name) for h in hosts}

    def _run(self, rid: str, recipe: Recipe, opts: Options, p: P.Plan, hosts: Mapping[str, Host],
             resume: bool, t0: float) -> RolloutResult:
        """The waves of a recorded rollout; ``t0`` is when the command started (planning included)."""
        hook = self._webhook(rid, opts.webhook)
        try:
            return self._waves(rid, recipe, opts, p, hosts, resume, t0, hook)
        finally:
            hook.close()

    def _waves(self, rid: str, recipe: Recipe, opts: Options, p: P.Plan, hosts: Mapping[str, Host],
               resume: bool, t0: float, hook: Webhook) -> RolloutResult:
        hook.send("start" if not resume else "wave", tag=p.tag, digest=p.digest, recipe=recipe.name,
                  hosts=[h.host for h in p.hosts], waves=[list(w) for w in p.waves], resumed=resume)
        for hp in p.hosts:
            self._emit("planned" if hp.action == "deploy" else "skip", "", hp.host, wave=hp.wave + 1 if hp.wave >= 0 else "-",
                       tag=hp.current_tag or "-")
        todo = [hosts[h.host] for h in p.hosts if h.action == "deploy"]
        t_pre = time.monotonic()
        try:
            pulls = self._prefetch(rid, todo, p.pull_ref)
        except _Stop as e:
            self.ledger.set_status(rid, e.status, e.error)
            hook.send("failure", error=e.error)
            return self._result(rid, p=p, seconds=time.monotonic() - t0)
        prefetch_s = time.monotonic() - t_pre
        wave_secs: list[float] = []
        status, error = fleet_ledger.COMPLETED, None
        try:
            for w, members in enumerate(p.waves):
                tw = time.monotonic()
                rec = self.ledger.get(rid)
                pending = [h for h in members
                           if (r := rec.host(h)) is not None
                           and not self._host_finished(rid, r, p, hosts[h], remote.fingerprint(recipe))]
                if not pending:
                    continue
                self.ledger.set_wave(rid, w, fleet_ledger.RUNNING)
                hook.send("wave", wave=w + 1, of=len(p.waves), hosts=list(members))
                # The fleet-wide line under the live table: which wave runs (a fleet of hundreds scrolls).
                self._emit("wave", f"{w + 1} of {len(p.waves)}: {len(pending)} host(s), "
                                   f"{p.max_unavailable} at a time")
                for step in P.split_steps(pending, p.max_unavailable):
                    batch = self._batch(rid, recipe, [hosts[h] for h in step])
                    try:
                        outs = self._parallel([hosts[h] for h in step],
                                              functools.partial(self._host_step, rid, recipe, opts, p, wave=w,
                                                                batch=batch))
                    except KeyboardInterrupt:
                        self.ledger.set_status(rid, fleet_ledger.PAUSED, "interrupted by Ctrl-C (hosts being changed were restored)")
                        hook.send("pause", error="interrupted by Ctrl-C")
                        raise
                    for name, err in outs.items():
                        if err is not None:
                            # An exception that escaped the step (its restore failed too): the host is down.
                            self.ledger.host_phase(rid, name, "error", detail=err.message(),
                                                   status=fleet_ledger.HOST_FAILED, error=err.message())
                    rec = self.ledger.get(rid)
                    paused = [h for h in step if (r := rec.host(h)) is not None and r.status == fleet_ledger.HOST_PAUSED]
                    bad = [h for h in step if (r := rec.host(h)) is not None and r.status in (fleet_ledger.ROLLED_BACK, fleet_ledger.HOST_FAILED)]
                    # Counted from the ledger, so that the budget is carried across resumes.
                    failures = sum(1 for r in rec.hosts if r.status in (fleet_ledger.ROLLED_BACK, fleet_ledger.HOST_FAILED))
                    if bad:
                        why = "; ".join(f"{h}: {rec.host(h).error}" for h in bad if rec.host(h) is not None)  # type: ignore[union-attr]
                        hook.send("failure", hosts=bad, error=why)
                        if any(rec.host(h).status == fleet_ledger.ROLLED_BACK for h in bad):  # type: ignore[union-attr]
                            hook.send("rollback", hosts=[h for h in bad if rec.host(h).status == fleet_ledger.ROLLED_BACK])  # type: ignore[union-attr]
                        if w == 0 or failures > p.failure_budget:
                            self.ledger.set_wave(rid, w, fleet_ledger.FAILED)
                            raise _Stop(fleet_ledger.FAILED, why)
                    if paused:
                        self.ledger.set_wave(rid, w, fleet_ledger.PAUSED)
                        why = "; ".join(f"{h}: {rec.host(h).error}" for h in paused)  # type: ignore[union-attr]
                        hook.send("pause", hosts=paused, error=why)
                        raise _Stop(fleet_ledger.PAUSED, f"inconclusive gate: {why}")
                self.ledger.set_wave(rid, w, fleet_ledger.DONE)
                wave_secs.append(time.monotonic() - tw)
            failed = [r for r in self.ledger.get(rid).hosts if r.status in (fleet_ledger.ROLLED_BACK, fleet_ledger.HOST_FAILED)]
            if failed:
                status = fleet_ledger.COMPLETED_WITH_FAILURES
                error = "; ".join(f"{r.host}: {r.error}" for r in failed)
        except _Stop as e:
            status, error = e.status, e.error
        self.ledger.set_status(rid, status, error)
        if status == fleet_ledger.COMPLETED:
            hook.send("completion", tag=p.tag, digest=p.digest)
        elif status == fleet_ledger.COMPLETED_WITH_FAILURES:
            hook.send("failure", error=error)
        self._emit(status, error or f"{p.tag} on {len(todo)} host(s)")
        return self._result(rid, p=p, seconds=time.monotonic() - t0, prefetch=prefetch_s, waves=tuple(wave_secs),
                            pulls=pulls)

    def _host_finished(self, rid: str, r: fleet_ledger.HostRecord, p: P.Plan, h: Host, fp: str) -> bool:
        """True when the host needs no step: skipped, already judged (rolled back or reported down:
        a resume never re-gates a version its gate failed), or done AND really serving the target."""
        if r.status in (fleet_ledger.SKIPPED, fleet_ledger.ROLLED_BACK, fleet_ledger.HOST_FAILED):
            return True
        if r.status != fleet_ledger.DONE:
            return False
        cur = self.ops(h).inspect(remote.container_name(h))
        if cur is not None and cur.running and cur.digest == p.digest and cur.fingerprint in (fp, None):
            return True
        self.ledger.host_phase(rid, h.name, "drifted", detail="the ledger said done but the host does not serve "
                               "the target: redoing it", status=fleet_ledger.PENDING)
        return False

    def _prefetch(self, rid: str, hosts: Sequence[Host], ref: str) -> dict[str, float]:
        """Pull the image on every target in parallel before anything is stopped; seconds per host."""
        if not hosts:
            return {}
        self.ledger.note(rid, "prefetch", ref)
        for h in hosts:
            self._emit("pull", ref.rsplit("@", 1)[0].rsplit("/", 1)[-1], h.name)
        outs = ssh.fan_out(hosts, lambda h: self.ops(h).pull(ref), timeout=None)
        bad = {n: o.error for n, o in outs.items() if o.error is not None}
        for n, o in outs.items():
            if o.error is None:
                self._emit("pulled", f"{o.value:.1f}s", n)
        if bad:
            why = "; ".join(f"{n}: {e.cause if e else '?'}" for n, e in bad.items())
            raise _Stop(fleet_ledger.FAILED, f"prefetch failed before any host was changed: {why}")
        return {n: float(o.value or 0.0) for n, o in outs.items()}

    # -- one host ----------------------------------------------------------------------------

    def _phase(self, rid: str, h: Host, phase: str, detail: str | None = None, data: Mapping[str, Any] | None = None,
               **fields: Any) -> None:
        """Commit the phase to the ledger, then show it."""
        self.ledger.host_phase(rid, h.name, phase, detail, **fields)
        self._emit(phase, detail or "", h.name, **dict(data or {}))

    def _check_cancel(self) -> None:
        """Raise KeyboardInterrupt in a worker once Ctrl-C was pressed (its host is then restored)."""
        if self._cancel.is_set():
            raise KeyboardInterrupt

    def _batch(self, rid: str, recipe: Recipe, step: Sequence[Host]) -> deploy.StepBatch | None:
        """The step's deploys through the deployer (one run for its hosts deployed via Ansible), or None."""
        members = [h.name for h in step if deploy.deploy_via(h) == deploy.VIA_ANSIBLE]
        if self.deployer is None or not members:
            return None
        return deploy.StepBatch(self.deployer, members, self._container_secrets(recipe),
                                paths.private_dir(self.state_dir / "runs" / rid), self.ops)

    def _host_step(self, rid: str, recipe: Recipe, opts: Options, p: P.Plan, h: Host, wave: int,
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

    def _host_step_on(self, rid: str, recipe: Recipe, opts: Options, p: P.Plan, h: Host, wave: int,
                      batch: deploy.StepBatch | None) -> None:
        name = remote.container_name(h)
        ops = self.ops(h)
        show = {"wave": wave + 1, "tag": p.tag}
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
        except _RECOVERABLE as e:
            why = e.message() if isinstance(e, FleetError) else (
                "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}")
            # Ctrl-C is no verdict on the version: the host is restored and left pending for --resume.
            self._fail_host(rid, recipe, h, why, None, show, t, judged=not isinstance(e, KeyboardInterrupt))
            if isinstance(e, KeyboardInterrupt):
                raise

    def _deploy_and_gate(self, rid: str, recipe: Recipe, opts: Options, p: P.Plan, h: Host, ops: remote.HostOps,
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
        self._phase(rid, h, "soak", f"{cfg.sustained_duration:.0f}s sustained", {**show, "health": "ready"})
        t0 = time.monotonic()
        art = self._artifacts(rid, h)
        verdict = self.gates.soak(h, recipe, p.tag, cfg, self.state_dir, before_tag, art, f"{rid}/{art.name}",
                                  self._forward(h, show, "soak"))
        t["soak"] = time.monotonic() - t0
        summary = gate.summarise(verdict, t)
        figures = gate.figures(verdict)
        if verdict.outcome.value == "pass":
            now = ops.inspect(remote.container_name(h))
            # Known-good first, then done: a kill between them leaves a host to re-check, never a lost intent.
            self.ledger.add_known_good(h.name, tag=p.tag, digest=p.digest, fingerprint=remote.fingerprint(recipe),
                                       settings=now.settings if now else None, source="gate", rollout_id=rid)
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

    def _artifacts(self, rid: str, h: Host) -> Path:
        """``state_dir/runs/<rollout id>/soak-<host>``: the gate's samples, scrapes and verdict.json,
        plus a failed container's log and the rollback's smoke check; the ledger records it."""
        return self.state_dir / "runs" / rid / f"soak-{h.name}"

    def _forward(self, h: Host, show: Mapping[str, Any], phase: str, cancellable: bool = True) -> Progress:
        """Soak/readiness events as rows of the live table (phase kept, figures picked out).

        A cancellable one raises KeyboardInterrupt after Ctrl-C, so that a long soak stops at its next event."""
        def forward(event: Event) -> None:
            if cancellable:
                self._check_cancel()
            data = {**show, "health": phase, **gate.table_figures(event.data)}
            self.progress(Event(phase, event.message or event.phase, h.name, data))
        return forward

    def _fail_host(self, rid: str, recipe: Recipe, h: Host, why: str, verdict: Any,
                   show: Mapping[str, Any], t: dict[str, float], judged: bool = True, resumed: bool = False) -> None:
        """Kill the failed container, restore the previous one on ``h``, verify it (readiness + smoke), record why.

        A host that cannot be restored is recorded as failed (down) with the command that fixes it.
        ``resumed``: finishing the rollback of a controller that died in it, whose restore may
        already have happened: a host that runs its previous version again is checked, not touched
        (restoring again would remove it, with no ``.prev`` left to start).
        """
        name = remote.container_name(h)
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
                if cur is not None and cur.running and cur.rollout != rid and _same(
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
        if not judged:
            self._phase(rid, h, "restored", f"{why}; serving {prev.tag} again", {**back, "health": "ok"},
                        status=fleet_ledger.PENDING, error=None, verdict=None)
            return
        self._phase(rid, h, "rolled-back", f"serving {prev.tag} again", {**back, "health": "ok"},
                    status=fleet_ledger.ROLLED_BACK, after_tag=prev.tag, after_digest=prev.digest, error=why, verdict=summary)

    def _save_logs(self, rid: str, h: Host, ops: remote.HostOps, name: str) -> None:
        """Keep the failed container's log in the run's artifacts (the container itself is removed)."""
        try:
            text = ops.logs(name, 300)
        except FleetError:
            return
        d = paths.private_dir(self._artifacts(rid, h))
        paths.write_private(d / "failed-container.log", text)

    # -- rollback and abort --------------------------------------------------------------------

    def rollback(self, to: str | None = None, limit: str | None = None, max_unavailable: str | None = None,
                 recipe_name: str | None = None, webhook: str | None = None,
                 only_active: bool = False) -> RolloutResult:
        """Every selected host back to the version it served before the last rollout or rollback (or to ``to``).

        Fast path: the kept ``.prev`` container is swapped in when it holds the
        wanted digest; otherwise the image is pulled and the recipe started
        from it. Gate: readiness and smoke, no full soak; a host whose target
        fails is put back on what it served. Usable while a rollout or rollback
        is paused or after its controller died: that one is then aborted.
        """
        rid = fleet_ledger.new_id("rollback")
        hook = self._webhook(rid, webhook)
        self.ledger.acquire(rid)
        try:
            active = self.ledger.latest(statuses=fleet_ledger.ACTIVE)
            if only_active and active is None:
                raise FleetError("there is no paused or interrupted rollout or rollback to abort",
                                 fix="use `fleetctl rollback` to return to the previous version")
            parent = active or self.ledger.latest()
            recipe = self.recipe(recipe_name or (parent.recipe if parent else None))
            self._check_recipe(recipe)
            everyone = [h.name for h in self.inv.select(limit)]
            if limit or parent is None or (to and not only_active):
                selected = everyone
            else:
                # Without --limit, the hosts of the last (or the interrupted) rollout or rollback.
                mine = {h.host for h in parent.hosts}
                selected = [n for n in everyone if n in mine]
            skips: dict[str, str] = {n: f"not in the last {parent.kind} ({parent.id})" for n in everyone
                                     if n not in selected and parent is not None}
            self._hold(rid, "rollback", [self.inv.host(n) for n in selected])
            name = {n: remote.container_name(self.inv.host(n)) for n in selected}
            looks = ssh.fan_out([self.inv.host(n) for n in selected], lambda h: self.ops(h).inspect(name[h.name]),
                                timeout=120)
            unreachable = [o.error.message() for o in looks.values() if o.error is not None]
            if unreachable:
                raise FleetError("could not look at every host before the rollback:\n  " + "\n  ".join(unreachable),
                                 fix="bring the host back, or leave it out with --limit '!NAME'")
            current = {n: looks[n].value for n in selected}
            targets: dict[str, tuple[str | None, str, str]] = {}
            # The container settings (fingerprint) each target ran with, when known: a recipe-only
            # change is undone by going back to the old settings, not only to the old image.
            fps: dict[str, str | None] = {}
            img = self._resolve(recipe.image, to, self.mirrors) if to else None
            tgt: tuple[str | None, str]
            for n in selected:
                cur = current[n]
                serving = (cur.digest, cur.fingerprint) if cur is not None and cur.running else None
                if img is not None:
                    # An explicit --to checks a host already there (readiness + smoke) rather than skip it.
                    tgt = (img.tag, img.digest)
                    fps[n] = remote.fingerprint(recipe)
                elif only_active:
                    hr = parent.host(n) if parent is not None else None
                    if hr is None or hr.status == fleet_ledger.SKIPPED:
                        skips[n] = f"not changed by {parent.id if parent else 'it'}"
                        continue
                    if not hr.before_digest:
                        skips[n] = "first deploy: nothing served before it (leave it, or `fleetctl rollout` a version)"
                        continue
                    tgt = (hr.before_tag, hr.before_digest)
                    fps[n] = ((hr.before or {}).get("labels") or {}).get(remote.LABEL_FINGERPRINT)
                    if serving is not None and _same(hr.before_digest, fps[n], *serving):
                        skips[n] = f"already there (serving {hr.before_tag})"
                        continue
                else:
                    known = self.ledger.known_good(n)
                    if not known:
                        # A host this ledger never knew (another operator's checkout): its own record.
                        v = self._known_good([n]).get(n)
                        if v is None:
                            skips[n] = "first deploy: no known-good version recorded (pass --to TAG)"
                        elif serving is not None and serving[0] == v.digest:
                            skips[n] = f"already there (serving its last known-good {v.tag}, recorded on the host)"
                        else:
                            targets[n] = (v.tag, v.digest, registry.pull_ref(recipe.image, v.digest, self.mirrors))
                        continue
                    # The newest known-good that is not what the host serves now.
                    other = [k for k in known if serving is None or not _same(k.digest, k.fingerprint, *serving)]
                    if not other and len(known) == 1 and known[0].source == "gate":
                        skips[n] = f"first deploy: {known[0].tag} is the only version known good here"
                        continue
                    if not other:
                        skips[n] = f"already there (serving its last known-good {known[0].tag})"
                        continue
                    tgt = (other[0].tag, other[0].digest)
                    fps[n] = other[0].fingerprint or None
                targets[n] = (tgt[0], tgt[1], registry.pull_ref(recipe.image, tgt[1], self.mirrors))
            names = [n for n in selected if n in targets]
            for n in names:
                c = current[n]
                if c is not None and c.running and c.digest and not self.ledger.known_good(n):
                    self.ledger.add_known_good(n, tag=c.tag, digest=c.digest, fingerprint=c.fingerprint,
                                               settings=c.settings, source="found", rollout_id=None)
            mu = P.parse_size(max_unavailable or "1", "--max-unavailable").of(max(1, len(names)))
            rows: list[dict[str, Any]] = [
                {"host": n, "wave": 0, "step": i // mu, "target_tag": targets[n][0], "target_digest": targets[n][1]}
                for i, n in enumerate(names)]
            rows += [{"host": n, "wave": -1, "step": -1, "status": fleet_ledger.SKIPPED, "phase": "skipped",
                      "verdict": json.dumps({"summary": f"skipped: {why}"})} for n, why in skips.items()]
            self.ledger.create(rid, kind="rollback", recipe=recipe.name, requested=to,
                               tag=targets[names[0]][0] if to and names else to,
                               digest=targets[names[0]][1] if to and names else None, image=recipe.image,
                               options={"max_unavailable": mu, "to": to,
                                        "fingerprints": {n: fps[n] for n in names if fps.get(n)}},
                               command=_command_line(), waves=[names],
                               hosts=rows, parent=parent.id if parent else None)
            if self.held is not None:
                now = time.time()
                self.held.seed({n: (hoststate.Version(targets[n][0], targets[n][1], rid, now), None) for n in names})
            if active is not None:
                self.ledger.set_status(active.id, fleet_ledger.ABORTED, f"undone by {rid}")
            hook.send("rollback", parent=parent.id if parent else None, hosts=names, to=to)
            return self._rollback_run(rid, recipe, hook)
        finally:
            hook.close()
            self._unhold()
            self.ledger.release(rid)

    def _rollback_run(self, rid: str, recipe: Recipe, hook: Webhook) -> RolloutResult:
        """The steps of a recorded rollback (new or resumed): hosts not yet done, ``max_unavailable`` at once."""
        t0 = time.monotonic()
        rec = self.ledger.get(rid)
        mu = int(rec.options.get("max_unavailable") or 1)
        todo = [h for h in rec.hosts if h.status not in (fleet_ledger.DONE, fleet_ledger.ROLLED_BACK, fleet_ledger.HOST_FAILED, fleet_ledger.SKIPPED)]
        fps: Mapping[str, str] = rec.options.get("fingerprints") or {}
        targets = {h.host: (h.target_tag, h.target_digest or "",
                            registry.pull_ref(recipe.image, h.target_digest or "", self.mirrors),
                            fps.get(h.host)) for h in todo}
        for step in P.split_steps([h.host for h in todo], mu):
            try:
                outs = self._parallel([self.inv.host(n) for n in step],
                                      lambda h: self._rollback_host(rid, recipe, h, *targets[h.name]))
            except KeyboardInterrupt:
                self.ledger.set_status(rid, fleet_ledger.PAUSED, "interrupted by Ctrl-C (hosts being changed were restored)")
                raise
            for n, err in outs.items():
                if err is not None:
                    self.ledger.host_phase(rid, n, "failed", err.message(), status=fleet_ledger.HOST_FAILED,
                                           error=err.message())
        rec = self.ledger.get(rid)
        bad = [h for h in rec.hosts if h.status not in (fleet_ledger.DONE, fleet_ledger.SKIPPED)]
        status = fleet_ledger.FAILED if bad else fleet_ledger.COMPLETED
        error = "; ".join(f"{h.host}: {h.error}" for h in bad) or None
        self.ledger.set_status(rid, status, error)
        hook.send("completion" if not bad else "failure", error=error)
        return self._result(rid, seconds=time.monotonic() - t0)

    def _known_good(self, names: Sequence[str]) -> dict[str, hoststate.Version]:
        """The last known-good recorded on each of ``names`` (hosts without one are left out)."""
        if not names:
            return {}
        states = hoststate.read_all(self.host_store, [self.inv.host(n) for n in names])
        return {n: s.last_known_good for n, s in states.items() if s.last_known_good is not None}

    def _rollback_host(self, rid: str, recipe: Recipe, h: Host, tag: str | None, digest: str, ref: str,
                       fingerprint: str | None = None) -> None:
        """One host to ``digest`` (with the settings ``fingerprint`` when known), checked by readiness and
        smoke; a target that fails is itself undone."""
        name = remote.container_name(h)
        ops = self.ops(h)
        show = {"wave": 1, "tag": tag or "?"}
        t: dict[str, float] = {}
        t0 = time.monotonic()
        rec = self.ledger.host_record(rid, h.name)
        cur = ops.inspect(name)
        prev = ops.inspect(name + remote.PREV_SUFFIX)
        if rec is not None and rec.phase == "undoing":
            # Killed while putting back what served before: finish that.
            self._undo_rollback(rid, recipe, h, ops, rec.error or "the target failed", show)
            return
        def wanted(s: remote.Serving | None) -> bool:
            return s is not None and _same(digest, fingerprint, s.digest, s.fingerprint)

        if not wanted(cur) and not wanted(prev) and fingerprint and fingerprint != remote.fingerprint(recipe):
            # Only a kept container has the old settings; starting the image with today's recipe would
            # not be the version that was good. Nothing has been touched: the host keeps serving.
            raise FleetError(
                f"its known-good {tag} ran with other container settings (fingerprint {fingerprint[:12]}) than "
                f"recipe {recipe.name} renders now ({remote.fingerprint(recipe)[:12]}), and that container is gone",
                host=h.name, fix=f"restore the recipe as it was, then `fleetctl rollout --tag {tag} --limit {h.name}`"
                                 f"; or `fleetctl rollback --to {tag} --limit {h.name}` for {tag} with today's recipe")
        if cur is not None and rec is not None and rec.before_digest is None and not wanted(cur):
            self.ledger.host_phase(rid, h.name, "inspected", status=fleet_ledger.IN_PROGRESS, before_tag=cur.tag,
                                   before_digest=cur.digest, before=cur.settings)
        try:
            self._check_cancel()
            if cur is not None and cur.running and wanted(cur):
                self._phase(rid, h, "loading", f"serving {tag}: checking it", {**show, "health": "loading"},
                            status=fleet_ledger.IN_PROGRESS)
            elif prev is not None and wanted(prev):
                self._phase(rid, h, "restoring", f"starting the kept {name}{remote.PREV_SUFFIX} ({tag})", show,
                            status=fleet_ledger.IN_PROGRESS)
                ops.swap(name)
            else:
                self._phase(rid, h, "pull", ref.rsplit("/", 1)[-1][:40], show, status=fleet_ledger.IN_PROGRESS)
                t["pull"] = ops.pull(ref)
                self._phase(rid, h, "stopping", None, show)
                # The version being left is abandoned: killed, not drained (it is kept as .prev).
                ops.retire(name, rid, digest, grace=0)
                self._phase(rid, h, "starting", None, show)
                ops.start(recipe, ref, tag=tag or digest[:19], digest=digest, rollout_id=rid, secrets=self._container_secrets(recipe))
            cfg = gate.config(recipe, None, h)
            ready = self.gates.wait(h, recipe, tag or "", cfg, None, self._forward(h, show, "loading"))
            t["ready"] = time.monotonic() - t0
            if not ready.ready:
                raise FleetError(f"readiness {ready.outcome.value}: {ready.message}", host=h.name)
            self._check_cancel()
            self._phase(rid, h, "smoke", None, {**show, "health": "ready"})
            v = self.gates.smoke(h, recipe, tag or "", cfg, self._artifacts(rid, h))
            t["total"] = time.monotonic() - t0
            if v.outcome.value != "pass":
                raise FleetError(f"smoke {v.outcome.value}: {gate.failed_checks_text(v)}", host=h.name)
        except _RECOVERABLE as e:
            why = e.cause if isinstance(e, FleetError) else (
                "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}")
            self._undo_rollback(rid, recipe, h, ops, f"{tag} failed: {why}", show)
            if isinstance(e, KeyboardInterrupt):
                raise
            return
        self._phase(rid, h, "done", f"serving {tag}", {**show, "health": "ok"}, status=fleet_ledger.DONE, after_tag=tag,
                    after_digest=digest, verdict=gate.summarise(v, t), artifacts=v.artifacts_dir)

    def _undo_rollback(self, rid: str, recipe: Recipe, h: Host, ops: remote.HostOps, why: str,
                       show: Mapping[str, Any]) -> None:
        """Put back what ``h`` served before this rollback (kept as ``.prev``) after its target failed."""
        name = remote.container_name(h)
        self._phase(rid, h, "undoing", why, {**show, "health": "failed"}, error=why)
        rec = self.ledger.host_record(rid, h.name)
        before = rec.before_digest if rec is not None else None
        fix = (f"`fleetctl rollback --to {rec.before_tag} --limit {h.name}`" if rec is not None and rec.before_tag
               else f"`fleetctl rollout --tag TAG --limit {h.name}` with a version that works")
        before_fp = (((rec.before or {}).get("labels") or {}).get(remote.LABEL_FINGERPRINT)
                     if rec is not None else None)
        try:
            cur = ops.inspect(name)
            if before is None:
                raise FleetError("nothing served before this rollback", host=h.name)
            if not (cur is not None and cur.running and _same(before, before_fp, cur.digest, cur.fingerprint)):
                prev = ops.inspect(name + remote.PREV_SUFFIX)
                if prev is None or not _same(before, before_fp, prev.digest, prev.fingerprint):
                    raise FleetError("the previous container is gone", host=h.name)
                ops.restore(name)
            cfg = gate.config(recipe, None, h)
            ready = self.gates.wait(h, recipe, rec.before_tag or "" if rec else "", cfg, None,
                                    self._forward(h, show, "undoing", cancellable=False))
            if not ready.ready:
                raise FleetError(f"the restored version did not become ready: {ready.message}", host=h.name)
        except Exception as e:
            cause = e.cause if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            self._phase(rid, h, "failed", f"{why}; undo failed: {cause}", {**show, "health": "down"},
                        status=fleet_ledger.HOST_FAILED, error=f"{why}; undo failed: {cause}; fix: {fix}")
            return
        tag_b = rec.before_tag if rec is not None else None
        self._phase(rid, h, "rolled-back", f"{why}; serving {tag_b} again", {**show, "health": "ok", "tag": tag_b},
                    status=fleet_ledger.ROLLED_BACK, after_tag=tag_b, after_digest=before, error=why)

    def abort(self, webhook: str | None = None, force: bool = False) -> RolloutResult:
        """Undo the paused or interrupted rollout: every host it touched back to its previous version."""
        if force:
            self.ledger.release(None)
            self.take_over = True
        return self.rollback(webhook=webhook, only_active=True)

    # -- results -------------------------------------------------------------------------------

    def _result(self, rid: str, p: P.Plan | None = None, seconds: float = 0.0, prefetch: float = 0.0,
                waves: tuple[float, ...] = (), pulls: Mapping[str, float] | None = None) -> RolloutResult:
        rec = self.ledger.get(rid)
        return RolloutResult(
            rec.id, rec.kind, rec.status, rec.recipe or "", rec.tag, rec.digest, rec.image,
            tuple(host_outcome(h) for h in rec.hosts), plan=p, error=rec.error, seconds=seconds,
            prefetch_seconds=prefetch, pull_seconds=dict(pulls or {}), wave_seconds=waves)


def _same(digest: str, fingerprint: str | None, digest2: str | None, fingerprint2: str | None) -> bool:
    """The same container version: same digest, and same settings when both fingerprints are known."""
    return digest == digest2 and (not fingerprint or not fingerprint2 or fingerprint == fingerprint2)


def host_outcome(h: fleet_ledger.HostRecord) -> HostOutcome:
    """A ledger host record as a result row."""
    v = h.verdict or {}
    return HostOutcome(
        host=h.host, wave=h.wave, status=h.status, phase=h.phase, before_tag=h.before_tag,
        before_digest=h.before_digest, after_tag=h.after_tag, after_digest=h.after_digest,
        verdict=v.get("summary"), failed_checks=tuple(v.get("failed_checks") or ()), artifacts=h.artifacts,
        error=h.error, timings=dict(v.get("timings") or {}))


def open_engine(inventory: Inventory, progress: Progress = NULL) -> Engine:
    """An engine for ``inventory`` with its ledger opened."""
    return Engine(inventory, progress)


