"""The ledger on both backends: schema versioning, the fleet lock (live, stale after kill -9),
records, history.

Every test that takes ``backend`` runs on SQLite (a file per fleet) and on a
real PostgreSQL server (``tests/plugins/postgres.py``), each test with a fleet
of its own (a schema of its own in the shared database).
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fleetctl import inventory
from fleetctl.cli.main import cli
from fleetctl.errors import ExitCode, FleetError, LockedError
from fleetctl.state import backends
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records
from fleetctl.state import schema as fleet_schema
from tests.plugins.postgres import PW_PASSWORD, PW_USER, PgServer

D = "sha256:" + "c" * 64


@dataclass(frozen=True)
class Backend:
    """Where one test's ledger lives, and the backend-specific ways to tamper with it."""

    kind: str
    state_dir: Path
    fleet: str
    server: PgServer | None

    @property
    def url(self) -> str | None:
        return self.server.url() if self.server else None

    def open(self) -> fleet_ledger.Ledger:
        return fleet_ledger.open_ledger(self.state_dir, self.fleet, self.url)

    def sql(self, *stmts: str) -> list[Any]:
        """Run statements straight on the database (the fleet's schema); the last one's rows."""
        rows: list[Any] = []
        if self.server is None:
            db = sqlite3.connect(self.state_dir / fleet_ledger.LEDGER_NAME)
            for s in stmts:
                rows = db.execute(s).fetchall()
            db.commit()
            db.close()
            return rows
        with self.server.admin() as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{backends.schema_name(self.fleet)}"')
            conn.execute(f'SET search_path TO "{backends.schema_name(self.fleet)}"')
            for s in stmts:
                cur = conn.execute(s)
                rows = cur.fetchall() if cur.description else []
        return rows

    def version(self) -> int:
        if self.server is None:
            return int(self.sql("PRAGMA user_version")[0][0])
        return int(self.sql("SELECT version FROM schema_version")[0][0])

    def set_version(self, v: int) -> None:
        self.sql(
            f"PRAGMA user_version={v}"
            if self.server is None
            else f"UPDATE schema_version SET version={v}"
        )

    def make_v1(self) -> None:
        """A ledger as fleetctl's schema version 1 left it."""
        db = backends.PostgresBackend(self.url, self.fleet) if self.url else backends.SqliteBackend(
            self.state_dir / fleet_ledger.LEDGER_NAME)
        with db.write() as tx:
            assert db.version(tx) == 0
            for stmt in db.ddl(fleet_schema.MIGRATIONS[0]):
                tx.run(stmt)
            db.set_version(tx, 1)
        db.close()

    def argv(self) -> list[str]:
        """How a subprocess opens the same ledger (see HOLDER)."""
        return [str(self.state_dir), self.fleet, self.url or ""]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    server: PgServer | None = (
        request.getfixturevalue("pg_server") if request.param == "postgresql" else None
    )
    return Backend(request.param, tmp_path, f"test-{uuid.uuid4().hex[:8]}", server)


def make(led: fleet_ledger.Ledger, rid: str = "ro-1") -> None:
    led.create(
        rid,
        kind="rollout",
        recipe="qwen",
        requested="v0.24.0",
        tag="2026-07-01-v0.24.0",
        digest=D,
        image="ghcr.io/a/b",
        options={"waves": "1,100%"},
        command="fleetctl rollout --tag v0.24.0",
        waves=[["s1"], ["s2", "s3"]],
        hosts=[
            {
                "host": h,
                "wave": w,
                "step": 0,
                "before_tag": "old",
                "before_digest": "sha256:old",
                "before": {"image": "x", "env": ["HF_TOKEN"]},
                "target_tag": "2026-07-01-v0.24.0",
                "target_digest": D,
            }
            for h, w in (("s1", 0), ("s2", 1), ("s3", 1))
        ],
    )


