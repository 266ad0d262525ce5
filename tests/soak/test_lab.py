"""The soak gate on the lab: emulator containers on a simulated Spark, judged over its network.

Uses its own container name and port (``soak-test`` on :8123) on the last node so that
it never collides with the rollout's ``vllm`` containers on :8000.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl import inventory, ssh
from fleetctl import lab as fleetlab
from fleetctl.lab import models
from fleetctl.lab.scenarios import AEON_REPOSITORY
from fleetctl.soak.container import DockerOverSSH
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.run import run_soak
from fleetctl.soak.verdict import Outcome, SoakTarget

pytestmark = pytest.mark.lab

NAME = "soak-test"
PORT = 8123
SERVED = ("qwen36-35b-heretic", "qwen36-fast")


def _tar(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(root, arcname=".")
    return buf.getvalue()


@pytest.fixture(scope="module")
def node(lab: fleetlab.LabStatus, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The last lab node, with tiny body + drafter models under /opt/soak-test (removed after)."""
    host_name = lab.nodes[-1].name
    root = tmp_path_factory.mktemp("soak-models")
    models.write_model(root / "body", "qwen36-35b-a3b-nvfp4")
    models.write_model(root / "drafter", "qwen36-35b-a3b-dflash")
    r = fleetlab.node_exec(
        host_name,
        ["sh", "-c", "mkdir -p /opt/soak-test && tar -x -C /opt/soak-test"],
        input=_tar(root),
    )
    assert r.returncode == 0, r.stderr
    host = inventory.load(lab.inventory).host(host_name)
    yield host
    ssh.run(
        host, f"docker rm -f {NAME} >/dev/null 2>&1; rm -rf /opt/soak-test", timeout=60, become=True
    )
    ssh.close_all()


def _serve(lab: fleetlab.LabStatus, host: Any, tag: str, env: str = "") -> SoakTarget:
    ref = f"{lab.registry}/{AEON_REPOSITORY}:{tag}"
    spec = json.dumps({"method": "dflash", "model": "/models/drafter", "num_speculative_tokens": 4})
    cmd = (
        f"docker rm -f {NAME} >/dev/null 2>&1; docker run -d --name {NAME} --network host {env} "
        f"-v /opt/soak-test:/models:ro {ref} serve /models/body --served-model-name "
        f"{' '.join(SERVED)} "
        f"--port {PORT} --max-num-seqs 64 --max-num-batched-tokens 8192 --speculative-config "
        f"'{spec}'"
    )
    ssh.docker(host, cmd, timeout=300).check(f"starting {ref}")
    return SoakTarget(host.name, f"http://{host.address}:{PORT}", DockerOverSSH(host, NAME), tag)


def _config() -> Any:
    return load_config(
        {
            "concurrency": [1, 8, 32],
            "classes": ["coding", "long_context"],
            "max_tokens": 24,
            "long_context_tokens": 1200,
            "sustained": {"duration": 3, "concurrency": 4, "window": 1},
        },
        profile="lab",
        served_model_names=SERVED,
        speculative=True,
    )


def test_healthy_tag_passes_on_a_node(lab: fleetlab.LabStatus, node: Any) -> None:
    target = _serve(lab, node, "2026-06-18-v0.23.0-dflashfix")
    v = run_soak(target, _config(), None)
    assert v.outcome is Outcome.PASS, v.summary
    assert v.version == "0.23.0"
    assert v.check("container").outcome is Outcome.PASS
    assert all(lv.errors == 0 for lv in v.levels)


def test_crash_tag_fails_at_c32_with_the_crash_named(lab: fleetlab.LabStatus, node: Any) -> None:
    target = _serve(lab, node, "2026-06-11-pr41703")
    v = run_soak(target, _config(), None)
    assert v.outcome is Outcome.FAIL
    errors = v.check("errors")
    assert [m.label for m in errors.measurements if m.outcome is Outcome.FAIL] == ["c=32"], (
        errors.message
    )
    assert "block_table" in errors.message
    container = v.check("container")
    assert container.outcome is Outcome.FAIL and "exited with exit code 1" in container.message


def test_boot_failure_fails_readiness_with_the_cause_from_docker_logs(
    lab: fleetlab.LabStatus, node: Any
) -> None:
    # The healthy image with the boot-failure knob set at `docker run` time.
    env = "-e 'EMU_BOOT_FAIL=ValueError: max_num_scheduled_tokens is set to -512'"
    target = _serve(lab, node, "2026-06-18-v0.23.0-dflashfix", env)
    v = run_soak(target, _config(), None)
    assert v.outcome is Outcome.FAIL
    r = v.check("readiness")
    assert r.outcome is Outcome.FAIL and "max_num_scheduled_tokens is set to -512" in r.message
    assert "exited with code 1" in r.message


def test_nothing_serving_on_a_node_is_an_error(lab: fleetlab.LabStatus, node: Any) -> None:
    ssh.docker(node, f"docker rm -f {NAME} >/dev/null 2>&1; true", timeout=60)
    target = SoakTarget(node.name, f"http://{node.address}:{PORT}", DockerOverSSH(node, NAME), "")
    v = run_soak(target, _config(), None)
    assert v.outcome is Outcome.ERROR
    assert "no container" in v.check("readiness").message
