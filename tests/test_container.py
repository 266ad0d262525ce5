"""The one container model, read from real ``docker inspect`` output (tests/fixtures/docker)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from fleetctl import container
from fleetctl.container import Container, from_inspect

FIXTURES = Path(__file__).parent / "fixtures" / "docker"
DIGEST = "sha256:" + "4e" * 32
TAG = "2026-07-01-v0.24.0"
IMAGE = f"ghcr.io/aeon-7/aeon-vllm-ultimate:{TAG}"


@pytest.fixture
def captured() -> dict[str, dict[str, Any]]:
    """``vllm`` (running, fleetctl's labels) and ``vllm.prev`` (exited 1, restarted twice)."""
    items = json.loads((FIXTURES / "inspect-vllm-and-prev.json").read_text())
    return {c["Name"].lstrip("/"): c for c in items}


def test_a_running_container_as_the_rollout_starts_one(captured: dict[str, dict[str, Any]]) -> None:
    c = from_inspect(captured["vllm"])
    assert (c.name, c.running, c.status, c.exists) == ("vllm", True, "running", True)
    assert (c.image, c.tag, c.digest) == (IMAGE, TAG, None)  # no fleetctl.digest, no RepoDigests
    assert c.id == captured["vllm"]["Id"] and c.restart_count == 0 and c.exit_code is None
    assert c.started_at == captured["vllm"]["State"]["StartedAt"]
    assert (c.recipe, c.rollout, c.fingerprint) == (
        "qwen36-35b-heretic",
        "ro-20260701-0001",
        "abc123",
    )
    assert set(c.labels) == {
        "fleetctl.recipe",
        "fleetctl.tag",
        "fleetctl.rollout",
        "fleetctl.fingerprint",
    }
    s = c.settings
    assert s["env_names"] == ["HF_TOKEN", "VLLM_API_KEY", "VLLM_USE_V1"]
    assert (s["network_mode"], s["ipc_mode"], s["restart"], s["gpus"]) == (
        "host",
        "host",
        "unless-stopped",
        False,
    )
    assert (
        s["binds"] == ["/tmp/mdk/w:/models:ro"]
        and s["entrypoint"] == ["/bin/sleep"]
        and s["cmd"] == ["3600"]
    )
    # The env values (secrets) are dropped by the parser, whoever sent them.
    assert (
        "s3cret" in json.dumps(captured["vllm"])
        and "s3cret" not in repr(c)
        and "k3y" not in repr(c)
    )


def test_an_exited_container_restarted_by_docker(captured: dict[str, dict[str, Any]]) -> None:
    c = from_inspect(captured["vllm.prev"])
    assert (c.name, c.running, c.status, c.exit_code, c.restart_count) == (
        "vllm.prev",
        False,
        "exited",
        1,
        2,
    )
    assert c.tag == TAG  # from the reference: no labels
    assert (c.recipe, c.rollout, c.fingerprint, dict(c.labels)) == (None, None, None, {})
    assert c.settings["restart"] == "on-failure"


def test_digest_from_the_label_then_the_reference_then_the_repo_digests(
    captured: dict[str, dict[str, Any]],
) -> None:
    """Changed from the capture: a digest-pinned reference and RepoDigests (a registry's image)."""
    by_digest = copy.deepcopy(captured["vllm.prev"])
    by_digest["Config"]["Image"] = f"10.78.6.1:5000/aeon-7/aeon-vllm-ultimate@{DIGEST}"
    c = from_inspect(by_digest, ["ghcr.io/aeon-7/aeon-vllm-ultimate@sha256:" + "0" * 64])
    assert c.digest == DIGEST and c.tag is None  # never the digest's hex as a tag
    by_tag = from_inspect(captured["vllm.prev"], [f"ghcr.io/aeon-7/aeon-vllm-ultimate@{DIGEST}"])
    assert by_tag.digest == DIGEST and by_tag.tag == TAG
    labelled = copy.deepcopy(captured["vllm"])
    labelled["Config"]["Labels"]["fleetctl.digest"] = DIGEST
    assert from_inspect(labelled, ["x@sha256:" + "1" * 64]).digest == DIGEST
    # a registry port is not a tag
    assert container.image_tag("10.78.6.1:5000/aeon-7/x", {}) is None


def test_a_container_in_its_restart_back_off_is_not_running(
    captured: dict[str, dict[str, Any]],
) -> None:
    """Changed from the capture: Docker's state while it waits to restart a crashed container."""
    backing_off = copy.deepcopy(captured["vllm"])
    backing_off["State"].update(
        {"Status": "restarting", "Restarting": True, "Running": True, "ExitCode": 1}
    )
    c = from_inspect(backing_off)
    assert not c.running and c.status == "restarting" and c.exit_code == 1


def test_gpus_are_seen_in_the_device_requests(captured: dict[str, dict[str, Any]]) -> None:
    """Changed from the capture: ``--gpus all`` as Docker records it."""
    gpu = copy.deepcopy(captured["vllm"])
    gpu["HostConfig"]["DeviceRequests"] = [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]
    assert from_inspect(gpu).settings["gpus"] is True


def test_a_gone_container_for_the_soak() -> None:
    gone = container.absent("vllm")
    assert gone == Container("vllm", status="absent", exists=False) and not gone.running
