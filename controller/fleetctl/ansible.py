"""Run a playbook through ansible-runner and fold its event stream into per-host results.

Every fleetctl verb that changes hosts in bulk (provision, stage, deploy) is a
playbook in ``fleetctl.paths.playbooks_dir()`` applying roles from
``fleetctl.paths.roles_dir()``. :func:`run_playbook` runs one, reports live
per-host progress (current task, ok/changed/failed counts) as
:class:`fleetctl.progress.Event` s and returns a frozen :class:`PlaybookResult`.
Partial failure is data: a failed or unreachable host is a :class:`HostResult`
with its failure messages, never an exception. Only a run that could not start
(a syntax error, a missing playbook, no host matched) raises :class:`AnsibleError`.

Ansible settings, chosen for speed and safety; each run writes them to its own
``ansible.cfg`` in the run's artifacts (so a run can be reproduced with plain
``ansible-playbook``) and points ``ANSIBLE_CONFIG`` at it:

- **SSH pipelining** (``pipelining = True``): a module runs over the open
  session's stdin instead of being copied to a temp file first, one round trip
  per task instead of three or four. Needs no ``requiretty`` in sudoers, which
  DGX OS does not set.
- **ControlPersist** (``ControlMaster=auto``, ``ControlPersist=60s``): one SSH
  connection per host carries every task, and a run started within a minute of
  the previous one (provision then stage, or a re-run) skips the handshake. The
  control sockets live in ``/tmp/fleetctl-ssh-<uid>/`` (mode 0700) as ``%C`` (a
  40-character hash): a Unix socket path is limited to 108 bytes, which paths
  under a state directory in ``$HOME`` overflow easily.
- **forks sized for the fleet**: one fork per selected host, at most
  :data:`MAX_FORKS` (or the inventory's ``fleetctl_ansible_forks``), so that a
  fleet of 8 runs each task on all 8 at once instead of in batches of
  Ansible's default 5. Each fork is a process (~25 MB of its own beside the
  copy-on-write parent) that spends controller CPU on every task result; 64 is
  what one 2-core controller keeps busy, a larger controller raises it.
- **strategy ``linear``** (Ansible's default, kept on purpose): every task runs
  on all hosts before the next, in batches of ``forks``. Staging depends on it
  (the seed host fetches before the others copy from it, see
  roles/weights/tasks/main.yml), and provisioning's roles restart Docker once
  per host in order; ``free`` would let a receiver start before its seed. A
  fleet of 256 runs each task in four batches of 64: a task's wall time is the
  sum of the four batches' slowest hosts.
- **host-key checking ON**: ``StrictHostKeyChecking=yes`` with
  ``UserKnownHostsFile`` set to every ``fleetctl_known_hosts`` of the selected
  hosts (``~/.ssh/known_hosts`` for a host without one). An unknown or changed
  key fails the host as unreachable; fleetctl never adds a key. ansible-runner
  turns Ansible's own check off unless ``ANSIBLE_HOST_KEY_CHECKING`` is set, so
  it is set explicitly.
- **no agent forwarding** (``ForwardAgent=no``): these options come before an
  inventory's ``ansible_ssh_common_args`` and ``~/.ssh/config``, and ssh keeps
  the first value, so no root on a fleet host can use the operator's agent.
- **bounded waits**: ``ConnectTimeout`` (:data:`CONNECT_TIMEOUT`) and
  ``ServerAliveInterval`` so a dead host turns unreachable instead of hanging
  the run; an optional per-task timeout and overall timeout.
- **one artifacts directory per run**: ``state_dir(inventory)/runs/<run_id>/
  ansible/<playbook>/`` holds ansible-runner's ``job_events/``, ``stdout``,
  ``status``, ``rc`` and this ``ansible.cfg``.
- **secrets never in artifacts**: extra variables go to Ansible through a 0600
  file in a private temporary directory, deleted after the run (never on the
  command line, which ansible-runner records); ``suppress_env_files`` keeps
  ansible-runner from writing ``env/extravars``; ansible-playbook runs with a
  minimal environment (:func:`minimal_env`: PATH, HOME, locale, ``ANSIBLE_*``,
  the ssh agent's socket, what ansible-runner sets), cut before ansible-runner
  records it in ``command``, so that a SIGKILL of the controller leaves no secret
  of its environment there; and every value passed in ``secrets`` is redacted from the
  job events (before they are written) and from ``stdout`` and ``command``
  after the run. Tasks that handle a secret must still say ``no_log: true``, so
  that Ansible itself never prints it.

Roles hand structured data back to the controller through a ``fleetctl_report``
mapping in a task's result (``ansible.builtin.set_fact: fleetctl_report: {...}``
works): the mappings of one host are merged into :attr:`HostResult.reports`,
a ``warnings`` list in them is gathered into :attr:`HostResult.warnings`.
Results of tasks whose name starts with one of the ``collect`` prefixes are
kept whole in :attr:`HostResult.results`.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import secrets as _secrets
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.inventory import Inventory
from fleetctl.progress import NULL, Event, Progress

#: Upper bound on Ansible forks: beyond it the controller's CPU, not the hosts, is the limit
#: (the inventory's ``fleetctl_ansible_forks`` sets another for a bigger controller).
MAX_FORKS = 64


def forks(inventory: Inventory, hosts: int) -> int:
    """Forks for a run on ``hosts`` hosts: one per host, at most ``fleetctl_ansible_forks`` or :data:`MAX_FORKS`."""
    cap = inventory.vars.get("fleetctl_ansible_forks", MAX_FORKS)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise AnsibleError(f"fleetctl_ansible_forks is {cap!r}, not a whole number of forks",
                           fix="set fleetctl_ansible_forks to a number >= 1 (default 64) in the inventory's all vars")
    return max(1, min(hosts, cap))
#: Seconds to wait for a host's SSH connection before it counts as unreachable.
CONNECT_TIMEOUT = 10
#: How long an idle SSH master connection is kept for the next task or run.
CONTROL_PERSIST = "60s"
#: The key a task result uses to hand structured data to the controller.
REPORT_KEY = "fleetctl_report"
#: Environment variables that ansible-runner may keep in its ``command`` artifact.
_ENV_KEPT_PREFIXES = ("ANSIBLE_", "LANG", "LC_")
_ENV_KEPT = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "AWX_ISOLATED_DATA_DIR", "TMPDIR",
                       "SSH_AUTH_SOCK"})
_REDACTED = "<redacted by fleetctl>"


class AnsibleError(FleetError):
    """ansible-playbook could not run the playbook at all (as opposed to a host failing in it)."""


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
    """The whole result of one collected task on one host (see ``collect`` in :func:`run_playbook`)."""

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


def new_run_id(prefix: str) -> str:
    """A sortable, unique run id: ``<prefix>-<UTC timestamp>-<6 hex>``."""
    return f"{prefix}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{_secrets.token_hex(3)}"


def control_path_dir() -> Path:
    """The directory of SSH ControlPersist sockets: short, private, shared by runs of one user."""
    d = Path(tempfile.gettempdir()) / f"fleetctl-ssh-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    if d.stat().st_uid != os.getuid() or d.stat().st_mode & 0o077:
        raise AnsibleError(
            f"{d} is not a private directory of this user, so SSH control sockets cannot be kept there",
            fix=f"remove {d} (or chmod 700 it if it is yours)",
        )
    return d


def ansible_cfg(inventory: Inventory, hosts: Collection[str], *, task_timeout: int | None = None) -> str:
    """The ``ansible.cfg`` text a run uses (see the module docstring for why each setting)."""
    known: list[str] = []
    for name in hosts:
        h = inventory.host(name)
        path = str(Path(h.known_hosts).expanduser()) if h.known_hosts else str(Path("~/.ssh/known_hosts").expanduser())
        if any(c.isspace() for c in path):
            raise AnsibleError(
                f"known_hosts path {path!r} contains whitespace, which ssh's UserKnownHostsFile cannot take",
                host=name, fix="move the known_hosts file to a path without spaces",
            )
        if path not in known:
            known.append(path)
    n_forks = forks(inventory, len(hosts))
    ssh_args = " ".join([
        "-o ControlMaster=auto",
        f"-o ControlPersist={CONTROL_PERSIST}",
        "-o StrictHostKeyChecking=yes",
        shlex.quote("-oUserKnownHostsFile=" + " ".join(known)),
        f"-o ConnectTimeout={CONNECT_TIMEOUT}",
        "-o ServerAliveInterval=5",
        "-o ServerAliveCountMax=3",
        "-o PasswordAuthentication=no",
        # A forwarded agent would let any root on a fleet host use the operator's keys.
        "-o ForwardAgent=no",
    ])
    lines = [
        "# Written by fleetctl for one run; see fleetctl/ansible.py for why each setting.",
        "[defaults]",
        f"roles_path = {paths.roles_dir()}",
        f"forks = {n_forks}",
        "host_key_checking = True",
        "interpreter_python = auto_silent",
        "retry_files_enabled = False",
        f"timeout = {CONNECT_TIMEOUT}",
        # Facts are gathered by the roles that need them, with the smallest subset.
        "gathering = explicit",
        "",
        "[ssh_connection]",
        "pipelining = True",
        f"ssh_args = {ssh_args}",
        f"control_path_dir = {control_path_dir()}",
        "control_path = %(directory)s/%%C",
        "retries = 0",
    ]
    if task_timeout:
        lines.insert(lines.index("gathering = explicit"), f"task_timeout = {int(task_timeout)}")
    return "\n".join(lines) + "\n"


class _Redactor:
    """Replaces secret values in strings, lists and mappings (in place for mutable containers)."""

    def __init__(self, values: Collection[str]) -> None:
        # Longest first, so a secret containing another is replaced whole.
        self.values = sorted({v for v in values if v and len(v) >= 4}, key=len, reverse=True)

    def text(self, s: str) -> str:
        for v in self.values:
            if v in s:
                s = s.replace(v, _REDACTED)
        return s

    def tree(self, obj: Any) -> Any:
        if not self.values:
            return obj
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            for k in list(obj):
                obj[k] = self.tree(obj[k])
            return obj
        if isinstance(obj, list):
            for i, v in enumerate(obj):
                obj[i] = self.tree(v)
            return obj
        return obj

    def file(self, path: Path) -> None:
        if not self.values or not path.is_file():
            return
        text = path.read_text(errors="replace")
        clean = self.text(text)
        if clean != text:
            tmp = path.with_name(path.name + ".redact")
            tmp.write_text(clean)
            tmp.chmod(0o600)
            tmp.replace(path)


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
    if rc not in (None, 0) and (not msg or msg.startswith("non-zero return code") or msg == "MODULE FAILURE"):
        cmd = res.get("cmd")
        cmd_s = shlex.join(cmd) if isinstance(cmd, list) else str(cmd or "")
        tail = _last_line(str(res.get("stderr") or "")) or _last_line(str(res.get("stdout") or "")) \
            or _last_line(str(res.get("module_stderr") or ""))
        head = f"`{_short(cmd_s)}` exited {rc}" if cmd_s else f"exit code {rc}"
        return f"{head}: {tail}" if tail else head
    if not msg:
        msg = _last_line(str(res.get("stderr") or res.get("module_stderr") or "")) or "failed (no message)"
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
        out.extend(line.rstrip("\n") for line in difflib.unified_diff(
            before_s.splitlines(keepends=True), after_s.splitlines(keepends=True),
            fromfile=str(d.get("before_header", "before")), tofile=str(d.get("after_header", "after")),
        ))
    return "\n".join(out)


class _Host:
    """Mutable per-host tally while events stream in; frozen into a HostResult at the end."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.task = ""
        self.counts = {"ok": 0, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 0, "rescued": 0,
                       "ignored": 0}
        self.failures: list[TaskFailure] = []
        self.warnings: list[str] = []
        self.reports: dict[str, Any] = {}
        self.results: list[TaskResult] = []
        self.diffs: list[TaskDiff] = []

    def freeze(self) -> HostResult:
        # A failure inside a block that was rescued is not a failure of the host.
        failures = tuple(self.failures) if (self.counts["failed"] or self.counts["unreachable"]) else ()
        return HostResult(
            name=self.name, ok=self.counts["ok"], changed=self.counts["changed"], failed=self.counts["failed"],
            unreachable=self.counts["unreachable"], skipped=self.counts["skipped"], rescued=self.counts["rescued"],
            ignored=self.counts["ignored"], failures=failures, warnings=tuple(self.warnings),
            reports=dict(self.reports), results=tuple(self.results), diffs=tuple(self.diffs),
        )


