"""The docker run argv of a recipe and what is read back from docker inspect, from data."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fleetctl import inventory
from fleetctl.errors import FleetError
from fleetctl.recipes import STAGED_MARKER as MARKER
from fleetctl.recipes import load_recipes
from fleetctl.rollout import api, results, session
from fleetctl.rollout import host as remote
from fleetctl.rollout.results import RollbackOptions

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "d" * 64


@pytest.fixture
def lab_inventory(tmp_path: Path) -> inventory.Inventory:
    (tmp_path / "group_vars").symlink_to(REPO / "inventory" / "lab" / "group_vars")
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    s1: {ansible_host: 10.0.0.1}\n")
    return inventory.load(tmp_path / "hosts.yml")


def test_run_argv_pins_the_digest_labels_mounts_and_names_secrets_only(
    lab_inventory: inventory.Inventory,
) -> None:
    recipe = next(iter(load_recipes(lab_inventory).values()))
    recipe = dataclasses.replace(recipe, secret_env=("HF_TOKEN", "VLLM_API_KEY"))
    h = lab_inventory.host("s1")
    ref = f"10.0.0.1:5000/aeon-7/x@{DIGEST}"
    argv = remote.run_argv(
        h, remote.StartRequest(recipe, ref, "2026-07-01-v0.24.0", DIGEST, "ro-1"), "vllm"
    )
    assert argv[:5] == ["docker", "run", "-d", "--name", "vllm"]
    for flag in (["--gpus", "all"], ["--ipc", "host"], ["--network", "host"]):
        i = argv.index(flag[0])
        assert argv[i:i + 2] == flag
    assert f"fleetctl.digest={DIGEST}" in argv and "fleetctl.rollout=ro-1" in argv
    assert f"fleetctl.recipe={recipe.name}" in argv and "fleetctl.tag=2026-07-01-v0.24.0" in argv
    for src, dst in recipe.mounts():
        assert f"{src}:{dst}:ro" in argv
    i = argv.index("--entrypoint")
    assert argv[i:i + 3] == ["--entrypoint", "vllm", ref] and argv[i + 3:] == recipe.serve_argv()
    # the secret is passed by name: docker takes the value from the environment the command runs in
    assert argv[argv.index("VLLM_API_KEY") - 1] == "-e" and not any(
        "VLLM_API_KEY=" in a for a in argv
    )
    # the hub token never enters a serving container: weights are staged before
    assert not any("HF_TOKEN" in a for a in argv)


def test_command_line_hides_the_webhook_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["/x/fleetctl", "rollout", "--tag", "v1", "--webhook", "https://h/T0KEN"])
    assert session.command_line() == "fleetctl rollout --tag v1 --webhook '***'"
    monkeypatch.setattr("sys.argv", ["fleetctl", "rollout", "--webhook=https://h/T0KEN"])
    assert "T0KEN" not in session.command_line()


def test_weights_count_as_staged_only_with_the_stage_marker_for_the_recipes_repo_and_revision(
        lab_inventory: inventory.Inventory) -> None:
    recipe = next(iter(load_recipes(lab_inventory).values()))
    assert recipe.weights
    good = {w.path: {"repo": w.repo, "revision": w.revision, "files": []} for w in recipe.weights}
    assert remote.unstaged_weights(recipe, good) == ()
    first = recipe.weights[0]
    absent = remote.unstaged_weights(recipe, {**good, first.path: None})
    assert (
        len(absent) == 1
        and first.role in absent[0]
        and first.path in absent[0]
        and MARKER in absent[0]
    )
    older = remote.unstaged_weights(
        recipe, {**good, first.path: {"repo": first.repo, "revision": "0ld"}}
    )
    assert len(older) == 1 and "@0ld instead" in older[0]
    broken = remote.unstaged_weights(recipe, {**good, first.path: "unreadable: Expecting value"})
    assert len(broken) == 1 and "unreadable" in broken[0]
    assert len(remote.unstaged_weights(recipe, {})) == len(recipe.weights)


def test_a_bad_webhook_or_a_missing_api_key_is_refused_before_any_host_is_touched(
    lab_inventory: inventory.Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEETCTL_WEBHOOK_URL", raising=False)
    eng = api.Engine(lab_inventory, secrets={}, state_dir=tmp_path / "state")
    try:
        # the host s1 (10.0.0.1) is never contacted: both refusals come before planning
        with pytest.raises(FleetError) as e:
            eng.rollout(results.Options(tag="v1", webhook="http://hooks.example.com/T0/s3cretT0KEN"))
        assert "plain http" in e.value.cause and "s3cret" not in e.value.message()
        with pytest.raises(FleetError) as e:
            eng.rollback(RollbackOptions(to="v1", webhook="https://hooks.example.com/x y"))
        assert "whitespace" in e.value.cause
        recipe = next(iter(load_recipes(lab_inventory).values()))
        with pytest.raises(FleetError) as e:
            eng.session.check_recipe(dataclasses.replace(recipe, secret_env=("VLLM_API_KEY",)))
        assert "requires VLLM_API_KEY" in e.value.cause
    finally:
        eng.close()


_FAKE_DOCKER = r"""#!/bin/bash
# A docker CLI over a directory: a file per container holding its state; `refuse-rm` names one rm
# cannot remove.
d=$DOCKER_STATE
case "$1" in
  rm) n=${@: -1}; [ -f "$d/$n" ] || exit 0; [ "$(cat "$d/refuse-rm" 2>/dev/null)" = "$n" ] && exit 1; rm "$d/$n";;
  inspect) [ -f "$d/${@: -1}" ];;
  stop) [ -f "$d/${@: -1}" ] && sed -i 's/running/exited/' "$d/${@: -1}";;
  rename) [ -f "$d/$2" ] && [ ! -f "$d/$3" ] && mv "$d/$2" "$d/$3";;
  *) exit 2;;
esac
"""  # noqa: E501 (data: lines as the program reads them)


@pytest.mark.parametrize("refuse", [False, True])
def test_the_retire_shell_never_leaves_the_serving_version_stopped_in_place(
    tmp_path: Path, refuse: bool
) -> None:
    import os
    import subprocess
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "docker").write_text(_FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    (state / "vllm").write_text("serving running")
    (state / "vllm.prev").write_text("older exited")
    if refuse:
        (state / "refuse-rm").write_text("vllm.prev")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DOCKER_STATE": str(state)}
    r = subprocess.run(
        ["bash", "-c", remote.retire_script("vllm", 0)], env=env, capture_output=True, text=True
    )
    if refuse:
        # Nothing changed: the serving version still runs under its name; the error says why.
        assert r.returncode != 0 and "could not remove the older vllm.prev" in r.stderr
        assert (state / "vllm").read_text() == "serving running"
    else:
        assert r.returncode == 0, r.stderr
        assert (
            not (state / "vllm").exists() and (state / "vllm.prev").read_text() == "serving exited"
        )
