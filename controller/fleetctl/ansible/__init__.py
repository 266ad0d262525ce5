"""Run a playbook through ansible-runner and fold its event stream into per-host results.

Every fleetctl verb that changes hosts in bulk (provision, stage, deploy) is a
playbook in ``fleetctl.paths.playbooks_dir()`` applying roles from
``fleetctl.paths.roles_dir()``. :func:`run_playbook` runs one, reports live
per-host progress (current task, ok/changed/failed counts) as
:class:`fleetctl.progress.Event` s and returns a frozen :class:`PlaybookResult`.
Partial failure is data: a failed or unreachable host is a :class:`HostResult`
with its failure messages, never an exception. Only a run that could not start
(a syntax error, a missing playbook, no host matched) raises :class:`AnsibleError`.

Which file owns what:

- :mod:`.config`: the ``ansible.cfg`` each run writes and why each setting,
  forks, the SSH control-socket directory, which ``ansible-playbook`` and which
  playbook file; :class:`AnsibleError`.
- :mod:`.events`: :class:`EventFolder` (ansible-runner's events -> per-host
  tallies and progress) and the frozen results (:class:`PlaybookResult`,
  :class:`HostResult`, :class:`TaskFailure`, :class:`TaskResult`,
  :class:`TaskDiff`); :func:`failure_message`, :func:`format_diff`.
- :mod:`.redaction`: secrets kept out of artifacts and of ansible-playbook's
  environment (:class:`Redactor`, :func:`minimal_env`, the private extra-vars file).
- :mod:`.runner`: :func:`run_playbook`, the one entry point that ties them together.

Inside this package ``import ansible`` still means ansible-core: every import is
absolute (``fleetctl.ansible.<module>``).
"""

from __future__ import annotations

from fleetctl.ansible.config import (
    CONNECT_TIMEOUT,
    CONTROL_PERSIST,
    MAX_FORKS,
    AnsibleError,
    ansible_cfg,
    ansible_playbook_binary,
    close_masters,
    control_path_dir,
    forks,
    resolve_playbook,
    run_control_dir,
)
from fleetctl.ansible.events import (
    REPORT_KEY,
    EventFolder,
    HostResult,
    PlaybookResult,
    TaskDiff,
    TaskFailure,
    TaskResult,
    failure_message,
    format_diff,
)
from fleetctl.ansible.redaction import REDACTED, Redactor, minimal_env
from fleetctl.ansible.runner import run_playbook

__all__ = [
    "CONNECT_TIMEOUT",
    "CONTROL_PERSIST",
    "MAX_FORKS",
    "REDACTED",
    "REPORT_KEY",
    "AnsibleError",
    "EventFolder",
    "HostResult",
    "PlaybookResult",
    "Redactor",
    "TaskDiff",
    "TaskFailure",
    "TaskResult",
    "ansible_cfg",
    "ansible_playbook_binary",
    "close_masters",
    "control_path_dir",
    "failure_message",
    "forks",
    "format_diff",
    "minimal_env",
    "resolve_playbook",
    "run_control_dir",
    "run_playbook",
]
