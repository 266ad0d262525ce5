"""The rollout ledger: every rollout and rollback, per wave and per host, in SQLite or PostgreSQL.

By default one SQLite file per fleet (``state_dir(inventory)/ledger.sqlite3``);
with ``fleetctl_ledger_url`` (or ``$FLEETCTL_LEDGER_URL``) a schema per fleet in
a PostgreSQL database a team shares (``state.backends`` holds both backends; the
logic here is the same for both). A versioned schema (a newer one is refused,
never guessed at), every change in a transaction (SQLite: WAL,
``synchronous=FULL``: a ``kill -9`` loses nothing that was committed), one
writer per fleet enforced by a lock row that names the holder's pid, host and
process start time. On SQLite that row is the lock, and a lock left by a
killed controller on this machine is recognised as stale and taken over by
``--resume``; on PostgreSQL the lock is a session advisory lock that dies
with the holder's connection (on any machine), and the row only says who
holds it.

Each host's *known-good* versions are kept too (``known_good``): the image
digest and container-settings fingerprint that last passed a full gate on
it, or that served before fleetctl first touched it (or, later, that was
serving when a rollout moved the host away from it). Rollback, abort and
resume act on these recorded intents, not on "the newest record".

The soak baselines live here too (``baselines``: per host and image tag, the window
of the last passing soak verdicts, pinned or not), so that every controller sharing
a ledger judges a host's throughput against one window. Their content is the soak
engine's business (``fleetctl.soak.baselines``): here they are JSON documents,
changed by a read-modify-write in one transaction.

Nothing secret is written here: container settings are recorded with
environment values removed (names only).

The public interface (what another backend, e.g. PostgreSQL, implements):
``acquire``/``release``/``holder`` (the fleet lock), ``create``,
``set_status``, ``set_wave``, ``host_phase``, ``note`` (writes, each one
transaction), ``get``/``ids``/``latest``/``history`` (reads),
``known_good``/``add_known_good`` (per-host intent), ``baseline``/``baselines``/
``update_baseline``/``delete_baseline`` (soak baselines), ``close``.

Why one file of ~600 lines: the ledger's records, its lock and its queries are one
transactional interface over the two backends; the SQL dialects are apart in ``backends.py``.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import ExitCode, FleetError, LockedError
from fleetctl.runids import new_run_id
from fleetctl.state.backends import Backend, PostgresBackend, SqliteBackend, Tx
from fleetctl.state.lock import proc_start

if TYPE_CHECKING:
    from fleetctl.inventory import Inventory

#: 1: rollouts, waves, hosts, phases, lock. 2: known_good. 3: out_of_rotation (the front door).
#: 4: baselines (the soak's, shared by every controller on the ledger).
SCHEMA_VERSION = 4
LEDGER_NAME = "ledger.sqlite3"

#: Rollout statuses. ``running`` with a stale lock means the controller died.
RUNNING, PAUSED, COMPLETED, FAILED, ABORTED = "running", "paused", "completed", "failed", "aborted"
#: Every wave went through, with host failures inside the failure budget (rolled back or down).
COMPLETED_WITH_FAILURES = "completed-with-failures"
ACTIVE = (RUNNING, PAUSED)
#: Host statuses.
PENDING, IN_PROGRESS, DONE, SKIPPED, ROLLED_BACK, HOST_FAILED, HOST_PAUSED = (
    "pending", "in-progress", "done", "skipped", "rolled-back", "failed", "paused")

_SCHEMA = """
CREATE TABLE rollouts (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,                 -- rollout | rollback
  status TEXT NOT NULL,
  recipe TEXT, requested TEXT, tag TEXT, digest TEXT, image TEXT,
  parent TEXT,                        -- the rollout a rollback undoes
  options TEXT NOT NULL DEFAULT '{}', -- JSON: waves, max_unavailable, soak, ...
  started_by TEXT NOT NULL, command TEXT NOT NULL,
  started_at REAL NOT NULL, finished_at REAL, error TEXT
);
CREATE TABLE waves (
  rollout_id TEXT NOT NULL REFERENCES rollouts(id), idx INTEGER NOT NULL,
  hosts TEXT NOT NULL, status TEXT NOT NULL, started_at REAL, finished_at REAL,
  PRIMARY KEY (rollout_id, idx)
);
CREATE TABLE hosts (
  rollout_id TEXT NOT NULL REFERENCES rollouts(id), host TEXT NOT NULL,
  wave INTEGER NOT NULL, step INTEGER NOT NULL,
  phase TEXT NOT NULL, status TEXT NOT NULL,
  before_tag TEXT, before_digest TEXT, before TEXT,   -- before: JSON container settings, env values removed
  after_tag TEXT, after_digest TEXT,
  target_tag TEXT, target_digest TEXT,
  verdict TEXT, artifacts TEXT, error TEXT,
  started_at REAL, updated_at REAL NOT NULL, finished_at REAL,
  PRIMARY KEY (rollout_id, host)
);
CREATE TABLE phases (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  rollout_id TEXT NOT NULL, host TEXT, phase TEXT NOT NULL, at REAL NOT NULL, detail TEXT
);
CREATE INDEX phases_by_host ON phases (rollout_id, host);
CREATE TABLE lock (
  fleet TEXT PRIMARY KEY, rollout_id TEXT NOT NULL, pid INTEGER NOT NULL, hostname TEXT NOT NULL,
  proc_start TEXT NOT NULL, acquired_at REAL NOT NULL
);
"""
#: Each schema version's statements after the previous one (index 0: version 1 from nothing).
_MIGRATIONS = (_SCHEMA, """
CREATE TABLE known_good (
  host TEXT NOT NULL, digest TEXT NOT NULL, fingerprint TEXT NOT NULL DEFAULT '',
  tag TEXT, settings TEXT,             -- settings: JSON container settings, env values removed
  source TEXT NOT NULL,                -- gate | found (before fleetctl first touched the host) | served
  rollout_id TEXT, at REAL NOT NULL,
  PRIMARY KEY (host, digest, fingerprint)
);
""", """
CREATE TABLE out_of_rotation (
  host TEXT PRIMARY KEY,               -- a host fleetctl took out of the front door's rotation
  rollout_id TEXT, reason TEXT,
  memo TEXT NOT NULL DEFAULT '{}',     -- JSON: what the door needs to put it back (no secrets)
  at REAL NOT NULL
);
""", """
CREATE TABLE baselines (
  host TEXT NOT NULL, tag TEXT NOT NULL,
  pinned INTEGER NOT NULL DEFAULT 0,
  runs TEXT NOT NULL,                  -- JSON list: the window's passing soak verdicts, oldest first
  updated_at REAL NOT NULL,
  PRIMARY KEY (host, tag)
);
""")


@dataclass(frozen=True)
class OutOfRotation:
    """A host fleetctl drained at its front door and has not re-admitted yet."""

    host: str
    rollout_id: str | None
    reason: str | None
    memo: dict[str, Any]
    at: float


@dataclass(frozen=True)
class PhaseRecord:
    """One phase a host (or the rollout, host None) entered, and when."""

    host: str | None
    phase: str
    at: float
    detail: str | None


@dataclass(frozen=True)
class HostRecord:
    """One host's course through a rollout: where it was, where it went, the gate's verdict."""

    host: str
    wave: int
    step: int
    phase: str
    status: str
    before_tag: str | None
    before_digest: str | None
    before: dict[str, Any] | None
    target_tag: str | None
    target_digest: str | None
    after_tag: str | None
    after_digest: str | None
    verdict: dict[str, Any] | None
    artifacts: str | None
    error: str | None
    started_at: float | None
    updated_at: float
    finished_at: float | None


@dataclass(frozen=True)
class WaveRecord:
    """One wave: its hosts and how it went."""

    idx: int
    hosts: tuple[str, ...]
    status: str
    started_at: float | None
    finished_at: float | None


@dataclass(frozen=True)
class RolloutRecord:
    """A rollout or rollback as the ledger knows it."""

    id: str
    kind: str
    status: str
    recipe: str | None
    requested: str | None
    tag: str | None
    digest: str | None
    image: str | None
    parent: str | None
    options: dict[str, Any]
    started_by: str
    command: str
    started_at: float
    finished_at: float | None
    error: str | None
    waves: tuple[WaveRecord, ...]
    hosts: tuple[HostRecord, ...]
    phases: tuple[PhaseRecord, ...]

    def host(self, name: str) -> HostRecord | None:
        """The record of one host, if it took part."""
        return next((h for h in self.hosts if h.host == name), None)


@dataclass(frozen=True)
class KnownGood:
    """A version a host is known to serve well: it passed a full gate there, or served before fleetctl came."""

    host: str
    tag: str | None
    digest: str
    #: The container settings' fingerprint (see ``rollout.host.fingerprint``); "" when unknown.
    fingerprint: str
    settings: dict[str, Any] | None
    #: ``gate`` (passed a full gate here), ``found`` (served before fleetctl first touched the host)
    #: or ``served`` (was serving, running, when a rollout moved the host away from it).
    source: str
    rollout_id: str | None
    at: float


@dataclass(frozen=True)
class BaselineRow:
    """One stored baseline window: ``runs`` are the soak verdicts as JSON documents, oldest first."""

    host: str
    tag: str
    pinned: bool
    runs: tuple[dict[str, Any], ...]
    updated_at: float = 0.0


@dataclass(frozen=True)
class LockHolder:
    """Who holds a fleet's lock."""

    rollout_id: str
    pid: int
    hostname: str
    proc_start: str
    acquired_at: float
    #: Known from the database's own lock (PostgreSQL, any machine); None: judged from the pid below.
    live: bool | None = None

    @property
    def alive(self) -> bool:
        """True unless the holder is provably gone (its database session ended; or, on SQLite, it ran on
        this machine and its pid is dead or reused)."""
        if self.live is not None:
            return self.live
        if self.hostname != socket.gethostname():
            return True  # another controller machine: we cannot tell, so we must assume it lives
        return proc_start(self.pid) == self.proc_start


