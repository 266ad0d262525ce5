"""Soak baselines live with the ledger, on both backends: a rolling window per host and tag, pin and
reset, the old per-controller files imported once, and two controllers sharing a ledger judging a
host against one window.

Every test that takes ``backend`` runs on SQLite and on a real PostgreSQL server
(``tests/plugins/postgres.py``), each test with a fleet (a schema) of its own.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from fleetctl import inventory, paths
from fleetctl.cli.main import cli
from fleetctl.errors import FleetError
from fleetctl.soak import baselines
from fleetctl.soak.verdict import LevelSummary, Outcome, Verdict, to_dict
from fleetctl.state import ledger as fleet_ledger
from tests.plugins.postgres import PgServer


@dataclasses.dataclass(frozen=True)
class Where:
    """One test's ledger: a state dir (SQLite), or a fleet in the shared PostgreSQL server."""

    kind: str
    state_dir: Path
    fleet: str
    server: PgServer | None

    def open(self, state_dir: Path | None = None) -> fleet_ledger.Ledger:
        """A controller's ledger; ``state_dir`` is that controller's own (PostgreSQL: they share
        the fleet)."""
        url = self.server.url() if self.server else None
        return fleet_ledger.open_ledger(state_dir or self.state_dir, self.fleet, url)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    server: PgServer | None = (
        request.getfixturevalue("pg_server") if request.param == "postgresql" else None
    )
    return Where(request.param, tmp_path / "state", f"bl-{uuid.uuid4().hex[:8]}", server)


@pytest.fixture
def store(backend: Where) -> Iterator[fleet_ledger.Ledger]:
    with backend.open() as led:
        yield led


def sweep(run: str, tok_s: float, fingerprint: str = "fp1", host: str = "h1", finished: str = "t1",
          tag: str = "v1") -> Verdict:
    return Verdict(
        run,
        host,
        f"http://{host}:8000",
        Outcome.PASS,
        "pass",
        "t0",
        finished,
        1.0,
        tag=tag,
        fingerprint=fingerprint,
        levels=(LevelSummary("sweep", "c=4", 4, 40, 0, 10.0, tok_s=tok_s),),
    )


def test_a_baseline_is_the_median_of_a_rolling_window_of_passing_runs(
    store: fleet_ledger.Ledger,
) -> None:
    for i, tok in enumerate(
        (100.0, 104.0, 96.0, 300.0, 102.0, 98.0)
    ):  # one lucky-high run among them
        baselines.save(store, "h1", "v1", sweep(f"r{i}", tok))
    w = baselines.read(store, "h1", "v1")
    assert [r.run_id for r in w.runs] == ["r1", "r2", "r3", "r4", "r5"]  # the oldest dropped out
    b = w.baseline
    assert b is not None and b.baseline_runs == 5
    lv = b.level("sweep", "c=4")
    assert lv is not None and lv.tok_s == 102.0  # the median: the lucky 300 moves nothing
    assert 0 < b.baseline_spread["c=4"] < 10
    # A failed run is never kept; a run made by another config starts a new window.
    failed = dataclasses.replace(sweep("bad", 10.0), outcome=Outcome.FAIL)
    assert baselines.save(store, "h1", "v1", failed) is None
    baselines.save(store, "h1", "v1", sweep("other", 50.0, fingerprint="fp2"))
    assert [r.run_id for r in baselines.read(store, "h1", "v1").runs] == ["other"]
    # The verdict comes back whole (levels, fingerprint), and other hosts and tags are apart.
    assert baselines.read(store, "h1", "v1").runs[0] == sweep("other", 50.0, fingerprint="fp2")
    assert (
        baselines.read(store, "h2", "v1").runs == () and baselines.load(store, "h1", "v2") is None
    )


