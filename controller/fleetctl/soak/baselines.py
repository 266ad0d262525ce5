"""Baselines: the last passing verdict per host and image tag, under ``state_dir/baselines/``.

A soak compares its throughput with the baseline of the tag that served
before on the same host (the rollout) or of the same tag (a scheduled soak):
the host's own history, not a fleet-wide figure, because Sparks differ.
"""

from __future__ import annotations

import json
from pathlib import Path

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.soak.verdict import SCHEMA_VERSION, Outcome, Verdict, from_dict, to_dict


def _safe(part: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in part) or "_"


def path(state_dir: Path, host: str, tag: str) -> Path:
    """Where the baseline of ``host`` serving ``tag`` lives."""
    return Path(state_dir) / "baselines" / _safe(host) / f"{_safe(tag or 'untagged')}.json"


def load(state_dir: Path, host: str, tag: str) -> Verdict | None:
    """The last passing verdict of ``host`` on ``tag``, or None when there is none.

    A baseline written by a newer fleetctl (higher schema) is refused with a clear
    message rather than misread; an unreadable file is treated as absent.
    """
    p = path(state_dir, host, tag)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    if int(data.get("schema", 0)) > SCHEMA_VERSION:
        raise FleetError(f"baseline {p} has schema {data.get('schema')}, newer than this fleetctl "
                         f"understands ({SCHEMA_VERSION})", host=host,
                         fix="upgrade fleetctl, or delete the file to start a new baseline")
    try:
        return from_dict(Verdict, data)
    except (TypeError, ValueError, KeyError):
        return None


def save(state_dir: Path, host: str, tag: str, verdict: Verdict) -> Path | None:
    """Keep ``verdict`` as the baseline if it passed (temp file + rename); returns the path."""
    if verdict.outcome is not Outcome.PASS:
        return None
    return paths.write_private(path(state_dir, host, tag), json.dumps(to_dict(verdict)) + "\n")
