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

What the ledger holds is in ``records.py`` (the records and statuses), its schema and migrations
in ``schema.py``: import them from there (``records.RUNNING``, ``records.HostRecord``). The SQL
dialects are apart in ``backends.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetError, LockedError
from fleetctl.state.backends import Backend, PostgresBackend, SqliteBackend, Tx
from fleetctl.state.lock import proc_start
from fleetctl.state.records import (
    ACTIVE,
    DONE,
    HOST_FAILED,
    PENDING,
    ROLLED_BACK,
    RUNNING,
    SKIPPED,
    BaselineRow,
    HostRecord,
    KnownGood,
    LedgerInfo,
    LockHolder,
    OutOfRotation,
    RolloutRecord,
    from_json,
    host_record,
    rollout_record,
    started_by,
)
from fleetctl.state.schema import migrate

if TYPE_CHECKING:
    from fleetctl.inventory import Inventory

LEDGER_NAME = "ledger.sqlite3"


class Ledger:
    """The fleet's ledger. Thread-safe: workers write through it, one transaction at a time."""

    def __init__(self, db: Backend | Path, fleet: str = "fleet") -> None:
        """``db``: a backend, or the path of a SQLite file."""
        self._db = db if isinstance(db, Backend) else SqliteBackend(db)
        #: Where the ledger is, for messages (a path, or a PostgreSQL conninfo without its
        #: password).
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
            migrate(self._db, db)

    def info(self) -> LedgerInfo:
        """Where this ledger is, its schema version, how many rollouts it holds, who holds the
        lock."""
        with self._read() as db:
            version = self._db.version(db)
            row = db.one("SELECT count(*) AS n FROM rollouts")
        return LedgerInfo(
            self._db.kind,
            self.where,
            self.fleet,
            version,
            int(row["n"]) if row else 0,
            self.holder(),
        )

    # -- the lock ------------------------------------------------------------------------

    def holder(self) -> LockHolder | None:
        """Who holds this fleet's lock, if anybody (alive or not)."""
        with self._read() as db:
            row = db.one("SELECT * FROM lock WHERE fleet=?", (self.fleet,))
            if row is None:
                return None
            live = self._db.lock_live()
        return LockHolder.from_row(row, live)

    def acquire(self, rollout_id: str) -> LockHolder | None:
        """Take the fleet's lock for ``rollout_id``; return the stale holder taken over, if any.

        A live holder makes this raise :class:`LockedError` naming it. On
        SQLite: the same pid and start time on this machine, or any holder on
        another machine (always presumed alive); on PostgreSQL: a holder whose
        database session still holds the fleet's advisory lock, on any machine.
        """
        me = LockHolder(
            rollout_id, os.getpid(), socket.gethostname(), proc_start(os.getpid()), time.time()
        )
        with self._mu:
            had = self._db.holding
            if not self._db.try_lock():
                with self._read() as db:
                    row = db.one("SELECT * FROM lock WHERE fleet=?", (self.fleet,))
                raise self._locked(LockHolder.from_row(row, True) if row else None)
            try:
                with self._tx() as db:
                    row = db.one("SELECT * FROM lock WHERE fleet=?", (self.fleet,))
                    stale: LockHolder | None = None
                    if row is not None:
                        # Taking the database's lock just now proves its last holder's session is
                        # gone.
                        h = LockHolder.from_row(row, None if not self._db.real_lock else had)
                        if (
                            h.pid == me.pid
                            and h.hostname == me.hostname
                            and h.proc_start == me.proc_start
                        ):
                            stale = None  # re-entrant: this process already holds it
                        elif h.alive:
                            raise self._locked(h)
                        else:
                            stale = h
                    db.run(
                        "INSERT INTO lock (fleet, rollout_id, pid, hostname, proc_start, "
                        "acquired_at)"
                        " VALUES (?,?,?,?,?,?) ON CONFLICT (fleet) DO UPDATE SET "
                        "rollout_id=excluded.rollout_id,"
                        " pid=excluded.pid, hostname=excluded.hostname, "
                        "proc_start=excluded.proc_start,"
                        " acquired_at=excluded.acquired_at",
                        (
                            self.fleet,
                            me.rollout_id,
                            me.pid,
                            me.hostname,
                            me.proc_start,
                            me.acquired_at,
                        ),
                    )
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
                f"another controller holds this fleet's lock in {self.where} (it has not recorded "
                "who it is yet, "
                "or its record was removed)",
                fix="wait for it and retry; `fleetctl history` shows what runs",
            )
        if self._db.real_lock:
            fix = (
                "wait for it, or follow it with `fleetctl history`; the lock is the controller's "
                "database "
                "session, freed when that controller exits, is killed or loses the database"
            )
        else:
            fix = (
                "wait for it, or follow it with `fleetctl history`; if that controller is dead on "
                "another "
                "machine, run `fleetctl rollout abort --force` there"
            )
        return LockedError(
            f"rollout {h.rollout_id} is in progress on this fleet (controller pid {h.pid} on "
            f"{h.hostname}, "
            f"since {time.strftime('%H:%M:%S', time.localtime(h.acquired_at))})",
            fix=fix,
        )

    def release(self, rollout_id: str | None = None) -> None:
        """Drop the lock if ``rollout_id`` (or, with None, anybody) holds it."""
        with self._mu:
            # Not fenced: a controller that lost its lock must still be able to clear its own
            # record.
            with self._tx(fenced=False) as db:
                if rollout_id is None:
                    db.run("DELETE FROM lock WHERE fleet=?", (self.fleet,))
                else:
                    db.run(
                        "DELETE FROM lock WHERE fleet=? AND rollout_id=?", (self.fleet, rollout_id)
                    )
            if rollout_id is None or rollout_id == self._lock_rid:
                self._lock_rid = None
                self._db.unlock()

    # -- writing -------------------------------------------------------------------------

    def create(
        self,
        rollout_id: str,
        *,
        kind: str,
        recipe: str | None,
        requested: str | None,
        tag: str | None,
        digest: str | None,
        image: str | None,
        options: Mapping[str, Any],
        command: str,
        waves: Sequence[Sequence[str]],
        hosts: Sequence[Mapping[str, Any]],
        parent: str | None = None,
        status: str = RUNNING,
    ) -> None:
        """Record a new rollout with its waves and hosts (each host a mapping of hosts-table
        columns)."""
        now = time.time()
        with self._tx() as db:
            db.run(
                "INSERT INTO rollouts (id, kind, status, recipe, requested, tag, digest, image, "
                "parent, options,"
                " started_by, command, started_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    rollout_id,
                    kind,
                    status,
                    recipe,
                    requested,
                    tag,
                    digest,
                    image,
                    parent,
                    json.dumps(dict(options)),
                    started_by(),
                    command,
                    now,
                ),
            )
            for i, w in enumerate(waves):
                db.run("INSERT INTO waves (rollout_id, idx, hosts, status) VALUES (?,?,?,?)",
                       (rollout_id, i, json.dumps(list(w)), PENDING))
            for h in hosts:
                cols = {
                    "rollout_id": rollout_id,
                    "phase": "planned",
                    "status": PENDING,
                    "updated_at": now,
                    **h,
                }
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
                db.run(
                    "UPDATE waves SET status=?, started_at=coalesce(started_at, ?) WHERE "
                    "rollout_id=? AND idx=?",
                    (status, now, rollout_id, idx),
                )
            else:
                db.run("UPDATE waves SET status=?, finished_at=? WHERE rollout_id=? AND idx=?",
                           (status, now, rollout_id, idx))

    _HOST_FIELDS = frozenset(
        {
            "status",
            "after_tag",
            "after_digest",
            "verdict",
            "artifacts",
            "error",
            "before",
            "before_tag",
            "before_digest",
            "recipe",
            "before_recipe",
        }
    )

    def host_phase(self, rollout_id: str, host: str, phase: str, detail: str | None = None,
                   **fields: Any) -> None:
        """Record that ``host`` entered ``phase`` (and update its other columns) in one
        transaction."""
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
                       only_if_none: bool = False, recipe: str | None = None) -> None:
        """Record that ``host`` serves ``digest`` with these settings well (the newest entry wins).

        Recording a version again makes it the newest; a ``gate`` source is
        never downgraded. ``only_if_none``: record only when the host has no
        known-good yet. ``recipe``: the recipe it served it with (kept when not given again).
        """
        with self._tx() as db:
            if only_if_none and db.one("SELECT 1 AS x FROM known_good WHERE host=?", (host,)):
                return
            # The old row's columns are qualified: PostgreSQL finds a bare name ambiguous with
            # excluded's.
            db.run(
                "INSERT INTO known_good (host, digest, fingerprint, tag, settings, source, "
                "rollout_id, at, recipe)"
                " VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT (host, digest, fingerprint) DO"
                " UPDATE SET tag=excluded.tag, settings=coalesce(excluded.settings, "
                "known_good.settings), recipe=coalesce(excluded.recipe, known_good.recipe),"
                " source=CASE WHEN known_good.source='gate' THEN 'gate' ELSE excluded.source END,"
                " rollout_id=coalesce(excluded.rollout_id, known_good.rollout_id), at=excluded.at",
                (
                    host,
                    digest,
                    fingerprint or "",
                    tag,
                    json.dumps(dict(settings)) if settings else None,
                    source,
                    rollout_id,
                    time.time(),
                    recipe,
                ),
            )

    def mark_out(
        self, host: str, rollout_id: str | None, reason: str, memo: Mapping[str, Any]
    ) -> None:
        """Record, before the door is asked, that fleetctl takes ``host`` out of rotation (kept on
        re-drain)."""
        with self._tx() as db:
            db.run(
                "INSERT INTO out_of_rotation (host, rollout_id, reason, memo, at) VALUES "
                "(?,?,?,?,?)"
                " ON CONFLICT (host) DO UPDATE SET rollout_id=excluded.rollout_id, "
                "reason=excluded.reason,"
                " memo=CASE WHEN excluded.memo='{}' THEN out_of_rotation.memo ELSE excluded.memo "
                "END,"
                " at=excluded.at",
                (host, rollout_id, reason, json.dumps(dict(memo)), time.time()),
            )

    def mark_in(self, host: str) -> None:
        """``host`` is back in rotation (after the door said so)."""
        with self._tx() as db:
            db.run("DELETE FROM out_of_rotation WHERE host=?", (host,))

    def out_of_rotation(self) -> dict[str, OutOfRotation]:
        """Every host fleetctl took out of rotation and has not put back."""
        with self._read() as db:
            rows = db.all("SELECT * FROM out_of_rotation ORDER BY host")
        return {r["host"]: OutOfRotation.from_row(r) for r in rows}

    def known_good(self, host: str) -> list[KnownGood]:
        """The host's known-good versions, newest first."""
        with self._read() as db:
            rows = db.all(
                f"SELECT * FROM known_good WHERE host=? ORDER BY at DESC, {self._db.seq} DESC",
                (host,),
            )
        return [KnownGood.from_row(r) for r in rows]

    # -- soak baselines -----------------------------------------------------------------

    @staticmethod
    def _baseline_row(r: Mapping[str, Any]) -> BaselineRow:
        return BaselineRow(
            r["host"], r["tag"], bool(r["pinned"]), tuple(json.loads(r["runs"])), r["updated_at"]
        )

    def baseline(self, host: str, tag: str) -> BaselineRow | None:
        """The stored window of ``host`` on ``tag``, or None."""
        with self._read() as db:
            r = db.one("SELECT * FROM baselines WHERE host=? AND tag=?", (host, tag))
        return self._baseline_row(r) if r else None

    def baselines(self, host: str | None = None) -> list[BaselineRow]:
        """Every stored window (of ``host``), by host and tag."""
        with self._read() as db:
            rows = (
                db.all("SELECT * FROM baselines WHERE host=? ORDER BY tag", (host,))
                if host is not None
                else db.all("SELECT * FROM baselines ORDER BY host, tag")
            )
        return [self._baseline_row(r) for r in rows]

    def update_baseline(
        self, host: str, tag: str, change: Callable[[BaselineRow | None], BaselineRow | None]
    ) -> BaselineRow | None:
        """Read the window, apply ``change`` and write what it returns (None: leave it), in one
        transaction:
        two controllers adding a run at once both get theirs in. Returns what was written."""
        with self._tx() as db:
            r = db.one("SELECT * FROM baselines WHERE host=? AND tag=?", (host, tag))
            new = change(self._baseline_row(r) if r else None)
            if new is None:
                return None
            db.run(
                "INSERT INTO baselines (host, tag, pinned, runs, updated_at) VALUES (?,?,?,?,?)"
                " ON CONFLICT (host, tag) DO UPDATE SET pinned=excluded.pinned, runs=excluded.runs,"
                " updated_at=excluded.updated_at",
                (host, tag, 1 if new.pinned else 0, json.dumps(list(new.runs)), time.time()),
            )
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
                raise FleetError(
                    f"no rollout {rollout_id!r} in {self.where}", fix="see `fleetctl history`"
                )
            waves = db.all("SELECT * FROM waves WHERE rollout_id=? ORDER BY idx", (rollout_id,))
            hosts = db.all(
                "SELECT * FROM hosts WHERE rollout_id=? ORDER BY wave<0, wave, step, "
                f"{self._db.seq}",
                (rollout_id,),
            )
            phases = db.all("SELECT * FROM phases WHERE rollout_id=? ORDER BY id", (rollout_id,))
        return rollout_record(row, waves, hosts, phases)

    def passed_steps(
        self, recipe: str, rollouts: int = 20, limit: int = 50
    ) -> list[dict[str, Any]]:
        """The verdicts (with ``timings``) of hosts that passed their gate in the last ``rollouts``
        rollouts
        of ``recipe``, newest first, at most ``limit``: what a plan's time estimate learns from."""
        with self._read() as db:
            rows = db.all(
                "SELECT verdict FROM hosts WHERE status=? AND verdict IS NOT NULL AND rollout_id "
                "IN ("
                " SELECT id FROM rollouts WHERE recipe=? AND kind='rollout'"
                f" ORDER BY started_at DESC, {self._db.seq} DESC LIMIT ?)"
                " ORDER BY finished_at DESC LIMIT ?",
                (DONE, recipe, rollouts, limit),
            )
        out = [from_json(r["verdict"]) for r in rows]
        return [v for v in out if isinstance(v, dict) and v.get("outcome") == "pass"
                and isinstance(v.get("timings"), dict)]

    def host_record(self, rollout_id: str, host: str) -> HostRecord | None:
        """One host's record in a rollout, if it took part. A host step reads its own record at each
        phase: ``get(...).host(...)`` read every host and phase of the rollout, O(hosts) each
        time."""
        with self._read() as db:
            row = db.one("SELECT * FROM hosts WHERE rollout_id=? AND host=?", (rollout_id, host))
        return host_record(row) if row is not None else None

    def ids(
        self, kind: str | None = None, statuses: Sequence[str] | None = None, limit: int = 50
    ) -> list[str]:
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

    def latest(
        self, kind: str | None = None, statuses: Sequence[str] | None = None
    ) -> RolloutRecord | None:
        """The newest rollout matching, or None."""
        ids = self.ids(kind, statuses, limit=1)
        return self.get(ids[0]) if ids else None

    def history(self, limit: int = 50) -> list[RolloutRecord]:
        """Every rollout and rollback, newest first."""
        return [self.get(i) for i in self.ids(limit=limit)]