def test_records_phases_and_history(backend: Backend) -> None:
    with backend.open() as led:
        make(led)
        led.set_wave("ro-1", 0, fleet_records.RUNNING)
        led.host_phase("ro-1", "s1", "starting", status=fleet_records.IN_PROGRESS)
        led.host_phase("ro-1", "s1", "soak", detail="30s")
        led.host_phase(
            "ro-1",
            "s1",
            "done",
            status=fleet_records.DONE,
            after_tag="2026-07-01-v0.24.0",
            after_digest=D,
            verdict={"outcome": "pass"},
            artifacts="/x/runs/1",
        )
        led.set_wave("ro-1", 0, fleet_records.DONE)
        led.set_status("ro-1", fleet_records.COMPLETED)
        r = led.get("ro-1")
    assert (
        r.status == fleet_records.COMPLETED
        and r.finished_at is not None
        and r.started_by.count("@") == 1
    )
    s1 = r.host("s1")
    assert s1 is not None and s1.status == fleet_records.DONE and s1.verdict == {"outcome": "pass"}
    assert s1.before == {"image": "x", "env": ["HF_TOKEN"]} and s1.finished_at is not None
    assert [p.phase for p in r.phases if p.host == "s1"] == ["starting", "soak", "done"]
    assert r.waves[0].status == fleet_records.DONE and r.waves[1].hosts == ("s2", "s3")
    # Timestamps keep sub-second precision (PostgreSQL's REAL would round them to ~100 s).
    assert r.finished_at is not None and abs(r.finished_at - time.time()) < 3600
    assert (
        s1.started_at is not None and s1.finished_at is not None and s1.started_at <= s1.finished_at
    )
    with backend.open() as led:  # reopening reads the same (committed) data
        assert [x.id for x in led.history()] == ["ro-1"]
        assert led.latest(statuses=fleet_records.ACTIVE) is None
        with pytest.raises(FleetError, match="no rollout 'nope'"):
            led.get("nope")
        with pytest.raises(ValueError):
            led.host_phase("ro-1", "s9", "x")


def test_one_host_record_is_the_same_as_in_the_whole_record(backend: Backend) -> None:
    with backend.open() as led:
        make(led)
        make(led, "ro-2")
        led.host_phase(
            "ro-1",
            "s2",
            "done",
            status=fleet_records.DONE,
            verdict={"outcome": "pass"},
            after_tag="t",
        )
        whole = led.get("ro-1")
        for h in ("s1", "s2", "s3"):
            assert led.host_record("ro-1", h) == whole.host(h)
        assert led.host_record("ro-2", "s2") == led.get("ro-2").host("s2") != whole.host("s2")
        assert led.host_record("ro-1", "s9") is None
        assert led.host_record("nope", "s1") is None


def test_passed_steps_are_the_passed_verdicts_of_the_recipes_recent_rollouts(
    backend: Backend,
) -> None:
    def passed(t: float) -> dict[str, Any]:
        return {"outcome": "pass", "timings": {"ready": t, "soak": 40.0}, "sustained_s": 5.0}

    with backend.open() as led:
        make(led, "ro-old")
        make(led, "ro-new")
        led.create(
            "ro-other",
            kind="rollout",
            recipe="other",
            requested="x",
            tag="x",
            digest=D,
            image="i",
            options={},
            command="c",
            waves=[["s1"]],
            hosts=[{"host": "s1", "wave": 0, "step": 0, "target_tag": "x", "target_digest": D}],
        )
        led.host_phase("ro-old", "s1", "done", status=fleet_records.DONE, verdict=passed(1.0))
        led.host_phase("ro-new", "s1", "done", status=fleet_records.DONE, verdict=passed(2.0))
        led.host_phase("ro-new", "s2", "done", status=fleet_records.DONE, verdict=passed(3.0))
        # not a passed gate: a failed one, a host still in its soak, another recipe's
        led.host_phase("ro-new", "s3", "failed", status=fleet_records.HOST_FAILED,
                       verdict={"outcome": "fail", "timings": {"ready": 99.0}})
        led.host_phase("ro-old", "s2", "soak", status=fleet_records.IN_PROGRESS)
        led.host_phase("ro-other", "s1", "done", status=fleet_records.DONE, verdict=passed(50.0))
        got = [v["timings"]["ready"] for v in led.passed_steps("qwen")]
        assert got == [3.0, 2.0, 1.0]  # newest first
        assert [v["timings"]["ready"] for v in led.passed_steps("qwen", limit=2)] == [3.0, 2.0]
        assert [v["timings"]["ready"] for v in led.passed_steps("qwen", rollouts=1)] == [3.0, 2.0]
        assert led.passed_steps("nope") == []