class EventFolder:
    """Folds ansible-runner events into per-host tallies and progress events (thread-safe).

    Public so that it can be fed recorded ``job_events`` (tests, re-rendering an old run).
    """

    def __init__(self, progress: Progress = NULL, collect: Collection[str] = (),
                 redactor: _Redactor | None = None) -> None:
        self.progress = progress
        self.collect = tuple(collect)
        self.redactor = redactor or _Redactor(())
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
            h.failures.append(TaskFailure(task, failure_message(res) or "unreachable", unreachable=True))
            self._take_result(h, task, data, res, "unreachable")
            self._emit(h, "unreachable", failure_message(res))

    def _take_result(self, h: _Host, task: str, data: Mapping[str, Any], res: Mapping[str, Any], status: str) -> None:
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
            h.results.append(TaskResult(task, str(data.get("resolved_action") or data.get("task_action") or ""),
                                        status, dict(res)))
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
            phase = "unreachable" if h.counts["unreachable"] else "failed" if h.counts["failed"] else "done"
            self._emit(h, phase, h.failures[0].message if h.failures and phase != "done" else "")

    def results(self, order: Collection[str]) -> dict[str, HostResult]:
        """Per-host results, in ``order`` first (inventory order) then any others."""
        with self._lock:
            names = [n for n in order if n in self.hosts] + [n for n in self.hosts if n not in order]
            return {n: self.hosts[n].freeze() for n in names}


