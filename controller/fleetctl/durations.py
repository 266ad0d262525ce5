"""Durations as operators write them (``90``, ``90s``, ``10m``, ``1h``, ``1m30s``): one parser for
the
command line, recipes and soak configs."""

from __future__ import annotations

import re
from typing import Any

from fleetctl.errors import FleetError


class DurationError(FleetError):
    """A value that is not a duration (or is negative)."""


def parse_duration(value: Any, what: str = "duration") -> float:
    """``90``, ``"90s"``, ``"10m"``, ``"1h"``, ``"1m30s"`` -> seconds."""
    if isinstance(value, bool):
        raise DurationError(f"{what} {value!r} is not a duration", fix="write e.g. 90s, 10m or 1h")
    if isinstance(value, int | float):
        if value < 0:
            raise DurationError(f"{what} {value!r} is negative", fix="write e.g. 90s, 10m or 1h")
        return float(value)
    text = str(value).strip().lower()
    if text.startswith("-"):
        raise DurationError(f"{what} {value!r} is negative", fix="write e.g. 90s, 10m or 1h")
    m = re.fullmatch(
        r"(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?", text
    )
    if not text or m is None or not any(m.groups()):
        raise DurationError(f"{what} {value!r} is not a duration", fix="write e.g. 90s, 10m or 1h")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + s