def test_history_is_newest_first_and_filtered(backend: Backend) -> None:
    with backend.open() as led:
        for rid in ("ro-a", "ro-b", "rb-c"):
            make(led, rid)
        led.set_status("ro-a", fleet_records.COMPLETED)
        # Same started_at to the microsecond is possible on a fast machine: insertion order decides.
        assert led.ids() == ["rb-c", "ro-b", "ro-a"]
        assert led.ids(statuses=fleet_records.ACTIVE) == ["rb-c", "ro-b"]
        assert led.ids(statuses=[fleet_records.COMPLETED], limit=5) == ["ro-a"]
        latest = led.latest(statuses=fleet_records.ACTIVE)
        assert latest is not None and latest.id == "rb-c"
        assert [h.host for h in led.get("ro-b").hosts] == ["s1", "s2", "s3"]


def test_newer_schema_is_refused(backend: Backend) -> None:
    backend.open().close()
    backend.set_version(fleet_schema.SCHEMA_VERSION + 1)
    with pytest.raises(FleetError) as e:
        backend.open()
    assert (
        "newer than this fleetctl" in e.value.message()
        and e.value.exit_code == ExitCode.INCONCLUSIVE
    )


def test_foreign_database_is_refused(backend: Backend) -> None:
    backend.sql("CREATE TABLE t (x INTEGER)")
    with pytest.raises(FleetError, match="not a fleetctl ledger"):
        backend.open()


HOLDER = textwrap.dedent("""
    import socket, sys, time
    from pathlib import Path
    if len(sys.argv) > 4:  # another controller machine
        socket.gethostname = lambda: sys.argv[4]
    from fleetctl.state.ledger import open_ledger
    led = open_ledger(Path(sys.argv[1]), sys.argv[2], sys.argv[3] or None)
    led.acquire("ro-first")
    print("locked", flush=True)
    time.sleep(120)
""")


def _hold(backend: Backend, *hostname: str) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *backend.argv(), *hostname],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "locked"
    return p


def _wait_free(led: fleet_ledger.Ledger) -> fleet_records.LockHolder | None:
    """The holder once the database has noticed its death (a server ends a session on the socket's
    EOF,
    a moment after the process died); bounded, not timed: it must happen."""
    deadline = time.monotonic() + 60
    h = led.holder()
    while h is not None and h.alive and time.monotonic() < deadline:
        time.sleep(0.05)
        h = led.holder()
    return h


def test_lock_refuses_live_holder_and_takes_over_after_kill_9(backend: Backend) -> None:
    p = _hold(backend)
    try:
        with backend.open() as led:
            with pytest.raises(LockedError) as e:
                led.acquire("ro-second")
            assert "ro-first" in e.value.message() and e.value.exit_code == ExitCode.LOCKED
            h = led.holder()
            assert h is not None and h.pid == p.pid and h.alive
            p.send_signal(signal.SIGKILL)
            p.wait(10)
            h = _wait_free(led)
            assert h is not None and h.rollout_id == "ro-first" and not h.alive
            stale = led.acquire("ro-second")
            assert stale is not None and stale.rollout_id == "ro-first" and not stale.alive
            assert led.acquire("ro-second") is None  # re-entrant for the same process
            h = led.holder()
            assert h is not None and h.rollout_id == "ro-second" and h.alive
            led.release("ro-other")
            assert led.holder() is not None  # only the holder's id releases
            led.release("ro-second")
            assert led.holder() is None
            with backend.open() as other:  # and the lock is free for the next controller
                assert other.acquire("ro-third") is None
                other.release("ro-third")
    finally:
        p.kill()
        p.wait(10)


