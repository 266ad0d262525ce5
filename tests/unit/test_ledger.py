"""The ledger: schema versioning, the fleet lock (live, stale after kill -9), records and history."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleetctl.errors import ExitCode, FleetError, LockedError
from fleetctl.rollout import ledger as L

D = "sha256:" + "c" * 64


def make(led: L.Ledger, rid: str = "ro-1") -> None:
    led.create(rid, kind="rollout", recipe="qwen", requested="v0.24.0", tag="2026-07-01-v0.24.0", digest=D,
               image="ghcr.io/a/b", options={"waves": "1,100%"}, command="fleetctl rollout --tag v0.24.0",
               waves=[["s1"], ["s2", "s3"]],
               hosts=[{"host": h, "wave": w, "step": 0, "before_tag": "old", "before_digest": "sha256:old",
                       "before": {"image": "x", "env": ["HF_TOKEN"]}, "target_tag": "2026-07-01-v0.24.0",
                       "target_digest": D}
                      for h, w in (("s1", 0), ("s2", 1), ("s3", 1))])


def test_records_phases_and_history(tmp_path: Path) -> None:
    with L.open_ledger(tmp_path) as led:
        make(led)
        led.set_wave("ro-1", 0, L.RUNNING)
        led.host_phase("ro-1", "s1", "starting", status=L.IN_PROGRESS)
        led.host_phase("ro-1", "s1", "soak", detail="30s")
        led.host_phase("ro-1", "s1", "done", status=L.DONE, after_tag="2026-07-01-v0.24.0", after_digest=D,
                       verdict={"outcome": "pass"}, artifacts="/x/runs/1")
        led.set_wave("ro-1", 0, L.DONE)
        led.set_status("ro-1", L.COMPLETED)
        r = led.get("ro-1")
    assert r.status == L.COMPLETED and r.finished_at is not None and r.started_by.count("@") == 1
    s1 = r.host("s1")
    assert s1 is not None and s1.status == L.DONE and s1.verdict == {"outcome": "pass"}
    assert s1.before == {"image": "x", "env": ["HF_TOKEN"]} and s1.finished_at is not None
    assert [p.phase for p in r.phases if p.host == "s1"] == ["starting", "soak", "done"]
    assert r.waves[0].status == L.DONE and r.waves[1].hosts == ("s2", "s3")
    with L.open_ledger(tmp_path) as led:  # reopening reads the same (committed) data
        assert [x.id for x in led.history()] == ["ro-1"]
        assert led.latest(statuses=L.ACTIVE) is None
        with pytest.raises(FleetError, match="no rollout 'nope'"):
            led.get("nope")
        with pytest.raises(ValueError):
            led.host_phase("ro-1", "s9", "x")


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    L.open_ledger(tmp_path).close()
    db = sqlite3.connect(tmp_path / L.LEDGER_NAME)
    db.execute(f"PRAGMA user_version={L.SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(FleetError) as e:
        L.open_ledger(tmp_path)
    assert "newer than this fleetctl" in e.value.message() and e.value.exit_code == ExitCode.INCONCLUSIVE


def test_foreign_database_is_refused(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / L.LEDGER_NAME)
    db.execute("CREATE TABLE t (x)")
    db.close()
    with pytest.raises(FleetError, match="not a fleetctl ledger"):
        L.open_ledger(tmp_path)


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from fleetctl.rollout.ledger import open_ledger
    led = open_ledger(Path(sys.argv[1]))
    led.acquire("ro-first")
    print("locked", flush=True)
    time.sleep(60)
""")


def test_lock_refuses_live_holder_and_takes_over_after_kill_9(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "locked"
        with L.open_ledger(tmp_path) as led:
            with pytest.raises(LockedError) as e:
                led.acquire("ro-second")
            assert "ro-first" in e.value.message() and e.value.exit_code == ExitCode.LOCKED
            h = led.holder()
            assert h is not None and h.pid == p.pid and h.alive
            p.send_signal(signal.SIGKILL)
            p.wait(10)
            stale = led.acquire("ro-second")
            assert stale is not None and stale.rollout_id == "ro-first" and not stale.alive
            assert led.acquire("ro-second") is None  # re-entrant for the same process
            led.release("ro-other")
            assert led.holder() is not None  # only the holder's id releases
            led.release("ro-second")
            assert led.holder() is None
    finally:
        p.kill()
        p.wait(10)


def test_a_version_1_ledger_is_migrated_and_keeps_its_records(tmp_path: Path) -> None:
    db = sqlite3.connect(str(tmp_path / L.LEDGER_NAME))
    for stmt in L._MIGRATIONS[0].split(";"):
        if stmt.strip():
            db.execute(stmt)
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    with L.open_ledger(tmp_path) as led:
        make(led)
    with L.open_ledger(tmp_path) as led:
        assert led.get("ro-1").hosts[0].before_digest == "sha256:old"
        assert led.known_good("s1") == []
        led.add_known_good("s1", tag="old", digest="sha256:old", fingerprint=None, settings={"env": ["HF_TOKEN"]},
                           source="found", rollout_id=None, only_if_none=True)
        led.add_known_good("s1", tag="x", digest="sha256:x", fingerprint=None, settings=None, source="found",
                           rollout_id=None, only_if_none=True)
        led.add_known_good("s1", tag="new", digest=D, fingerprint="f1", settings=None, source="gate",
                           rollout_id="ro-1")
        assert [(k.tag, k.source) for k in led.known_good("s1")] == [("new", "gate"), ("old", "found")]
    version = sqlite3.connect(str(tmp_path / L.LEDGER_NAME)).execute("PRAGMA user_version").fetchone()[0]
    assert version == L.SCHEMA_VERSION == 2
