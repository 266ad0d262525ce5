"""Preflight on a real fleet's access: the admin user's rights are checked once per host, before
any change, and a host that lacks them is refused with the user, what is missing and the fix.

The lab logs in as ``nvidia`` through its bastion; ``lab node --revoke-access`` takes sudo and
the docker group away from that user on one node, as on a half-set-up Spark.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from fleetctl import lab as fleetlab
from fleetctl import paths

pytestmark = pytest.mark.lab

FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
Fault = Callable[..., AbstractContextManager[fleetlab.LabNode]]


def _serving_id(name: str) -> str:
    """The image ID of the node's serving container, read without SSH (its rights are what is
    tested)."""
    r = fleetlab.node_exec(
        name,
        [
            "sh",
            "-c",
            "docker ps --filter name=vllm --format '{{.Image}} {{.ID}}'; "
            "docker inspect --format '{{.Image}}' $(docker ps -q --filter name=vllm)",
        ],
    )
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    return r.stdout.strip()


def _rollout(
    env: dict[str, str], name: str, inventory: Path | None = None
) -> subprocess.CompletedProcess[str]:
    where = ["-i", str(inventory)] if inventory is not None else []
    return subprocess.run(
        [FLEETCTL, *where, "rollout", "--tag", "v0.24.0", "--limit", name, "--soak", "3s", "--yes"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_user_without_sudo_or_docker_is_refused_at_preflight(
    serving: Any, lab_fault: Fault
) -> None:
    del serving
    before = _serving_id("spark-04")
    with lab_fault("spark-04", revoked_access=True):
        r = _rollout(dict(os.environ), "spark-04")
        after = _serving_id("spark-04")
    assert r.returncode != 0, r.stdout
    err = " ".join(r.stderr.split())
    # Without a sudoers line sudo still asks for a password (it never tells who may use it before
    # that).
    assert (
        "spark-04" in err
        and "sudo asks nvidia for a password" in err
        and "nothing was changed" in err
    ), err
    assert "can run docker neither as a member of the docker group nor through sudo" in err, err
    # the fix names the sudoers line and the group, for this user
    assert (
        "NOPASSWD: ALL' > /etc/sudoers.d/fleetctl" in err and "usermod -aG docker nvidia" in err
    ), err
    assert after == before


def test_a_vaulted_become_password_needs_the_vault_password(serving: Any, tmp_path: Path) -> None:
    """spark-02's sudo asks for the password: without the vault password the rollout says so and
    changes nothing. The lab's inventory names its password file in an ansible.cfg beside it
    (found by fleetctl): a copy without that file is an inventory that gives none."""
    del serving
    before = _serving_id("spark-02")
    inventory = tmp_path / "inventory"
    shutil.copytree(paths.lab_inventory().parent, inventory,
                    ignore=shutil.ignore_patterns("ansible.cfg"))
    env = {k: v for k, v in os.environ.items() if k != "ANSIBLE_VAULT_PASSWORD_FILE"}
    env["FLEETCTL_STATE_DIR"] = str(tmp_path / "state")
    r = _rollout(env, "spark-02", inventory / paths.lab_inventory().name)
    assert r.returncode != 0, r.stdout
    err = " ".join(r.stderr.split())
    assert "spark-02" in err and "vault-encrypted and no vault password was given" in err, err
    assert "--vault-password-file" in err, err
    assert _serving_id("spark-02") == before