def minimal_env(env: Mapping[str, str], inherited: Mapping[str, str]) -> dict[str, str]:
    """``env`` without what it inherited from ``inherited`` (the controller's environment), except the
    variables Ansible and ssh need (PATH, HOME, locale, ``ANSIBLE_*``, the ssh agent's socket, TMPDIR).

    What ansible-runner and fleetctl set themselves (a value not inherited) is kept.
    """
    return {k: v for k, v in env.items()
            if inherited.get(k) != v or k in _ENV_KEPT or k.startswith(_ENV_KEPT_PREFIXES)}


def _scrub_command_env(path: Path, redactor: _Redactor) -> None:
    """Keep only Ansible's and the locale's variables in ansible-runner's ``command`` record."""
    if not path.is_file():
        return
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    env = data.get("env")
    if isinstance(env, dict):
        data["env"] = {k: v for k, v in env.items() if k in _ENV_KEPT or k.startswith(_ENV_KEPT_PREFIXES)}
    tmp = path.with_name(path.name + ".scrub")
    tmp.write_text(redactor.text(json.dumps(data)))
    tmp.chmod(0o600)
    tmp.replace(path)


@contextlib.contextmanager
def _private_vars_file(extravars: Mapping[str, Any]) -> Iterator[Path]:
    """Extra variables in a 0600 file of a private temp dir, removed when the run ends."""
    with tempfile.TemporaryDirectory(prefix="fleetctl-vars-") as d:
        p = Path(d) / "extravars.json"
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(dict(extravars), f)
        yield p


