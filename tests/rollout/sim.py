"""A simulated fleet for the rollout engine's state machine: hosts with Docker's container
semantics.

Each host keeps containers by unique name, and implements the engine's
:class:`~fleetctl.rollout.host.HostOps` with what the docker CLI would do:
``run`` refuses a name in use and leaves a created-but-not-running container
when the image cannot start, ``stop``/``kill`` keep the container, ``rename``
refuses a taken name, ``rm -f`` removes. Images behave as the test says
(``ok``, ``nostart``: docker run fails; ``exit1``: the entrypoint exits at
once; ``soakfail``: ready but fails the soak), per digest or per host.

Every host operation that changes something, and every ledger transition,
is a numbered *point*; ``kill_at=N`` makes the controller die at the Nth one
(:class:`Killed`, a BaseException of its own, so that nothing in the engine
mistakes it for a failure it could recover from), and from then on every
operation and ledger write raises it too, as after a SIGKILL.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl import serving
from fleetctl.container import (
    LABEL_DIGEST,
    LABEL_FINGERPRINT,
    LABEL_RECIPE,
    LABEL_ROLLOUT,
    LABEL_TAG,
)
from fleetctl.container import Container as Inspected
from fleetctl.errors import FleetError, HostUnreachable
from fleetctl.facts import Facts
from fleetctl.inventory import Host
from fleetctl.progress import Progress
from fleetctl.recipes import Recipe
from fleetctl.registry import ResolvedImage
from fleetctl.rollout import host as remote
from fleetctl.rollout.deploy import DeployOutcome, DeployRequest, reconcile
from fleetctl.rollout.gate import Baseline, Judged
from fleetctl.soak import Readiness, SoakConfig, Verdict
from fleetctl.soak.verdict import Outcome
from fleetctl.state.ledger import Ledger
from tests.rollout.sim_hostside import Relay, SimHostSide
from tests.rollout.sim_run import active as active
from tests.rollout.sim_run import assert_not_wedged as assert_not_wedged
from tests.rollout.sim_run import recover as recover
from tests.rollout.sim_run import run_command as run_command

NAME = serving.DEFAULT_CONTAINER
PREV = NAME + remote.PREV_SUFFIX
OK, NOSTART, EXIT1, SOAKFAIL = "ok", "nostart", "exit1", "soakfail"
#: A container label overriding its image's behaviour (one container's settings are broken).
BEHAVIOUR_LABEL = "sim.behaviour"


class Killed(BaseException):
    """The controller died here (SIGKILL): nothing after this point runs."""


#: Container IDs, unique in the process (a container replaced under the same name has another).
_IDS = (f"c{n:063d}" for n in itertools.count(1))


def digest_of(tag: str) -> str:
    """A stable fake digest per tag."""
    return "sha256:" + (tag.encode().hex() * 64)[:64]


@dataclass
class Container:
    name: str
    digest: str
    tag: str
    rollout: str
    running: bool
    status: str
    labels: dict[str, str] = field(default_factory=dict)
    id: str = field(default_factory=lambda: next(_IDS))


@dataclass
class SimHost:
    name: str
    containers: dict[str, Container] = field(default_factory=dict)
    images: set[str] = field(default_factory=set)
    #: The image relay running here, if any (imagetree.RELAY_NAME).
    relay: Relay | None = None
    #: Compile caches: ``<recipe>/<key>`` -> relative path -> bytes; the manifests shared ones got.
    caches: dict[str, dict[str, bytes]] = field(default_factory=dict)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The host's state file (hoststate): the fleet's lock and intent, as text.
    state: str = ""
    #: Behaviour overrides of digests on this host only.
    behaviour: dict[str, str] = field(default_factory=dict)
    #: SSH answers no more (every operation raises HostUnreachable).
    ssh_down: bool = False
    #: After an operation of this name succeeds, SSH goes down.
    ssh_down_after: str | None = None

    def serving(self) -> Container | None:
        c = self.containers.get(NAME)
        return c if c is not None and c.running else None


class SimFleet:
    """The hosts, the registry's tags and the kill switch, shared by every engine of a test."""

    def __init__(self, hosts: Mapping[str, str], tags: Mapping[str, str],
                 recipes: Mapping[str, str] | None = None) -> None:
        """``hosts``: name -> tag it serves at first; ``tags``: tag -> behaviour of its image;
        ``recipes``: name -> the recipe its first container serves (its ``fleetctl.recipe`` label;
        none: a container fleetctl did not start)."""
        self.tags = dict(tags)
        self.behaviour = {digest_of(t): b for t, b in tags.items()}
        self.hosts: dict[str, SimHost] = {}
        for n, tag in hosts.items():
            h = SimHost(n)
            d = digest_of(tag)
            h.images.add(d)
            labels = {LABEL_RECIPE: recipes[n]} if recipes and n in recipes else {}
            h.containers[NAME] = Container(NAME, d, tag, "", True, "running", labels)
            self.hosts[n] = h
        self.mu = threading.RLock()
        self.kill_at: int | None = None
        #: Die at the first point of this name (steps of two groups interleave: an index is not a
        #: place).
        self.kill_on: str | None = None
        self.points: list[str] = []
        self.dead = False
        #: Raise KeyboardInterrupt (Ctrl-C) in the soak of this host.
        self.ctrl_c_in_soak: str | None = None
        #: Serving units: head -> every member, the head first. A head serves (ready, soak, smoke)
        #: only while every member runs the head's version, as a multi-node engine whose ranks all
        #: joined.
        self.units: dict[str, list[str]] = {}
        #: Stop this member's container when the soak of its unit's head begins (a worker dying
        #: mid-soak).
        self.kill_in_soak: str | None = None
        #: Relays by (address, port), for a relay whose upstream is another host's.
        self.relays: dict[tuple[str, int], str] = {}
        #: Who filled a relay from whom, in order: (host, the host whose relay it read, "registry").
        self.relay_reads: list[tuple[str, str]] = []
        #: Hosts whose relay does not start (its port taken).
        self.relay_fails: set[str] = set()
        #: Every bandwidth probe run: (host, unit, image reference); the bus bandwidth it measures.
        self.probes: list[tuple[str, str, str]] = []
        self.busbw_gbs = 24.0

    # -- the kill switch --------------------------------------------------------------------

    def point(self, what: str) -> None:
        """A side effect or a ledger transition happened; die here if told to."""
        with self.mu:
            if self.dead:
                raise Killed(what)
            self.points.append(what)
            if (self.kill_at is not None and len(self.points) >= self.kill_at) or (
                    self.kill_on is not None and what == self.kill_on):
                self.dead = True
                raise Killed(what)

    def alive(self) -> None:
        with self.mu:
            if self.dead:
                raise Killed("dead")

    def revive(self) -> None:
        """A new controller: no kill planned, every point counted from zero."""
        with self.mu:
            self.dead = False
            self.kill_at = None
            self.kill_on = None
            self.points = []

    def watch(self, ledger: Ledger) -> None:
        """Make every committed ledger transition a point."""
        for m in ("create", "set_status", "set_wave", "host_phase", "note"):
            orig: Callable[..., Any] = getattr(ledger, m)

            def wrapped(*a: Any, _orig: Callable[..., Any] = orig, _m: str = m, **kw: Any) -> Any:
                self.alive()
                out = _orig(*a, **kw)
                detail = a[2] if _m == "host_phase" and len(a) > 2 else (a[1] if len(a) > 1 else "")
                self.point(f"ledger.{_m}:{detail}")
                return out
            setattr(ledger, m, wrapped)

    # -- what hosts serve -------------------------------------------------------------------

    def behaves(self, h: SimHost, digest: str) -> str:
        return h.behaviour.get(digest) or self.behaviour.get(digest, OK)

    def serving_digest(self, host: str) -> str | None:
        c = self.hosts[host].serving()
        return c.digest if c is not None else None

    def serving_tags(self) -> dict[str, str | None]:
        return {
            n: (c.tag if (c := h.serving()) is not None else None) for n, h in self.hosts.items()
        }

    # -- seams for the engine ---------------------------------------------------------------

    def ops(self, host: Host) -> SimOps:
        return SimOps(host, self)

    def resolve(self, image: str, tag: str, mirrors: Mapping[str, str]) -> ResolvedImage:
        if tag not in self.tags:
            raise FleetError(f"no tag {tag} in {image}", fix="pick a tag that exists")
        return ResolvedImage(
            image, tag, tag, digest_of(tag), "application/vnd.oci.image.index.v1+json"
        )


