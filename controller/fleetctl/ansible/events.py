"""Folding ansible-runner's event stream into per-host results, and the result types.

Partial failure is data: a failed or unreachable host is a :class:`HostResult`
with its failure messages, never an exception.

Roles hand structured data back to the controller through a ``fleetctl_report``
mapping in a task's result (``ansible.builtin.set_fact: fleetctl_report: {...}``
works): the mappings of one host are merged into :attr:`HostResult.reports`,
a ``warnings`` list in them is gathered into :attr:`HostResult.warnings`.
Results of tasks whose name starts with one of the ``collect`` prefixes are
kept whole in :attr:`HostResult.results`.
"""

from __future__ import annotations

import difflib
import json
import shlex
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.ansible.redaction import Redactor
from fleetctl.progress import NULL, Event, Progress

#: The key a task result uses to hand structured data to the controller.
REPORT_KEY = "fleetctl_report"


@dataclass(frozen=True)
class TaskFailure:
    """One task that failed (or could not reach) a host: the task's name and a readable message."""

    task: str
    message: str
    unreachable: bool = False

    def __str__(self) -> str:
        # Task names are full sentences: "Check the disk." + ": msg" would read ".:".
        return f"{self.task.rstrip('.')}: {self.message}" if self.task else self.message


@dataclass(frozen=True)
class TaskResult:
    """The whole result of one collected task on one host (see ``collect`` in
    :func:`fleetctl.ansible.run_playbook`)."""

    task: str
    action: str
    #: ok, changed, failed, skipped or unreachable.
    status: str
    result: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskDiff:
    """What a task changed (or would change, with ``check``) on a host, as a unified diff."""

    task: str
    diff: str


@dataclass(frozen=True)
class HostResult:
    """One host's outcome of a playbook run: Ansible's recap counts plus what failed and why."""

    name: str
    #: Tasks that succeeded, changed ones included (Ansible's ``ok=`` in the recap).
    ok: int = 0
    changed: int = 0
    failed: int = 0
    #: Non-zero when the host could not be reached (Ansible's ``unreachable=``).
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    failures: tuple[TaskFailure, ...] = ()
    warnings: tuple[str, ...] = ()
    #: Merged ``fleetctl_report`` mappings the host's tasks returned (facts the roles gathered).
    reports: Mapping[str, Any] = field(default_factory=dict)
    results: tuple[TaskResult, ...] = ()
    diffs: tuple[TaskDiff, ...] = ()

    @property
    def succeeded(self) -> bool:
        """True when no task failed and the host was reachable throughout."""
        return self.failed == 0 and self.unreachable == 0

    @property
    def status(self) -> str:
        """``ok``, ``failed`` or ``unreachable``: one word for tables."""
        if self.unreachable:
            return "unreachable"
        return "failed" if self.failed else "ok"

    @property
    def message(self) -> str:
        """The first failure's message (the one that stopped the host), or empty."""
        return str(self.failures[0]) if self.failures else ""


@dataclass(frozen=True)
class PlaybookResult:
    """One playbook run: its id, where its artifacts are, and a :class:`HostResult` per host."""

    run_id: str
    playbook: str
    artifacts_dir: Path
    hosts: Mapping[str, HostResult]
    elapsed: float
    #: ansible-runner's final status: successful, failed, timeout or canceled.
    status: str
    rc: int
    check: bool = False

    @property
    def ok(self) -> bool:
        """True when every host succeeded and the run was not cut short."""
        return self.status == "successful" and all(h.succeeded for h in self.hosts.values())

    @property
    def failed_hosts(self) -> list[str]:
        """Names of the hosts that failed or were unreachable, in inventory order."""
        return [h.name for h in self.hosts.values() if not h.succeeded]



