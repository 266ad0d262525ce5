"""What the ledger holds, as read back: rollouts, their waves and hosts, each host's known-good
versions, the hosts out of rotation, soak baselines, the lock's holder; and the statuses."""

from __future__ import annotations

import getpass
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetctl.runids import new_run_id
from fleetctl.state.lock import proc_start

#: Rollout statuses. ``running`` with a stale lock means the controller died.
RUNNING, PAUSED, COMPLETED, FAILED, ABORTED = "running", "paused", "completed", "failed", "aborted"


#: Every wave went through, with host failures inside the failure budget (rolled back or down).
COMPLETED_WITH_FAILURES = "completed-with-failures"


ACTIVE = (RUNNING, PAUSED)


#: Host statuses.
PENDING, IN_PROGRESS, DONE, SKIPPED, ROLLED_BACK, HOST_FAILED, HOST_PAUSED = (
    "pending", "in-progress", "done", "skipped", "rolled-back", "failed", "paused")


@dataclass(frozen=True)
class OutOfRotation:
    """A host fleetctl drained at its front door and has not re-admitted yet."""

    host: str
    rollout_id: str | None
    reason: str | None
    memo: dict[str, Any]
    at: float

    @classmethod
    def from_row(cls, r: Mapping[str, Any]) -> OutOfRotation:
        """The record an ``out_of_rotation`` row holds."""
        return cls(r["host"], r["rollout_id"], r["reason"], from_json(r["memo"]) or {}, r["at"])


@dataclass(frozen=True)
class PhaseRecord:
    """One phase a host (or the rollout, host None) entered, and when."""

    host: str | None
    phase: str
    at: float
    detail: str | None


@dataclass(frozen=True)
class HostRecord:
    """One host's course through a rollout: where it was, where it went, the gate's verdict."""

    host: str
    wave: int
    step: int
    phase: str
    status: str
    before_tag: str | None
    before_digest: str | None
    before: dict[str, Any] | None
    target_tag: str | None
    target_digest: str | None
    after_tag: str | None
    after_digest: str | None
    verdict: dict[str, Any] | None
    artifacts: str | None
    error: str | None
    started_at: float | None
    updated_at: float
    finished_at: float | None
    #: The recipe the host's step serves, and the one it served before (None: not recorded, an
    #: older ledger's row); two different ones make the step a model switch.
    recipe: str | None = None
    before_recipe: str | None = None

    @property
    def switch(self) -> bool:
        """The step moved the host to another model (recipe)."""
        return bool(self.recipe and self.before_recipe and self.recipe != self.before_recipe)


@dataclass(frozen=True)
class WaveRecord:
    """One wave: its hosts and how it went."""

    idx: int
    hosts: tuple[str, ...]
    status: str
    started_at: float | None
    finished_at: float | None


@dataclass(frozen=True)
class RolloutRecord:
    """A rollout or rollback as the ledger knows it."""

    id: str
    kind: str
    status: str
    recipe: str | None
    requested: str | None
    tag: str | None
    digest: str | None
    image: str | None
    parent: str | None
    options: dict[str, Any]
    started_by: str
    command: str
    started_at: float
    finished_at: float | None
    error: str | None
    waves: tuple[WaveRecord, ...]
    hosts: tuple[HostRecord, ...]
    phases: tuple[PhaseRecord, ...]

    def host(self, name: str) -> HostRecord | None:
        """The record of one host, if it took part."""
        return next((h for h in self.hosts if h.host == name), None)


@dataclass(frozen=True)
class KnownGood:
    """A version a host is known to serve well: it passed a full gate there, or served before
    fleetctl came."""

    host: str
    tag: str | None
    digest: str
    #: The container settings' fingerprint (see ``rollout.host.fingerprint``); "" when unknown.
    fingerprint: str
    settings: dict[str, Any] | None
    #: ``gate`` (passed a full gate here), ``found`` (served before fleetctl first touched the host)
    #: or ``served`` (was serving, running, when a rollout moved the host away from it).
    source: str
    rollout_id: str | None
    at: float
    #: The recipe the host served it with (None: not recorded).
    recipe: str | None = None

    @classmethod
    def from_row(cls, r: Mapping[str, Any]) -> KnownGood:
        """The record a ``known_good`` row holds."""
        return cls(r["host"], r["tag"], r["digest"], r["fingerprint"], from_json(r["settings"]),
                   r["source"], r["rollout_id"], r["at"], r.get("recipe"))


