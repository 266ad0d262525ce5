"""Baselines: a rolling window of the last passing verdicts per host and image tag.

A soak compares its throughput with the baseline of the tag that served
before on the same host (the rollout) or of the same tag (a scheduled soak):
the host's own history, not a fleet-wide figure, because Sparks differ.

One file per host and tag under ``state_dir/baselines/`` keeps the last
:data:`WINDOW` passing runs made by one soak config (a run with another
config fingerprint starts a new window: the old runs are not comparable).
The baseline compared with is their combination: each sweep level's median
tok/s and its spread, so that one lucky-high run does not fail every later
one, and a slow drift (each night a little worse) is measured against the
median of several nights rather than last night alone. An operator can pin a
window (later passes no longer move it) or reset it (``fleetctl soak baseline``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.soak.verdict import SCHEMA_VERSION, Outcome, Verdict, from_dict, to_dict

#: Passing runs a window keeps.
WINDOW = 5
#: The file's format: {"format", "pinned", "runs": [verdict, ...]} (a bare verdict is the old format).
FORMAT = "baseline-window-1"
#: MAD -> standard deviation of a normal distribution.
_MAD_TO_SD = 1.4826


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


def _safe(part: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in part) or "_"


def path(state_dir: Path, host: str, tag: str) -> Path:
    """Where the baseline window of ``host`` serving ``tag`` lives."""
    return Path(state_dir) / "baselines" / _safe(host) / f"{_safe(tag or 'untagged')}.json"


def _verdict(data: Any, p: Path, host: str) -> Verdict | None:
    if not isinstance(data, dict):
        return None
    if int(data.get("schema", 0)) > SCHEMA_VERSION:
        raise FleetError(f"baseline {p} has schema {data.get('schema')}, newer than this fleetctl "
                         f"understands ({SCHEMA_VERSION})", host=host,
                         fix="upgrade fleetctl, or `fleetctl soak baseline reset` to start a new baseline")
    try:
        return from_dict(Verdict, data)
    except (TypeError, ValueError, KeyError):
        return None


def read(state_dir: Path, host: str, tag: str) -> Window:
    """The stored window (empty when there is none or the file is unreadable; an old single verdict migrates)."""
    p = path(state_dir, host, tag)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return Window(host, tag, ())
    if isinstance(data, dict) and data.get("format") == FORMAT:
        raw, pinned = data.get("runs") or [], bool(data.get("pinned"))
    else:
        raw, pinned = [data], False
    runs = tuple(v for d in raw if (v := _verdict(d, p, host)) is not None)
    return Window(host, tag, runs, pinned)


def _write(state_dir: Path, w: Window) -> Path:
    doc = {"format": FORMAT, "pinned": w.pinned, "runs": [to_dict(v) for v in w.runs]}
    return paths.write_private(path(state_dir, w.host, w.tag), json.dumps(doc) + "\n")


def combine(runs: tuple[Verdict, ...] | list[Verdict]) -> Verdict | None:
    """The baseline of ``runs``: the newest run, with each sweep level's tok/s the median over the runs
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
    return dataclasses.replace(newest, levels=tuple(levels), baseline_runs=len(same), baseline_spread=spread,
                               run_id=f"median of {len(same)} runs up to {newest.run_id}")


def load(state_dir: Path, host: str, tag: str) -> Verdict | None:
    """The baseline of ``host`` on ``tag`` (combined from its window), or None when there is none."""
    return read(state_dir, host, tag).baseline


def save(state_dir: Path, host: str, tag: str, verdict: Verdict) -> Path | None:
    """Add a passing ``verdict`` to the window (the oldest beyond :data:`WINDOW` drops out); returns the path.

    A failed or inconclusive run is never kept; a pinned window is not moved; a run made by
    another soak config starts a new window.
    """
    if verdict.outcome is not Outcome.PASS:
        return None
    w = read(state_dir, host, tag)
    if w.pinned:
        return None
    runs = [r for r in w.runs if r.fingerprint == verdict.fingerprint] + [verdict]
    return _write(state_dir, Window(host, tag, tuple(runs[-WINDOW:])))


def pin(state_dir: Path, host: str, tag: str, pinned: bool = True) -> Window:
    """Pin (or unpin) the window: while pinned, passing runs no longer change the baseline."""
    w = read(state_dir, host, tag)
    if not w.runs:
        raise FleetError(f"no baseline recorded for tag {tag}", host=host,
                         fix="run `fleetctl soak` on the host first; a passing soak becomes its baseline")
    w = dataclasses.replace(w, pinned=pinned)
    _write(state_dir, w)
    return w


def reset(state_dir: Path, host: str, tag: str) -> bool:
    """Forget the window (the next passing run starts a new one); False when there was none."""
    p = path(state_dir, host, tag)
    try:
        p.unlink()
    except FileNotFoundError:
        return False
    return True


def windows(state_dir: Path, host: str) -> list[Window]:
    """Every stored window of ``host``, by tag."""
    d = Path(state_dir) / "baselines" / _safe(host)
    out = []
    for f in sorted(d.glob("*.json")):
        w = read(state_dir, host, f.stem)
        if w.runs:
            out.append(dataclasses.replace(w, tag=w.runs[-1].tag or f.stem))
    return out
