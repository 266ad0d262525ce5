"""Run a playbook through ansible-runner and return its per-host results.

:func:`run_playbook` writes the run's ``ansible.cfg`` (:mod:`.config`), hands
extra variables over in a private file and keeps secrets out of the artifacts
(:mod:`.redaction`), and folds ansible-runner's events into a
:class:`~fleetctl.ansible.events.PlaybookResult` (:mod:`.events`).
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from fleetctl import paths
from fleetctl.ansible.config import (
    AnsibleError,
    ansible_cfg,
    ansible_playbook_binary,
    close_masters,
    forks,
    resolve_playbook,
    run_control_dir,
)
from fleetctl.ansible.events import EventFolder, PlaybookResult
from fleetctl.ansible.redaction import Redactor, minimal_env, private_vars_file, scrub_command_env
from fleetctl.inventory import Inventory
from fleetctl.progress import NULL, Event, Progress
from fleetctl.runids import new_run_id


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
    """Run ``playbook`` on the hosts of ``inventory`` matching ``limit``; never raises for a host's
    failure.

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
    control_dir = run_control_dir()
    try:
        cfg.write_text(
            ansible_cfg(inventory, selected, task_timeout=task_timeout, control_dir=control_dir)
        )
    except BaseException:
        close_masters(control_dir)  # none yet: removes the directory
        raise

    redactor = Redactor([*(secrets or {}).values(), *redact])
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
    with private_vars_file(all_vars) as vars_file:
        cmdline += ["-e", f"@{vars_file}"]
        try:
            # init_runner + run is what ansible_runner.run does; in between, the environment
            # ansible-runner seeded from ours (HF_TOKEN, registry and webhook secrets...) is cut
            # down to what Ansible needs, before ansible-runner records it in the `command`
            # artifact: a SIGKILL of the controller then leaves no secret behind (the scrub in
            # `finally` never runs after a SIGKILL).
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
            close_masters(control_dir)  # none outlive the run (config.py: ControlPersist)
            scrub_command_env(artifacts_dir / "command", redactor)
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
    return PlaybookResult(
        run_id=run_id,
        playbook=str(path),
        artifacts_dir=artifacts_dir,
        hosts=hosts,
        elapsed=elapsed,
        status=status,
        rc=rc,
        check=check,
    )


def _error_lines(stdout: Path) -> list[str]:
    try:
        lines = [ln.strip() for ln in stdout.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []
    errs = [
        ln for ln in lines if ln.startswith(("ERROR!", "[ERROR]", "[WARNING]: Could not match"))
    ]
    return (errs or lines)[-3:]