def test_lock_held_from_another_machine(backend: Backend) -> None:
    """Two controllers on different machines: the second is refused naming the first; after the
    first is killed, PostgreSQL knows its lock died with its session; SQLite cannot tell, and keeps
    refusing."""
    p = _hold(backend, "controller-b")
    try:
        with backend.open() as led:
            with pytest.raises(LockedError) as e:
                led.acquire("ro-second")
            msg = e.value.message()
            assert (
                "rollout ro-first is in progress" in msg
                and "controller-b" in msg
                and f"pid {p.pid}" in msg
            )
            p.send_signal(signal.SIGKILL)
            p.wait(10)
            if backend.kind == "sqlite":
                h = led.holder()
                assert (
                    h is not None and h.alive
                )  # presumed alive: another machine's pid is unknowable here
                with pytest.raises(LockedError, match="abort --force"):
                    led.acquire("ro-second")
                return
            h = _wait_free(led)
            assert h is not None and h.hostname == "controller-b" and not h.alive
            stale = led.acquire("ro-second")
            assert stale is not None and stale.hostname == "controller-b"
            led.release("ro-second")
    finally:
        p.kill()
        p.wait(10)


def test_hosts_out_of_rotation_are_kept_until_put_back(backend: Backend) -> None:
    with backend.open() as led:
        led.mark_out("s1", "ro-1", "rollout", {})
        led.mark_out("s1", "ro-1", "rollout", {"deployments": [{"id": "d1"}]})
        led.mark_out("s1", "ro-2", "rollback", {})  # a re-drain keeps what the first one took away
        led.mark_out("s2", "ro-2", "rollback", {})
    with backend.open() as led:
        out = led.out_of_rotation()
        assert sorted(out) == ["s1", "s2"]
        assert (out["s1"].rollout_id, out["s1"].reason, out["s1"].memo) == (
            "ro-2",
            "rollback",
            {"deployments": [{"id": "d1"}]},
        )
        led.mark_in("s1")
        assert list(led.out_of_rotation()) == ["s2"]


def test_a_version_1_ledger_is_migrated_and_keeps_its_records(backend: Backend) -> None:
    backend.make_v1()
    with backend.open() as led:
        make(led)
    with backend.open() as led:
        assert led.get("ro-1").hosts[0].before_digest == "sha256:old"
        assert led.known_good("s1") == []
        led.add_known_good(
            "s1",
            tag="old",
            digest="sha256:old",
            fingerprint=None,
            settings={"env": ["HF_TOKEN"]},
            source="found",
            rollout_id=None,
            only_if_none=True,
        )
        led.add_known_good(
            "s1",
            tag="x",
            digest="sha256:x",
            fingerprint=None,
            settings=None,
            source="found",
            rollout_id=None,
            only_if_none=True,
        )
        led.add_known_good(
            "s1",
            tag="new",
            digest=D,
            fingerprint="f1",
            settings=None,
            source="gate",
            rollout_id="ro-1",
        )
        assert [(k.tag, k.source) for k in led.known_good("s1")] == [
            ("new", "gate"),
            ("old", "found"),
        ]
        # Recorded again: the upsert keeps a gate source and the settings, and makes it the newest.
        led.add_known_good(
            "s1",
            tag="old2",
            digest="sha256:old",
            fingerprint=None,
            settings=None,
            source="served",
            rollout_id="ro-1",
        )
        led.add_known_good(
            "s1",
            tag="new",
            digest=D,
            fingerprint="f1",
            settings=None,
            source="served",
            rollout_id=None,
        )
        kg = led.known_good("s1")
        assert [(k.tag, k.source, k.rollout_id) for k in kg] == [
            ("new", "gate", "ro-1"),
            ("old2", "served", "ro-1"),
        ]
        assert kg[1].settings == {"env": ["HF_TOKEN"]}
    assert backend.version() == fleet_schema.SCHEMA_VERSION == 5


