"""The fleet's lock and intent, kept on the hosts themselves (one small JSON file per host).

The local ledger is one controller's record: two operators, two checkouts
(separate ``FLEETCTL_STATE_DIR``) or a lost laptop each have their own. What
must be shared lives where every controller has to go anyway, on the hosts:

* ``lock``: who is changing this host (rollout id, controller machine, user,
  pid, start, heartbeat). Taking the fleet's lock claims every selected host,
  all or nothing, so a second controller is refused naming the host and holder.
* ``target``: what the current command is putting there.
* ``last_known_good``: the tag+digest that last passed a full gate on this host
  (or served before fleetctl first touched it): what ``rollback`` returns to
  when the local ledger has never heard of this host.

The file (``fleetctl_state_file``, default ``/var/lib/fleetctl/state.json``,
mode 0600) is only ever replaced whole, under ``flock`` and only if it still
holds what this controller read (compare-and-swap on its sha256), so two
controllers claiming the same host at the same instant cannot both win. The
controller reaches it through the host's ``HostOps`` (:class:`OpsStore`), like
every other command it runs on a host.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import json
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fleetctl import ssh
from fleetctl.errors import FleetError, HostUnreachable, LockedError
from fleetctl.inventory import Host
from fleetctl.state.lock import proc_start

DEFAULT_STATE_FILE = "/var/lib/fleetctl/state.json"
#: A lock whose heartbeat is older than this (seconds) belongs to a controller presumed dead.
#: Heartbeats come every HEARTBEAT_EVERY s, so this survives several missed ones (a slow SSH, a GC
#: pause).
STALE_AFTER = 180.0
HEARTBEAT_EVERY = 30.0
#: How often a compare-and-swap that lost a race is retried before giving up.
CAS_RETRIES = 5
#: Hosts claimed, released or written at once (one SSH command each).
MAX_PARALLEL = 16
TAKE_OVER_FIX = "pass --take-over to take over a lock whose controller is dead"

#: Rollout ids this process holds hosts for right now: a lock of this process under another id is a
#: leftover (a release that could not reach the host), not a live holder.
_LIVE: set[str] = set()


@dataclass(frozen=True)
class Owner:
    """A controller process holding hosts for one rollout or rollback."""

    rollout_id: str
    kind: str
    controller: str
    user: str
    pid: int
    proc_start: str
    started: float
    heartbeat: float

    def same_process(self, other: Owner) -> bool:
        """True when both name the same live process (pid + start time on the same machine)."""
        return (self.controller, self.pid, self.proc_start) == (
            other.controller,
            other.pid,
            other.proc_start,
        )

    def describe(self) -> str:
        """``rollout ro-... by alice@laptop (pid 123), heartbeat 12s ago``, for messages."""
        age = max(0.0, time.time() - self.heartbeat)
        return (f"{self.kind} {self.rollout_id} by {self.user}@{self.controller} (pid {self.pid}), "
                f"last heartbeat {_age(age)} ago")


@dataclass(frozen=True)
class Version:
    """A tag and digest recorded on a host (by which command, when)."""

    tag: str | None
    digest: str
    rollout_id: str | None = None
    recorded_at: float = 0.0


@dataclass(frozen=True)
class HostState:
    """The content of one host's state file."""

    lock: Owner | None = None
    target: Version | None = None
    last_known_good: Version | None = None

    def to_json(self) -> str:
        """The file's text (stable key order, so that equal states hash equal)."""
        return (
            json.dumps({"version": 1, **dataclasses.asdict(self)}, sort_keys=True, indent=1) + "\n"
        )

    @staticmethod
    def from_json(text: str, host: str = "?") -> HostState:
        """Parse the file's text ("" is the empty state); a damaged file is an error naming its
        fix."""
        if not text.strip():
            return HostState()
        try:
            d = json.loads(text)
            return HostState(
                lock=Owner(**d["lock"]) if d.get("lock") else None,
                target=Version(**d["target"]) if d.get("target") else None,
                last_known_good=Version(**d["last_known_good"])
                if d.get("last_known_good")
                else None,
            )
        except (ValueError, TypeError, KeyError) as e:
            raise FleetError(
                f"its fleetctl state file is damaged ({e})",
                host=host,
                fix="check no other tool writes it; move it away on that host to start afresh "
                "(its lock and last known-good are then forgotten)",
            ) from None


