"""What every benchmark does with its figures at the end: write them as JSON and say where."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console


def write_figures(con: Console, path: str | Path, figures: Mapping[str, Any]) -> Path:
    """Write ``figures`` to ``path`` (its directory made if needed) and print where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    con.print(f"figures written to {out}")
    return out
