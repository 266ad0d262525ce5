"""The rules a built recipe must keep (docs/domain.md#recipes: each cost somebody an outage), and
a recipe's fit to the unit it is placed on (docs/units.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fleetctl import secretenv
from fleetctl.errors import RecipeError
from fleetctl.inventory import Host, Inventory
from fleetctl.recipes.argv import has_flag, shorthand
from fleetctl.recipes.problems import Bad, RecipeProblem
from fleetctl.recipes.recipe import Recipe
from fleetctl.recipes.topology import MEMBER_FLAGS, PP_FLAGS, TP_FLAGS
from fleetctl.recipes.weights import FORMAT_QUANTIZATION

#: Above this, GB10's unified memory thrashes (docs/domain.md#recipes).
MAX_GPU_MEMORY_UTILIZATION = 0.88


#: Every flag of vllm_args that fleetctl reads or refuses (here, in the schema, the topology and
#: the launch): vLLM would take an abbreviation of one, or one key of a JSON one, that these
#: checks would not see (``--trust-remote``, ``--speculative-config.model``).
CHECKED_FLAGS = (
    "--trust-remote-code", "--api-key", "--gpu-memory-utilization", "--port", "--host",
    "--speculative-config", "--kv-cache-dtype", "--max-num-seqs", "--max-num-batched-tokens",
    "--quantization", "--served-model-name", TP_FLAGS[0], PP_FLAGS[0], *MEMBER_FLAGS,
)


def check_rules(r: Recipe) -> list[RecipeProblem]:
    """The rules of docs/domain.md#recipes a well-formed recipe must still obey, each a problem
    with its fix."""
    out: list[RecipeProblem] = []

    def bad(fld: str, problem: str, fix: str) -> None:
        out.append(RecipeProblem(r.name, fld, problem, fix))

    _shorthands(r, bad)
    _trust_remote_code(r, bad)
    _gpu_memory(r, bad)
    _api_key(r, bad)
    _port(r, bad)
    _drafter(r, _speculative_config(r, bad), bad)
    _quantization(r, bad)
    _docker_args(r, bad)
    return out


#: ``docker run`` options a recipe's docker_args may not give (long name -> why). The container's
#: privileges, mounts, network, entrypoint and environment are fleetctl's (from the recipe's own
#: fields, where they are checked): one of these would give the model's code the host, or put a
#: secret in the ledger's record of the container's settings and in ``ps``.
REFUSED_DOCKER_OPTIONS = {
    "--privileged": "gives the container every device and capability of the host",
    "--cap-add": "adds kernel capabilities", "--security-opt": "lifts seccomp or AppArmor",
    "--device": "passes a host device", "--device-cgroup-rule": "opens host devices",
    "--pid": "shares a host namespace", "--userns": "shares a host namespace",
    "--uts": "shares a host namespace", "--cgroupns": "shares a host namespace",
    "--user": "changes the container's user", "--group-add": "adds host groups",
    "--volume": "mounts a host path", "--mount": "mounts a host path",
    "--volumes-from": "mounts another container's volumes",
    "--env": "sets the environment on the command line (ps, docker inspect, the ledger)",
    "--env-file": "reads an environment file",
    "--entrypoint": "replaces vllm", "--network": "replaces the host network",
    "--net": "replaces the host network",
}
_SHORT_DOCKER = {"e": "--env", "v": "--volume", "u": "--user"}


def _docker_args(r: Recipe, bad: Bad) -> None:
    """docker_args: resource settings (``--shm-size``, ``--ulimit``, ``--restart``), nothing that
    changes what the container may reach or holds."""
    for a in r.docker_args:
        key = a.split("=", 1)[0]
        if key.startswith("--"):
            hit = key if key in REFUSED_DOCKER_OPTIONS else None
        elif key.startswith("-") and len(key) > 1:
            # a cluster of short options (-itv/:/host): any refused letter before a value
            hit = next((_SHORT_DOCKER[c] for c in key[1:] if c in _SHORT_DOCKER), None)
        else:
            continue
        if hit is not None:
            # the option, never its value: it may be a secret
            bad(f"docker_args {hit}", f"{key} {REFUSED_DOCKER_OPTIONS[hit]}",
                "remove it: weights, caches and the serving network are mounted and set by "
                "fleetctl; give the environment in env: and secrets in secret_env:")


def _shorthands(r: Recipe, bad: Bad) -> None:
    """A checked flag written in full: an abbreviation or a dotted key would pass every check."""
    for a in r.serve_argv()[2:]:  # the whole argv vLLM parses after ``serve MODEL``
        hit = shorthand(a, CHECKED_FLAGS)
        if hit is not None:
            flag, how = hit
            written = a.split("=", 1)[0]  # never the value: it may be a key
            bad(
                f"vllm_args {flag}",
                f"{written} {how}: vLLM reads it so, but fleetctl checks {flag} by its full name",
                f"write {flag} in full"
                + (" with the whole JSON object" if "." in written else ""),
            )


def _trust_remote_code(r: Recipe, bad: Bad) -> None:
    """Remote code runs only where the recipe says it was reviewed."""
    if has_flag(r.serve_argv(), "--trust-remote-code") and not r.trust_remote_code:
        bad(
            "vllm_args --trust-remote-code",
            "lets the model's repository run its own Python code on every host",
            "drop the flag (most architectures need none), or review the repository's code at the "
            "pinned revision "
            "and set trust_remote_code: true in the recipe",
        )


def _gpu_memory(r: Recipe, bad: Bad) -> None:
    """--gpu-memory-utilization: a fraction above 0, at most GB10's bound."""
    gmu = r.flag("--gpu-memory-utilization")
    if gmu is not None:
        try:
            value = float(gmu)
        except ValueError:
            bad(
                "vllm_args --gpu-memory-utilization",
                f"{gmu!r} is not a number",
                "give a fraction, e.g. 0.70",
            )
        else:
            if not value > 0:
                bad("vllm_args --gpu-memory-utilization", f"{gmu} is not a fraction above 0",
                    "give a fraction of the GPU's memory, e.g. 0.70")
            elif value > MAX_GPU_MEMORY_UTILIZATION:
                bad(
                    "vllm_args --gpu-memory-utilization",
                    f"{gmu} is above {MAX_GPU_MEMORY_UTILIZATION}: GB10's unified memory thrashes",
                    f"use at most {MAX_GPU_MEMORY_UTILIZATION} (the published recipes use "
                    "0.60-0.80)",
                )