def me(rollout_id: str, kind: str, now: float | None = None) -> Owner:
    """This controller process as a lock owner."""
    t = time.time() if now is None else now
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    return Owner(
        rollout_id, kind, socket.gethostname(), user, os.getpid(), proc_start(os.getpid()), t, t
    )


def holder_dead(
    holder: Owner, mine: Owner, now: float, stale_after: float = STALE_AFTER
) -> str | None:
    """Why ``holder`` is presumed dead, or None while it may be alive.

    On this controller machine a pid that is gone (or reused: another start
    time) is proof. From another machine only silence is evidence: a heartbeat
    older than ``stale_after``.
    """
    if holder.controller == mine.controller and proc_start(holder.pid) != holder.proc_start:
        return f"its controller process (pid {holder.pid} on {holder.controller}) is gone"
    if holder.same_process(mine) and holder.rollout_id not in _LIVE:
        return "this process left it behind (its release did not reach the host)"
    age = now - holder.heartbeat
    if age > stale_after:
        return f"its heartbeat is {_age(age)} old (more than {_age(stale_after)})"
    return None


def claim_state(host: str, state: HostState, mine: Owner, now: float, take_over: bool,
                stale_after: float = STALE_AFTER) -> tuple[HostState, str | None]:
    """The state with ``mine`` holding the lock, and a note when a dead holder was taken over.

    Raises :class:`LockedError` when a live controller holds the host, or a
    dead one on another machine and ``take_over`` was not asked for (only the
    operator can know that the laptop really is lost, not just offline).
    """
    h = state.lock
    if h is None or (h.same_process(mine) and h.rollout_id == mine.rollout_id):
        note = None
    else:
        dead = holder_dead(h, mine, now, stale_after)
        if dead is None:
            raise LockedError(
                f"held by {h.describe()}",
                host=host,
                fix="wait for it to finish (`fleetctl status`); if that controller is dead, "
                "`--take-over` once its heartbeat is older than "
                f"{_age(stale_after)}",
            )
        local = h.controller == mine.controller
        if not (take_over or local):
            raise LockedError(f"held by {h.describe()}: {dead}", host=host, fix=TAKE_OVER_FIX)
        note = f"took over the lock of {h.describe()}: {dead}"
    return dataclasses.replace(state, lock=dataclasses.replace(mine, heartbeat=now)), note


class Store(Protocol):
    """Where host state files are read and replaced (on the hosts, through their HostOps:
    :class:`OpsStore`; unit tests may keep them in memory)."""

    def read(self, host: Host) -> str: ...

    def swap(self, host: Host, expect: str, text: str) -> bool:
        """Replace the file's text with ``text`` if it still is ``expect``; False if it changed
        meanwhile."""
        ...


class MemoryStore:
    """State files in memory, with the hosts' compare-and-swap contract: for a simulated fleet (the
    engine's fault-injection harness) and the unit tests of the lock's rules."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self._mu = threading.Lock()

    def read(self, host: Host) -> str:
        with self._mu:
            return self.files.get(host.name, "")

    def swap(self, host: Host, expect: str, text: str) -> bool:
        with self._mu:
            if self.files.get(host.name, "") != expect:
                return False
            self.files[host.name] = text
            return True


def state_file(host: Host) -> str:
    """The host's state file path (``fleetctl_state_file``)."""
    return str(host.vars.get("fleetctl_state_file") or DEFAULT_STATE_FILE)


#: exit code of the remote CAS when the file changed since it was read.
CHANGED = 76


def read_command(path: str) -> str:
    """The shell printing the state file at ``path`` (nothing when there is none; fails when it
    cannot be read)."""
    f = shlex.quote(path)
    return f"cat {f} 2>/dev/null || test ! -e {f}"