def test_a_pinned_baseline_does_not_move_and_a_reset_one_is_gone(
    store: fleet_ledger.Ledger,
) -> None:
    baselines.save(store, "h1", "v1", sweep("r0", 100.0))
    assert baselines.pin(store, "h1", "v1").pinned
    assert baselines.save(store, "h1", "v1", sweep("r1", 80.0)) is None
    assert [r.run_id for r in baselines.read(store, "h1", "v1").runs] == ["r0"]
    assert not baselines.pin(store, "h1", "v1", pinned=False).pinned
    assert baselines.save(store, "h1", "v1", sweep("r2", 90.0)) is not None
    assert baselines.reset(store, "h1", "v1") and baselines.load(store, "h1", "v1") is None
    assert not baselines.reset(store, "h1", "v1")
    with pytest.raises(FleetError, match="no baseline recorded") as e:
        baselines.pin(store, "h1", "v1")
    assert e.value.host == "h1" and "fleetctl soak" in (e.value.fix or "")


def test_two_controllers_sharing_a_ledger_judge_against_one_window(
    backend: Where, tmp_path: Path
) -> None:
    """Two controllers, each with its own state dir (PostgreSQL) or the same checkout (SQLite),
    adding
    runs at once: every run is in the one window both read."""
    a_dir = backend.state_dir
    b_dir = tmp_path / "other-controller" if backend.server else backend.state_dir
    with backend.open(a_dir) as a, backend.open(b_dir) as b:
        start = threading.Barrier(2)

        def add(led: fleet_ledger.Ledger, who: str) -> None:
            start.wait()
            for i in range(2):
                baselines.save(led, "h1", "v1", sweep(f"{who}{i}", 100.0 + i))

        threads = [
            threading.Thread(target=add, args=(led, who)) for led, who in ((a, "a"), (b, "b"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seen_a, seen_b = baselines.read(a, "h1", "v1"), baselines.read(b, "h1", "v1")
        assert sorted(r.run_id for r in seen_a.runs) == ["a0", "a1", "b0", "b1"]
        assert seen_a == seen_b and seen_a.baseline == seen_b.baseline
        # A pin by one is the other's pin too.
        baselines.pin(b, "h1", "v1")
        assert baselines.save(a, "h1", "v1", sweep("a2", 50.0)) is None
    if backend.server:
        assert not (b_dir / "ledger.sqlite3").exists()  # nothing was kept locally


def _old_file(state_dir: Path, host: str, tag: str, runs: list[Verdict], pinned: bool = False,
              bare: bool = False) -> Path:
    """A baseline file as fleetctl kept them before the ledger did (a window, or a single
    verdict)."""
    p = baselines.path(state_dir, host, tag)
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = to_dict(runs[0]) if bare else {"format": baselines.FORMAT, "pinned": pinned,
                                          "runs": [to_dict(v) for v in runs]}
    p.write_text(json.dumps(doc))
    return p


def test_old_baseline_files_are_imported_once(backend: Where, tmp_path: Path) -> None:
    old = backend.state_dir
    _old_file(
        old,
        "h1",
        "v1",
        [sweep("f0", 100.0, finished="2026-07-01"), sweep("f1", 101.0, finished="2026-07-03")],
    )
    _old_file(old, "h2", "v1", [sweep("g0", 90.0, host="h2")], pinned=True)
    _old_file(
        old,
        "h3",
        "2026-07-01-v0.24.0",
        [sweep("x0", 80.0, host="h3", tag="2026-07-01-v0.24.0")],
        bare=True,
    )
    (old / "baselines" / "h3" / "junk.json").write_text("{not json")
    with backend.open() as led:
        # What another controller already recorded in a shared ledger is kept, merged in time order.
        baselines.save(led, "h1", "v1", sweep("ledger", 99.0, finished="2026-07-02"))
        assert baselines.import_files(old, led) == 3
        assert [r.run_id for r in baselines.read(led, "h1", "v1").runs] == ["f0", "ledger", "f1"]
        assert baselines.read(led, "h2", "v1").pinned
        assert [w.tag for w in baselines.windows(led, "h3")] == ["2026-07-01-v0.24.0"]
        # Once: the directory is renamed and never read again; a second import finds nothing.
        assert (
            not (old / "baselines").exists()
            and (old / "baselines.imported" / "h1" / "v1.json").exists()
        )
        assert baselines.import_files(old, led) == 0
        assert [r.run_id for r in baselines.read(led, "h1", "v1").runs] == ["f0", "ledger", "f1"]
    # The engine's and the CLI's way in imports too (open_for): a file appearing later (an old
    # fleetctl still run on this checkout) is merged the same way, a run never twice.
    _old_file(
        old,
        "h1",
        "v1",
        [sweep("f1", 101.0, finished="2026-07-03"), sweep("f2", 102.0, finished="2026-07-04")],
    )
    inv = _inventory(tmp_path, backend)
    with baselines.open_for(inventory.load(inv), old) as led:
        assert [r.run_id for r in baselines.read(led, "h1", "v1").runs] == [
            "f0",
            "ledger",
            "f1",
            "f2",
        ]
    assert (old / "baselines.imported").exists() and not (old / "baselines").exists()


def _inventory(tmp_path: Path, backend: Where) -> Path:
    """The example inventory, on this test's ledger (PostgreSQL: fleetctl_ledger_url +
    fleetctl_fleet)."""
    inv = tmp_path / "inv"
    inv.mkdir(exist_ok=True)
    src = paths.project_root() / "inventory" / "example"
    (inv / "hosts.yml").write_text((src / "hosts.yml").read_text())
    gv = inv / "group_vars" / "all"
    gv.mkdir(parents=True, exist_ok=True)
    for f in (src / "group_vars" / "all").iterdir():
        (gv / f.name).write_text(f.read_text())
    if backend.server:
        (gv / "ledger.yml").write_text(yaml.safe_dump({"fleetctl_ledger_url": backend.server.url(),
                                                       "fleetctl_fleet": backend.fleet}))
    return inv / "hosts.yml"


def test_soak_baseline_commands_work_on_either_backend(backend: Where, tmp_path: Path) -> None:
    """``fleetctl soak baseline show|pin|reset`` read and change the ledger's windows: on
    PostgreSQL, what
    one controller recorded is shown and pinned from another checkout with an empty state dir."""
    tag = "2026-07-01-v0.24.0"
    with backend.open() as led:
        for i, tok in enumerate((400.0, 410.0, 395.0)):
            baselines.save(led, "spark-01", tag, sweep(f"run-{i}", tok, host="spark-01", tag=tag,
                                                       finished=f"2026-07-0{i + 1}T12:00:00"))
    inv = _inventory(tmp_path, backend)
    state = backend.state_dir if backend.server is None else tmp_path / "elsewhere"

    def run(*argv: str) -> tuple[int, str]:
        r = CliRunner().invoke(cli, ["-i", str(inv), "soak", "baseline", *argv],
                               env={"FLEETCTL_STATE_DIR": str(state), "COLUMNS": "80"})
        if isinstance(r.exception, FleetError):
            return 2, r.exception.message()
        return r.exit_code, r.output

    code, out = run("show", "--json")
    assert code == 0, out
    shown = json.loads(out)
    assert [(w["host"], w["tag"], w["runs"], w["pinned"]) for w in shown] == [
        ("spark-01", tag, ["run-0", "run-1", "run-2"], False)]
    assert shown[0]["levels"]["c=4"]["tok_s"] == 400.0
    code, out = run("pin", "--limit", "spark-01", "--tag", tag, "--json")
    assert code == 0 and json.loads(out)[0]["pinned"] is True, out
    with backend.open() as led:
        assert baselines.read(
            led, "spark-01", tag
        ).pinned  # the ledger holds it, for every controller
    code, out = run("pin", "--limit", "spark-02", "--tag", tag)
    assert code == 2 and "spark-02: no baseline recorded" in out
    code, out = run("reset", "--limit", "spark-01", "--tag", tag)
    assert code == 0 and "removed" in out
    with backend.open() as led:
        assert baselines.load(led, "spark-01", tag) is None