@dataclass(frozen=True)
class BaselineRow:
    """One stored baseline window: ``runs`` are the soak verdicts as JSON documents, oldest
    first."""

    host: str
    tag: str
    pinned: bool
    runs: tuple[dict[str, Any], ...]
    updated_at: float = 0.0


@dataclass(frozen=True)
class LockHolder:
    """Who holds a fleet's lock."""

    rollout_id: str
    pid: int
    hostname: str
    proc_start: str
    acquired_at: float
    #: Known from the database's own lock (PostgreSQL, any machine); None: judged from the pid
    #: below.
    live: bool | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any], live: bool | None) -> LockHolder:
        """The holder a lock row names."""
        return cls(row["rollout_id"], row["pid"], row["hostname"], row["proc_start"],
                   row["acquired_at"], live)

    @property
    def alive(self) -> bool:
        """True unless the holder is provably gone (its database session ended; or, on SQLite, it
        ran on
        this machine and its pid is dead or reused)."""
        if self.live is not None:
            return self.live
        if self.hostname != socket.gethostname():
            return True  # another controller machine: we cannot tell, so we must assume it lives
        return proc_start(self.pid) == self.proc_start


@dataclass(frozen=True)
class LedgerInfo:
    """Which ledger a fleet uses and who holds its lock (``fleetctl ledger``)."""

    backend: str
    #: A path, or a PostgreSQL conninfo without its password.
    where: str
    fleet: str
    schema_version: int
    rollouts: int
    holder: LockHolder | None


def started_by() -> str:
    """``user@host`` of this controller (``$SUDO_USER`` first: the human behind sudo)."""
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    return f"{user}@{socket.gethostname()}"


def new_id(kind: str = "rollout") -> str:
    """A rollout's id: ``ro-20260701T120000Z-3f9a1c`` (``rb-`` for a rollback)."""
    return new_run_id("rb" if kind == "rollback" else "ro")


def host_record(h: Mapping[str, Any]) -> HostRecord:
    return HostRecord(
        host=h["host"],
        wave=h["wave"],
        step=h["step"],
        phase=h["phase"],
        status=h["status"],
        before_tag=h["before_tag"],
        before_digest=h["before_digest"],
        before=from_json(h["before"]),
        target_tag=h["target_tag"],
        target_digest=h["target_digest"],
        after_tag=h["after_tag"],
        after_digest=h["after_digest"],
        verdict=from_json(h["verdict"]),
        artifacts=h["artifacts"],
        error=h["error"],
        started_at=h["started_at"],
        updated_at=h["updated_at"],
        finished_at=h["finished_at"],
        recipe=h.get("recipe"),
        before_recipe=h.get("before_recipe"),
    )


def from_json(text: str | None) -> Any:
    return json.loads(text) if text else None


def rollout_record(
    row: Mapping[str, Any],
    waves: Sequence[Mapping[str, Any]],
    hosts: Sequence[Mapping[str, Any]],
    phases: Sequence[Mapping[str, Any]],
) -> RolloutRecord:
    """A rollout's record from its row and its waves', hosts' and phases' rows."""
    return RolloutRecord(
        id=row["id"],
        kind=row["kind"],
        status=row["status"],
        recipe=row["recipe"],
        requested=row["requested"],
        tag=row["tag"],
        digest=row["digest"],
        image=row["image"],
        parent=row["parent"],
        options=json.loads(row["options"]),
        started_by=row["started_by"],
        command=row["command"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        error=row["error"],
        waves=tuple(
            WaveRecord(
                w["idx"],
                tuple(json.loads(w["hosts"])),
                w["status"],
                w["started_at"],
                w["finished_at"],
            )
            for w in waves
        ),
        hosts=tuple(host_record(h) for h in hosts),
        phases=tuple(PhaseRecord(p["host"], p["phase"], p["at"], p["detail"]) for p in phases),
    )