# -- PostgreSQL only: what a shared database adds
# ---------------------------------------------------------


@pytest.fixture
def pg(pg_server: PgServer, tmp_path: Path) -> Backend:
    return Backend("postgresql", tmp_path, f"test-{uuid.uuid4().hex[:8]}", pg_server)


def test_two_fleets_share_one_database_not_their_history_or_lock(
    pg: Backend, pg_server: PgServer
) -> None:
    other = Backend("postgresql", pg.state_dir, pg.fleet + "-b", pg_server)
    with pg.open() as a, other.open() as b, pg.open() as a2:
        make(a, "ro-a")
        make(b, "ro-b")
        assert a.ids() == ["ro-a"] and b.ids() == ["ro-b"]
        assert a.acquire("ro-a") is None and b.acquire("ro-b") is None  # one lock per fleet
        with pytest.raises(LockedError, match="ro-a"):
            a2.acquire("ro-a2")  # same fleet, another controller
        a.release("ro-a")
        b.release("ro-b")
        assert a2.acquire("ro-a2") is None
        a2.release("ro-a2")


def test_a_controller_that_lost_its_session_writes_nothing_more(
    pg: Backend, pg_server: PgServer
) -> None:
    with pg.open() as led:
        make(led)
        led.acquire("ro-1")
        h = led.holder()
        assert h is not None and h.alive
        with (
            pg_server.admin() as conn
        ):  # the server ends the lock's session (a restart, a network cut)
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype='advisory' AND pid "
                "IN"
                " (SELECT pid FROM pg_stat_activity WHERE application_name='fleetctl')"
            )
        h = _wait_free(led)
        assert h is not None and not h.alive
        with pytest.raises(FleetError, match="lost the fleet's lock"):
            led.host_phase("ro-1", "s1", "starting", status=fleet_records.IN_PROGRESS)
        assert led.get("ro-1").host("s1").phase == "planned"  # type: ignore[union-attr]
        led.release("ro-1")  # its own record can still be cleared
        assert led.holder() is None


def _dump(server: PgServer, fleet: str) -> str:
    """Every row of a fleet's schema, as text."""
    schema = backends.schema_name(fleet)
    out = []
    with server.admin() as conn:
        tables = [
            r[0]
            for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname=%s", (schema,))
        ]
        for t in tables:
            out += [
                json.dumps(r, default=str) for r in conn.execute(f'SELECT * FROM "{schema}"."{t}"')
            ]
    return "\n".join(out)


