"""The fleet's record: what fleetctl did, what each host should serve, and who may change it.

- ``ledger``: every rollout and rollback, per wave and per host; each host's known-good
  versions; the fleet's lock (one writer per fleet). The logic is one for both backends.
- ``backends``: where the ledger lives: a local SQLite file, or a schema in a shared
  PostgreSQL database (dialect, schema version, migrations).
- ``hoststate``: the state file on each host (``/var/lib/fleetctl/state.json``): the host's
  own lock, its current target and its last known-good, claimed all or nothing.
- ``lock``: a lock holder's identity on this machine (pid + process start time), shared by
  both locks to tell a dead holder from a live one.

Nothing here imports the verbs (rollout, stage, soak, cli): they use this package.
"""