def failure_message(res: Mapping[str, Any]) -> str:
    """A readable one-line message from a failed task's result, without Ansible's noise.

    An ``assert``'s ``fail_msg`` or a ``fail``'s ``msg`` is used as it is; a
    command's "non-zero return code" becomes the command, its exit code and the
    last line of its stderr; a loop gives the first failed item's message.
    """
    if res.get("censored"):
        return "the task failed; its output is hidden because it handles a secret (no_log)"
    items = res.get("results")
    if isinstance(items, list):
        msgs = [failure_message(r) for r in items if isinstance(r, dict) and r.get("failed")]
        if msgs:
            return msgs[0] if len(msgs) == 1 else f"{msgs[0]} (and {len(msgs) - 1} more item(s))"
    msg = res.get("msg")
    if isinstance(msg, list):
        msg = "; ".join(str(m) for m in msg)
    msg = str(msg).strip() if msg else ""
    rc = res.get("rc")
    if rc not in (None, 0) and (
        not msg or msg.startswith("non-zero return code") or msg == "MODULE FAILURE"
    ):
        cmd = res.get("cmd")
        cmd_s = shlex.join(cmd) if isinstance(cmd, list) else str(cmd or "")
        tail = (
            _last_line(str(res.get("stderr") or ""))
            or _last_line(str(res.get("stdout") or ""))
            or _last_line(str(res.get("module_stderr") or ""))
        )
        head = f"`{_short(cmd_s)}` exited {rc}" if cmd_s else f"exit code {rc}"
        return f"{head}: {tail}" if tail else head
    if not msg:
        msg = (
            _last_line(str(res.get("stderr") or res.get("module_stderr") or ""))
            or "failed (no message)"
        )
    return msg


def format_diff(diff: Any) -> str:
    """A unified diff from a result's ``diff`` (a mapping or a list of them, as modules return)."""
    parts = diff if isinstance(diff, list) else [diff]
    out: list[str] = []
    for d in parts:
        if not isinstance(d, dict):
            continue
        if d.get("prepared"):
            out.append(str(d["prepared"]).rstrip("\n"))
            continue
        before, after = d.get("before", ""), d.get("after", "")
        if isinstance(before, dict | list) or isinstance(after, dict | list):
            before = json.dumps(before, indent=2, sort_keys=True) + "\n"
            after = json.dumps(after, indent=2, sort_keys=True) + "\n"
        before_s, after_s = str(before or ""), str(after or "")
        if before_s == after_s:
            continue
        out.extend(
            line.rstrip("\n")
            for line in difflib.unified_diff(
                before_s.splitlines(keepends=True),
                after_s.splitlines(keepends=True),
                fromfile=str(d.get("before_header", "before")),
                tofile=str(d.get("after_header", "after")),
            )
        )
    return "\n".join(out)


