"""Run ids: one format for every run that leaves a record or artifacts (rollouts, soaks, Ansible
runs).

``<kind>-<UTC time>-<random hex>``, e.g. ``ro-20261124T230000Z-3f9a1c``: sortable by time, unique
across controllers, readable in a log, and safe as a directory name.
"""

from __future__ import annotations

import secrets
import time


def new_run_id(kind: str, name: str = "") -> str:
    """A new id for a run of ``kind`` (``ro``, ``rb``, ``soak``, a playbook's name), about
    ``name``."""
    parts = [kind]
    if name:
        parts.append("".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:40])
    parts += [time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), secrets.token_hex(3)]
    return "-".join(parts)
