"""The one facts probe and its one parser: what provision, status and the rollout each get from it.

The probe's output is a real capture (tests/fixtures/facts); GPU readings are tested against the
real ``nvidia-smi`` formats in tests/status/test_status.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetctl import facts, inventory, ssh
from fleetctl.ansible import HostResult
from fleetctl.cli.output import to_jsonable
from fleetctl.cli.status import status_json
from fleetctl.container import from_inspect
from fleetctl.inventory import Host
from fleetctl.provision import host_facts
from fleetctl.recipes import STAGED_MARKER, load_recipes
from fleetctl.rollout import host as remote
from fleetctl.status import parse_probe

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "tests" / "fixtures" / "facts" / "no-gpu-docker-20.10.json"
TAG = "2026-07-01-v0.24.0"


@pytest.fixture
def raw() -> dict[str, Any]:
    return dict(json.loads(CAPTURE.read_text()))


def test_the_capture_parses_into_facts(raw: dict[str, Any]) -> None:
    f = facts.parse("h1", CAPTURE.read_text())
    assert (
        f.gpu is None
        and "nvidia-smi" in f.problems["gpu"]
        and f.gpu_or_why.startswith("(nvidia-smi failed")
    )
    assert (f.docker, f.docker_running, f.toolkit, f.dgx_release) == (
        "20.10.24+dfsg1",
        True,
        None,
        None,
    )
    assert f.disk_free_gb == 80.96 and f.image_free_gb == 80.94 and f.uptime_s == 797.98
    assert f.kernel == f.next_kernel == "6.18.44-fc-v657" and f.next_kernel_has_nvidia is False
    assert (
        f.has_image is True
        and f.runtimes is not None
        and "runc" in f.runtimes
        and not f.nvidia_runtime
    )
    assert f.weights == {"/tmp/mdk/w": {"1": 1}, "/tmp/mdk/none": None}
    assert f.health is None and f.health_error and "refused" in f.health_error
    assert (
        set(f.containers) == {"vllm", "vllm.prev", "vllm.swap"}
        and f.containers["vllm.swap"] is None
    )
    assert (
        f.serving is not None and f.serving.tag == TAG and f.serving.recipe == "qwen36-35b-heretic"
    )
    prev = f.containers["vllm.prev"]
    assert prev is not None and (prev.running, prev.exit_code, prev.restart_count) == (False, 1, 2)
    # The probe sends env names only: the values stay on the host.
    assert "s3cret" not in CAPTURE.read_text() and f.serving.settings["env_names"][0] == "HF_TOKEN"


def test_a_real_h100_without_docker() -> None:
    f = facts.parse("h1", (CAPTURE.parent / "h100-no-docker.json").read_text())
    assert (f.gpu, f.driver, f.cuda, f.compute_cap, f.gpu_count) == (
        "NVIDIA H100 80GB HBM3", "580.159.04", "13.0", "9.0", 1)
    assert f.gpu_or_why == f.gpu != remote.GB10  # the rollout's preflight refuses it by name
    assert f.docker is None and "docker" in f.problems and f.serving is None
    assert f.has_image is None and f.runtimes is None and not f.nvidia_runtime  # not asked
    assert f.disk_free_gb == 68.69 and f.health is None


def test_garbage_is_a_clear_error() -> None:
    from fleetctl.errors import FleetError

    with pytest.raises(FleetError, match="printed no JSON"):
        facts.parse("h1", "Traceback (most recent call last):\n  ...")


def _lab_inventory(tmp_path: Path) -> inventory.Inventory:
    (tmp_path / "group_vars").symlink_to(REPO / "inventory" / "lab" / "group_vars")
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    h1: {ansible_host: 10.0.0.1}\n")
    return inventory.load(tmp_path / "hosts.yml")


def test_provision_status_and_the_rollout_get_the_same_facts_and_container(
    raw: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = _lab_inventory(tmp_path)
    host = inv.host("h1")
    recipe = next(iter(load_recipes(inv).values()))
    sent: list[tuple[list[str], str | None]] = []

    def answer(
        h: Host, command: str | list[str], timeout: float = 60.0, stdin: str | None = None, **_: Any
    ) -> ssh.CommandResult:
        sent.append((list(command), stdin))
        return ssh.CommandResult(h.name, "probe", 0, CAPTURE.read_text(), "", 0.1)

    monkeypatch.setattr(ssh, "run", answer)
    rolled = remote.facts(host, recipe, "ref@sha256:x")
    provisioned = host_facts(HostResult("h1", reports={"preflight": raw}))
    probed = facts.from_json("h1", raw)
    status = parse_probe(host, CAPTURE.read_text(), 0.2, 8000)
    vllm = from_inspect(raw["containers"]["vllm"]["inspect"], [])
    assert probed.serving == vllm == status.container == rolled.serving
    assert rolled.previous == probed.containers["vllm.prev"] and rolled.previous is not None
    assert provisioned == probed  # the role reports the same JSON: the same Facts
    # `fleetctl provision --json` keeps the keys its facts had before they were these Facts.
    old_keys = {"gpu", "driver", "cuda", "compute_cap", "docker", "kernel", "next_kernel",
                "next_kernel_has_nvidia", "disk_free_gb", "toolkit"}
    assert old_keys <= set(to_jsonable(provisioned))
    assert (status.gpu, status.docker, status.disk_free_gb) == (
        probed.gpu,
        probed.docker,
        probed.disk_free_gb,
    )
    # The rollout sends the role's own file and asks for its extra facts.
    [(argv, stdin)] = sent
    assert (
        stdin == facts.probe_script() == (REPO / "roles/preflight/files/spark_facts.py").read_text()
    )
    assert argv[:2] == ["python3", "-"] and argv[argv.index("--image") + 1] == "ref@sha256:x"
    assert argv[argv.index("--marker") + 1] == STAGED_MARKER
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--inspect"] == ["vllm", "vllm.prev"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--weights"] == [
        w.path for w in recipe.weights
    ]
    assert len(rolled.missing_weights) == len(recipe.weights)  # none of them is in the capture


def test_the_probe_runs_the_options_the_rollout_sends(tmp_path: Path) -> None:
    """The argv of :func:`fleetctl.facts.argv` as the probe parses it, run on this machine."""
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / STAGED_MARKER).write_text('{"repo": "r", "revision": "1"}')
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / STAGED_MARKER).write_text("{")
    argv = facts.argv(
        image="ref@sha256:x",
        weights=[str(tmp_path / "w"), str(tmp_path / "bad"), "/nope"],
        marker=STAGED_MARKER,
        inspect=["vllm"],
        serving=("vllm", 1),
    )
    env = {
        "PATH": "/nonexistent"
    }  # no docker, no nvidia-smi: every docker fact is None with a reason
    p = subprocess.run(
        [sys.executable, *argv[1:]],
        input=facts.probe_script(),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    f = facts.parse("h1", p.stdout)
    assert (
        f.weights[str(tmp_path / "w")] == {"repo": "r", "revision": "1"}
        and f.weights["/nope"] is None
    )
    assert str(f.weights[str(tmp_path / "bad")]).startswith("unreadable")
    assert f.has_image is False and f.runtimes is None and "docker_runtimes" in f.problems
    assert f.containers == {"vllm": None} and f.serving is None and not f.nvidia_runtime


def test_status_json_keeps_the_container_keys_scripts_read(raw: dict[str, Any]) -> None:
    st = parse_probe(Host("h1", "10.0.0.1"), json.dumps(raw), 0.2, 8000)
    out = json.loads(json.dumps(status_json({"h1": st})))
    c = out["h1"]["container"]
    assert (c["state"], c["restarts"], c["status"], c["restart_count"]) == (
        "running",
        0,
        "running",
        0,
    )
    for key in ("name", "image", "tag", "digest", "running", "started_at", "labels"):
        assert key in c
    assert c["tag"] == TAG and out["h1"]["docker"] == "20.10.24+dfsg1"