@dataclass(frozen=True)
class LedgerInfo:
    """Which ledger a fleet uses and who holds its lock (``fleetctl ledger``)."""

    backend: str
    #: A path, or a PostgreSQL conninfo without its password.
    where: str
    fleet: str
    schema_version: int
    rollouts: int
    holder: LockHolder | None


def started_by() -> str:
    """``user@host`` of this controller (``$SUDO_USER`` first: the human behind sudo)."""
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    return f"{user}@{socket.gethostname()}"


def new_id(kind: str = "rollout") -> str:
    """A rollout's id: ``ro-20260701T120000Z-3f9a1c`` (``rb-`` for a rollback)."""
    return new_run_id("rb" if kind == "rollback" else "ro")


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


class Ledger:
    """The fleet's ledger. Thread-safe: workers write through it, one transaction at a time."""

    def __init__(self, db: Backend | Path, fleet: str = "fleet") -> None:
        """``db``: a backend, or the path of a SQLite file."""
        self._db = db if isinstance(db, Backend) else SqliteBackend(db)
        #: Where the ledger is, for messages (a path, or a PostgreSQL conninfo without its password).
        self.where = self._db.where
        self.fleet = fleet
        self._mu = threading.RLock()
        #: The rollout this ledger took the database's own lock for (PostgreSQL), if any.
        self._lock_rid: str | None = None
        try:
            self._migrate()
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        """Close the database (on PostgreSQL a lock still held goes with the connection)."""
        with self._mu:
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _tx(self, fenced: bool = True) -> Iterator[Tx]:
        with self._mu, self._db.write(fenced) as tx:
            yield tx

    @contextlib.contextmanager
    def _read(self) -> Iterator[Tx]:
        with self._mu, self._db.read() as tx:
            yield tx

    def _migrate(self) -> None:
        with self._tx() as db:
            version = self._db.version(db)
            if version > SCHEMA_VERSION:
                raise FleetError(
                    f"ledger {self.where} has schema version {version}, newer than this fleetctl's {SCHEMA_VERSION}",
                    fix="upgrade fleetctl (a newer one wrote this ledger); do not edit or delete the ledger",
                    exit_code=ExitCode.INCONCLUSIVE,
                )
            if version == 0 and self._db.foreign(db):
                raise FleetError(f"{self.where} is not a fleetctl ledger (unversioned tables)",
                                 fix="move the file away or set FLEETCTL_STATE_DIR (PostgreSQL: drop that "
                                     "fleet's schema or name the fleet differently with fleetctl_fleet)")
            # Statement by statement inside this transaction (executescript would commit early),
            # so that two controllers creating or upgrading the ledger at once cannot both do it.
            for script in _MIGRATIONS[version:]:
                for stmt in self._db.ddl(script):
                    db.run(stmt)
            if version < SCHEMA_VERSION:
                self._db.set_version(db, SCHEMA_VERSION)

    def info(self) -> LedgerInfo:
        """Where this ledger is, its schema version, how many rollouts it holds, who holds the lock."""
        with self._read() as db:
            version = self._db.version(db)
            row = db.one("SELECT count(*) AS n FROM rollouts")
        return LedgerInfo(self._db.kind, self.where, self.fleet, version, int(row["n"]) if row else 0,
                          self.holder())

    # -- the lock ------------------------------------------------------------------------

    def _holder(self, row: Mapping[str, Any], live: bool | None) -> LockHolder:
        return LockHolder(row["rollout_id"], row["pid"], row["hostname"], row["proc_start"], row["acquired_at"],
                          live)

    def holder(self) -> LockHolder | None:
        """Who holds this fleet's lock, if anybody (alive or not)."""
        with self._read() as db:
            row = db.one("SELECT * FROM lock WHERE fleet=?", (self.fleet,))
            if row is None:
                return None
            live = self._db.lock_live()
        return self._holder(row, live)

    def acquire(self, rollout_id: str) -> LockHolder | None:
        """Take the fleet's lock for ``rollout_id``; return the stale holder taken over, if any.

        A live holder makes this raise :class:`LockedError` naming it. On
        SQLite: the same pid and start time on this machine, or any holder on
        another machine (always presumed alive); on PostgreSQL: a holder whose
        database session still holds the fleet's advisory lock, on any machine.
        """
        me = LockHolder(rollout_id, os.getpid(), socket.gethostname(), proc_start(os.getpid()), time.time())
        with self._mu:
            had = self._db.holding
            if not self._db.try_lock():
                with self._read() as db:
                    row = db.one("SELECT * FROM lock WHERE fleet=?", (self.fleet,))
                raise self._locked(self._holder(row, True) if row else None)
            try:
                with self._tx() as db:
                    row = db.one("SELECT * FROM lock WHERE fleet=?", (self.fleet,))
                    stale: LockHolder | None = None
                    if row is not None:
                        # Taking the database's lock just now proves its last holder's session is gone.
                        h = self._holder(row, None if not self._db.real_lock else had)
                        if h.pid == me.pid and h.hostname == me.hostname and h.proc_start == me.proc_start:
                            stale = None  # re-entrant: this process already holds it
                        elif h.alive:
                            raise self._locked(h)
                        else:
                            stale = h
                    db.run("INSERT INTO lock (fleet, rollout_id, pid, hostname, proc_start, acquired_at)"
                           " VALUES (?,?,?,?,?,?) ON CONFLICT (fleet) DO UPDATE SET rollout_id=excluded.rollout_id,"
                           " pid=excluded.pid, hostname=excluded.hostname, proc_start=excluded.proc_start,"
                           " acquired_at=excluded.acquired_at",
                           (self.fleet, me.rollout_id, me.pid, me.hostname, me.proc_start, me.acquired_at))
            except BaseException:
                if not had:
                    self._db.unlock()
                raise
            if self._db.real_lock:
                self._lock_rid = rollout_id
        return stale

    def _locked(self, h: LockHolder | None) -> LockedError:
        if h is None:
            return LockedError(
                f"another controller holds this fleet's lock in {self.where} (it has not recorded who it is yet, "
                "or its record was removed)",
                fix="wait for it and retry; `fleetctl history` shows what runs")
        if self._db.real_lock:
            fix = ("wait for it, or follow it with `fleetctl history`; the lock is the controller's database "
                   "session, freed when that controller exits, is killed or loses the database")
        else:
            fix = ("wait for it, or follow it with `fleetctl history`; if that controller is dead on another "
                   "machine, run `fleetctl rollout abort --force` there")
        return LockedError(
            f"rollout {h.rollout_id} is in progress on this fleet (controller pid {h.pid} on {h.hostname}, "
            f"since {time.strftime('%H:%M:%S', time.localtime(h.acquired_at))})", fix=fix)

    def release(self, rollout_id: str | None = None) -> None:
        """Drop the lock if ``rollout_id`` (or, with None, anybody) holds it."""
        with self._mu:
            # Not fenced: a controller that lost its lock must still be able to clear its own record.
            with self._tx(fenced=False) as db:
                if rollout_id is None:
                    db.run("DELETE FROM lock WHERE fleet=?", (self.fleet,))
                else:
                    db.run("DELETE FROM lock WHERE fleet=? AND rollout_id=?", (self.fleet, rollout_id))
            if rollout_id is None or rollout_id == self._lock_rid:
                self._lock_rid = None
                self._db.unlock()

    # -- writing -------------------------------------------------------------------------

    def create(self, rollout_id: str, *, kind: str, recipe: str | None, requested: str | None, tag: str | None,
               digest: str | None, image: str | None, options: Mapping[str, Any], command: str,
               waves: Sequence[Sequence[str]], hosts: Sequence[Mapping[str, Any]], parent: str | None = None,
               status: str = RUNNING) -> None:
        """Record a new rollout with its waves and hosts (each host a mapping of hosts-table columns)."""
        now = time.time()
        with self._tx() as db:
            db.run(
                "INSERT INTO rollouts (id, kind, status, recipe, requested, tag, digest, image, parent, options,"
                " started_by, command, started_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (rollout_id, kind, status, recipe, requested, tag, digest, image, parent,
                 json.dumps(dict(options)), started_by(), command, now))
            for i, w in enumerate(waves):
                db.run("INSERT INTO waves (rollout_id, idx, hosts, status) VALUES (?,?,?,?)",
                       (rollout_id, i, json.dumps(list(w)), PENDING))
            for h in hosts:
                cols = {"rollout_id": rollout_id, "phase": "planned", "status": PENDING, "updated_at": now, **h}
                if isinstance(cols.get("before"), dict):
                    cols["before"] = json.dumps(cols["before"])
                db.run(f"INSERT INTO hosts ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                           tuple(cols.values()))
            db.run("INSERT INTO phases (rollout_id, host, phase, at, detail) VALUES (?,?,?,?,?)",
                       (rollout_id, None, "created", now, None))

    def set_status(self, rollout_id: str, status: str, error: str | None = None) -> None:
        """Set the rollout's status (a terminal one also stamps ``finished_at``)."""
        now = time.time()
        finished = now if status not in ACTIVE else None
        with self._tx() as db:
            db.run("UPDATE rollouts SET status=?, error=?, finished_at=? WHERE id=?",
                       (status, error, finished, rollout_id))
            db.run("INSERT INTO phases (rollout_id, host, phase, at, detail) VALUES (?,?,?,?,?)",
                       (rollout_id, None, status, now, error))

    def set_wave(self, rollout_id: str, idx: int, status: str) -> None:
        """Mark a wave running (stamps its start) or finished (stamps its end)."""
        now = time.time()
        with self._tx() as db:
            if status == RUNNING:
                db.run("UPDATE waves SET status=?, started_at=coalesce(started_at, ?) WHERE rollout_id=? AND idx=?",
                           (status, now, rollout_id, idx))
            else:
                db.run("UPDATE waves SET status=?, finished_at=? WHERE rollout_id=? AND idx=?",
                           (status, now, rollout_id, idx))

    _HOST_FIELDS = frozenset({"status", "after_tag", "after_digest", "verdict", "artifacts", "error",
                              "before", "before_tag", "before_digest"})

    def host_phase(self, rollout_id: str, host: str, phase: str, detail: str | None = None,
                   **fields: Any) -> None:
        """Record that ``host`` entered ``phase`` (and update its other columns) in one transaction."""
        unknown = set(fields) - self._HOST_FIELDS
        if unknown:
            raise ValueError(f"unknown host fields {unknown}")
        now = time.time()
        cols = dict(fields)
        for k in ("verdict", "before"):
            if k in cols and cols[k] is not None and not isinstance(cols[k], str):
                cols[k] = json.dumps(cols[k])
        status = cols.get("status")
        sets = ["phase=?", "updated_at=?", "started_at=coalesce(started_at, ?)"]
        args: list[Any] = [phase, now, now]
        if status in (DONE, SKIPPED, ROLLED_BACK, HOST_FAILED):
            sets.append("finished_at=?")
            args.append(now)
        for k, v in cols.items():
            sets.append(f"{k}=?")
            args.append(v)
        with self._tx() as db:
            changed = db.run(f"UPDATE hosts SET {', '.join(sets)} WHERE rollout_id=? AND host=?",
                             (*args, rollout_id, host))
            if changed != 1:
                raise ValueError(f"no host {host} in rollout {rollout_id}")
            db.run("INSERT INTO phases (rollout_id, host, phase, at, detail) VALUES (?,?,?,?,?)",
                       (rollout_id, host, phase, now, detail))

    def note(self, rollout_id: str, phase: str, detail: str | None = None) -> None:
        """A fleet-wide event in the rollout's timeline (pause, resume, abort...)."""
        with self._tx() as db:
            db.run("INSERT INTO phases (rollout_id, host, phase, at, detail) VALUES (?,?,?,?,?)",
                       (rollout_id, None, phase, time.time(), detail))

    def add_known_good(self, host: str, *, tag: str | None, digest: str, fingerprint: str | None,
                       settings: Mapping[str, Any] | None, source: str, rollout_id: str | None,
                       only_if_none: bool = False) -> None:
        """Record that ``host`` serves ``digest`` with these settings well (the newest entry wins).

        Recording a version again makes it the newest; a ``gate`` source is
        never downgraded. ``only_if_none``: record only when the host has no
        known-good yet.
        """
        with self._tx() as db:
            if only_if_none and db.one("SELECT 1 AS x FROM known_good WHERE host=?", (host,)):
                return
            # The old row's columns are qualified: PostgreSQL finds a bare name ambiguous with excluded's.
            db.run("INSERT INTO known_good (host, digest, fingerprint, tag, settings, source, rollout_id, at)"
                   " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (host, digest, fingerprint) DO"
                   " UPDATE SET tag=excluded.tag, settings=coalesce(excluded.settings, known_good.settings),"
                   " source=CASE WHEN known_good.source='gate' THEN 'gate' ELSE excluded.source END,"
                   " rollout_id=coalesce(excluded.rollout_id, known_good.rollout_id), at=excluded.at",
                       (host, digest, fingerprint or "", tag, json.dumps(dict(settings)) if settings else None,
                        source, rollout_id, time.time()))

    def mark_out(self, host: str, rollout_id: str | None, reason: str, memo: Mapping[str, Any]) -> None:
        """Record, before the door is asked, that fleetctl takes ``host`` out of rotation (kept on re-drain)."""
        with self._tx() as db:
            db.run("INSERT INTO out_of_rotation (host, rollout_id, reason, memo, at) VALUES (?,?,?,?,?)"
                   " ON CONFLICT (host) DO UPDATE SET rollout_id=excluded.rollout_id, reason=excluded.reason,"
                   " memo=CASE WHEN excluded.memo='{}' THEN out_of_rotation.memo ELSE excluded.memo END,"
                   " at=excluded.at", (host, rollout_id, reason, json.dumps(dict(memo)), time.time()))

    def mark_in(self, host: str) -> None:
        """``host`` is back in rotation (after the door said so)."""
        with self._tx() as db:
            db.run("DELETE FROM out_of_rotation WHERE host=?", (host,))

    def out_of_rotation(self) -> dict[str, OutOfRotation]:
        """Every host fleetctl took out of rotation and has not put back."""
        with self._read() as db:
            rows = db.all("SELECT * FROM out_of_rotation ORDER BY host")
        return {r["host"]: OutOfRotation(r["host"], r["rollout_id"], r["reason"], _loads(r["memo"]) or {}, r["at"])
                for r in rows}

    def known_good(self, host: str) -> list[KnownGood]:
        """The host's known-good versions, newest first."""
        with self._read() as db:
            rows = db.all(f"SELECT * FROM known_good WHERE host=? ORDER BY at DESC, {self._db.seq} DESC", (host,))
        return [KnownGood(r["host"], r["tag"], r["digest"], r["fingerprint"], _loads(r["settings"]), r["source"],
                          r["rollout_id"], r["at"]) for r in rows]

    # -- soak baselines -----------------------------------------------------------------

    @staticmethod
    def _baseline_row(r: Mapping[str, Any]) -> BaselineRow:
        return BaselineRow(r["host"], r["tag"], bool(r["pinned"]), tuple(json.loads(r["runs"])), r["updated_at"])

    def baseline(self, host: str, tag: str) -> BaselineRow | None:
        """The stored window of ``host`` on ``tag``, or None."""
        with self._read() as db:
            r = db.one("SELECT * FROM baselines WHERE host=? AND tag=?", (host, tag))
        return self._baseline_row(r) if r else None

    def baselines(self, host: str | None = None) -> list[BaselineRow]:
        """Every stored window (of ``host``), by host and tag."""
        with self._read() as db:
            rows = (db.all("SELECT * FROM baselines WHERE host=? ORDER BY tag", (host,)) if host is not None
                    else db.all("SELECT * FROM baselines ORDER BY host, tag"))
        return [self._baseline_row(r) for r in rows]

    def update_baseline(self, host: str, tag: str,
                        change: Callable[[BaselineRow | None], BaselineRow | None]) -> BaselineRow | None:
        """Read the window, apply ``change`` and write what it returns (None: leave it), in one transaction:
        two controllers adding a run at once both get theirs in. Returns what was written."""
        with self._tx() as db:
            r = db.one("SELECT * FROM baselines WHERE host=? AND tag=?", (host, tag))
            new = change(self._baseline_row(r) if r else None)
            if new is None:
                return None
            db.run("INSERT INTO baselines (host, tag, pinned, runs, updated_at) VALUES (?,?,?,?,?)"
                   " ON CONFLICT (host, tag) DO UPDATE SET pinned=excluded.pinned, runs=excluded.runs,"
                   " updated_at=excluded.updated_at",
                   (host, tag, 1 if new.pinned else 0, json.dumps(list(new.runs)), time.time()))
        return new

    def delete_baseline(self, host: str, tag: str) -> bool:
        """Forget the window; False when there was none."""
        with self._tx() as db:
            return db.run("DELETE FROM baselines WHERE host=? AND tag=?", (host, tag)) > 0

    # -- reading -------------------------------------------------------------------------

    def get(self, rollout_id: str) -> RolloutRecord:
        """The full record of one rollout, or a FleetError naming the id."""
        with self._read() as db:
            row = db.one("SELECT * FROM rollouts WHERE id=?", (rollout_id,))
            if row is None:
                raise FleetError(f"no rollout {rollout_id!r} in {self.where}", fix="see `fleetctl history`")
            waves = db.all("SELECT * FROM waves WHERE rollout_id=? ORDER BY idx", (rollout_id,))
            hosts = db.all(f"SELECT * FROM hosts WHERE rollout_id=? ORDER BY wave<0, wave, step, {self._db.seq}",
                           (rollout_id,))
            phases = db.all("SELECT * FROM phases WHERE rollout_id=? ORDER BY id", (rollout_id,))
        return RolloutRecord(
            id=row["id"], kind=row["kind"], status=row["status"], recipe=row["recipe"], requested=row["requested"],
            tag=row["tag"], digest=row["digest"], image=row["image"], parent=row["parent"],
            options=json.loads(row["options"]), started_by=row["started_by"], command=row["command"],
            started_at=row["started_at"], finished_at=row["finished_at"], error=row["error"],
            waves=tuple(WaveRecord(w["idx"], tuple(json.loads(w["hosts"])), w["status"], w["started_at"],
                                   w["finished_at"]) for w in waves),
            hosts=tuple(_host_record(h) for h in hosts),
            phases=tuple(PhaseRecord(p["host"], p["phase"], p["at"], p["detail"]) for p in phases),
        )

    def passed_steps(self, recipe: str, rollouts: int = 20, limit: int = 50) -> list[dict[str, Any]]:
        """The verdicts (with ``timings``) of hosts that passed their gate in the last ``rollouts`` rollouts
        of ``recipe``, newest first, at most ``limit``: what a plan's time estimate learns from."""
        with self._read() as db:
            rows = db.all(
                "SELECT verdict FROM hosts WHERE status=? AND verdict IS NOT NULL AND rollout_id IN ("
                " SELECT id FROM rollouts WHERE recipe=? AND kind='rollout'"
                f" ORDER BY started_at DESC, {self._db.seq} DESC LIMIT ?)"
                " ORDER BY finished_at DESC LIMIT ?", (DONE, recipe, rollouts, limit))
        out = [_loads(r["verdict"]) for r in rows]
        return [v for v in out if isinstance(v, dict) and v.get("outcome") == "pass"
                and isinstance(v.get("timings"), dict)]

    def host_record(self, rollout_id: str, host: str) -> HostRecord | None:
        """One host's record in a rollout, if it took part. A host step reads its own record at each
        phase: ``get(...).host(...)`` read every host and phase of the rollout, O(hosts) each time."""
        with self._read() as db:
            row = db.one("SELECT * FROM hosts WHERE rollout_id=? AND host=?", (rollout_id, host))
        return _host_record(row) if row is not None else None

    def ids(self, kind: str | None = None, statuses: Sequence[str] | None = None, limit: int = 50) -> list[str]:
        """Rollout ids, newest first, optionally of one kind and in some statuses."""
        q = "SELECT id FROM rollouts WHERE 1=1"
        args: list[Any] = []
        if kind:
            q += " AND kind=?"
            args.append(kind)
        if statuses:
            q += f" AND status IN ({','.join('?' * len(statuses))})"
            args.extend(statuses)
        q += f" ORDER BY started_at DESC, {self._db.seq} DESC LIMIT ?"
        args.append(limit)
        with self._read() as db:
            return [r["id"] for r in db.all(q, args)]

    def latest(self, kind: str | None = None, statuses: Sequence[str] | None = None) -> RolloutRecord | None:
        """The newest rollout matching, or None."""
        ids = self.ids(kind, statuses, limit=1)
        return self.get(ids[0]) if ids else None

    def history(self, limit: int = 50) -> list[RolloutRecord]:
        """Every rollout and rollback, newest first."""
        return [self.get(i) for i in self.ids(limit=limit)]


def _host_record(h: Mapping[str, Any]) -> HostRecord:
    return HostRecord(
        host=h["host"], wave=h["wave"], step=h["step"], phase=h["phase"], status=h["status"],
        before_tag=h["before_tag"], before_digest=h["before_digest"], before=_loads(h["before"]),
        target_tag=h["target_tag"], target_digest=h["target_digest"],
        after_tag=h["after_tag"], after_digest=h["after_digest"], verdict=_loads(h["verdict"]),
        artifacts=h["artifacts"], error=h["error"], started_at=h["started_at"], updated_at=h["updated_at"],
        finished_at=h["finished_at"])


def open_ledger(state_dir: Path, fleet: str = "fleet", url: str | None = None) -> Ledger:
    """The ledger of the fleet whose state lives in ``state_dir``, or, with ``url``, fleet ``fleet``'s
    history in that PostgreSQL database."""
    if url:
        return Ledger(PostgresBackend(url, fleet), fleet)
    return Ledger(state_dir / LEDGER_NAME, fleet)


def ledger_url(inventory: Inventory) -> str | None:
    """The shared ledger database of ``inventory`` (``$FLEETCTL_LEDGER_URL`` first), or None: SQLite."""
    url = os.environ.get("FLEETCTL_LEDGER_URL") or inventory.vars.get("fleetctl_ledger_url")
    return str(url) if url else None


def open_for(inventory: Inventory, state_dir: Path) -> Ledger:
    """The ledger ``inventory`` names: its shared PostgreSQL database, else the SQLite file in ``state_dir``."""
    url = ledger_url(inventory)
    if not url:
        return open_ledger(state_dir)
    fleet = inventory.vars.get("fleetctl_fleet")
    if not isinstance(fleet, str) or not fleet.strip():
        # Checkouts on different machines have different paths: only a name both write can key the
        # shared history and lock, and guessing one could merge two fleets' histories.
        raise FleetError(
            f"a shared ledger database is set (fleetctl_ledger_url or $FLEETCTL_LEDGER_URL) but the inventory "
            f"{inventory.path} names no fleetctl_fleet",
            fix="add `fleetctl_fleet: NAME` to the inventory's all vars (group_vars/all): the name this fleet's "
                "history and lock have in the shared database, the same in every operator's checkout")
    return open_ledger(state_dir, fleet.strip(), url)