def ansible_playbook_binary() -> str:
    """The ``ansible-playbook`` of fleetctl's own environment (the venv may not be on PATH)."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("ansible-playbook")
    if found:
        return found
    raise AnsibleError(
        "ansible-playbook is not installed beside fleetctl nor on PATH",
        fix="run scripts/bootstrap.sh (it installs ansible-core into .venv)",
    )


def resolve_playbook(playbook: str) -> Path:
    """``provision`` / ``provision.yml`` in ``playbooks_dir()``, or a path to a playbook file."""
    p = Path(playbook)
    if p.is_absolute() or p.parent != Path("."):
        candidates = [p]
    else:
        name = playbook if playbook.endswith((".yml", ".yaml")) else f"{playbook}.yml"
        candidates = [paths.playbooks_dir() / name]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise AnsibleError(
        f"playbook {playbook!r} not found (looked for {', '.join(str(c) for c in candidates)})",
        fix=f"use a playbook from {paths.playbooks_dir()} or give a path to one",
    )


def run_playbook(
    playbook: str,
    inventory: Inventory,
    *,
    limit: str | None = None,
    extravars: Mapping[str, Any] | None = None,
    secrets: Mapping[str, str] | None = None,
    redact: Collection[str] = (),
    check: bool = False,
    diff: bool = False,
    progress: Progress = NULL,
    artifacts_dir: Path | None = None,
    run_id: str | None = None,
    tags: Collection[str] | None = None,
    collect: Collection[str] = (),
    task_timeout: int | None = None,
    timeout: int | None = None,
) -> PlaybookResult:
    """Run ``playbook`` on the hosts of ``inventory`` matching ``limit``; never raises for a host's failure.

    ``extravars`` and ``secrets`` are both passed as extra variables; the values
    of ``secrets`` (and the strings in ``redact``, for secrets nested in an extra
    variable) are also redacted from every artifact. ``check``/``diff`` are
    Ansible's ``--check``/``--diff``. ``collect`` lists task-name prefixes whose
    whole results are kept. ``task_timeout`` bounds each task (seconds) and
    ``timeout`` the whole run. ``artifacts_dir`` defaults to
    ``state_dir(inventory)/runs/<run_id>/ansible/<playbook name>``.

    Raises :class:`AnsibleError` when the playbook is missing, ``limit`` matches
    nothing, or ansible-playbook stops before running any host.
    """
    # A slow import (≈0.3 s): only commands that run playbooks pay it.
    from ansible_runner.interface import init_runner

    path = resolve_playbook(playbook)
    binary = ansible_playbook_binary()
    selected = [h.name for h in inventory.select(limit)]  # raises on a limit that matches nothing
    run_id = run_id or new_run_id(path.stem)
    if artifacts_dir is None:
        artifacts_dir = paths.state_dir(inventory.path) / "runs" / run_id / "ansible" / path.stem
    artifacts_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    cfg = artifacts_dir / "ansible.cfg"
    cfg.write_text(ansible_cfg(inventory, selected, task_timeout=task_timeout))

    redactor = _Redactor([*(secrets or {}).values(), *redact])
    folder = EventFolder(progress, collect=collect, redactor=redactor)
    all_vars = {**(extravars or {}), **(secrets or {})}
    cmdline: list[str] = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    envvars = {
        "ANSIBLE_CONFIG": str(cfg),
        # ansible-runner sets it to False unless it is present: keep Ansible's check on.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_NOCOLOR": "1",
        # ansible-runner spawns `ansible-playbook` by name: put fleetctl's own first on PATH.
        "PATH": os.pathsep.join([str(Path(binary).parent), os.environ.get("PATH", os.defpath)]),
    }
    status = "failed"
    rc = -1
    t0 = time.monotonic()
    progress(Event("start", f"{path.name} on {len(selected)} host(s)", data={"run_id": run_id}))
    with _private_vars_file(all_vars) as vars_file:
        cmdline += ["-e", f"@{vars_file}"]
        try:
            # init_runner + run is what ansible_runner.run does; in between, the environment ansible-runner
            # seeded from ours (HF_TOKEN, registry and webhook secrets...) is cut down to what Ansible needs,
            # before ansible-runner records it in the `command` artifact: a SIGKILL of the controller then
            # leaves no secret behind (the scrub in `finally` never runs after a SIGKILL).
            r = init_runner(
                private_data_dir=str(artifacts_dir),
                artifact_dir=str(artifacts_dir.parent),
                ident=artifacts_dir.name,
                project_dir=str(path.parent),
                playbook=path.name,
                inventory=str(inventory.path.resolve()),
                limit=",".join(selected) if limit else None,
                cmdline=shlex.join(cmdline),
                envvars=envvars,
                forks=forks(inventory, len(selected)),
                tags=",".join(tags) if tags else None,
                quiet=True,
                suppress_env_files=True,
                event_handler=folder,
                timeout=timeout,
            )
            r.config.env = minimal_env(r.config.env, os.environ)
            r.run()
            status, rc = str(r.status), int(r.rc if r.rc is not None else -1)
        finally:
            _scrub_command_env(artifacts_dir / "command", redactor)
            redactor.file(artifacts_dir / "stdout")
    elapsed = time.monotonic() - t0
    hosts = folder.results(selected)
    if not folder.stats_seen and not hosts:
        tail = "; ".join(_error_lines(artifacts_dir / "stdout") or folder.last_error_lines[-3:]) \
            or f"ansible-runner status {status}, rc {rc}"
        raise AnsibleError(
            f"ansible-playbook could not run {path.name}: {tail}",
            fix=f"see {artifacts_dir / 'stdout'}; `ansible-playbook --syntax-check` helps",
        )
    progress(Event("end", f"{path.name} {status} in {elapsed:.1f}s", data={"run_id": run_id}))
    return PlaybookResult(run_id=run_id, playbook=str(path), artifacts_dir=artifacts_dir, hosts=hosts,
                          elapsed=elapsed, status=status, rc=rc, check=check)


def _error_lines(stdout: Path) -> list[str]:
    try:
        lines = [ln.strip() for ln in stdout.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []
    errs = [ln for ln in lines if ln.startswith(("ERROR!", "[ERROR]", "[WARNING]: Could not match"))]
    return (errs or lines)[-3:]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
