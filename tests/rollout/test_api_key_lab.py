"""A recipe requiring VLLM_API_KEY on a lab node: the real container enforces it, the gate passes
with it, and its value is in no file the controller writes nor in the container's command line."""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleetctl import inventory, ssh
from fleetctl.rollout import host as remote
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options
from tests.plugins.serving import LAB_SOAK

pytestmark = pytest.mark.lab

KEY = "sk-lab-" + secrets.token_hex(12)


def keyed_inventory(d: Path) -> inventory.Inventory:
    """The lab's inventory with its default recipe requiring VLLM_API_KEY (nothing else changed)."""
    lab = inventory.load(None)
    src = Path(lab.path).parent
    (d / "group_vars" / "all").mkdir(parents=True)
    shutil.copy(src / "hosts.yml", d / "hosts.yml")
    if (src / "host_vars").is_dir():
        (d / "host_vars").symlink_to((src / "host_vars").resolve())
    for f in (src / "group_vars" / "all").iterdir():
        if f.name != "recipes.yml":
            (d / "group_vars" / "all" / f.name).symlink_to(f.resolve())
    raw: dict[str, Any] = yaml.safe_load((src / "group_vars" / "all" / "recipes.yml").read_text())
    raw["fleetctl_recipes"][raw["fleetctl_recipe"]]["secret_env"] = ["VLLM_API_KEY"]
    (d / "group_vars" / "all" / "recipes.yml").write_text(yaml.safe_dump(raw))
    return inventory.load(d / "hosts.yml")


def _wait_health(url: str, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} never answered /health")


@pytest.fixture
def keyed(serving: Any, tmp_path: Path) -> Iterator[tuple[inventory.Inventory, str]]:
    """The last node, to be served by the keyed recipe; its previous container is restored after."""
    del serving
    inv = keyed_inventory(tmp_path / "inv")
    name = list(inv.hosts)[-1]
    yield inv, name
    h = inv.host(name)
    remote.restore(h, remote.container_name(h))
    _wait_health(f"http://{h.address}:8000")
    ssh.close_all()


def test_a_keyed_recipe_serves_only_with_the_key_and_stores_it_nowhere(
        keyed: tuple[inventory.Inventory, str], tmp_path: Path) -> None:
    inv, name = keyed
    h = inv.host(name)
    key_file = tmp_path / "vllm.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    state = tmp_path / "state"
    eng = Engine(inv, secrets={"VLLM_API_KEY_FILE": str(key_file)}, state_dir=state)
    try:
        r = eng.rollout(Options(tag="v0.24.0", limit=name, soak=LAB_SOAK))
    finally:
        eng.close()
    # The gate (readiness, identity, smoke, soak) passed: it sent the key.
    assert r.status == "completed", r.error
    base = f"http://{h.address}:8000"
    assert httpx.get(base + "/health", timeout=10).status_code == 200
    assert httpx.get(base + "/v1/models", timeout=10).status_code == 401
    ok = httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert ok.status_code == 200
    written = [p for p in state.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert written == []
    # By name only on the host: not in the container's command line nor any process's arguments.
    cmd = ssh.docker(
        h, "docker inspect vllm --format '{{json .Config.Cmd}} {{json .Args}}'", timeout=30
    )
    assert cmd.ok and KEY not in cmd.stdout
    ps = ssh.run(h, ["ps", "-eo", "args"], timeout=30)
    assert ps.ok and KEY not in ps.stdout
