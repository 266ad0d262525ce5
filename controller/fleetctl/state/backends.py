"""Where the ledger's rows live: a SQLite file per fleet (the default) or a shared PostgreSQL
database.

The ledger's logic (``ledger.Ledger``) writes one SQL text for both: ``?``
placeholders, standard upserts (``ON CONFLICT``), explicit column lists, and
``Backend.seq`` for the column that keeps insertion order (SQLite's ``rowid``,
so that existing ledger files keep their format; an identity column ``seq`` on
PostgreSQL). A backend runs that text, keeps the schema version, serialises
writers (``BEGIN IMMEDIATE`` on SQLite; a transaction-level advisory lock per
fleet on PostgreSQL) and, on PostgreSQL, holds the fleet's rollout lock as a
session advisory lock on a connection of its own, so that a controller that
dies (or loses the database) loses the lock with its connection.

On PostgreSQL every fleet has a schema of its own (``fleetctl_<name>_<hash>``):
several fleets share one database without sharing a history or a lock, and
the tables are the same as in a SQLite file.

The connection string's secrets (``password``, and ``sslpassword``, which unlocks
the client's key) are never shown: ``where`` is the conninfo without them, and
libpq's error texts are scrubbed of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fleetctl.errors import FleetError

#: Where the optional dependency comes from (named in the error when it is missing).
PG_EXTRA = "pip install 'fleetctl[postgres]'"
#: Seconds a connection attempt may take before the server counts as unreachable.
CONNECT_TIMEOUT = 10
#: TCP keepalives (seconds: idle, interval; count) on both ends of our connections, unless the URL
#: says otherwise: the OS default (2 h idle) would let a controller cut off by the network keep the
#: fleet's lock on the server for hours; with these the server drops its session within ~1 min.
KEEPALIVE = (30, 10, 3)


class Tx(ABC):
    """Statements inside one transaction (or, for reads, one after another)."""

    @abstractmethod
    def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Execute a statement; the number of rows it changed."""

    @abstractmethod
    def all(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Every row of a query, as column -> value."""

    def one(self, sql: str, args: Sequence[Any] = ()) -> dict[str, Any] | None:
        """The first row of a query, or None."""
        rows = self.all(sql, args)
        return rows[0] if rows else None


class Backend(ABC):
    """One fleet's ledger database: its dialect, its transactions and its lock."""

    #: ``sqlite`` or ``postgresql``.
    kind: str
    #: Shown in messages: a file path, or a conninfo without its password.
    where: str
    #: The column that orders a table's rows as they were inserted.
    seq: str
    #: True when the fleet lock is the database's own (liveness known from it, on any machine).
    real_lock: bool

    @abstractmethod
    def write(self, fenced: bool = True) -> contextlib.AbstractContextManager[Tx]:
        """A write transaction; one writer per fleet at a time.

        ``fenced``: refuse it when this backend took the fleet's own lock and has lost it since.
        """

    @abstractmethod
    def read(self) -> contextlib.AbstractContextManager[Tx]:
        """Reads (no transaction of their own beyond each statement's)."""

    @abstractmethod
    def ddl(self, script: str) -> list[str]:
        """A migration script (written for SQLite) as this dialect's statements."""

    @abstractmethod
    def version(self, tx: Tx) -> int:
        """The schema version (0: nothing there yet). May create the fleet's namespace."""

    @abstractmethod
    def foreign(self, tx: Tx) -> bool:
        """Tables exist without a fleetctl schema version."""

    @abstractmethod
    def set_version(self, tx: Tx, version: int) -> None:
        """Record the schema version."""

    def try_lock(self) -> bool:
        """Take the fleet's own lock (True when taken or already held). SQLite: the lock row
        decides."""
        return True

    def unlock(self) -> None:  # noqa: B027 (SQLite has no lock of its own to let go)
        """Let the fleet's own lock go, if held."""

    @property
    def holding(self) -> bool:
        """This backend holds the fleet's own lock."""
        return False

    def lock_live(self) -> bool | None:
        """Whether any session holds the fleet's lock; None when the database cannot tell
        (SQLite)."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Close every connection (the lock's too: the lock goes with it)."""


# -- SQLite ------------------------------------------------------------------------------------


def _dict_row(cur: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {d[0]: v for d, v in zip(cur.description, row, strict=True)}


@contextlib.contextmanager
def _readable(path: Path) -> Iterator[None]:
    """A ledger file that is not one (random bytes, text, truncated, a directory, unreadable): one
    error naming the file and the fix, not an internal error. SQLite's base ``DatabaseError`` is
    that ("file is not a database", "database disk image is malformed"); its subclasses (locked,
    constraint) are the ledger's business."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        if type(e) is not sqlite3.DatabaseError:
            raise
        raise _corrupt(path, str(e)) from None
    except OSError as e:
        raise _corrupt(path, e.strerror or type(e).__name__) from None


def _corrupt(path: Path, why: str) -> FleetError:
    return FleetError(
        f"the ledger {path} cannot be read ({why})",
        fix=f"move it aside (mv {path} {path}.bad) and restore it from a backup, or let the next "
            "command start a new, empty ledger there; make the state directory's files the "
            "user's own, mode 0600, if it is their permissions")


class _SqliteTx(Tx):
    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self.db = db
        self.path = path

    def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        with _readable(self.path):
            return self.db.execute(sql, args).rowcount

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with _readable(self.path):
            rows: list[dict[str, Any]] = self.db.execute(sql, args).fetchall()
        return rows


class SqliteBackend(Backend):
    """One file per fleet; WAL, ``synchronous=FULL`` (a ``kill -9`` loses nothing committed)."""

    kind = "sqlite"
    seq = "rowid"
    real_lock = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _readable(path):
            # 0600 before SQLite opens it: its -wal and -shm files take the database file's mode.
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)
            self._db = sqlite3.connect(
                str(path), timeout=10.0, isolation_level=None, check_same_thread=False
            )
        self._db.row_factory = _dict_row
        try:
            with _readable(path):
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute("PRAGMA busy_timeout=10000")
        except FleetError:
            self._db.close()
            raise
        self._tx = _SqliteTx(self._db, path)

    @contextlib.contextmanager
    def write(self, fenced: bool = True) -> Iterator[Tx]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._tx
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    @contextlib.contextmanager
    def read(self) -> Iterator[Tx]:
        yield self._tx

    def ddl(self, script: str) -> list[str]:
        return [s for s in script.split(";") if s.strip()]

    def version(self, tx: Tx) -> int:
        row = tx.one("PRAGMA user_version")
        return int(row["user_version"]) if row else 0

    def foreign(self, tx: Tx) -> bool:
        row = tx.one("SELECT count(*) AS n FROM sqlite_master WHERE type='table'")
        return bool(row and row["n"])

    def set_version(self, tx: Tx, version: int) -> None:
        tx.run(f"PRAGMA user_version={int(version)}")

    def close(self) -> None:
        self._db.close()


# -- PostgreSQL --------------------------------------------------------------------------------


def _key(purpose: str, fleet: str) -> int:
    """A signed 64-bit advisory-lock key for one fleet and purpose (the same on every
    controller)."""
    return int.from_bytes(
        hashlib.sha256(f"fleetctl:{purpose}:{fleet}".encode()).digest()[:8], "big", signed=True
    )


def schema_name(fleet: str) -> str:
    """The PostgreSQL schema of a fleet: readable, and unique per fleet name (the hash)."""
    slug = re.sub(r"[^a-z0-9]+", "_", fleet.lower()).strip("_")[:32]
    return f"fleetctl_{slug}_{hashlib.sha256(fleet.encode()).hexdigest()[:8]}"


def _pg_ddl(script: str) -> list[str]:
    # Same tables as SQLite's; REAL is 4 bytes on PostgreSQL (timestamps need 8), and the tables
    # that SQLite orders by rowid get an identity column for it.
    script = script.replace(" REAL", " DOUBLE PRECISION")
    script = script.replace(
        "INTEGER PRIMARY KEY AUTOINCREMENT", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
    )
    script = re.sub(r"CREATE TABLE (rollouts|hosts|known_good) \(",
                    r"CREATE TABLE \1 (\n  seq BIGINT GENERATED ALWAYS AS IDENTITY,", script)
    return [s for s in script.split(";") if s.strip()]


#: libpq parameters holding a secret: never shown (``sslpassword`` unlocks the client key).
SECRET_PARAMS = frozenset({"password", "sslpassword"})


def redact(url: str) -> str:
    """``url`` as a conninfo string without its secrets (:data:`SECRET_PARAMS`; a fixed text when it
    does not parse)."""
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo
    except ImportError:
        return "(PostgreSQL ledger)"
    try:
        parts = conninfo_to_dict(url)
    except Exception:  # libpq's parse errors quote the string, password and all
        return "(unparsable PostgreSQL connection string)"
    return make_conninfo("", **{k: v for k, v in parts.items()
                                if k not in SECRET_PARAMS and v is not None})


def _scrub(text: str, secrets: Sequence[str]) -> str:
    """libpq's text on one line (its hints come on indented lines), without the password(s)."""
    text = " ".join(text.split())
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


class _PgTx(Tx):
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        rowcount: int = self.conn.execute(sql.replace("?", "%s"), args).rowcount
        return rowcount

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.conn.execute(sql.replace("?", "%s"), args).fetchall()
        return rows


class PostgresBackend(Backend):
    """A fleet's schema in a shared database, and the fleet's lock as a session advisory lock."""

    kind = "postgresql"
    seq = "seq"
    real_lock = True

    def __init__(self, url: str, fleet: str) -> None:
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
        except ImportError as e:
            raise FleetError(
                "the ledger is set to a PostgreSQL database (fleetctl_ledger_url or "
                "$FLEETCTL_LEDGER_URL) "
                f"but the PostgreSQL driver psycopg is not installed ({e})",
                fix=f"{PG_EXTRA} (scripts/bootstrap.sh does), or unset the URL to use the local "
                    "SQLite ledger",
            ) from None
        self._psycopg = psycopg
        self.where = redact(url)
        try:
            self._params: dict[str, Any] = {
                k: v for k, v in conninfo_to_dict(url).items() if v is not None
            }
        except Exception:
            raise FleetError(
                "the ledger URL (fleetctl_ledger_url or $FLEETCTL_LEDGER_URL) is not a valid "
                "PostgreSQL connection string",
                fix="use postgresql://USER@HOST:PORT/DBNAME or 'host=... dbname=... user=...'; "
                "keep the password in ~/.pgpass or $PGPASSWORD",
            ) from None
        self._secret = [str(v) for v in (*(self._params.get(k) for k in sorted(SECRET_PARAMS)),
                                         os.environ.get("PGPASSWORD")) if v]
        self.fleet = fleet
        self.schema = schema_name(fleet)
        self._lock_key = _key("lock", fleet)
        self._tx_key = _key("tx", fleet)
        self._conn = self._connect()
        self._lock_conn: Any = None
        #: The lock session's server pid (0: no lock taken).
        self._lock_pid = 0
        self._tx = _PgTx(self._conn)

    def _connect(self) -> Any:
        psycopg = self._psycopg
        from psycopg import sql
        from psycopg.rows import dict_row
        try:
            idle, interval, count = KEEPALIVE
            conn = psycopg.connect(**{"connect_timeout": CONNECT_TIMEOUT, "keepalives_idle": idle,
                                      "keepalives_interval": interval, "keepalives_count": count,
                                      **self._params}, autocommit=True, row_factory=dict_row,
                                   application_name="fleetctl")
        except psycopg.OperationalError as e:
            raise self._connect_error(e) from None
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        return conn

    def _connect_error(self, e: Exception) -> FleetError:
        cause = _scrub(str(e), self._secret)
        if re.search(r"authentication|password|pg_hba\.conf|role .* does not exist", cause):
            return FleetError(
                f"the ledger database {self.where} refused the login: {cause}",
                fix="check the user and its password: put the password in ~/.pgpass (or a "
                    "passfile= in the URL) "
                "or $PGPASSWORD, not in the URL; ask the database's admin for a role that may "
                "connect",
            )
        return FleetError(
            f"cannot reach the ledger database {self.where}: {cause}",
            fix="check that the PostgreSQL server runs and that host, port and dbname in "
                "fleetctl_ledger_url "
            "(or $FLEETCTL_LEDGER_URL) are right; unset it to use the local SQLite ledger",
        )

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except self._psycopg.OperationalError as e:
            raise FleetError(
                f"lost the connection to the ledger database {self.where}: "
                f"{_scrub(str(e), self._secret)}",
                fix="check the database server, then continue with `fleetctl rollout --resume`",
            ) from None
        except self._psycopg.errors.InsufficientPrivilege as e:
            raise FleetError(
                f"the ledger database {self.where} denies this role what the ledger needs: "
                f"{_scrub(str(e), self._secret)}",
                fix="have the database's admin `GRANT CREATE ON DATABASE` to the role, or create "
                    "schema "
                f"{self.schema} with `AUTHORIZATION` that role (it holds fleet {self.fleet}'s "
                "tables)",
            ) from None
        except self._psycopg.Error as e:
            raise FleetError(
                f"the ledger database {self.where} failed: {_scrub(str(e), self._secret)}",
                fix="see the database server's log; the ledger's transaction was rolled back",
            ) from None

    @contextlib.contextmanager
    def write(self, fenced: bool = True) -> Iterator[Tx]:
        with self._errors(), self._conn.transaction():
            # One writer per fleet at a time, as SQLite's BEGIN IMMEDIATE (read-then-write stays
            # atomic); and, in the same round trip, whether our lock session still holds the
            # fleet's lock.
            row = self._conn.execute(
                "SELECT pg_advisory_xact_lock(%s)::text AS tx, (SELECT count(*) FROM pg_locks WHERE"
                " locktype='advisory' AND granted AND pid=%s) AS held",
                (self._tx_key, self._lock_pid),
            ).fetchone()
            if fenced and self._lock_pid and not row["held"]:
                # A controller whose session ended (network, server restart) no longer owns the
                # fleet: another one may have taken it, and two writers would interleave their
                # records.
                raise FleetError(
                    f"this controller lost the fleet's lock in {self.where} (its database session "
                    "ended)",
                    fix="another controller may hold the fleet now: see `fleetctl history`; when "
                        "none runs, "
                    "continue with `fleetctl rollout --resume`",
                )
            yield self._tx

    @contextlib.contextmanager
    def read(self) -> Iterator[Tx]:
        with self._errors():
            yield self._tx

    def ddl(self, script: str) -> list[str]:
        return _pg_ddl(script)

    def version(self, tx: Tx) -> int:
        from psycopg import sql
        # Created only when missing: CREATE SCHEMA IF NOT EXISTS checks the CREATE privilege on the
        # database first, which a role given only its fleet's schema by an admin does not have.
        if not tx.one("SELECT 1 AS x FROM pg_namespace WHERE nspname=?", (self.schema,)):
            self._conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
        row = tx.one("SELECT to_regclass('schema_version') IS NOT NULL AS versioned")
        if not row or not row["versioned"]:
            return 0
        got = tx.one("SELECT max(version) AS v FROM schema_version")
        return int(got["v"]) if got and got["v"] is not None else 0

    def foreign(self, tx: Tx) -> bool:
        row = tx.one("SELECT count(*) AS n FROM pg_tables WHERE schemaname = current_schema()")
        return bool(row and row["n"])

    def set_version(self, tx: Tx, version: int) -> None:
        tx.run("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        tx.run("DELETE FROM schema_version")
        tx.run("INSERT INTO schema_version (version) VALUES (?)", (version,))

    # -- the fleet's lock: a session advisory lock on a connection of its own ----------------

    def try_lock(self) -> bool:
        if self._lock_conn is not None:
            return True
        conn = self._connect()
        try:
            got = conn.execute(
                "SELECT pg_try_advisory_lock(%s) AS got", (self._lock_key,)
            ).fetchone()["got"]
        except self._psycopg.OperationalError as e:
            conn.close()
            raise self._connect_error(e) from None
        if not got:
            conn.close()
            return False
        # The server's end of the keepalives (per session; ignored on a unix socket).
        idle, interval, count = KEEPALIVE
        conn.execute(f"SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = {interval};"
                     f" SET tcp_keepalives_count = {count}")
        self._lock_conn = conn
        self._lock_pid = int(conn.info.backend_pid)
        return True

    def unlock(self) -> None:
        conn, self._lock_conn, self._lock_pid = self._lock_conn, None, 0
        if conn is None:
            return
        try:
            # Freed before we return: closing alone frees it only once the server has processed the
            # disconnect, and the next controller (or this one's next acquire) may ask before that.
            conn.execute("SELECT pg_advisory_unlock(%s)", (self._lock_key,))
        except self._psycopg.Error:
            pass  # a dead session has freed it already
        finally:
            conn.close()

    @property
    def holding(self) -> bool:
        return self._lock_conn is not None

    def lock_live(self) -> bool:
        u = self._lock_key & 0xFFFFFFFFFFFFFFFF
        with self.read() as tx:
            row = tx.one(
                "SELECT count(*) AS n FROM pg_locks WHERE locktype='advisory' AND granted"
                " AND database=(SELECT oid FROM pg_database WHERE datname=current_database())"
                " AND classid=?::oid AND objid=?::oid AND objsubid=1",
                (u >> 32, u & 0xFFFFFFFF),
            )
        return bool(row and row["n"])

    def close(self) -> None:
        self.unlock()
        self._conn.close()
