"""A recipe's YAML checked field by field and built into a :class:`Recipe`: every problem is
collected (not only the first), each naming the field and the fix."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fleetctl.recipes.argv import has_flag
from fleetctl.recipes.capabilities import check_capabilities, check_modalities, check_sampling
from fleetctl.recipes.problems import Bad, RecipeProblem
from fleetctl.recipes.recipe import Recipe
from fleetctl.recipes.topology import build_topology
from fleetctl.recipes.weights import (
    MAX_GB,
    SOURCES,
    WeightSet,
    build_caches,
    build_weights,
    is_gb,
)

_RECIPE_KEYS = {
    "description", "image", "served_model_names", "port", "weights", "vllm_args", "env",
    "secret_env", "docker_args", "soak", "min_free_gb", "source", "trust_remote_code", "topology",
    "compile_cache", "watch", "modalities",
}


_REQUIRED_RECIPE_KEYS = ("image", "served_model_names", "weights", "vllm_args")


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


_SECRET_HINT = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|_KEY$", re.IGNORECASE)


#: An OCI repository name with an optional registry host[:port] (docker's reference grammar).
_IMAGE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?/)?"
                    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*\Z")


#: Flags fleetctl sets itself from other recipe fields; repeating them in vllm_args would conflict.
_OWN_FLAGS = ("--served-model-name",)


#: A string starting so is a template to Ansible whatever it holds: the rest of its first line
#: redefines the delimiters (``variable_start_string:'[['``), so ``[[ lookup('pipe','id') ]]`` on
#: the next line runs.
JINJA2_HEADER = "#jinja2:"


@functools.cache
def _ansible_template_test() -> Callable[[str], bool]:
    """ansible-core's own "is this possibly a template" test (a ``#jinja2:`` header, or a
    variable, block or comment start string): the guard refuses what Ansible would render."""
    from ansible.template import Templar  # deferred: loaded with the inventory in any case

    test: Callable[[str], bool] = Templar().is_possibly_template
    return test


def _templated(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(field path, text) of every string under ``value`` that Ansible would render as a
    template."""
    if isinstance(value, str):
        if value.startswith(JINJA2_HEADER) or _ansible_template_test()(value):
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
        bad(
            "(recipe)",
            f"must be a mapping, not {type(body).__name__}",
            "give the recipe image:, weights:, vllm_args:, ...",
        )
        return None
    _check_keys(body, bad)
    image = _image(body, bad)
    names = _served_names(body, bad)
    port = _port(body, bad)
    args = _vllm_args(body, bad)
    env = _env(body, bad)
    secret_env = _str_list(body, "secret_env", bad, "must be a list of environment variable names",
                           "e.g. secret_env: [HF_TOKEN]", _ENV_NAME)
    docker_args = _str_list(body, "docker_args", bad, "must be a list of strings",
                            "e.g. docker_args: [--shm-size=16g]")
    soak = body.get("soak") or {}
    if not isinstance(soak, Mapping):
        bad("soak", "must be a mapping", "see fleetctl.soak.config for its keys")
        soak = {}
    check_capabilities(soak.get("capabilities"), bad)
    check_sampling(soak.get("sampling"), names, bad)
    modalities = check_modalities(body.get("modalities"), bad)
    watch = body.get("watch") or {}
    if not isinstance(watch, Mapping):
        bad("watch", "must be a mapping", "e.g. watch: {remediate: true, breaker: 3, window: 1h}")
        watch = {}
    min_free, source, trust = _min_free(body, bad), _source(body, bad), _trust(body, bad)
    weights = build_weights(body.get("weights"), "weights" in body, bad)
    topology = build_topology(body.get("topology"), args, env, bad)
    caches = build_caches(body.get("compile_cache"), [w.mount for w in weights], bad)
    if not _one_body(weights, len(problems) > n0, bad):
        return None
    return Recipe(
        name=name,
        image=image,
        served_model_names=tuple(names),
        port=port,
        weights=tuple(weights),
        vllm_args=tuple(args),
        env=env,
        secret_env=tuple(secret_env),
        docker_args=tuple(docker_args),
        soak=dict(soak),
        watch=dict(watch),
        min_free_gb=min_free,
        source=source,
        description=str(body.get("description", "")),
        trust_remote_code=trust,
        topology=topology,
        compile_cache=caches,
        modalities=modalities,
    )