def swap_script(path: str, expect: str, pid: int) -> str:
    """The shell (as root, the new text on stdin) that replaces the file at ``path`` if it still
    holds ``expect``: exit :data:`CHANGED` when it does not, 75 when its ``flock`` is not had in
    10 s."""
    f, d = shlex.quote(path), shlex.quote(os.path.dirname(path) or ".")
    want = hashlib.sha256(expect.encode()).hexdigest()
    tmp = shlex.quote(f"{path}.tmp-{pid}")
    # flock serialises controllers on this host; the hash check makes the read-decide-write a CAS.
    return (f"umask 077; mkdir -p {d} && exec 9>>{f}.lock && flock -w 10 9 || exit 75; "
            f"cur=$(cat {f} 2>/dev/null | sha256sum | cut -d' ' -f1); "
            f"[ \"$cur\" = {want} ] || exit {CHANGED}; "
            f"cat > {tmp} && chmod 600 {tmp} && mv -f {tmp} {f}")


class StateFileOps(Protocol):
    """The host's state file as the rollout's ``HostOps`` reaches it (over SSH: :func:`read_command`
    and :func:`swap_script` under sudo; the simulated fleet: a text per host)."""

    @property
    def host(self) -> Host:
        """The host these operations act on."""
        ...

    def check_access(self) -> None:
        """Every right the operations need (sudo for this file, docker for the steps), checked
        before anything is written: one FleetError naming all that is missing."""
        ...

    def read_state(self) -> str:
        """The state file's text (empty when there is none)."""
        ...

    def swap_state(self, expect: str, text: str) -> bool:
        """Replace the file's text with ``text`` if it still is ``expect``; False if it changed."""
        ...


class OpsStore:
    """The state files on the hosts, through each host's operations (``ops(host)``: the rollout's
    ``HostOps``): read whole, replaced atomically under ``flock`` (the compare-and-swap above)."""

    def __init__(self, ops: Callable[[Host], StateFileOps]) -> None:
        self.ops = ops

    def read(self, host: Host) -> str:
        return self.ops(host).read_state()

    def swap(self, host: Host, expect: str, text: str) -> bool:
        return self.ops(host).swap_state(expect, text)

    def check_access(self, host: Host) -> None:
        """The login's rights on ``host`` (see :meth:`StateFileOps.check_access`)."""
        self.ops(host).check_access()


def update(
    store: Store, host: Host, change: Callable[[HostState], HostState], retry_broken: bool = True
) -> HostState:
    """Read, change and compare-and-swap ``host``'s state, retrying when another controller wrote
    in between
    (and once after an SSH hiccup, unless ``retry_broken`` is False)."""
    broken = 0
    for _ in range(CAS_RETRIES):
        try:
            text = store.read(host)
            new = change(HostState.from_json(text, host.name))
            out = new.to_json()
            if out == text or store.swap(host, text, out):
                return new
        except HostUnreachable:
            # One SSH hiccup (a channel that did not open in time on a loaded host) is retried:
            # safe, since the retry re-reads, so a swap that did land is seen instead of redone.
            broken += 1
            if broken > 1 or not retry_broken:
                raise
            time.sleep(1.0)
    raise LockedError(
        "its state file kept changing under this controller (another controller is writing it)",
        host=host.name,
        fix="wait for the other controller, then retry",
    )


