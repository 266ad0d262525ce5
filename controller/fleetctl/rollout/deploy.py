"""The rollout's deploy step (retire the serving container, start the new one) through the
vllm_serve role.

``fleetctl rollout`` deploys through ``playbooks/deploy.yml`` (the ``vllm_serve``
role and its ``vllm_container`` module) run by ansible-runner, so that what it
does to a host is a role an operator can read and run from AWX; the inventory's
``fleetctl_deploy_via: ssh`` keeps the controller's own docker commands over
paramiko (for comparison and the bench). One ansible-runner run covers every
host of a *step* (the hosts of a wave restarted together, at most
``--max-unavailable``; forks = their number), not one run per host:
ansible-playbook's start-up is paid once per step.

Only the deploy goes through Ansible. Readiness, soak and smoke stay the
engine's gates (the role's own readiness wait and preflight are turned off:
the engine checked every host before the first wave), and the recovery path -
``restore``, ``swap``, ``kill``, ``inspect``, ``facts``, ``logs`` - stays on
:class:`~fleetctl.rollout.host.SshHostOps`: one pooled SSH round trip each.
Measured on the lab, 4 nodes, 2 shared cores at load 4-13
(``bench/rollout.py --deploy-compare --repeat 3``, medians): retire + start of
the canary 3.2 s through the role vs 1.3 s over SSH, of a 3-host step (one
run) 9.8 s vs 2.0 s; a whole rollout with 3 s soaks 92.7 s vs 88.5 s (1.05x).
A rollback through ``rollback.yml`` took 5.7-6.5 s against 4.1 s over
paramiko with a 1 s load (bench/ansible_serve.py), past the goal
of at most 5 s over the previous version's load; the SSH restore after a
failed gate stays at 3.3-3.7 s over it with either deploy path. A rollback is
what ends an incident: it keeps the fast path.

How the engine's recovery guarantees carry over: the module decides what
happens to ``NAME`` and ``NAME.prev`` exactly as :func:`~fleetctl.rollout.host.retire`
does, with the same docker steps in the same order, and labels the container
with the rollout id, so that a controller killed during the role's run leaves
a host the engine's inspect-first resume already handles (nothing touched;
the old one stopped and kept as ``.prev``; or this rollout's container
started). The engine still commits ``stopping`` before the run and
``starting`` after it. A host whose part of the run failed is looked at over
SSH (:func:`reconcile`): if the old container was not retired, the failure is
the retire's (the host was never stopped by this deploy, nothing is restored);
otherwise the failure is the start's and the engine's ``_fail_host`` restores
``.prev`` over SSH, as it does for a failed ``docker run``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fleetctl import ansible
from fleetctl.container import LABEL_DIGEST, LABEL_TAG, Container
from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Inventory
from fleetctl.progress import NULL, Event, Progress
from fleetctl.recipes import Recipe
from fleetctl.rollout import host as remote
from fleetctl.runids import new_run_id

#: Values of the inventory's ``fleetctl_deploy_via``.
VIA_ANSIBLE, VIA_SSH = "ansible", "ssh"
#: The role's deploy when the inventory says nothing: the issue wants the role to be what deploys.
DEFAULT_VIA = VIA_ANSIBLE
#: Seconds each task of a deploy run may take beyond the old server's drain (stop, rename, run).
_TASK_TIMEOUT = 240


def deploy_via(host: Host) -> str:
    """How a rollout deploys on ``host``: ``ansible`` (the vllm_serve role) or ``ssh`` (the
    controller's docker CLI)."""
    via = str(host.vars.get("fleetctl_deploy_via") or DEFAULT_VIA).strip().lower()
    if via not in (VIA_ANSIBLE, VIA_SSH):
        raise FleetError(
            f"fleetctl_deploy_via is {host.vars.get('fleetctl_deploy_via')!r}",
            host=host.name,
            fix=f"set fleetctl_deploy_via to {VIA_ANSIBLE} (the vllm_serve role) or {VIA_SSH}",
        )
    return via


@dataclass(frozen=True)
class DeployRequest:
    """Retire what serves on one host and start the recipe from ``ref`` (one host's part of a
    step)."""

    host: Host
    name: str
    recipe: Recipe
    ref: str
    tag: str
    digest: str
    rollout_id: str
    #: Seconds ``docker stop`` gives the old server to drain.
    grace: int = 30
    #: The host's compile-cache key (fleetctl.warmcache): its caches mounted, when the recipe has
    #: any.
    cache_key: str | None = None


@dataclass(frozen=True)
class DeployOutcome:
    """How one host's deploy went.

    ``retired``: the old container no longer serves under the name (stopped and
    kept as ``.prev``, or removed in favour of the ``.prev`` that served last);
    ``before`` is then what ``retire`` returns (the version to go back to).
    ``error`` with ``retired`` False is a failure of the retire (nothing to
    restore); with ``retired`` True a failure of the start (``.prev`` is restored).
    """

    retired: bool
    before: Container | None = None
    error: FleetError | None = None
    #: Where the run's artifacts are (ansible-runner's job events), when it went through Ansible.
    artifacts: str | None = None


class Deployer(Protocol):
    """Deploys one step's hosts together (the wave-level deploy hook of the engine)."""

    def deploy(self, requests: Sequence[DeployRequest], secrets: Mapping[str, str],
               run_dir: Path) -> dict[str, DeployOutcome]:
        """Retire and start on every host of ``requests``; one outcome per host name, failures as
        data.

        ``run_dir`` is the rollout's artifacts directory (``state_dir/runs/<rollout id>``)."""
        ...


def reconcile(ops: remote.ServingOps, req: DeployRequest, error: FleetError) -> DeployOutcome:
    """After a failed deploy on one host: was the old container retired? Decided by looking at the
    host.

    Still running something that is not this rollout's container, or holding the old one stopped
    under the serving name: not retired (the retire failed; nothing is restored, as when the
    controller's retire fails). Otherwise the serving name is empty or holds this rollout's
    container: retired, and ``.prev`` is the version to go back to. A host that cannot even be
    looked at counts as not retired: restoring blindly could remove the only good container.
    """
    try:
        cur = ops.inspect(req.name)
        prev = ops.inspect(req.name + remote.PREV_SUFFIX)
    except FleetError as e:
        return DeployOutcome(
            False,
            error=FleetError(
                f"{error.cause}; then the host could not be looked at: {e.cause}",
                host=req.host.name,
                fix=f"once the host answers, `fleetctl rollback --limit {req.host.name}` (back to "
                    "its last known-good)",
            ),
        )
    if cur is not None and not (cur.rollout == req.rollout_id and cur.digest == req.digest):
        what = "still serves" if cur.running else "holds the stopped"
        return DeployOutcome(
            False,
            error=FleetError(
                f"{error.cause}; {req.name} {what} {cur.tag or cur.image}, not retired by this "
                "deploy",
                host=req.host.name,
                fix=error.fix
                or f"see the error; `fleetctl rollback --limit {req.host.name}` "
                "if it does not serve",
            ),
        )
    return DeployOutcome(True, before=prev, error=error)


class StepBatch:
    """The deploys of one step, gathered so that one run covers them all.

    Every member either joins (its worker reached the deploy) or leaves (it will
    not deploy: already running this rollout's container, failing before, or
    cancelled); the run starts in the thread of the last one to arrive, and each
    joiner gets its own outcome. Anything the run raises beyond an Exception
    (Ctrl-C, or the harness's kill) is raised in every joiner.
    """

    def __init__(self, deployer: Deployer, members: Collection[str], secrets: Mapping[str, str],
                 run_dir: Path, ops: Callable[[Host], remote.ServingOps]) -> None:
        """``ops``: how to look at a host when the deployer broke as a whole (see
        :func:`reconcile`)."""
        self._deployer = deployer
        self._ops = ops
        self._secrets = secrets
        self._run_dir = run_dir
        self._cv = threading.Condition()
        #: The hosts of the step that deploy through this batch (the others deploy over SSH).
        self.members = frozenset(members)
        self._order = list(members)
        self._waiting = set(members)
        self._joined: dict[str, DeployRequest] = {}
        self._outcomes: dict[str, DeployOutcome] | None = None
        self._raised: BaseException | None = None
        self._started = False

    def _take_run(self) -> bool:
        """Under the lock: whether the caller is the one to run the batch now."""
        if self._waiting or self._started or not self._joined:
            return False
        self._started = True
        return True

    def _run(self) -> None:
        # In the step's order, not the workers' arrival: the same run for the same step, every time.
        reqs = [self._joined[n] for n in self._order if n in self._joined]
        outcomes: dict[str, DeployOutcome] = {}
        raised: BaseException | None = None
        try:
            outcomes = dict(self._deployer.deploy(reqs, self._secrets, self._run_dir))
        except Exception as e:  # a deployer that broke as a whole: each host is looked at
            err = (
                e
                if isinstance(e, FleetError)
                else FleetError(f"deploy run broke: {type(e).__name__}: {e}")
            )
            try:
                outcomes = {r.host.name: reconcile(self._ops(r.host), r, err) for r in reqs}
            except BaseException as e2:
                raised = e2
        except BaseException as e:
            raised = e
        with self._cv:
            self._outcomes = outcomes
            self._raised = raised
            self._cv.notify_all()

    def leave(self, host: str) -> None:
        """``host`` will not deploy in this step (a no-op once it joined)."""
        with self._cv:
            if host not in self._waiting:
                return
            self._waiting.discard(host)
            go = self._take_run()
        if go:
            self._run()

    def join(self, req: DeployRequest) -> DeployOutcome:
        """Deploy ``req`` with the others of the step; returns when the step's run is over."""
        with self._cv:
            self._waiting.discard(req.host.name)
            self._joined[req.host.name] = req
            go = self._take_run()
        if go:
            self._run()
        with self._cv:
            while self._outcomes is None:
                self._cv.wait()
            if self._raised is not None:
                raise self._raised
            out = self._outcomes.get(req.host.name)
        if out is None:
            return DeployOutcome(
                False,
                error=FleetError(
                    "the deploy run reported nothing for this host",
                    host=req.host.name,
                    fix="see the run's artifacts",
                ),
            )
        return out


@dataclass
class BatchedDeploy:
    """One host's part of a :class:`StepBatch`: its retire and its start are the step's one
    deploy run (the role retires and starts in one module call). Every other operation on the
    host stays its ``HostOps``' (SSH): the recovery path stays on paramiko."""

    batch: StepBatch
    request: DeployRequest
    outcome: DeployOutcome | None = field(default=None)

    def retire(self) -> Container | None:
        """Join the batch; what ``HostOps.retire`` would return, or the retire's failure
        raised."""
        self.outcome = self.batch.join(self.request)
        if not self.outcome.retired:
            raise self.outcome.error or FleetError(
                "the deploy did not retire the old container", host=self.request.host.name
            )
        return self.outcome.before

    def start(self) -> None:
        """The start's failure raised, if the run's start failed (call after :meth:`retire`)."""
        assert self.outcome is not None, "a batched start follows its retire"
        if self.outcome.error is not None:
            raise self.outcome.error


def serving_from_report(c: Mapping[str, object] | None) -> Container | None:
    """The module's redacted container summary as a :class:`~fleetctl.container.Container`."""
    if not c:
        return None
    labels = {str(k): str(v) for k, v in dict(c.get("labels") or {}).items()}  # type: ignore[call-overload]
    settings = {
        k: c.get(k)
        for k in (
            "image",
            "entrypoint",
            "cmd",
            "env_names",
            "binds",
            "network_mode",
            "ipc_mode",
            "gpus",
        )
    }
    settings["labels"] = labels
    return Container(
        name=str(c.get("name") or ""),
        running=bool(c.get("running")),
        status=str(c.get("status") or ""),
        image=str(c.get("image") or ""),
        digest=labels.get(LABEL_DIGEST),
        tag=labels.get(LABEL_TAG),
        labels={k: v for k, v in labels.items() if k.startswith("fleetctl.")},
        settings=settings,
    )


class AnsibleDeployer:
    """:class:`Deployer` through ``playbooks/deploy.yml`` (the vllm_serve role), one ansible-runner
    run per step."""

    def __init__(
        self,
        inventory: Inventory,
        mirrors: Mapping[str, str],
        ops: Callable[[Host], remote.ServingOps] = remote.SshHostOps,
        playbook: str = "deploy",
        progress: Progress = NULL,
    ) -> None:
        self.inv = inventory
        self.mirrors = dict(mirrors)
        self.ops = ops
        self.playbook = playbook
        self.progress = progress

    def _tasks(self, event: Event) -> None:
        """Each host's Ansible task, as it starts and ends, into that host's row of the live
        views."""
        task = str(event.data.get("task") or "")
        if event.host is not None and task:
            self.progress(Event("deploying", f"ansible: {task} ({event.phase})", event.host,
                                {"task": task, "ansible": event.phase}))

    def deploy(self, requests: Sequence[DeployRequest], secrets: Mapping[str, str],
               run_dir: Path) -> dict[str, DeployOutcome]:
        if not requests:
            return {}
        first = requests[0]
        if any(
            (r.recipe.name, r.digest, r.tag, r.rollout_id, r.grace)
            != (first.recipe.name, first.digest, first.tag, first.rollout_id, first.grace)
            for r in requests
        ):
            raise FleetError("one deploy run was given hosts with different targets",
                             fix="report this as a bug in fleetctl")
        extravars = {
            "deploy_waves": ["100%"],
            # One host's failure must not stop the others of the step: each is judged by the engine.
            "deploy_max_fail_percentage": 100,
            "vllm_serve_recipe": first.recipe.name,
            "vllm_serve_tag": first.tag,
            "vllm_serve_digest": first.digest,
            "vllm_serve_rollout": first.rollout_id,
            "vllm_serve_registry_mirrors": self.mirrors,
            "vllm_serve_stop_timeout": int(first.grace),
            # Readiness and the gates are the engine's; the engine's preflight checked every host
            # already.
            "vllm_serve_wait_ready": False,
            "vllm_serve_preflight": False,
            "vllm_serve_secrets": dict(secrets),
            # Each host's compile-cache key (one per host: the key names its GPU).
            "vllm_serve_compile_cache_keys": {
                r.host.name: r.cache_key for r in requests if r.cache_key
            },
        }
        run_id = new_run_id("deploy")
        try:
            res = ansible.run_playbook(
                self.playbook,
                self.inv,
                limit=",".join(r.host.name for r in requests),
                extravars=extravars,
                redact=list(secrets.values()),
                progress=self._tasks,
                artifacts_dir=run_dir / "ansible" / run_id,
                run_id=run_id,
                # As bounded as the controller's own commands (stop: 90 s, run: 120 s), plus the
                # drain.
                task_timeout=int(first.grace) + _TASK_TIMEOUT,
            )
        except FleetError as e:
            return {r.host.name: reconcile(self.ops(r.host), r, e) for r in requests}
        out: dict[str, DeployOutcome] = {}
        art = str(res.artifacts_dir)
        for r in requests:
            hr = res.hosts.get(r.host.name)
            report = dict((hr.reports if hr is not None else {}).get("serve") or {})
            if hr is not None and hr.succeeded and report:
                out[r.host.name] = DeployOutcome(
                    True, before=serving_from_report(report.get("previous")), artifacts=art
                )
                continue
            why = (hr.message if hr is not None and hr.message else
                   f"the deploy run ended {res.status} without a result for this host")
            o = reconcile(self.ops(r.host), r, FleetError(
                f"deploy through the vllm_serve role failed: {why}", host=r.host.name,
                fix=f"see {res.artifacts_dir / 'stdout'}"))
            out[r.host.name] = DeployOutcome(o.retired, o.before, o.error, art)
        return out