def _check_keys(body: Mapping[str, Any], bad: Bad) -> None:
    """The recipe's keys: known, no Jinja template anywhere, the required ones given."""
    for key in sorted(set(body) - _RECIPE_KEYS):
        bad(
            str(key),
            "unknown field",
            f"remove it, or use one of: {', '.join(sorted(_RECIPE_KEYS))}",
        )
    for fld, text in _templated(body):
        # fleetctl validates and uses the text as written, but Ansible would render it (and run its
        # lookups, on the controller) when a playbook gets the recipe: the two would differ.
        header = text.startswith(JINJA2_HEADER)
        bad(
            fld,
            (f"starts with a {JINJA2_HEADER} header, which makes Ansible render it with its own "
             "delimiters, so it " if header else "")
            + f"holds a Jinja template ({text[:60]!r}): recipes are data, not templates",
            "write the value out; a value that differs per host belongs in host_vars, not in a "
            "template"
            + (f" (a value that must start with {JINJA2_HEADER}: put a space before it)"
               if header else ""),
        )
    for key in _REQUIRED_RECIPE_KEYS:
        if key not in body:
            bad(key, "is missing", f"add {key}: to the recipe")


def _image(body: Mapping[str, Any], bad: Bad) -> str:
    """The image repository, without a tag or digest (the rollout chooses the tag)."""
    image = body.get("image", "")
    if not isinstance(image, str) or not image:
        if "image" in body:
            bad(
                "image",
                "must be a non-empty string",
                "e.g. image: ghcr.io/aeon-7/aeon-vllm-ultimate",
            )
    elif "@" in image or ":" in image.rsplit("/", 1)[-1]:
        bad(
            "image",
            f"{image!r} carries a tag or digest",
            "give the repository only; the rollout chooses the tag",
        )
    elif not _IMAGE.match(image):
        bad(
            "image",
            f"{image!r} is not an image repository name",
            "lowercase letters, digits and . _ - between "
            "slashes, after an optional registry host[:port], e.g. "
            "ghcr.io/aeon-7/aeon-vllm-ultimate",
        )
    return str(image)


def _served_names(body: Mapping[str, Any], bad: Bad) -> list[str]:
    """The served model names: a non-empty list, each once."""
    names = body.get("served_model_names", [])
    if not _is_str_list(names) or ("served_model_names" in body and not names):
        if "served_model_names" in body:
            bad(
                "served_model_names",
                "must be a non-empty list of strings",
                "e.g. served_model_names: [qwen36-fast]",
            )
        return []
    if len(set(names)) != len(names):
        bad("served_model_names", "repeats a name", "list each alias once")
    for i, n in enumerate(names):
        if not n.strip() or n.startswith("-"):
            # vLLM's parser reads a name starting with '-' as a flag of its own: the serve argv
            # would carry --trust-remote-code or --api-key=... past every check of vllm_args.
            bad(f"served_model_names[{i}]",
                "is empty" if not n.strip() else "starts with '-': vLLM would read it as a flag",
                "name the model with letters, digits, '.', '_', '-' or '/', not starting with '-'")
    return list(names)


def _port(body: Mapping[str, Any], bad: Bad) -> int:
    """The server's TCP port (vLLM's 8000 by default)."""
    port = body.get("port", 8000)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        bad(
            "port",
            f"{port!r} is not a TCP port",
            "use a number from 1 to 65535 (vLLM's default is 8000)",
        )
        return 8000
    return port