class HostLocks:
    """The hosts this command holds: claimed all or nothing, heartbeated, written, released."""

    def __init__(self, store: Store, hosts: Sequence[Host], rollout_id: str, kind: str, *,
                 take_over: bool = False, stale_after: float = STALE_AFTER,
                 notify: Callable[[str, str | None], None] | None = None) -> None:
        self.store = store
        self.hosts = {h.name: h for h in hosts}
        self.owner = me(rollout_id, kind)
        self.take_over = take_over
        self.stale_after = stale_after
        self.notify = notify or (lambda _msg, _host: None)
        self.held: list[str] = []
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _fan(self, names: Sequence[str], fn: Callable[[Host], Any]) -> dict[str, ssh.Outcome[Any]]:
        return ssh.fan_out(
            [self.hosts[n] for n in names], fn, timeout=120, max_workers=MAX_PARALLEL
        )

    def claim(self) -> None:
        """Hold every host, or none: if one is held by another controller, release the others and
        raise."""
        notes: dict[str, str] = {}

        def one(h: Host) -> HostState:
            if isinstance(self.store, OpsStore):
                # Every right the command will need (sudo for this file, docker for the steps),
                # checked once before anything is written: one message with all that is missing.
                self.store.check_access(h)

            def change(s: HostState) -> HostState:
                new, note = claim_state(
                    h.name, s, self.owner, time.time(), self.take_over, self.stale_after
                )
                if note:
                    notes[h.name] = note
                return new
            return update(self.store, h, change)

        outs = self._fan(list(self.hosts), one)
        self.held = [n for n, o in outs.items() if o.error is None]
        errors = [o.error for o in outs.values() if o.error is not None]
        if errors:
            self.release()
            locked = [e for e in errors if isinstance(e, LockedError)]
            first = (locked or errors)[0]
            others = [e.host for e in errors if e is not first and e.host]
            more = f" (also: {', '.join(others)})" if others else ""
            raise type(first)(
                f"cannot take the fleet's lock, nothing was changed: {first.cause}{more}",
                host=first.host,
                exit_code=first.exit_code,
                fix=first.fix
                or "retry when the host answers, or leave it out with --limit '!NAME'",
            )
        _LIVE.add(self.owner.rollout_id)
        for n, note in notes.items():
            self.notify(note, n)
        self._beat = threading.Thread(
            target=self._heartbeat, daemon=True, name="fleetctl-heartbeat"
        )
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_EVERY):
            self._fan(list(self.held), self._beat_one)

    def _beat_one(self, h: Host) -> None:
        now = time.time()

        def change(s: HostState) -> HostState:
            if s.lock is None or not s.lock.same_process(self.owner):
                return s  # taken over meanwhile: never write the lock back
            return dataclasses.replace(s, lock=dataclasses.replace(s.lock, heartbeat=now))
        update(self.store, h, change, retry_broken=False)

    def release(self) -> None:
        """Drop the lock on every host this process holds (a failure to reach one is left to go
        stale)."""
        self._stop.set()
        if self._beat is not None:
            # Short: a beat stuck on an unreachable host cannot undo the release (its swap would
            # fail the CAS).
            self._beat.join(timeout=5)

        def one(h: Host) -> None:
            # No retry: a host that does not answer keeps the lock until it goes stale or is taken
            # over, and the command's end must not wait twice for it.
            update(
                self.store,
                h,
                lambda s: (
                    dataclasses.replace(s, lock=None)
                    if s.lock is not None and s.lock.same_process(self.owner)
                    else s
                ),
                retry_broken=False,
            )

        self._fan(list(self.held), one)
        self.held = []
        _LIVE.discard(self.owner.rollout_id)

    def record(
        self,
        host: str,
        *,
        target: Version | None = None,
        last_known_good: Version | None = None,
        seed_last_known_good: Version | None = None,
    ) -> None:
        """Write the host's target and/or last known-good; ``seed_...`` only when none is recorded
        yet.

        Best effort: the ledger is the record of the run; a host that cannot be
        written now keeps its previous intent and is reported.
        """
        h = self.hosts.get(host)
        if h is None:
            return

        def change(s: HostState) -> HostState:
            lkg = last_known_good or s.last_known_good or seed_last_known_good
            return dataclasses.replace(s, target=target or s.target, last_known_good=lkg)
        try:
            update(self.store, h, change)
        except FleetError as e:
            self.notify(f"could not record the host's intent: {e.cause}", host)

    def seed(self, versions: Mapping[str, tuple[Version | None, Version | None]]) -> None:
        """Per host (target, what serves now): record the target, and the serving version as last
        known-good
        where the host has none yet (what it served before fleetctl first touched it)."""
        def one(h: Host) -> None:
            target, serving = versions[h.name]
            self.record(h.name, target=target, seed_last_known_good=serving)
        self._fan([n for n in versions if n in self.hosts], one)


def read_all(store: Store, hosts: Sequence[Host]) -> dict[str, HostState]:
    """Every host's state (hosts that cannot be read are left out: the caller reports what it
    lacks)."""
    outs = ssh.fan_out(hosts, lambda h: HostState.from_json(store.read(h), h.name), timeout=120,
                       max_workers=MAX_PARALLEL)
    return {n: o.value for n, o in outs.items() if o.value is not None}


def _age(seconds: float) -> str:
    s = int(seconds)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"
