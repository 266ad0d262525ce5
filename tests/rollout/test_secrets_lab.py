"""Secrets set in the controller's environment, and the vault-encrypted become password of the
inventory, are written nowhere: not in the state dir (ledger, run artifacts, ansible-runner's
records, baselines), not in the lab's inventory, not in reports, not on the host's state file or its
container, after a stage, a soak and a rollout, even one SIGKILLed mid-soak. The host is the lab's
node whose sudo asks for the password, so every step that escalates there sends it."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, ssh
from fleetctl.lab import access, layout
from fleetctl.rollout import host as remote
from fleetctl.state import hoststate
from tests.plugins.serving import BASE_TAG, serve

pytestmark = pytest.mark.lab

TOKEN = secrets.token_hex(16)
SECRETS = {
    "HF_TOKEN": f"hf_{TOKEN}a",
    "VLLM_API_KEY": f"sk-{TOKEN}b",
    "FLEETCTL_REGISTRY_USER": "robot",
    "FLEETCTL_REGISTRY_PASSWORD": f"pw-{TOKEN}c",
    # Unreachable on purpose: events fail, the rollout does not, and the URL's token is never
    # written.
    "FLEETCTL_WEBHOOK_URL": f"https://127.0.0.1:9/hooks/{TOKEN}d",
}
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
VALUES = {k: v for k, v in SECRETS.items() if k != "FLEETCTL_REGISTRY_USER"}


def _fleetctl(
    env: dict[str, str], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEETCTL, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _leaks(root: Path, values: dict[str, str]) -> list[str]:
    out = []
    for f in root.rglob("*"):
        if f.is_file() and not f.is_symlink():
            try:
                data = f.read_bytes()
            except OSError:
                continue
            out += [f"{f}: {k}" for k, v in values.items() if v.encode() in data]
    return out


def test_secrets_of_the_environment_are_written_nowhere(serving: Any, tmp_path: Path) -> None:
    del serving
    # The rollout below must have something to do: every node on the base version first (an
    # earlier test of this lab may have left one on v0.24.0; a no-op when none did).
    serve(BASE_TAG)
    inv = inventory.load(None)
    name = next(n for n, h in inv.hosts.items() if h.become.password is not None)
    h = inv.host(name)
    values = {**VALUES, "ansible_become_password": access.become_password(layout.current())}
    state = tmp_path / "state"
    reports = tmp_path / "reports"
    env = {
        **os.environ,
        **SECRETS,
        "FLEETCTL_STATE_DIR": str(state),
        "FLEETCTL_INVENTORY": str(inv.path),
    }
    try:
        st = _fleetctl(env, "stage", "--limit", name)
        assert st.returncode == 0, st.stderr[-2000:]
        so = _fleetctl(
            env,
            "soak",
            "--limit",
            name,
            "--duration",
            "3s",
            "--json-report",
            str(reports / "soak.json"),
            "--junit",
            str(reports / "soak.xml"),
            "--html",
            str(reports / "soak.html"),
        )
        assert so.returncode == 0, so.stderr[-2000:]
        # A rollout SIGKILLed while its canary soaks: nothing cleans up after it, so nothing may be
        # there.
        p = subprocess.Popen(
            [FLEETCTL, "rollout", "--tag", "v0.24.0", "--limit", name, "--soak", "60s", "--yes"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + 300
        while not list(state.glob("runs/ro-*/**/samples.jsonl")):
            assert p.poll() is None, p.communicate()[0][-2000:]
            assert time.monotonic() < deadline, "the canary's soak never started"
            time.sleep(0.5)
        os.killpg(p.pid, signal.SIGKILL)
        out = p.communicate()[0]
        ab = _fleetctl(env, "rollout", "abort", "--yes", "--force")
        assert ab.returncode == 0, ab.stdout[-2000:] + ab.stderr[-2000:]
        for text in (st.stdout, st.stderr, so.stdout, so.stderr, out, ab.stdout, ab.stderr):
            assert not [k for k, v in values.items() if v in text], "a secret was printed"
        assert not _leaks(state, values), _leaks(state, values)
        assert not _leaks(reports, values), _leaks(reports, values)
        assert not _leaks(Path(inv.path).parent, values), _leaks(Path(inv.path).parent, values)
        # On the host: its fleetctl state file, and what `docker inspect` shows of its container.
        on_host = ssh.run(
            h,
            f"cat {hoststate.state_file(h)}; docker inspect {remote.container_name(h)}",
            timeout=30,
            become=True,
        ).stdout
        assert on_host.strip() and not [k for k, v in values.items() if v in on_host]
    finally:
        serve(BASE_TAG)
        ssh.close_all()
