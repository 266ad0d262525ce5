"""A real PostgreSQL server for the ledger's tests, from Debian's ``postgresql`` package.

Session-scoped: ``initdb`` into a temporary directory, a server listening on a
unix socket only (no TCP port to collide with), fsync off (a test server's
data need not survive a crash), stopped and removed at the end. As root (CI)
the server runs as the ``postgres`` user, which initdb requires.

Missing binaries or a missing psycopg fail the tests in CI (scripts/bootstrap.sh
installs both); outside CI they skip, saying why.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

#: A role that logs in with a password (scram), for the tests of authentication and redaction.
PW_USER = "fleet_pw"
PW_PASSWORD = "s3cret-" + uuid.uuid4().hex[:12]


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def _unavailable(why: str) -> NoReturn:
    msg = f"{why}; run scripts/bootstrap.sh (it installs Debian's postgresql and fleetctl[postgres])"
    if os.environ.get("CI"):
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


@dataclass(frozen=True)
class PgServer:
    """A running test server: its socket directory and how to reach it."""

    socket_dir: Path
    data: Path

    def url(self, user: str = "postgres", password: str | None = None, dbname: str = "postgres") -> str:
        """A libpq URL (unix socket) for ``user``."""
        auth = f"{user}:{password}" if password else user
        return f"postgresql://{auth}@/{dbname}?host={self.socket_dir}"

    def admin(self) -> Any:
        """A superuser connection (autocommit)."""
        import psycopg
        return psycopg.connect(self.url(), autocommit=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """Start PostgreSQL for the session (a few seconds), stop it at the end."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg (fleetctl[postgres]) is not installed")
    bindir = _bindir()
    if bindir is None:
        _unavailable("PostgreSQL's server binaries (/usr/lib/postgresql/*/bin) are not installed")
    # Short path under /tmp: the socket's path must stay under 108 bytes, and the postgres user must
    # be able to reach it (pytest's tmp dirs are root's, mode 0700).
    root = Path(tempfile.mkdtemp(prefix="fleetctl-pg-", dir="/tmp"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = root / "data"

    def run(*argv: str) -> None:
        r = subprocess.run([*as_user, *argv], capture_output=True, text=True, timeout=120)
        if r.returncode:
            raise RuntimeError(f"{argv[0]} failed ({r.returncode}): {r.stdout}{r.stderr}")

    try:
        run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
        # Password (scram) for the one role the auth tests use; trust for the rest (the socket is private).
        (data / "pg_hba.conf").write_text(f"local all {PW_USER} scram-sha-256\nlocal all all trust\n")
        run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w",
            "-o", f"-k {root} -h '' -F -c max_connections=100", "start")
    except Exception:
        shutil.rmtree(root, ignore_errors=True)
        raise
    server = PgServer(root, data)
    try:
        with server.admin() as conn:
            conn.execute(f"CREATE ROLE {PW_USER} LOGIN PASSWORD '{PW_PASSWORD}'")
            conn.execute(f"GRANT CREATE ON DATABASE postgres TO {PW_USER}")
        yield server
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60, check=False)
        shutil.rmtree(root, ignore_errors=True)