def _api_key(r: Recipe, bad: Bad) -> None:
    """No API key on the command line."""
    if has_flag(r.serve_argv(), "--api-key"):
        bad(
            "vllm_args --api-key",
            "puts the API key on the command line, where `ps`, `docker inspect`, the ledger and "
            "vLLM's startup log show it",
            f"remove --api-key and its value, list {secretenv.API_KEY_ENV} in secret_env and set "
            f"${secretenv.API_KEY_ENV} (or ${secretenv.file_var(secretenv.API_KEY_ENV)}, a 0600 "
            "file) on the controller",
        )


def _port(r: Recipe, bad: Bad) -> None:
    """--port agrees with the recipe's port."""
    port_flag = r.flag("--port")
    if port_flag is not None and port_flag != str(r.port):
        bad(
            "vllm_args --port",
            f"--port {port_flag} disagrees with port: {r.port}",
            "set one of them to match the other",
        )


def _speculative_config(r: Recipe, bad: Bad) -> dict[str, Any] | None:
    """The --speculative-config JSON object (None when absent or invalid)."""
    spec: dict[str, Any] | None = None
    raw_spec = r.flag("--speculative-config")
    if raw_spec is not None:
        try:
            parsed = json.loads(raw_spec)
        except json.JSONDecodeError as e:
            bad(
                "vllm_args --speculative-config",
                f"is not valid JSON ({e.msg} at column {e.colno})",
                'quote the JSON in single quotes in YAML: \'{"method":"dflash",...}\'',
            )
        else:
            if isinstance(parsed, dict):
                spec = parsed
            else:
                bad(
                    "vllm_args --speculative-config",
                    "must be a JSON object",
                    'write {"method": ..., ...}',
                )
    return spec