class _Host:
    """Mutable per-host tally while events stream in; frozen into a HostResult at the end."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.task = ""
        self.counts = {
            "ok": 0,
            "changed": 0,
            "failed": 0,
            "unreachable": 0,
            "skipped": 0,
            "rescued": 0,
            "ignored": 0,
        }
        self.failures: list[TaskFailure] = []
        self.warnings: list[str] = []
        self.reports: dict[str, Any] = {}
        self.results: list[TaskResult] = []
        self.diffs: list[TaskDiff] = []

    def freeze(self) -> HostResult:
        # A failure inside a block that was rescued is not a failure of the host.
        failures = (
            tuple(self.failures) if (self.counts["failed"] or self.counts["unreachable"]) else ()
        )
        return HostResult(
            name=self.name,
            ok=self.counts["ok"],
            changed=self.counts["changed"],
            failed=self.counts["failed"],
            unreachable=self.counts["unreachable"],
            skipped=self.counts["skipped"],
            rescued=self.counts["rescued"],
            ignored=self.counts["ignored"],
            failures=failures,
            warnings=tuple(self.warnings),
            reports=dict(self.reports),
            results=tuple(self.results),
            diffs=tuple(self.diffs),
        )


class EventFolder:
    """Folds ansible-runner events into per-host tallies and progress events (thread-safe).

    Public so that it can be fed recorded ``job_events`` (tests, re-rendering an old run).
    """

    def __init__(self, progress: Progress = NULL, collect: Collection[str] = (),
                 redactor: Redactor | None = None) -> None:
        self.progress = progress
        self.collect = tuple(collect)
        self.redactor = redactor or Redactor(())
        self.hosts: dict[str, _Host] = {}
        self.stats_seen = False
        self.last_error_lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> bool:
        """ansible-runner's ``event_handler``: fold the event, redact it, keep it (True)."""
        self.redactor.tree(event)
        with self._lock:
            self._fold(event)
        return True

    def _host(self, name: str) -> _Host:
        h = self.hosts.get(name)
        if h is None:
            h = self.hosts[name] = _Host(name)
        return h

    def _emit(self, h: _Host, phase: str, message: str) -> None:
        c = h.counts
        self.progress(Event(phase, message, host=h.name, data={
            "task": h.task, "ok": c["ok"], "changed": c["changed"], "failed": c["failed"],
        }))

    def _fold(self, ev: dict[str, Any]) -> None:
        kind = ev.get("event", "")
        data = ev.get("event_data") or {}
        if kind == "verbose" or kind == "error":
            line = str(ev.get("stdout") or "").strip()
            if line:
                self.last_error_lines = [*self.last_error_lines[-19:], line]
            return
        if kind == "playbook_on_stats":
            self._fold_stats(data)
            return
        host = data.get("host")
        if not host:
            if kind == "playbook_on_play_start":
                self.progress(Event("play", str(data.get("name") or data.get("play") or "")))
            return
        task = str(data.get("task") or "").strip()
        h = self._host(str(host))
        raw = data.get("res")
        res: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if kind == "runner_on_start":
            h.task = task
            self._emit(h, "task", task)
        elif kind == "runner_on_ok":
            h.task = task
            h.counts["ok"] += 1
            if res.get("changed"):
                h.counts["changed"] += 1
            self._take_result(h, task, data, res, "changed" if res.get("changed") else "ok")
            self._emit(h, "task", task)
        elif kind == "runner_on_skipped":
            h.counts["skipped"] += 1
            self._take_result(h, task, data, res, "skipped")
        elif kind == "runner_on_failed":
            h.task = task
            if data.get("ignore_errors"):
                h.counts["ignored"] += 1
            else:
                h.counts["failed"] += 1
                h.failures.append(TaskFailure(task, failure_message(res)))
            self._take_result(h, task, data, res, "failed")
            self._emit(h, "task", task)
        elif kind == "runner_on_unreachable":
            h.task = task
            h.counts["unreachable"] += 1
            h.failures.append(
                TaskFailure(task, failure_message(res) or "unreachable", unreachable=True)
            )
            self._take_result(h, task, data, res, "unreachable")
            self._emit(h, "unreachable", failure_message(res))

    def _take_result(
        self, h: _Host, task: str, data: Mapping[str, Any], res: Mapping[str, Any], status: str
    ) -> None:
        report = res.get(REPORT_KEY)
        facts = res.get("ansible_facts")
        if report is None and isinstance(facts, dict):
            report = facts.get(REPORT_KEY)
        if isinstance(report, dict):
            warns = report.get("warnings")
            if isinstance(warns, list):
                h.warnings.extend(str(w) for w in warns if w and str(w) not in h.warnings)
            h.reports.update({k: v for k, v in report.items() if k != "warnings"})
        if self.collect and task.startswith(self.collect):
            h.results.append(
                TaskResult(
                    task,
                    str(data.get("resolved_action") or data.get("task_action") or ""),
                    status,
                    dict(res),
                )
            )
        if status == "changed" and res.get("diff"):
            text = format_diff(res["diff"])
            if text:
                h.diffs.append(TaskDiff(task, text))

    def _fold_stats(self, data: Mapping[str, Any]) -> None:
        self.stats_seen = True
        keys = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable",
                "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}
        names: set[str] = set()
        for k in ("processed", *keys):
            v = data.get(k)
            if isinstance(v, dict):
                names.update(str(n) for n in v)
        for name in names:
            h = self._host(name)
            for src, dst in keys.items():
                v = data.get(src)
                h.counts[dst] = int(v.get(name, 0)) if isinstance(v, dict) else 0
            phase = (
                "unreachable"
                if h.counts["unreachable"]
                else "failed"
                if h.counts["failed"]
                else "done"
            )
            self._emit(h, phase, h.failures[0].message if h.failures and phase != "done" else "")

    def results(self, order: Collection[str]) -> dict[str, HostResult]:
        """Per-host results, in ``order`` first (inventory order) then any others."""
        with self._lock:
            names = [n for n in order if n in self.hosts] + [
                n for n in self.hosts if n not in order
            ]
            return {n: self.hosts[n].freeze() for n in names}



def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
