"""How fleetctl runs Ansible: the per-run ``ansible.cfg``, forks, and which playbook and binary.

Ansible settings, chosen for speed and safety; each run writes them to its own
``ansible.cfg`` in the run's artifacts (so a run can be reproduced with plain
``ansible-playbook``) and points ``ANSIBLE_CONFIG`` at it:

- **SSH pipelining** (``pipelining = True``): a module runs over the open
  session's stdin instead of being copied to a temp file first, one round trip
  per task instead of three or four. Needs no ``requiretty`` in sudoers, which
  DGX OS does not set.
- **ControlPersist, bounded by the run** (``ControlMaster=auto``,
  ``ControlPersist=60s``): one SSH connection per host carries every task of a
  run. Each run keeps its masters in a directory of its own,
  ``/tmp/fleetctl-ssh-<uid>/r<8 random characters>/`` (mode 0700), as ``%C`` (a
  40-character hash: a Unix socket path is limited to 108 bytes, which paths
  under a state directory in ``$HOME`` overflow easily), and closes them when
  it ends (:func:`close_masters`). A master is an ``ssh`` process of ~4 MB
  resident (plus its ProxyJump ``ssh`` through a bastion): left to expire, the
  masters of a rollout's successive steps and of provision then stage piled up
  to one per host of the fleet for a minute after each run, ~1 GB at 256
  hosts. Now a run holds at most one per host it runs on (a rollout step's
  hosts; ``bench/control_persist.py``), and none outlive it; the 60 s persist
  only bounds what a killed controller leaves behind. The cost is one
  handshake per host per run (~15 ms of controller CPU). Separate directories
  also mean a run never closes a master another fleetctl command is using.
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

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

from fleetctl import paths
from fleetctl.errors import FleetError
from fleetctl.inventory import Inventory

#: Upper bound on Ansible forks: beyond it the controller's CPU, not the hosts, is the limit
#: (the inventory's ``fleetctl_ansible_forks`` sets another for a bigger controller).
MAX_FORKS = 64


def forks(inventory: Inventory, hosts: int) -> int:
    """Forks for a run on ``hosts`` hosts: one per host, at most ``fleetctl_ansible_forks`` or
    :data:`MAX_FORKS`."""
    cap = inventory.vars.get("fleetctl_ansible_forks", MAX_FORKS)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise AnsibleError(
            f"fleetctl_ansible_forks is {cap!r}, not a whole number of forks",
            fix="set fleetctl_ansible_forks to a number >= 1 (default 64) in the inventory's all "
                "vars",
        )
    return max(1, min(hosts, cap))
#: Seconds to wait for a host's SSH connection before it counts as unreachable.
CONNECT_TIMEOUT = 10
#: How long an idle SSH master connection is kept for the next task or run.
CONTROL_PERSIST = "60s"


class AnsibleError(FleetError):
    """ansible-playbook could not run the playbook at all (as opposed to a host failing in it)."""



def control_path_dir() -> Path:
    """The parent of every run's SSH ControlPersist sockets: short, private to this user."""
    d = Path(tempfile.gettempdir()) / f"fleetctl-ssh-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    if d.stat().st_uid != os.getuid() or d.stat().st_mode & 0o077:
        raise AnsibleError(
            f"{d} is not a private directory of this user, so SSH control sockets cannot be kept "
            "there",
            fix=f"remove {d} (or chmod 700 it if it is yours)",
        )
    return d


#: A run's control directory left empty this long (a killed controller's) is removed by the next
#: run.
STALE_CONTROL_DIR = 6 * 3600
#: ``ssh -O exit`` commands in flight at once when a run closes its masters.
CLOSE_FAN_OUT = 32
#: Seconds the masters that answered ``exit`` have, together, to remove their sockets.
SOCKET_GONE_TIMEOUT = 2.0


def run_control_dir() -> Path:
    """A new directory for one run's SSH masters (see the module docstring); sweeps old empty
    ones."""
    parent = control_path_dir()
    now = time.time()
    for old in parent.iterdir():
        with contextlib.suppress(OSError):  # another run's, in use, or gone meanwhile
            if old.is_dir() and now - old.stat().st_mtime > STALE_CONTROL_DIR:
                old.rmdir()  # only when empty: a live master's socket keeps it
    # mkdtemp: 0700 and a name no concurrent run (of this or another command) can share.
    return Path(tempfile.mkdtemp(prefix="r", dir=parent))


def close_masters(control_dir: Path) -> int:
    """Close every SSH master whose socket is in ``control_dir``, then remove the directory.

    ``ssh -O exit`` asks each master to end (at most :data:`CLOSE_FAN_OUT` at once, a few ms
    each); a master that does not answer within 5 s is left to its ControlPersist timeout.
    Returns how many masters were asked to close.
    """
    try:
        sockets = [p for p in control_dir.iterdir() if p.is_socket()]
    except FileNotFoundError:
        return 0
    for i in range(0, len(sockets), CLOSE_FAN_OUT):
        procs = [
            subprocess.Popen(
                ["ssh", "-o", f"ControlPath={s}", "-O", "exit", "fleetctl-master"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for s in sockets[i : i + CLOSE_FAN_OUT]
        ]
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    # A master answers `exit` before it unlinks its socket: give the ones that answered a moment
    # to finish, so the directory can go (one that did not answer keeps it until ControlPersist).
    deadline = time.monotonic() + SOCKET_GONE_TIMEOUT
    while any(s.exists() for s in sockets) and time.monotonic() < deadline:
        time.sleep(0.02)
    with contextlib.suppress(OSError):  # a master that did not answer still holds its socket
        control_dir.rmdir()
    return len(sockets)


def ansible_cfg(inventory: Inventory, hosts: Collection[str], *, task_timeout: int | None = None,
                control_dir: Path | None = None) -> str:
    """The ``ansible.cfg`` text a run uses (see this module's docstring for why each setting).

    ``control_dir`` holds the run's SSH masters (:func:`run_control_dir`); by default the
    shared parent, for a config written to be read rather than run.
    """
    known: list[str] = []
    for name in hosts:
        h = inventory.host(name)
        path = (
            str(Path(h.known_hosts).expanduser())
            if h.known_hosts
            else str(Path("~/.ssh/known_hosts").expanduser())
        )
        if any(c.isspace() for c in path):
            raise AnsibleError(
                f"known_hosts path {path!r} contains whitespace, which ssh's UserKnownHostsFile "
                "cannot take",
                host=name,
                fix="move the known_hosts file to a path without spaces",
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
        f"control_path_dir = {control_dir or control_path_dir()}",
        "control_path = %(directory)s/%%C",
        "retries = 0",
    ]
    if task_timeout:
        lines.insert(lines.index("gathering = explicit"), f"task_timeout = {int(task_timeout)}")
    if inventory.vault_password_file:
        # The file the inventory was opened with (--vault-password-file, the environment's, or the
        # ansible.cfg's beside the inventory): this config replaces any other ansible.cfg.
        lines.insert(lines.index("gathering = explicit"),
                     f"vault_password_file = {inventory.vault_password_file}")
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
