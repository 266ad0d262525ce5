"""The ledger's schema, version by version: each version's statements after the previous one
(the same on SQLite and PostgreSQL; the dialects are apart in ``backends.py``)."""

from __future__ import annotations

from fleetctl.errors import ExitCode, FleetError
from fleetctl.state.backends import Backend, Tx

#: 1: rollouts, waves, hosts, phases, lock. 2: known_good. 3: out_of_rotation (the front door).
#: 4: baselines (the soak's, shared by every controller on the ledger). 5: each host's recipe in a
#: run (``recipe``, ``before_recipe``: a fleet serving several models) and a known-good's recipe.
SCHEMA_VERSION = 5


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
"""  # noqa: E501 (data: lines as the program reads them)


#: Each schema version's statements after the previous one (index 0: version 1 from nothing).
MIGRATIONS = (
    _SCHEMA,
    """
CREATE TABLE known_good (
  host TEXT NOT NULL, digest TEXT NOT NULL, fingerprint TEXT NOT NULL DEFAULT '',
  tag TEXT, settings TEXT,             -- settings: JSON container settings, env values removed
  source TEXT NOT NULL,                -- gate | found (before fleetctl first touched the host) | served
  rollout_id TEXT, at REAL NOT NULL,
  PRIMARY KEY (host, digest, fingerprint)
);
""",  # noqa: E501 (data: lines as the program reads them)
    """
CREATE TABLE out_of_rotation (
  host TEXT PRIMARY KEY,               -- a host fleetctl took out of the front door's rotation
  rollout_id TEXT, reason TEXT,
  memo TEXT NOT NULL DEFAULT '{}',     -- JSON: what the door needs to put it back (no secrets)
  at REAL NOT NULL
);
""",
    """
CREATE TABLE baselines (
  host TEXT NOT NULL, tag TEXT NOT NULL,
  pinned INTEGER NOT NULL DEFAULT 0,
  runs TEXT NOT NULL,                  -- JSON list: the window's passing soak verdicts, oldest first
  updated_at REAL NOT NULL,
  PRIMARY KEY (host, tag)
);
""",  # noqa: E501 (data: lines as the program reads them)
    """
ALTER TABLE hosts ADD COLUMN recipe TEXT;         -- the recipe the host's step serves
ALTER TABLE hosts ADD COLUMN before_recipe TEXT;  -- the recipe it served before (a switch: another)
ALTER TABLE known_good ADD COLUMN recipe TEXT;
""",
)


def migrate(backend: Backend, db: Tx) -> None:
    """Bring the ledger in ``backend`` to this fleetctl's schema, in the transaction ``db``; a newer
    schema, or tables that are not a ledger's, are refused."""
    version = backend.version(db)
    if version > SCHEMA_VERSION:
        raise FleetError(
            f"ledger {backend.where} has schema version {version}, newer than this fleetctl's "
            f"{SCHEMA_VERSION}",
            fix="upgrade fleetctl (a newer one wrote this ledger); do not edit or delete the "
                "ledger",
            exit_code=ExitCode.INCONCLUSIVE,
        )
    if version == 0 and backend.foreign(db):
        raise FleetError(f"{backend.where} is not a fleetctl ledger (unversioned tables)",
                         fix="move the file away or set FLEETCTL_STATE_DIR (PostgreSQL: drop that "
                             "fleet's schema or name the fleet differently with fleetctl_fleet)")
    # Statement by statement inside this transaction (executescript would commit early),
    # so that two controllers creating or upgrading the ledger at once cannot both do it.
    for script in MIGRATIONS[version:]:
        for stmt in backend.ddl(script):
            db.run(stmt)
    if version < SCHEMA_VERSION:
        backend.set_version(db, SCHEMA_VERSION)
