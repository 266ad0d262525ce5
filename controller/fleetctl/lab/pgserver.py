"""A throwaway PostgreSQL server from Debian's ``postgresql`` package, for the ledger's tests and
benchmark.

``initdb`` into a fresh directory under /tmp, a server listening on a unix
socket only (no TCP port to collide with), fsync off (its data need not
survive a crash of this machine), stopped with ``-m immediate`` and removed
at the end. As root the server runs as the ``postgres`` user (initdb refuses
root). About a second to start on a 2-core machine.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class PgUnavailable(Exception):
    """PostgreSQL's server binaries or the psycopg driver are not installed."""


def bindir() -> Path | None:
    """The newest installed PostgreSQL's bin directory (Debian's layout), or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


@dataclass(frozen=True)
class PgServer:
    """A running server: its socket directory and its data directory."""

    socket_dir: Path
    data: Path

    def url(
        self, user: str = "postgres", password: str | None = None, dbname: str = "postgres"
    ) -> str:
        """A libpq URL (unix socket) for ``user``."""
        auth = f"{user}:{password}" if password else user
        return f"postgresql://{auth}@/{dbname}?host={self.socket_dir}"

    def admin(self) -> Any:
        """A superuser connection (autocommit)."""
        import psycopg
        return psycopg.connect(self.url(), autocommit=True)


@contextlib.contextmanager
def running(
    password_role: tuple[str, str] | None = None, fsync: bool = False
) -> Iterator[PgServer]:
    """A server for the duration of the block. ``password_role``: (name, password) of a role that
    must log in with a password (scram); every other role is trusted on the private socket.
    ``fsync``: commit
    durably, as a real server does (a benchmark against SQLite's ``synchronous=FULL``)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise PgUnavailable("psycopg (fleetctl[postgres]) is not installed") from None
    bins = bindir()
    if bins is None:
        raise PgUnavailable(
            "PostgreSQL's server binaries (/usr/lib/postgresql/*/bin) are not installed"
        )
    # Short path under /tmp: a socket's path must stay under 108 bytes, and the postgres user must
    # be able to reach it (pytest's and mkdtemp's usual parents are root's, mode 0700).
    root = Path(tempfile.mkdtemp(prefix="fleetctl-pg-", dir="/tmp"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = root / "data"

    def run(*argv: str) -> None:
        r = subprocess.run(
            [*as_user, *argv], capture_output=True, text=True, timeout=120, check=False
        )
        if r.returncode:
            raise RuntimeError(
                f"{Path(argv[0]).name} failed ({r.returncode}): {r.stdout}{r.stderr}"
            )

    try:
        run(str(bins / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
        hba = f"local all {password_role[0]} scram-sha-256\n" if password_role else ""
        (data / "pg_hba.conf").write_text(hba + "local all all trust\n")
        run(str(bins / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w",
            "-o", f"-k {root} -h ''" + ("" if fsync else " -F"), "start")
    except Exception:
        shutil.rmtree(root, ignore_errors=True)
        raise
    server = PgServer(root, data)
    try:
        if password_role:
            from psycopg import sql
            name, password = password_role
            with server.admin() as conn:
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(name), sql.Literal(password)
                    )
                )
                conn.execute(
                    sql.SQL("GRANT CREATE ON DATABASE postgres TO {}").format(sql.Identifier(name))
                )
        yield server
    finally:
        subprocess.run(
            [*as_user, str(bins / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(root, ignore_errors=True)
