"""A recipe's YAML checked field by field and built into a :class:`Recipe`: every problem is
collected (not only the first), each naming the field and the fix."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from fleetctl.recipes.argv import has_flag
from fleetctl.recipes.problems import RecipeProblem
from fleetctl.recipes.recipe import Recipe
from fleetctl.recipes.topology import build_topology
from fleetctl.recipes.weights import SOURCES, build_caches, build_weights

_RECIPE_KEYS = {
    "description", "image", "served_model_names", "port", "weights", "vllm_args", "env",
    "secret_env", "docker_args", "soak", "min_free_gb", "source", "trust_remote_code", "topology",
    "compile_cache",
}


_REQUIRED_RECIPE_KEYS = ("image", "served_model_names", "weights", "vllm_args")


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


_SECRET_HINT = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|_KEY$", re.IGNORECASE)


#: An OCI repository name with an optional registry host[:port] (docker's reference grammar).
_IMAGE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?/)?"
                    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*\Z")


#: Flags fleetctl sets itself from other recipe fields; repeating them in vllm_args would conflict.
_OWN_FLAGS = ("--served-model-name",)
_JINJA = ("{{", "{%", "{#")


def _templated(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(field path, text) of every string under ``value`` that Ansible would render as a template."""
    if isinstance(value, str):
        if any(m in value for m in _JINJA):
            yield where or "(recipe)", value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _templated(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _templated(v, f"{where}[{i}]")


def build_recipe(name: str, body: Any, problems: list[RecipeProblem]) -> Recipe | None:
    """A Recipe from raw data, or None when its shape is too broken to check its rules."""
    n0 = len(problems)

    def bad(fld: str, problem: str, fix: str) -> None:
        problems.append(RecipeProblem(name, fld, problem, fix))

    if not isinstance(body, Mapping):
        bad("(recipe)", f"must be a mapping, not {type(body).__name__}", "give the recipe image:, weights:, vllm_args:, ...")
        return None
    for key in sorted(set(body) - _RECIPE_KEYS):
        bad(str(key), "unknown field", f"remove it, or use one of: {', '.join(sorted(_RECIPE_KEYS))}")
    for fld, text in _templated(body):
        # fleetctl validates and uses the text as written, but Ansible would render it (and run its
        # lookups, on the controller) when a playbook gets the recipe: the two would differ.
        bad(fld, f"holds a Jinja template ({text[:60]!r}): recipes are data, not templates",
            "write the value out; a value that differs per host belongs in host_vars, not in a template")
    for key in _REQUIRED_RECIPE_KEYS:
        if key not in body:
            bad(key, "is missing", f"add {key}: to the recipe")

    image = body.get("image", "")
    if not isinstance(image, str) or not image:
        if "image" in body:
            bad("image", "must be a non-empty string", "e.g. image: ghcr.io/aeon-7/aeon-vllm-ultimate")
    elif "@" in image or ":" in image.rsplit("/", 1)[-1]:
        bad("image", f"{image!r} carries a tag or digest", "give the repository only; the rollout chooses the tag")
    elif not _IMAGE.match(image):
        bad("image", f"{image!r} is not an image repository name", "lowercase letters, digits and . _ - between "
            "slashes, after an optional registry host[:port], e.g. ghcr.io/aeon-7/aeon-vllm-ultimate")

    names = body.get("served_model_names", [])
    if not _is_str_list(names) or ("served_model_names" in body and not names):
        if "served_model_names" in body:
            bad("served_model_names", "must be a non-empty list of strings", "e.g. served_model_names: [qwen36-fast]")
        names = []
    elif len(set(names)) != len(names):
        bad("served_model_names", "repeats a name", "list each alias once")

    port = body.get("port", 8000)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        bad("port", f"{port!r} is not a TCP port", "use a number from 1 to 65535 (vLLM's default is 8000)")
        port = 8000

    args = body.get("vllm_args", [])
    if not isinstance(args, list) or not all(isinstance(a, str | int | float) and not isinstance(a, bool) for a in args):
        if "vllm_args" in body:
            bad("vllm_args", "must be a list of strings (one flag or value per item)", "quote numbers: - \"0.70\"")
        args = []
    args = [str(a) for a in args]
    if args and args[0] == "serve":
        bad("vllm_args", "starts with 'serve'", "leave out 'serve MODEL': fleetctl adds them from the body's mount")
    for own in _OWN_FLAGS:
        if has_flag(args, own):
            bad("vllm_args", f"sets {own}", "list the names in served_model_names instead")

    env_raw = body.get("env") or {}
    env: dict[str, str] = {}
    if not isinstance(env_raw, Mapping):
        bad("env", "must be a mapping of NAME: value", "e.g. env: {VLLM_USE_FLASHINFER_SAMPLER: \"1\"}")
    else:
        for k, v in env_raw.items():
            if not isinstance(k, str) or not _ENV_NAME.match(k):
                bad("env", f"{k!r} is not an environment variable name", "use letters, digits and _")
            elif isinstance(v, Mapping | list) or v is None:
                bad(f"env.{k}", "must be a scalar value", "quote it as a string")
            elif _SECRET_HINT.search(k):
                bad(f"env.{k}", "looks like a secret stored in the inventory",
                    f"remove it from env and list {k} in secret_env; its value then comes from the controller's environment")
            else:
                env[k] = str(v).lower() if isinstance(v, bool) else str(v)

    secret_env = body.get("secret_env") or []
    if not _is_str_list(secret_env) or not all(_ENV_NAME.match(s) for s in secret_env):
        bad("secret_env", "must be a list of environment variable names", "e.g. secret_env: [HF_TOKEN]")
        secret_env = []

    docker_args = body.get("docker_args") or []
    if not _is_str_list(docker_args):
        bad("docker_args", "must be a list of strings", "e.g. docker_args: [--shm-size=16g]")
        docker_args = []

    soak = body.get("soak") or {}
    if not isinstance(soak, Mapping):
        bad("soak", "must be a mapping", "see fleetctl.soak.config for its keys")
        soak = {}

    min_free = body.get("min_free_gb", 0)
    if isinstance(min_free, bool) or not isinstance(min_free, int | float) or min_free < 0:
        bad("min_free_gb", f"{min_free!r} is not a size in GB", "e.g. min_free_gb: 35")
        min_free = 0

    source = body.get("source")
    if source is not None and source not in SOURCES:
        bad("source", f"{source!r} is not a weights source", f"use one of: {', '.join(SOURCES)} (or leave it out)")
        source = None

    desc = body.get("description", "")
    trust = body.get("trust_remote_code", False)
    if not isinstance(trust, bool):
        bad("trust_remote_code", f"{trust!r} is not true or false", "write trust_remote_code: true (or leave it out)")
        trust = False
    weights = build_weights(body.get("weights"), "weights" in body, bad)
    topology = build_topology(body.get("topology"), args, env, bad)
    caches = build_caches(body.get("compile_cache"), [w.mount for w in weights], bad)

    if len(problems) > n0 and not weights:
        return None
    if weights and sum(w.role == "body" for w in weights) != 1:
        bad("weights", f"has {sum(w.role == 'body' for w in weights)} body sets", "give exactly one weight set with role: body")
        return None
    if not weights:
        return None
    return Recipe(
        name=name, image=str(image), served_model_names=tuple(names), port=int(port), weights=tuple(weights),
        vllm_args=tuple(args), env=env, secret_env=tuple(secret_env), docker_args=tuple(docker_args),
        soak=dict(soak), min_free_gb=float(min_free), source=source, description=str(desc),
        trust_remote_code=trust, topology=topology, compile_cache=caches,
    )


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)