@dataclass
class SimOps(SimHostSide):
    """:class:`HostOps` on a simulated host (each call is one atomic round trip, like one SSH
    command); its operations besides the container's: :class:`~.sim_hostside.SimHostSide`."""

    host: Host
    fleet: SimFleet

    @property
    def _h(self) -> SimHost:
        h = self.fleet.hosts[self.host.name]
        if h.ssh_down:
            raise HostUnreachable("SSH session broke", host=h.name, fix="check that the host is up")
        return h

    def _done(self, op: str) -> None:
        h = self.fleet.hosts[self.host.name]
        if h.ssh_down_after == op:
            h.ssh_down = True
            h.ssh_down_after = None
        self.fleet.point(f"{self.host.name}:{op}")

    def _serving(self, c: Container | None) -> Inspected | None:
        if c is None:
            return None
        labels = {**c.labels, LABEL_ROLLOUT: c.rollout}
        return Inspected(c.name, running=c.running, status=c.status, image=f"img@{c.digest}",
                                digest=c.digest, tag=c.tag, id=c.id,
                                settings={"labels": dict(c.labels)},
                                labels={k: v for k, v in labels.items()
                                        if k.startswith("fleetctl.")})

    # docker primitives
    def _rm_f(self, h: SimHost, name: str) -> None:
        h.containers.pop(name, None)

    def _rename(self, h: SimHost, old: str, new: str) -> None:
        if old not in h.containers:
            raise FleetError(f"docker rename: no container {old}", host=h.name)
        if new in h.containers:
            raise FleetError(f"docker rename: name {new} in use", host=h.name)
        c = h.containers.pop(old)
        c.name = new
        h.containers[new] = c

    def _start(self, h: SimHost, name: str) -> None:
        c = h.containers[name]
        b = c.labels.get(BEHAVIOUR_LABEL) or self.fleet.behaves(h, c.digest)
        if b == NOSTART:
            c.running, c.status = False, "created"
            raise FleetError("docker start: could not select device driver", host=h.name)
        c.running, c.status = (False, "exited") if b == EXIT1 else (True, "running")

    def _start_then(self, h: SimHost, name: str, op: str) -> None:
        """Start ``name``; the operation happened on the host whether the start worked or not."""
        try:
            self._start(h, name)
        finally:
            self._done(op)

    # HostOps
    def facts(self, recipe: Recipe, ref: str) -> Facts:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            d = ref.rsplit("@", 1)[-1]
            return Facts(h.name, gpu="NVIDIA GB10", runtimes=("nvidia", "runc"),
                                image_free_gb=100.0, has_image=d in h.images,
                                serving=self._serving(h.containers.get(NAME)),
                                previous=self._serving(h.containers.get(PREV)))

    def inspect(self, name: str) -> Inspected | None:
        with self.fleet.mu:
            self.fleet.alive()
            return self._serving(self._h.containers.get(name))

    def pull(self, ref: str, on_line: Callable[[str], None] | None = None) -> float:
        del on_line  # a simulated pull has no layers to report
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            d = ref.rsplit("@", 1)[-1]
            if ref.startswith("127.0.0.1:") and (h.relay is None or d not in h.relay.holds):
                raise FleetError(f"docker pull {ref}: the relay here does not hold it", host=h.name)
            h.images.add(d)
            self._done("pull")
            return 0.0

    def retire(self, name: str, rollout_id: str, target_digest: str,
               grace: int = 30) -> Inspected | None:
        # The same decisions as host.retire's shell script, on the simulated containers.
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            cur = h.containers.get(name)
            prev = h.containers.get(name + remote.PREV_SUFFIX)
            if cur is None:
                return self._serving(prev)
            if prev is not None and (
                not cur.running or (cur.rollout == rollout_id and cur.digest == target_digest)
            ):
                self._rm_f(h, name)
                self._done("retire")
                return self._serving(prev)
            before = self._serving(cur)
            self._rm_f(h, name + remote.PREV_SUFFIX)
            cur.running, cur.status = False, "exited"
            self._rename(h, name, name + remote.PREV_SUFFIX)
            self._done("retire")
            return before

    def swap(self, name: str) -> Inspected | None:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            prev = h.containers.get(name + remote.PREV_SUFFIX)
            if prev is None:
                return None
            before = self._serving(prev)
            cur = h.containers.get(name)
            if cur is not None:
                cur.running, cur.status = False, "exited"
                self._rename(h, name, name + ".swap")
                self._rename(h, name + remote.PREV_SUFFIX, name)
                self._rename(h, name + ".swap", name + remote.PREV_SUFFIX)
            else:
                self._rename(h, name + remote.PREV_SUFFIX, name)
            self._start_then(h, name, "swap")
            return before

    def start(self, req: remote.StartRequest) -> None:
        recipe, tag, digest, rollout_id = req.recipe, req.tag, req.digest, req.rollout_id
        cache_key, launch = req.cache_key, req.launch
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            name = remote.container_name(self.host)
            if name in h.containers:
                raise FleetError(f"docker run: the name {name} is already in use", host=h.name)
            if digest not in h.images:
                raise FleetError(f"docker run: no image {digest}", host=h.name)
            labels = {LABEL_TAG: tag, LABEL_DIGEST: digest,
                      LABEL_FINGERPRINT: remote.fingerprint(recipe),
                      LABEL_RECIPE: recipe.name}
            if launch is not None:
                labels["fleetctl.unit.rank"] = str(launch.rank)
            h.containers[name] = Container(name, digest, tag, rollout_id, False, "created", labels)
            if cache_key is not None and recipe.compile_cache:
                # a cold start compiles into its key directory; a warm one finds the files there
                h.caches.setdefault(f"{recipe.name}/{cache_key}", {
                    f"{c.name}/compiled.bin": f"{c.name} {cache_key}".encode()
                    for c in recipe.compile_cache})
            self._start_then(h, name, "start")

    def stop(self, name: str) -> None:
        with self.fleet.mu:
            self.fleet.alive()
            c = self._h.containers.get(name)
            if c is not None:
                c.running, c.status = False, "exited"
            self._done("stop")

    def start_again(self, name: str) -> None:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            if name not in h.containers:
                raise FleetError(f"docker start: no container {name}", host=h.name)
            self._start_then(h, name, "start-again")

    def restore(self, name: str) -> Inspected | None:
        with self.fleet.mu:
            self.fleet.alive()
            h = self._h
            prev = h.containers.get(name + remote.PREV_SUFFIX)
            if prev is None:
                return None
            before = self._serving(prev)
            self._rm_f(h, name)
            self._rename(h, name + remote.PREV_SUFFIX, name)
            self._start_then(h, name, "restore")
            return before

    def kill(self, name: str) -> None:
        with self.fleet.mu:
            self.fleet.alive()
            self._rm_f(self._h, name)
            self._done("kill")

    def logs(self, name: str, tail: int = 300) -> str:
        with self.fleet.mu:
            self.fleet.alive()
            c = self._h.containers.get(name)
            return f"{name}: {c.status if c else 'no such container'}\n"