def test_password_is_never_shown_and_bad_logins_are_clear(pg: Backend, pg_server: PgServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    url = pg_server.url(PW_USER, PW_PASSWORD)
    with (
        fleet_ledger.open_ledger(pg.state_dir, pg.fleet, url) as led,
        fleet_ledger.open_ledger(pg.state_dir, pg.fleet, url) as led2,
    ):
        assert PW_PASSWORD not in led.where and PW_USER in led.where
        make(led)
        led.acquire("ro-1")
        with pytest.raises(LockedError) as e:
            led2.acquire("ro-2")
        assert PW_PASSWORD not in e.value.message()
        with pytest.raises(FleetError) as e2:
            led.get("nope")
        assert PW_PASSWORD not in e2.value.message() and PW_USER in e2.value.message()
        led.release("ro-1")
    assert PW_PASSWORD not in _dump(pg_server, pg.fleet) and "ro-1" in _dump(pg_server, pg.fleet)

    # The documented way: no password in the URL, libpq's $PGPASSWORD (or ~/.pgpass) supplies it.
    monkeypatch.setenv("PGPASSWORD", PW_PASSWORD)
    with fleet_ledger.open_ledger(pg.state_dir, pg.fleet, pg_server.url(PW_USER)) as led:
        assert led.ids() == ["ro-1"]
    monkeypatch.setenv("PGPASSWORD", "wrong-" + PW_PASSWORD)
    with pytest.raises(FleetError) as e3:
        fleet_ledger.open_ledger(pg.state_dir, pg.fleet, pg_server.url(PW_USER))
    msg = e3.value.message()
    assert (
        "refused the login" in msg and "password authentication failed" in msg and ".pgpass" in msg
    )
    assert PW_PASSWORD not in msg
    monkeypatch.delenv("PGPASSWORD")
    with pytest.raises(FleetError) as e4:
        fleet_ledger.open_ledger(
            pg.state_dir, pg.fleet, pg_server.url(PW_USER, "wrong-" + PW_PASSWORD)
        )
    assert "refused the login" in e4.value.message() and PW_PASSWORD not in e4.value.message()
    # A malformed URL: libpq's parse error would quote it, password and all.
    with pytest.raises(FleetError, match="not a valid PostgreSQL connection string") as e5:
        fleet_ledger.open_ledger(
            pg.state_dir, pg.fleet, f"host=/tmp password={PW_PASSWORD} port=notaport ="
        )
    assert PW_PASSWORD not in e5.value.message()


def test_an_unreachable_server_is_one_clear_error(pg_server: PgServer, tmp_path: Path) -> None:
    with pytest.raises(FleetError) as e:
        fleet_ledger.open_ledger(tmp_path, "f", f"postgresql://postgres@/postgres?host={tmp_path}")
    msg = e.value.message()
    assert "cannot reach the ledger database" in msg and "fleetctl_ledger_url" in msg, msg


def test_missing_driver_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if fleetctl[postgres] were not installed
    monkeypatch.setitem(sys.modules, "psycopg.conninfo", None)
    with pytest.raises(FleetError) as e:
        fleet_ledger.open_ledger(tmp_path, "f", "postgresql://u:pw-123@db.example/fleetctl")
    assert (
        "psycopg is not installed" in e.value.message()
        and "fleetctl[postgres]" in e.value.message()
    )
    assert "pw-123" not in e.value.message()


def _inventory(tmp_path: Path, **all_vars: str) -> inventory.Inventory:
    lines = "".join(f"    {k}: {v!r}\n" for k, v in all_vars.items())
    (tmp_path / "hosts.yml").write_text(
        f"all:\n  hosts:\n    s1:\n      ansible_host: 10.0.0.1\n  vars:\n{lines}"
        if lines
        else "all:\n  hosts:\n    s1:\n      ansible_host: 10.0.0.1\n"
    )
    return inventory.load(tmp_path / "hosts.yml")


def test_the_inventory_or_the_environment_chooses_the_backend(
    pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEETCTL_LEDGER_URL", raising=False)
    with fleet_ledger.open_for(_inventory(tmp_path), tmp_path) as led:
        assert led.where == str(tmp_path / fleet_ledger.LEDGER_NAME)
    fleet = f"inv-{uuid.uuid4().hex[:8]}"
    inv = _inventory(tmp_path, fleetctl_ledger_url=pg_server.url(), fleetctl_fleet=fleet)
    with fleet_ledger.open_for(inv, tmp_path) as led:
        assert "host=" in led.where and led.fleet == fleet
        make(led)
    monkeypatch.setenv("FLEETCTL_LEDGER_URL", pg_server.url())
    with fleet_ledger.open_for(_inventory(tmp_path, fleetctl_fleet=fleet), tmp_path) as led:
        assert led.ids() == ["ro-1"]
    with pytest.raises(FleetError, match="no fleetctl_fleet"):
        fleet_ledger.open_for(_inventory(tmp_path), tmp_path)


def test_the_ledger_command_shows_backend_and_holder_without_the_password(
        pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETCTL_LEDGER_URL", raising=False)
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path))
    fleet = f"cli-{uuid.uuid4().hex[:8]}"
    url = pg_server.url(PW_USER, PW_PASSWORD)
    inv = _inventory(tmp_path, fleetctl_ledger_url=url, fleetctl_fleet=fleet)
    runner = CliRunner()
    with fleet_ledger.open_for(inv, tmp_path) as led:
        make(led)
        led.acquire("ro-1")
        for args in (["ledger", "--json"], ["ledger"], ["history", "--json"]):
            r = runner.invoke(cli, ["-i", str(inv.path), *args])
            assert r.exit_code == 0, r.output
            assert PW_PASSWORD not in r.output, args
        data = json.loads(runner.invoke(cli, ["-i", str(inv.path), "ledger", "--json"]).output)
        assert data["backend"] == "postgresql" and data["fleet"] == fleet and data["rollouts"] == 1
        assert data["lock"]["rollout_id"] == "ro-1" and data["lock"]["alive"] is True
        assert PW_USER in data["where"] and data["schema_version"] == fleet_schema.SCHEMA_VERSION
    r = runner.invoke(
        cli, ["-i", str(inv.path), "ledger"]
    )  # closed: its session, and so its lock, is gone
    assert "lock: left by a dead controller" in r.output and "ro-1" in r.output, r.output
    monkeypatch.setenv("PGPASSWORD", "wrong")
    r = runner.invoke(cli, ["-i", str(inv.path), "ledger", "--json"])
    monkeypatch.delenv("PGPASSWORD")
    assert r.exit_code == 0  # the URL's password wins over $PGPASSWORD
    plain = _inventory(tmp_path)
    data = json.loads(runner.invoke(cli, ["-i", str(plain.path), "ledger", "--json"]).output)
    assert (
        data["backend"] == "sqlite"
        and data["lock"] is None
        and data["where"].endswith(fleet_ledger.LEDGER_NAME)
    )


def test_controllers_starting_at_once_create_one_schema_and_one_holder(pg: Backend) -> None:
    """Eight controllers open a new fleet's ledger and race for its lock at the same moment."""
    n = 8
    start = threading.Barrier(n, timeout=60)  # a controller that failed breaks it for all: no hang

    def controller(i: int) -> tuple[fleet_ledger.Ledger, bool]:
        start.wait()
        led = pg.open()  # creating and migrating the schema: one of them does it
        start.wait()
        try:
            led.acquire(f"ro-{i}")
            return led, True
        except LockedError:
            return led, False

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(controller, range(n)))
    try:
        assert sum(won for _, won in results) == 1
        winner = next(led for led, won in results if won)
        h = winner.holder()
        assert h is not None and h.alive and pg.version() == fleet_schema.SCHEMA_VERSION
        make(winner)
        assert [led.ids() for led, _ in results] == [["ro-1"]] * n
    finally:
        for led, _ in results:
            led.close()


def test_a_role_given_only_its_fleets_schema_works_and_one_given_nothing_is_told_what_to_ask(
        pg: Backend, pg_server: PgServer) -> None:
    # No CREATE on the database (PUBLIC has none since PostgreSQL 15).
    role = f"r_{uuid.uuid4().hex[:8]}"
    schema = backends.schema_name(pg.fleet)
    with pg_server.admin() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    with pytest.raises(FleetError) as e:
        fleet_ledger.open_ledger(pg.state_dir, pg.fleet, pg_server.url(role))
    assert "denies this role" in e.value.message() and schema in e.value.message()
    with pg_server.admin() as conn:  # what the message tells the admin to do
        conn.execute(f'CREATE SCHEMA "{schema}" AUTHORIZATION {role}')
    with fleet_ledger.open_ledger(pg.state_dir, pg.fleet, pg_server.url(role)) as led:
        make(led)
        assert led.acquire("ro-1") is None and led.ids() == ["ro-1"]
        led.release("ro-1")
