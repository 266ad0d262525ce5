"""Baselines: a rolling window of the last passing verdicts per host and image tag.

A soak compares its throughput with the baseline of the tag that served
before on the same host (the rollout) or of the same tag (a scheduled soak):
the host's own history, not a fleet-wide figure, because Sparks differ.

The windows live with the fleet's ledger (``state.ledger``: the local SQLite file, or
the PostgreSQL database a team shares), so that every controller sharing a ledger
judges a host against the same window. Each window keeps the last :data:`WINDOW`
passing runs made by one soak config (a run with another config fingerprint starts
a new window: the old runs are not comparable). The baseline compared with is their
combination: each sweep level's median tok/s and its spread, so that one lucky-high
run does not fail every later one, and a slow drift (each night a little worse) is
measured against the median of several nights rather than last night alone. An
operator can pin a window (later passes no longer move it) or reset it (``fleetctl
soak baseline``).

Before the ledger held them, each controller kept its windows in files under
``state_dir/baselines/``: :func:`import_files` moves them into the ledger once
(merged with what other controllers recorded) and renames the directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fleetctl.errors import FleetError
from fleetctl.inventory import Inventory
from fleetctl.soak.verdict import SCHEMA_VERSION, Outcome, Verdict, from_dict, to_dict
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state.ledger import Ledger
from fleetctl.state.records import BaselineRow

#: Passing runs a window keeps.
WINDOW = 5
#: The old files' format: {"format", "pinned", "runs": [verdict, ...]} (a bare verdict is older
#: still).
FORMAT = "baseline-window-1"
#: Where the old files were, and where they go once imported.
LEGACY_DIR, IMPORTED_DIR = "baselines", "baselines.imported"
#: MAD -> standard deviation of a normal distribution.
_MAD_TO_SD = 1.4826


class Store(Protocol):
    """Where windows are kept: :class:`fleetctl.state.ledger.Ledger` (either backend)."""

    where: str

    def baseline(self, host: str, tag: str) -> BaselineRow | None: ...

    def baselines(self, host: str | None = None) -> list[BaselineRow]: ...

    def update_baseline(
        self, host: str, tag: str, change: Callable[[BaselineRow | None], BaselineRow | None]
    ) -> BaselineRow | None: ...

    def delete_baseline(self, host: str, tag: str) -> bool: ...


@dataclass(frozen=True)
class Window:
    """The stored runs of one host and tag (oldest first), and whether the operator pinned them."""

    host: str
    tag: str
    runs: tuple[Verdict, ...]
    pinned: bool = False

    @property
    def baseline(self) -> Verdict | None:
        """The combined baseline (None without runs)."""
        return combine(self.runs)


def unit_key(unit: str) -> str:
    """The baselines' key of a serving unit (``unit:pair-a``): its throughput is the unit's, not
    its head's alone, and stays the unit's when its head changes; it never mixes with a member's
    single-host
    window."""
    return f"unit:{unit}"


def host_key(host: str, recipe: str | None, fleet_recipe: object) -> str:
    """The baselines' key of a single host serving ``recipe``: its name for the fleet's recipe
    (``fleet_recipe``, the inventory's ``fleetctl_recipe``; a fleet of one recipe keeps the keys it
    always had), ``host/recipe`` for another: one model's figures are never another's baseline."""
    if not recipe or not fleet_recipe or recipe == str(fleet_recipe):
        return host
    return f"{host}/{recipe}"


def _safe(part: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in part) or "_"


def path(state_dir: Path, host: str, tag: str) -> Path:
    """Where the old (pre-ledger) baseline file of ``host`` serving ``tag`` was."""
    return Path(state_dir) / LEGACY_DIR / _safe(host) / f"{_safe(tag or 'untagged')}.json"


def _verdict(data: Any, where: str, host: str) -> Verdict | None:
    if not isinstance(data, dict):
        return None
    if int(data.get("schema", 0)) > SCHEMA_VERSION:
        raise FleetError(
            f"baseline in {where} has schema {data.get('schema')}, newer than this fleetctl "
            f"understands ({SCHEMA_VERSION})",
            host=host,
            fix="upgrade fleetctl, or `fleetctl soak baseline reset` to start a new baseline",
        )
    try:
        return from_dict(Verdict, data)
    except (TypeError, ValueError, KeyError):
        return None


def _window(store: Store, row: BaselineRow) -> Window:
    runs = tuple(v for d in row.runs if (v := _verdict(d, store.where, row.host)) is not None)
    return Window(row.host, row.tag, runs, row.pinned)


def read(store: Store, host: str, tag: str) -> Window:
    """The stored window (empty when there is none)."""
    row = store.baseline(host, tag)
    return _window(store, row) if row is not None else Window(host, tag, ())


def combine(runs: tuple[Verdict, ...] | list[Verdict]) -> Verdict | None:
    """The baseline of ``runs``: the newest run, with each sweep level's tok/s the median over the
    runs
    made by the newest one's config, and that median's spread in ``baseline_spread``."""
    if not runs:
        return None
    newest = runs[-1]
    same = [r for r in runs if r.fingerprint == newest.fingerprint]
    if len(same) == 1:
        return newest
    levels = []
    spread: dict[str, float] = {}
    for lv in newest.levels:
        vals = [x.tok_s for r in same if (x := r.level(lv.phase, lv.label)) is not None and x.tok_s]
        if lv.phase == "sweep" and len(vals) >= 2:
            med = statistics.median(vals)
            spread[lv.label] = _MAD_TO_SD * statistics.median(abs(v - med) for v in vals)
            levels.append(dataclasses.replace(lv, tok_s=med))
        else:
            levels.append(lv)
    return dataclasses.replace(
        newest,
        levels=tuple(levels),
        baseline_runs=len(same),
        baseline_spread=spread,
        run_id=f"median of {len(same)} runs up to {newest.run_id}",
    )


def load(store: Store, host: str, tag: str) -> Verdict | None:
    """The baseline of ``host`` on ``tag`` (combined from its window), or None when there is
    none."""
    return read(store, host, tag).baseline


def _added(runs: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]],
           by_time: bool = False) -> tuple[dict[str, Any], ...]:
    """``runs`` with ``new`` added (a run id already there is not added twice; ``by_time``: merged
    in the order the runs finished), only the newest one's config fingerprint kept, the last
    :data:`WINDOW`."""
    have = {r.get("run_id") for r in runs}
    out = list(runs) + [r for r in new if r.get("run_id") not in have]
    if by_time:
        out.sort(key=lambda r: str(r.get("finished") or ""))
    if not out:
        return ()
    fp = out[-1].get("fingerprint", "")
    return tuple([r for r in out if r.get("fingerprint", "") == fp][-WINDOW:])


def save(store: Store, host: str, tag: str, verdict: Verdict) -> BaselineRow | None:
    """Add a passing ``verdict`` to the window (the oldest beyond :data:`WINDOW` drops out);
    returns what was stored (the runs as JSON documents: not read back into verdicts, which costs a
    gate more than the rest of its bookkeeping), None when nothing was.

    A failed or inconclusive run is never kept; a pinned window is not moved; a run made by
    another soak config starts a new window. Read and written in one ledger transaction.
    """
    if verdict.outcome is not Outcome.PASS:
        return None

    def change(row: BaselineRow | None) -> BaselineRow | None:
        if row is not None and row.pinned:
            return None
        # The reference answers are kept once, as the recipe's known-good (soak/references.py).
        kept = to_dict(dataclasses.replace(verdict, answers=()))
        return BaselineRow(host, tag, False, _added(row.runs if row else (), [kept]))

    return store.update_baseline(host, tag, change)


def pin(store: Store, host: str, tag: str, pinned: bool = True) -> Window:
    """Pin (or unpin) the window: while pinned, passing runs no longer change the baseline."""

    def change(row: BaselineRow | None) -> BaselineRow | None:
        if row is None or not row.runs:
            raise FleetError(
                f"no baseline recorded for tag {tag} in {store.where}",
                host=host,
                fix="run `fleetctl soak` on the host first; a passing soak becomes its baseline",
            )
        return dataclasses.replace(row, pinned=pinned)

    row = store.update_baseline(host, tag, change)
    assert row is not None
    return _window(store, row)


def reset(store: Store, host: str, tag: str) -> bool:
    """Forget the window (the next passing run starts a new one); False when there was none."""
    return store.delete_baseline(host, tag)


def windows(store: Store, host: str) -> list[Window]:
    """Every stored window of ``host``, by tag."""
    return [w for row in store.baselines(host) if (w := _window(store, row)).runs]


def _legacy_file(p: Path, host: str) -> tuple[str, bool, list[dict[str, Any]]] | None:
    """(tag, pinned, runs) of an old baseline file (a window, or a bare verdict), None when
    unreadable."""
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and data.get("format") == FORMAT:
        raw, pinned = data.get("runs") or [], bool(data.get("pinned"))
    else:
        raw, pinned = [data], False
    runs = [to_dict(v) for d in raw if (v := _verdict(d, str(p), host)) is not None]
    if not runs:
        return None
    return str(runs[-1].get("tag") or p.stem), pinned, runs


def open_for(inventory: Inventory, state_dir: Path) -> Ledger:
    """The ledger holding ``inventory``'s baselines (its shared PostgreSQL, else the SQLite file in
    ``state_dir``), with this state dir's old baseline files imported into it first (once)."""
    led = fleet_ledger.open_for(inventory, state_dir)
    try:
        import_files(state_dir, led)
    except BaseException:
        led.close()
        raise
    return led