def _drafter(r: Recipe, spec: dict[str, Any] | None, bad: Bad) -> None:
    """DFlash's needs (scheduler budgets, KV dtype, a drafter at the config's model), and a drafter
    only where a speculative config uses it."""
    kv = r.flag("--kv-cache-dtype")
    drafter = r.drafter
    if spec is not None and str(spec.get("method", "")).lower() == "dflash":
        for needed in ("--max-num-seqs", "--max-num-batched-tokens"):
            if r.flag(needed) is None:
                bad(
                    f"vllm_args {needed}",
                    "is missing: with DFlash the scheduler computes a negative token budget "
                    "and the server never boots (max_num_scheduled_tokens is set to -512)",
                    f"set {needed} (the published recipes use --max-num-seqs 64 "
                    "--max-num-batched-tokens 32768)",
                )
        if kv is not None and kv.lower().startswith("nvfp4"):
            bad(
                "vllm_args --kv-cache-dtype",
                "nvfp4 KV cannot pair with the non-causal DFlash drafter "
                "(vLLM: No valid attention backend found)",
                "use --kv-cache-dtype fp8_e4m3 or auto, or a causal speculator",
            )
        if drafter is None:
            bad("weights", "the speculative config uses DFlash but no weight set has role: drafter",
                "add the drafter: - {role: drafter, repo: z-lab/..., mount: /drafter, ...}")
        elif spec.get("model") != drafter.mount:
            bad(
                "vllm_args --speculative-config",
                f"its model {spec.get('model')!r} is not the drafter's mount {drafter.mount!r}",
                f'set "model":"{drafter.mount}" in the speculative config',
            )
    elif drafter is not None and (spec is None or "model" not in spec):
        bad(
            "weights",
            "a drafter is staged but no speculative config uses it",
            'add --speculative-config with "model" set to the drafter\'s mount, or drop the '
            'drafter',
        )


def _quantization(r: Recipe, bad: Bad) -> None:
    """--quantization matches the body's checkpoint format."""
    quant = r.flag("--quantization")
    fmt = r.body.format
    expected = FORMAT_QUANTIZATION.get(fmt)
    if quant is not None and expected is None:
        bad(
            "vllm_args --quantization",
            f"--quantization {quant} on a {fmt} checkpoint fails at load",
            "remove --quantization for an unquantized (bf16) body",
        )
    elif quant is not None and quant != expected:
        bad(
            "vllm_args --quantization",
            f"--quantization {quant} does not match the body's {fmt} checkpoint: it fails at load",
            f"use --quantization {expected} (or correct weights[body].format)",
        )


def placement_problems(inventory: Inventory, recipes: Mapping[str, Recipe]) -> list[RecipeError]:
    """Each recipe's node count against where it is placed: a unit of that many members, or a
    single host.

    One error per unit or host, naming it, the recipe, the two counts and the fix. A host's recipe
    that does not exist is left to the caller (``fleetctl recipes`` names those first).
    """
    out: list[RecipeError] = []
    default = inventory.vars.get("fleetctl_recipe")

    def recipe_of(h: Host) -> str | None:
        name = h.vars.get("fleetctl_recipe", default)
        return str(name) if name else None

    for unit in inventory.units.values():
        names = {m: recipe_of(inventory.hosts[m]) for m in unit.members}
        if len(set(names.values())) > 1:
            listed = ", ".join(f"{m} {n!r}" for m, n in names.items())
            out.append(
                RecipeError(
                    f"the members of unit {unit.name!r} serve different recipes ({listed})",
                    host=unit.head,
                    fix="set fleetctl_recipe once for the unit's group, not per member",
                )
            )
            continue
        name = names[unit.head]
        r = recipes.get(name) if name else None
        if r is not None and r.topology.nodes != unit.size:
            out.append(
                RecipeError(
                    f"recipe {r.name!r} spans {r.topology.nodes} node(s) but unit {unit.name!r} "
                    f"has {unit.size} members "
                    f"({', '.join(unit.members)})",
                    host=unit.head,
                    fix=f"give the unit a recipe with topology: {{nodes: {unit.size}}}, or change "
                        "the unit's members",
                )
            )
    for h in inventory.hosts.values():
        name = recipe_of(h)
        r = recipes.get(name) if name else None
        if h.unit is None and r is not None and r.topology.nodes > 1:
            out.append(
                RecipeError(
                    f"recipe {r.name!r} spans {r.topology.nodes} nodes but the host is in no unit",
                    host=h.name,
                    fix=f"put it in a unit of {r.topology.nodes} hosts (fleetctl_unit), or give it "
                        "a single-node recipe",
                )
            )
    return out
