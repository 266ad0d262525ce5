"""A real PostgreSQL server for the ledger's tests, from Debian's ``postgresql`` package
(session-scoped).

``fleetctl.lab.pgserver`` starts it (initdb in /tmp, unix socket only, as the
``postgres`` user under root) and removes it at the end. Missing binaries or a
missing psycopg fail the tests in CI (scripts/bootstrap.sh installs both);
outside CI they skip, saying why.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from fleetctl.lab.pgserver import PgServer, PgUnavailable, running

#: A role that logs in with a password (scram), for the tests of authentication and redaction.
PW_USER = "fleet_pw"
PW_PASSWORD = "s3cret-" + uuid.uuid4().hex[:12]

__all__ = ["PW_PASSWORD", "PW_USER", "PgServer", "pg_server"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """PostgreSQL for the session (about a second to start), stopped at the end."""
    try:
        with running((PW_USER, PW_PASSWORD)) as server:
            yield server
    except PgUnavailable as e:
        msg = (f"{e}; run scripts/bootstrap.sh (it installs Debian's postgresql and "
               "fleetctl[postgres])")
        if os.environ.get("CI"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