def import_files(state_dir: Path, store: Store) -> int:
    """Move the old per-controller baseline files (``state_dir/baselines/HOST/TAG.json``) into the
    ledger, once: each window merged with the one the ledger has (its runs first, a run id never
    twice, pinned if either was), then the directory renamed ``baselines.imported`` so that it is
    never read again.
    Returns how many windows were imported (0 when there was nothing to import)."""
    src = Path(state_dir) / LEGACY_DIR
    if not src.is_dir():
        return 0
    n = 0
    for f in sorted(src.glob("*/*.json")):
        got = _legacy_file(f, f.parent.name)
        if got is None:
            continue
        tag, pinned, runs = got
        host = f.parent.name

        def change(row: BaselineRow | None, tag: str = tag, pinned: bool = pinned,
                   runs: list[dict[str, Any]] = runs, host: str = host) -> BaselineRow:
            if row is None:
                return BaselineRow(host, tag, pinned, _added((), runs, by_time=True))
            return BaselineRow(
                host, tag, row.pinned or pinned, _added(row.runs, runs, by_time=True)
            )

        store.update_baseline(host, tag, change)
        n += 1
    dst = Path(state_dir) / IMPORTED_DIR
    with contextlib.suppress(
        FileNotFoundError
    ):  # another controller on this state dir moved it first
        if dst.exists():
            dst = Path(state_dir) / f"{IMPORTED_DIR}.{int(time.time())}"
        src.rename(dst)
    return n