def _vllm_args(body: Mapping[str, Any], bad: Bad) -> list[str]:
    """vLLM's flags as strings, without ``serve MODEL`` and the flags fleetctl sets itself."""
    args = body.get("vllm_args", [])
    if not isinstance(args, list) or not all(
        isinstance(a, str | int | float) and not isinstance(a, bool) for a in args
    ):
        if "vllm_args" in body:
            bad(
                "vllm_args",
                "must be a list of strings (one flag or value per item)",
                'quote numbers: - "0.70"',
            )
        args = []
    args = [str(a) for a in args]
    if args and args[0] == "serve":
        bad(
            "vllm_args",
            "starts with 'serve'",
            "leave out 'serve MODEL': fleetctl adds them from the body's mount",
        )
    for own in _OWN_FLAGS:
        if has_flag(args, own):
            bad("vllm_args", f"sets {own}", "list the names in served_model_names instead")
    return args


def _env(body: Mapping[str, Any], bad: Bad) -> dict[str, str]:
    """The container's environment: names and scalar values, no secret among them."""
    env_raw = body.get("env") or {}
    env: dict[str, str] = {}
    if not isinstance(env_raw, Mapping):
        bad(
            "env",
            "must be a mapping of NAME: value",
            'e.g. env: {VLLM_USE_FLASHINFER_SAMPLER: "1"}',
        )
        return env
    for k, v in env_raw.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            bad("env", f"{k!r} is not an environment variable name", "use letters, digits and _")
        elif isinstance(v, Mapping | list) or v is None:
            bad(f"env.{k}", "must be a scalar value", "quote it as a string")
        elif _SECRET_HINT.search(k):
            bad(
                f"env.{k}",
                "looks like a secret stored in the inventory",
                f"remove it from env and list {k} in secret_env; its value then comes from the "
                "controller's environment",
            )
        else:
            env[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return env


def _str_list(body: Mapping[str, Any], key: str, bad: Bad, problem: str, fix: str,
              pattern: re.Pattern[str] | None = None) -> list[str]:
    """A list of strings (each matching ``pattern``), empty when absent or refused."""
    value = body.get(key) or []
    matches = pattern is None or all(pattern.match(s) for s in value)
    if not _is_str_list(value) or not matches:
        bad(key, problem, fix)
        return []
    return list(value)


def _min_free(body: Mapping[str, Any], bad: Bad) -> float:
    """The free disk a host needs, in GB."""
    min_free = body.get("min_free_gb", 0)
    if not is_gb(min_free):
        bad("min_free_gb", f"{min_free!r} is not a size in GB (0 to {MAX_GB})",
            "e.g. min_free_gb: 35")
        return 0.0
    return float(min_free)


def _source(body: Mapping[str, Any], bad: Bad) -> str | None:
    """Where the weights come from (the hub or the mirror), None for the fleet's choice."""
    source = body.get("source")
    if source is not None and source not in SOURCES:
        bad(
            "source",
            f"{source!r} is not a weights source",
            f"use one of: {', '.join(SOURCES)} (or leave it out)",
        )
        return None
    return source


def _trust(body: Mapping[str, Any], bad: Bad) -> bool:
    """Whether the model's repository code was reviewed (``trust_remote_code``)."""
    trust = body.get("trust_remote_code", False)
    if not isinstance(trust, bool):
        bad(
            "trust_remote_code",
            f"{trust!r} is not true or false",
            "write trust_remote_code: true (or leave it out)",
        )
        return False
    return trust


def _one_body(weights: list[WeightSet], had_problems: bool, bad: Bad) -> bool:
    """Whether the weight sets are whole enough to build the recipe: exactly one body."""
    if had_problems and not weights:
        return False
    if weights and sum(w.role == "body" for w in weights) != 1:
        bad(
            "weights",
            f"has {sum(w.role == 'body' for w in weights)} body sets",
            "give exactly one weight set with role: body",
        )
        return False
    return bool(weights)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)
