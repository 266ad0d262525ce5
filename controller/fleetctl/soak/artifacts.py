"""A soak's artifacts: samples, /metrics scrapes and the verdict, written under one private
directory
as the soak goes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.soak.verdict import (
    Sample,
    to_dict,
)


class Artifacts:
    """Writes samples, scrapes and the verdict under one directory as the soak goes."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.n = 0
        if root is not None:
            # scrapes and samples quote the server's answers: private like the rest of the state
            paths.private_dir(root)
            paths.private_dir(root / "scrapes")
            # A resumed rollout gates a host again into the same directory: its scrapes number on.
            self.n = len(os.listdir(root / "scrapes"))
            fd = os.open(
                root / "samples.jsonl",
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                0o600,
            )
            self._samples = os.fdopen(fd, "a")

    def sample(self, s: Sample) -> None:
        if self.root is not None:
            self._samples.write(json.dumps(to_dict(s)) + "\n")

    def scrape(self, label: str, t: float, text: str) -> None:
        if self.root is None:
            return
        self.n += 1
        safe = "".join(c if c.isalnum() or c in "-_=" else "_" for c in label)
        # A new name each time, in a directory of its own: created exclusively (never through a
        # planted symlink), no temp file and rename needed.
        fd = os.open(self.root / "scrapes" / f"{self.n:04d}-{safe}-t{t:.1f}.prom",
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)

    def write_json(self, name: str, data: Any) -> None:
        if self.root is None:
            return
        # One line (``jq .`` indents it): json's C encoder does not indent, and the Python one it
        # falls back on cost a gate ~10 ms on a verdict with its latency samples.
        paths.write_private(self.root / name, json.dumps(data) + "\n")

    def close(self) -> None:
        if self.root is not None:
            self._samples.close()