class SimGates:
    """Readiness, soak and smoke answered from the simulated container's image behaviour."""

    def __init__(self, fleet: SimFleet) -> None:
        self.fleet = fleet

    def _state(self, host: Host) -> tuple[Container | None, str]:
        with self.fleet.mu:
            self.fleet.alive()
            h = self.fleet.hosts[host.name]
            if h.ssh_down:
                return None, "down"
            c = h.containers.get(remote.container_name(host))
            if c is None or not c.running:
                return c, "down"
            b = c.labels.get(BEHAVIOUR_LABEL) or self.fleet.behaves(h, c.digest)
            for m in self.fleet.units.get(host.name, [])[1:]:
                # a unit's head serves only while every rank runs its version (else: wedged, no
                # token)
                mh = self.fleet.hosts[m]
                mc = mh.containers.get(NAME)
                if mc is None or not mc.running or mc.digest != c.digest:
                    return c, "down"
                mb = mc.labels.get(BEHAVIOUR_LABEL) or self.fleet.behaves(mh, mc.digest)
                b = b if mb == OK else mb
            return c, b

    def wait(self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, timeout: float | None,
             progress: Progress) -> Readiness:
        c, b = self._state(host)
        if b in (OK, SOAKFAIL):
            return Readiness(Outcome.PASS, "ready", 0.0)
        return Readiness(
            Outcome.FAIL,
            f"container {c.status if c else 'missing'}",
            0.0,
            cause="exited with code 1",
        )

    def _verdict(self, host: Host, tag: str, ok: bool, artifacts: Path | None) -> Verdict:
        return Verdict(
            f"sim/{host.name}",
            host.name,
            f"http://{host.address}",
            Outcome.PASS if ok else Outcome.FAIL,
            "pass" if ok else "fail: decode tok/s dropped 60%",
            "",
            "",
            0.0,
            tag=tag,
            artifacts_dir=str(artifacts) if artifacts else None,
        )

    def soak(self, judged: Judged, baseline: Baseline, artifacts: Path, run_id: str,
             progress: Progress) -> Verdict:
        host, tag = judged.host, judged.tag
        if self.fleet.ctrl_c_in_soak == host.name:
            self.fleet.ctrl_c_in_soak = None
            raise KeyboardInterrupt
        member = self.fleet.kill_in_soak
        if member is not None and member in self.fleet.units.get(host.name, []):
            with self.fleet.mu:
                self.fleet.kill_in_soak = None
                c = self.fleet.hosts[member].containers.get(NAME)
                if c is not None:
                    c.running, c.status = False, "exited"
        _c, b = self._state(host)
        return self._verdict(host, tag, b == OK, artifacts)

    def smoke(
        self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, artifacts: Path
    ) -> Verdict:
        _c, b = self._state(host)
        return self._verdict(host, tag, b in (OK, SOAKFAIL), artifacts)

    def load(self, host: Host, recipe: Recipe, tag: str, cfg: SoakConfig, seconds: float,
             artifacts: Path) -> Verdict:
        """A version that fails its soak fails a burst of load too (it passes smoke)."""
        _c, b = self._state(host)
        return self._verdict(host, tag, b == OK, artifacts)


