"""The vllm_serve role's container module: it renders what the controller's rollout runs, bit for
bit.

The controller (fleetctl.rollout.host.run_argv) and the role take turns on one fleet, so the
module's ``docker run`` argv must equal the controller's for every seed recipe, and the
comparison that decides "already right" must ignore only the run id.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml

from fleetctl import paths, registry, warmcache
from fleetctl.inventory import Host
from fleetctl.recipes import parse_recipes
from fleetctl.rollout import host as remote
from tests.role_modules import load_role_file

vc = load_role_file("vllm_serve", "library/vllm_container.py")

SEED_FILE = paths.project_root() / "inventory" / "lab" / "group_vars" / "all" / "recipes.yml"
DIGEST = "sha256:" + "ab" * 32
RAW: dict[str, Any] = yaml.safe_load(SEED_FILE.read_text())["fleetctl_recipes"]


@pytest.mark.parametrize("name", sorted(RAW))
def test_the_docker_run_argv_is_the_controllers(name: str) -> None:
    recipe = parse_recipes(RAW)[name]
    mirrors = {"ghcr.io": "10.78.0.1:5000"}
    ref = registry.pull_ref(recipe.image, DIGEST, mirrors)
    host = Host("spark-01", "10.0.0.1")
    want = remote.run_argv(host, remote.StartRequest(recipe, ref, "v0.24.0", DIGEST, "r-1"), "vllm")
    label = f"fleetctl.fingerprint={vc.fingerprint(RAW[name])}"
    controller_fingerprint = getattr(remote, "fingerprint", None)
    if controller_fingerprint is not None:
        assert controller_fingerprint(recipe) == vc.fingerprint(RAW[name])
    elif label not in want:
        # A controller from before the fingerprint label: the role puts it right after
        # fleetctl.image.
        i = want.index(f"fleetctl.image={recipe.image}") + 1
        want = [*want[:i], "--label", label, *want[i:]]
    assert vc.pull_ref(RAW[name]["image"], DIGEST, mirrors) == ref
    assert vc.render(name, RAW[name], ref, "v0.24.0", DIGEST, "r-1", "vllm") == want
    # With a compile-cache key: the same cache mounts and key variable (none for a recipe without
    # caches).
    key = "0f" * 16
    keyed = remote.run_argv(
        host, remote.StartRequest(recipe, ref, "v0.24.0", DIGEST, "r-1", cache_key=key), "vllm"
    )
    assert vc.render(name, RAW[name], ref, "v0.24.0", DIGEST, "r-1", "vllm", None, key) == keyed
    assert (keyed != want) == bool(recipe.compile_cache)
    assert vc.COMPILE_CACHE_ROOT == warmcache.ROOT and vc.COMPILE_CACHE_KEY_ENV == warmcache.KEY_ENV


@pytest.mark.parametrize(("image", "mirrors"), [
    ("ghcr.io/aeon-7/aeon-vllm-ultimate", {}),
    ("ghcr.io/aeon-7/aeon-vllm-ultimate", {"ghcr.io": "http://mirror.lan:5000/"}),
    ("vllm/vllm-openai", {}),
    ("ubuntu", {}),
    ("ubuntu", {"docker.io": "mirror.lan"}),
    ("localhost:5000/x/y", {}),
])
def test_the_pull_reference_is_the_registry_modules(image: str, mirrors: dict[str, str]) -> None:
    assert vc.pull_ref(image, DIGEST, mirrors) == registry.pull_ref(image, DIGEST, mirrors)


def _inspect_of(argv: list[str], running: bool = True) -> dict[str, Any]:
    """What ``docker inspect`` shows for a container started with ``argv`` (the fields compared)."""
    i = argv.index("--entrypoint")
    opts, ref, cmd = argv[4:i], argv[i + 2], argv[i + 3:]
    pairs = list(itertools.pairwise(opts))
    labels = dict(v.split("=", 1) for k, v in pairs if k == "--label")
    env = [v for k, v in pairs if k == "-e" and "=" in v]
    # docker keeps the last --restart given; inspect names the policy without its :max-retries.
    restart = (
        [v for k, v in pairs if k == "--restart"]
        + [o.split("=", 1)[1] for o in opts if o.startswith("--restart=")]
        or ["no"]
    )[-1]
    return {
        "Name": "/" + argv[4],
        "State": {"Running": running},
        "Config": {
            "Image": ref,
            "Entrypoint": ["vllm"],
            "Cmd": cmd,
            "Env": [*env, "PATH=/usr/bin"],
            "Labels": {**labels, "maintainer": "x"},
        },
        "HostConfig": {
            "Binds": [v for k, v in pairs if k == "-v"],
            "NetworkMode": "host",
            "IpcMode": "host",
            "DeviceRequests": [{"Count": -1}],
            "RestartPolicy": {"Name": restart.split(":")[0]},
        },
    }


def _diff(
    argv_run: list[str], raw: dict[str, Any], digest: str = DIGEST, running: bool = True
) -> list[str]:
    ref = vc.pull_ref(raw["image"], digest)
    want = vc.wanted("qwen36-35b-heretic", raw, ref, "v0.24.0", digest, {}, [])
    return list(vc.differences(want, vc.observed(_inspect_of(argv_run, running), want["env"], [])))


def test_the_same_settings_under_another_run_id_need_no_change() -> None:
    raw = RAW["qwen36-35b-heretic"]
    argv = vc.render(
        "qwen36-35b-heretic",
        raw,
        vc.pull_ref(raw["image"], DIGEST),
        "v0.24.0",
        DIGEST,
        "old-run",
        "vllm",
    )
    assert _diff(argv, raw) == []


def test_a_new_digest_a_new_flag_an_env_value_or_a_stopped_container_are_changes() -> None:
    raw = RAW["qwen36-35b-heretic"]
    old = "sha256:" + "cd" * 32
    argv = vc.render(
        "qwen36-35b-heretic", raw, vc.pull_ref(raw["image"], old), "v0.23.0", old, "r", "vllm"
    )
    assert _diff(argv, raw) == ["image", "label fleetctl.digest", "label fleetctl.tag"]
    changed = {**raw, "vllm_args": [*raw["vllm_args"], "--enforce-eager"],
               "env": {**raw["env"], "NVIDIA_FORWARD_COMPAT": "0"}}
    argv = vc.render(
        "qwen36-35b-heretic",
        changed,
        vc.pull_ref(raw["image"], DIGEST),
        "v0.24.0",
        DIGEST,
        "r",
        "vllm",
    )
    assert _diff(argv, raw) == ["cmd", "env NVIDIA_FORWARD_COMPAT", "label fleetctl.fingerprint"]
    # docker_args are not in docker inspect's compared fields: the fingerprint label catches them.
    argv = vc.render("qwen36-35b-heretic", {**raw, "docker_args": ["--shm-size=8g"]},
                     vc.pull_ref(raw["image"], DIGEST), "v0.24.0", DIGEST, "r", "vllm")
    assert _diff(argv, raw) == ["label fleetctl.fingerprint"]
    argv = vc.render(
        "qwen36-35b-heretic", raw, vc.pull_ref(raw["image"], DIGEST), "v0.24.0", DIGEST, "r", "vllm"
    )
    assert _diff(argv, raw, running=False) == ["running"]
    assert vc.differences({"a": 1}, None) == ["(no container)"]


def test_the_container_comes_back_after_a_reboot_unless_the_recipe_says_otherwise() -> None:
    raw = RAW["qwen36-35b-heretic"]
    ref = vc.pull_ref(raw["image"], DIGEST)
    argv = vc.render("qwen36-35b-heretic", raw, ref, "v0.24.0", DIGEST, "r-1", "vllm")
    assert argv[argv.index("--restart") + 1] == "unless-stopped" == remote.RESTART_POLICY
    assert _diff(argv, raw) == []
    # A container started before the policy (an older fleetctl, or by hand) is replaced by a deploy.
    old = [a for i, a in enumerate(argv) if a != "--restart" and argv[i - 1] != "--restart"]
    assert "restart" in _diff(old, raw)
    # The recipe's own --restart wins: docker keeps the last one given, and the role compares that.
    own = {**raw, "docker_args": [*raw.get("docker_args", []), "--restart=on-failure:3"]}
    argv_own = vc.render("qwen36-35b-heretic", own, ref, "v0.24.0", DIGEST, "r-1", "vllm")
    assert vc.restart_policy(own) == "on-failure" and _diff(argv_own, own) == []
    assert vc.fingerprint(own) != vc.fingerprint(raw)


def test_a_container_in_its_restart_back_off_is_not_running() -> None:
    raw = RAW["qwen36-35b-heretic"]
    argv = vc.render(
        "qwen36-35b-heretic",
        raw,
        vc.pull_ref(raw["image"], DIGEST),
        "v0.24.0",
        DIGEST,
        "r-1",
        "vllm",
    )
    c = _inspect_of(argv)
    c["State"] = {"Running": True, "Restarting": True, "Status": "restarting"}
    assert vc.summary(c)["running"] is False  # type: ignore[index]
    have = vc.observed(c, {}, [])
    assert have is not None and have["running"] is False
    assert vc.retire_plan(have["running"], "r-1", DIGEST, True, "r-2", DIGEST) == "remove"


def test_a_container_on_another_compile_cache_key_is_a_change() -> None:
    raw = RAW["qwen36-35b-heretic"]
    ref = vc.pull_ref(raw["image"], DIGEST)
    k1, k2 = "1" * 32, "2" * 32
    argv = vc.render("qwen36-35b-heretic", raw, ref, "v0.24.0", DIGEST, "r-1", "vllm", None, k1)
    want = vc.wanted("qwen36-35b-heretic", raw, ref, "v0.24.0", DIGEST, {}, [], k1)
    assert vc.differences(want, vc.observed(_inspect_of(argv), want["env"], [])) == []
    other = vc.wanted("qwen36-35b-heretic", raw, ref, "v0.24.0", DIGEST, {}, [], k2)
    assert sorted(vc.differences(other, vc.observed(_inspect_of(argv), other["env"], []))) == [
        "binds", f"env {warmcache.KEY_ENV}"]
