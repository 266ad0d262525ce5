"""How fleetctl runs Ansible: the per-run ``ansible.cfg``, forks, and which playbook and binary.

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

How secrets stay out of those artifacts: :mod:`fleetctl.ansible.redaction`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Collection
from pathlib import Path

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.inventory import Inventory

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


class AnsibleError(FleetError):
    """ansible-playbook could not run the playbook at all (as opposed to a host failing in it)."""



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
    """The ``ansible.cfg`` text a run uses (see this module's docstring for why each setting)."""
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
        "# Written by fleetctl for one run; see fleetctl/ansible/config.py for why each setting.",
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