class SimDeployer:
    """The vllm_serve role's deploy run (:class:`fleetctl.rollout.deploy.Deployer`) on the
    simulated fleet.

    Each host goes through what the role's ``vllm_container`` module does: nothing when the
    container already runs the digest and settings; otherwise its retire decision (the module's
    own ``retire_plan``, loaded from the role) and its docker commands one by one (``rm -f``
    NAME.prev, ``stop``, ``rename``, ``run``), each a kill point of its own, so that the harness
    kills the controller inside the role's run. A failed host is looked at like the real
    deployer does (:func:`fleetctl.rollout.deploy.reconcile`). ``fail_at``: host -> the docker
    step that fails there (``rm-prev``, ``stop``, ``rename``, ``run``). ``runs``: the hosts of
    each run, in order.
    """

    def __init__(self, fleet: SimFleet) -> None:
        from tests.role_modules import load_role_file

        self.fleet = fleet
        self.module = load_role_file("vllm_serve", "library/vllm_container.py")
        self.fail_at: dict[str, str] = {}
        self.runs: list[list[str]] = []
        self.secrets: list[dict[str, str]] = []

    def deploy(self, requests: Sequence[DeployRequest], secrets: Mapping[str, str],
               run_dir: Path) -> dict[str, DeployOutcome]:
        self.fleet.alive()
        self.runs.append([r.host.name for r in requests])
        self.secrets.append(dict(secrets))
        out: dict[str, DeployOutcome] = {}
        # Ansible runs the hosts in forks at once; one after the other is one of its interleavings.
        for r in requests:
            try:
                out[r.host.name] = DeployOutcome(True, before=self._one(r))
            except FleetError as e:
                out[r.host.name] = reconcile(self.fleet.ops(r.host), r, e)
        return out

    def _step(self, ops: SimOps, r: DeployRequest, step: str) -> None:
        if self.fail_at.get(r.host.name) == step:
            raise FleetError(
                f"docker {step} failed", host=r.host.name, fix="see the docker daemon's log"
            )

    def _one(self, r: DeployRequest) -> Inspected | None:
        with self.fleet.mu:
            self.fleet.alive()
            ops = SimOps(r.host, self.fleet)
            h = ops._h
            name, prev_name = r.name, r.name + remote.PREV_SUFFIX
            fp = remote.fingerprint(r.recipe)
            cur, prev = h.containers.get(name), h.containers.get(prev_name)
            if (
                cur is not None
                and cur.digest == r.digest
                and cur.labels.get(LABEL_FINGERPRINT) == fp
            ):
                if cur.running:
                    return ops._serving(prev)
                if prev is None:  # the module starts a stopped container that is already right
                    ops._start_then(h, name, "start")
                    return None
            plan = self.module.retire_plan(
                None if cur is None else cur.running,
                cur.rollout if cur else None,
                cur.digest if cur else None,
                prev is not None,
                r.rollout_id,
                r.digest,
            )
            if plan == "remove":
                self._step(ops, r, "rm")
                ops._rm_f(h, name)
                ops._done("role-rm")
            elif plan == "keep":
                assert cur is not None
                if prev is not None:
                    self._step(ops, r, "rm-prev")
                    ops._rm_f(h, prev_name)
                    ops._done("role-rm-prev")
                self._step(ops, r, "stop")
                cur.running, cur.status = False, "exited"
                ops._done("role-stop")
                self._step(ops, r, "rename")
                ops._rename(h, name, prev_name)
                ops._done("retire")
            self._step(ops, r, "run")
            if r.digest not in h.images:
                raise FleetError(f"docker run: no image {r.digest}", host=h.name)
            h.containers[name] = Container(name, r.digest, r.tag, r.rollout_id, False, "created",
                                           {LABEL_TAG: r.tag, LABEL_DIGEST: r.digest,
                                            LABEL_FINGERPRINT: fp,
                                            LABEL_RECIPE: r.recipe.name})
            ops._start_then(h, name, "start")
            return ops._serving(h.containers.get(prev_name))