def open_ledger(state_dir: Path, fleet: str = "fleet", url: str | None = None) -> Ledger:
    """The ledger of the fleet whose state lives in ``state_dir``, or, with ``url``, fleet
    ``fleet``'s
    history in that PostgreSQL database."""
    if url:
        return Ledger(PostgresBackend(url, fleet), fleet)
    return Ledger(state_dir / LEDGER_NAME, fleet)


def ledger_url(inventory: Inventory) -> str | None:
    """The shared ledger database of ``inventory`` (``$FLEETCTL_LEDGER_URL`` first), or None:
    SQLite."""
    url = os.environ.get("FLEETCTL_LEDGER_URL") or inventory.vars.get("fleetctl_ledger_url")
    return str(url) if url else None


def open_for(inventory: Inventory, state_dir: Path) -> Ledger:
    """The ledger ``inventory`` names: its shared PostgreSQL database, else the SQLite file in
    ``state_dir``."""
    url = ledger_url(inventory)
    if not url:
        return open_ledger(state_dir)
    fleet = inventory.vars.get("fleetctl_fleet")
    if not isinstance(fleet, str) or not fleet.strip():
        # Checkouts on different machines have different paths: only a name both write can key the
        # shared history and lock, and guessing one could merge two fleets' histories.
        raise FleetError(
            "a shared ledger database is set (fleetctl_ledger_url or $FLEETCTL_LEDGER_URL) but "
            "the inventory "
            f"{inventory.path} names no fleetctl_fleet",
            fix="add `fleetctl_fleet: NAME` to the inventory's all vars (group_vars/all): the name "
                "this fleet's "
            "history and lock have in the shared database, the same in every operator's checkout",
        )
    return open_ledger(state_dir, fleet.strip(), url)
