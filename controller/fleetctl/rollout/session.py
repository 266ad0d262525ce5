"""A rollout command's session: the seams every collaborator of the rollout shares.

A rollout goes plan, preflight, prefetch, then per host stop -> start -> ready -> gate. Each host
goes ``planned -> stopping -> starting -> loading -> soak -> done``; a failed gate goes
``-> rolling-back -> rolled-back`` (the previous container, kept as ``<name>.prev``, is started
again and checked with readiness + smoke). Every phase is committed to the ledger before it is
acted on, and every step starts from the host's real state (``docker inspect`` over SSH), so that a
controller killed at any point leaves a ledger that ``--resume`` continues from, or ``rollback``
undoes.

:class:`Session` lives as long as one ``Engine``: the inventory, the ledger, the seams to hosts
(``ops``), gates, registry and front door, the progress sink, Ctrl-C, and the bounded fan-out of
host steps. What one run carries (its id, options, groups, locks, webhook) is the run context,
:class:`fleetctl.rollout.run.Run`, handed to each collaborator explicitly; docs/design.md draws
who calls whom.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl import frontdoor, paths, registry, secretenv, warmcache
from fleetctl.durations import parse_duration
from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Inventory
from fleetctl.progress import NULL, Event, Progress, Relay
from fleetctl.recipes import Recipe, load_recipes, recipe_for
from fleetctl.rollout import deploy, gate, imagetree
from fleetctl.rollout import host as remote
from fleetctl.rollout.plan import MIN_AVAILABLE_VAR
from fleetctl.rollout.webhook import Posting, Webhook
from fleetctl.soak import baselines
from fleetctl.state import hoststate
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

#: What a failure after a host's stop is recovered from (the previous container restored first).
#: A controller that is killed outright (SIGKILL; in the tests a BaseException of its own) is not:
#: it leaves the ledger for ``--resume``, ``abort`` or ``rollback``.
RECOVERABLE = (Exception, KeyboardInterrupt)
#: Concurrent host steps at most, whatever --max-unavailable allows: each is a thread, an SSH
#: session and a soak gate (an event loop with up to the largest level + 8 connections, its samples
#: in memory, bounded by sustained.max_requests); the soaks' streams, not the hosts, load the
#: controller.
MAX_WORKERS = 32
#: Environment variables whose values are kept out of webhook bodies.
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|_KEY$|API_KEY|CREDENTIAL", re.I)


class StopRollout(Exception):
    """Raised inside the wave loop to end the rollout with a status."""

    def __init__(self, status: str, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


def command_line() -> str:
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


def same_version(digest: str, fingerprint: str | None, digest2: str | None,
                 fingerprint2: str | None) -> bool:
    """The same container version: same digest, and same settings when both fingerprints are
    known."""
    return digest == digest2 and (not fingerprint or not fingerprint2
                                  or fingerprint == fingerprint2)


def readmit_attempts(inventory: Inventory) -> int:
    """``fleetctl_readmit_attempts`` (default 3): a whole number from 1 to 10, else one clear
    refusal."""
    raw = inventory.vars.get("fleetctl_readmit_attempts", 3)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 10:
        raise FleetError(f"fleetctl_readmit_attempts in {inventory.path} is {raw!r}, not a whole "
                         f"number from 1 to 10",
                         fix="set fleetctl_readmit_attempts: 3 (re-admissions tried before a host "
                             "is reported out)")
    return raw


@dataclass(frozen=True)
class Seams:
    """How a session reaches the world, each None for the real one: the hosts (``ops``; default
    SSH), the soak gate (``gates``; the soak engine), the registry (``resolve``; its API), the
    hosts' lock files (``host_store``; on the hosts over SSH, in memory with ``ops``), the deploy
    step (``deployer``; the vllm_serve role through ansible-runner, none with ``ops``: see
    :mod:`.deploy`) and the front door (``door``; the inventory's ``fleetctl_front_door``). The unit
    tests pass a simulated fleet."""

    ops: Callable[[Host], remote.HostOps] | None = None
    gates: gate.Gates | None = None
    resolve: Callable[[str, str, Mapping[str, str]], registry.ResolvedImage] | None = None
    host_store: hoststate.Store | None = None
    deployer: deploy.Deployer | None = None
    door: frontdoor.FrontDoor | None = None


NO_SEAMS = Seams()


class Session:
    """The seams one ``Engine`` shares with every collaborator of its runs: the inventory, the
    ledger, the hosts (``ops``), gates, registry and front door, progress, Ctrl-C and the hosts'
    fan-out."""

    def __init__(self, inventory: Inventory, progress: Progress = NULL, *,
                 secrets: Mapping[str, str] | None = None, state_dir: Path | None = None,
                 take_over: bool = False, seams: Seams = NO_SEAMS) -> None:
        """``seams``: how it reaches the hosts, the gate, the registry, the lock files, the deploy
        step and the front door (:class:`Seams`; default: the real ones)."""
        ops, gates, resolve = seams.ops, seams.gates, seams.resolve
        host_store, deployer, door = seams.host_store, seams.deployer, seams.door
        self.inv = inventory
        self.secrets = dict(os.environ if secrets is None else secrets)
        #: Token services besides the registry's own host that may receive its credentials (https
        #: only).
        self.auth_hosts: tuple[str, ...] = tuple(
            str(h) for h in inventory.vars.get("fleetctl_registry_auth_hosts") or ())
        self.ops = ops or remote.SshHostOps
        self.gates: gate.Gates = gates or gate.SoakGates(self.secrets, self.inv)
        self.resolve_image = resolve or functools.partial(registry.resolve,
                                                          auth_hosts=self.auth_hosts)
        #: An image's layer sizes for the pulls' bytes (none asked of a registry with a simulated
        #: fleet).
        self.layer_sizes: Callable[[str, str, Mapping[str, str]], list[dict[str, int]]] = (
            functools.partial(registry.layer_sizes, auth_hosts=self.auth_hosts) if ops is None
            else (lambda image, digest, mirrors: []))
        #: Set on Ctrl-C: every worker restores its host at its next phase boundary, then stops.
        self.cancel = threading.Event()
        #: The command's sink, and its webhook's while one posts (:meth:`webhook`).
        self.relay = Relay(progress)
        self.progress: Progress = self.relay
        self.state_dir = state_dir or paths.state_dir(inventory.path)
        self.ledger = fleet_ledger.open_for(inventory, self.state_dir)
        # Baselines kept in files by an older fleetctl join the ledger's, once.
        baselines.import_files(self.state_dir, self.ledger)
        mirrors = inventory.vars.get("fleetctl_registry_mirrors") or {}
        self.mirrors: dict[str, str] = {str(k): str(v) for k, v in mirrors.items()}
        #: How the prefetch reaches many hosts (:mod:`.imagetree`); with a simulated fleet, never a
        #: tree.
        self.image_tree = (imagetree.config(inventory.vars.get(imagetree.VAR), str(inventory.path))
                           if ops is None else imagetree.TreeConfig(enabled=False))
        self.deployer: deploy.Deployer | None = deployer or (
            deploy.AnsibleDeployer(inventory, self.mirrors,
                                   progress=self.progress) if ops is None else None)
        # The lock and intent on the hosts: the local lock only covers this state dir.
        self.take_over = take_over
        self.host_store: hoststate.Store = host_store or hoststate.OpsStore(self.ops)
        #: The fleet's front door (``door``, else ``fleetctl_front_door``; None: none), checked
        #: before any host.
        self.door: frontdoor.FrontDoor | None = (door if door is not None
                                                 else frontdoor.from_inventory(inventory))
        where = str(inventory.path)
        self.drain_timeout = parse_duration(inventory.vars.get("fleetctl_drain_timeout", 120),
                                            f"fleetctl_drain_timeout in {where}")
        self.readmit_timeout = parse_duration(inventory.vars.get("fleetctl_readmit_timeout", 60),
                                              f"fleetctl_readmit_timeout in {where}")
        #: How long a step waits for the door to have enough hosts in rotation before it refuses
        #: (pauses).
        self.capacity_timeout = parse_duration(inventory.vars.get("fleetctl_capacity_timeout", 600),
                                               f"fleetctl_capacity_timeout in {where}")
        #: Re-admissions tried (with backoff) before a host is reported still out of rotation.
        self.readmit_attempts = readmit_attempts(inventory)
        #: Each host's GPU model as its preflight saw it (a part of its compile-cache key).
        self.gpus: dict[str, str] = {}

    def close(self) -> None:
        """Close the ledger and SSH connections."""
        self.ledger.close()

    def emit(self, phase: str, message: str = "", host: str | None = None, **data: Any) -> None:
        """Show an event (nothing recorded)."""
        self.progress(Event(phase, message, host, data))

    def check_cancel(self) -> None:
        """Raise KeyboardInterrupt in a worker once Ctrl-C was pressed (its host is then
        restored)."""
        if self.cancel.is_set():
            raise KeyboardInterrupt

    def recipe(self, name: str | None = None) -> Recipe:
        """The recipe ``name`` (default: the inventory's ``fleetctl_recipe``)."""
        return recipe_for(self.inv, name)

    def recipe_names(self) -> list[str]:
        """The inventory's recipes' names."""
        return list(load_recipes(self.inv))

    def cache_key(self, h: Host, recipe: Recipe, digest: str) -> str | None:
        """``h``'s compile-cache key for ``recipe`` at ``digest`` (None when the recipe declares no
        cache).

        The GPU is the preflight's; a resumed run that did not look yet takes the one GPU a rollout
        accepts (preflight refuses any other)."""
        if not recipe.compile_cache:
            return None
        return warmcache.cache_key(digest, remote.fingerprint(recipe),
                                   self.gpus.get(h.name, remote.GB10))

    def container_secrets(self, recipe: Recipe) -> dict[str, str]:
        """The values of the recipe's container secrets, from the environment or ``NAME_FILE``."""
        return secretenv.resolve(secretenv.container_secrets(recipe.secret_env), self.secrets)

    def check_recipe(self, recipe: Recipe) -> None:
        """Refuse a recipe whose required secrets are missing; show its security warnings."""
        self.container_secrets(recipe)
        secretenv.api_key(recipe.secret_env, self.secrets, recipe=recipe.name)
        for w in recipe.warnings:
            self.emit("warning", w)

    def min_available(self) -> object:
        """The inventory's floor (``fleetctl_min_available`` in group ``all``), or None."""
        return self.inv.vars.get(MIN_AVAILABLE_VAR)

    def webhook(self, rid: str, url: str | None, *, check_only: bool = False) -> Webhook:
        """The run's webhook; constructing it validates the URL (call it before touching any host).
        Unless ``check_only``, it watches the run's progress until :meth:`Webhook.close`."""
        u = (url or os.environ.get("FLEETCTL_WEBHOOK_URL")
             or self.inv.vars.get("fleetctl_webhook_url"))
        allow_http = self.inv.vars.get("fleetctl_webhook_allow_http") is True
        hook = Webhook(str(u) if u else None, rid, str(self.inv.path), self.relay.sink,
                       posting=Posting(allow_http=allow_http, secrets=self.secret_values()),
                       on_close=lambda h: self.relay.remove(h.watch))
        if hook.url and not check_only:
            # The hosts' progress too (throttled and batched by the webhook): the same events as
            # every view.
            self.relay.add(hook.watch)
        return hook

    def secret_values(self) -> list[str]:
        """Values no webhook body may carry: the hosts' become passwords and every secret-looking
        variable of the environment (a token, key, password or secret), container secrets
        included."""
        values = [h.become.password.reveal() for h in self.inv.hosts.values()
                  if h.become.password is not None]
        values += [v for k, v in self.secrets.items() if SECRET_NAME.search(k)]
        return values

    def hold(self, rid: str, kind: str, hosts: Sequence[Host]) -> hoststate.HostLocks:
        """Claim ``hosts`` in their own state files, all or nothing (LockedError names the
        holder)."""
        locks = hoststate.HostLocks(self.host_store, hosts, rid, kind, take_over=self.take_over,
                                    stale_after=float(self.inv.vars.get("fleetctl_lock_stale_after",
                                                                        hoststate.STALE_AFTER)),
                                    notify=lambda msg, host: self.emit("lock", msg, host))
        locks.claim()
        return locks

    def check_idle(self) -> None:
        """Refuse when another rollout is running (live lock) or left active (paused, or killed)."""
        for rec_id in self.ledger.ids(statuses=fleet_records.ACTIVE, limit=5):
            rec = self.ledger.get(rec_id)
            verb = ("is paused" if rec.status == fleet_records.PAUSED
                    else "was interrupted (its controller died)")
            raise FleetError(
                f"{rec.kind} {rec.id} to {rec.tag} {verb}",
                fix="`fleetctl rollout --resume` to continue it, or `fleetctl rollout abort` / "
                    "`fleetctl rollback` to undo it",
            )

    def parallel(self, hosts: Sequence[Host],
                 fn: Callable[[Host], None]) -> dict[str, FleetError | None]:
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
                self.cancel.set()

        pool = ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(hosts)),
                                  thread_name_prefix="fleetctl-step")
        futures = [pool.submit(call, h) for h in hosts]
        interrupted = False
        while True:
            try:
                wait_futures(futures)
                break
            except KeyboardInterrupt:
                interrupted = True
                self.cancel.set()
                self.emit("interrupt", "Ctrl-C: restoring the hosts being changed, then stopping")
        pool.shutdown(wait=True)
        kills = [e for e in raised if not isinstance(e, KeyboardInterrupt)]
        if kills:
            raise kills[0]
        if interrupted or raised:
            raise KeyboardInterrupt
        return {h.name: out.get(h.name) for h in hosts}
