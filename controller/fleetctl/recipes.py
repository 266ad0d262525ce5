"""Serving recipes (model profiles): image, weights, served names, vLLM flags, soak settings.

Recipes are data in the inventory (``fleetctl_recipes`` in ``group_vars/all/recipes.yml``)
so that operators edit YAML, not code. They are validated when loaded: every
problem (schema or one of the rules in docs/domain.md#recipes, each of which
cost somebody an outage) is collected and reported at once, one line per problem naming the
recipe, the field and the fix.

A recipe also declares its topology (how many Sparks it spans, tensor/pipeline parallel sizes,
Ray or vLLM's native multi-node launch); :meth:`Recipe.launch` renders each member's command line
and its NCCL/Gloo/UCX environment from the unit's fabric (fleetctl.inventory.Unit), and
:func:`placement_problems` refuses a recipe placed on a unit of another size (docs/units.md).

Why one file of ~800 lines: a recipe's schema, its rendering to a vLLM command line and the
rules from docs/domain.md#recipes are read together; each rule is a few lines beside its fix.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from fleetctl import secretenv
from fleetctl.errors import RecipeError
from fleetctl.inventory import Host, Inventory, Unit

#: Above this, GB10's unified memory thrashes (docs/domain.md#recipes).
MAX_GPU_MEMORY_UTILIZATION = 0.88
#: Checkpoint formats a weight set can declare, and the ``--quantization`` each needs.
FORMAT_QUANTIZATION: Mapping[str, str | None] = {
    "compressed-tensors": "compressed-tensors",
    "modelopt": "modelopt",
    "bf16": None,
}
ROLES = ("body", "drafter")
#: Where weights live on a host: a recipe may only stage below it.
WEIGHTS_ROOT = "/opt/"
SOURCES = ("hub", "mirror")

_RECIPE_KEYS = {
    "description", "image", "served_model_names", "port", "weights", "vllm_args", "env",
    "secret_env", "docker_args", "soak", "min_free_gb", "source", "trust_remote_code", "topology",
    "compile_cache",
}
_REQUIRED_RECIPE_KEYS = ("image", "served_model_names", "weights", "vllm_args")
_WEIGHT_KEYS = {"role", "repo", "revision", "path", "mount", "format", "min_date", "size_gb", "manifest_sha256"}
_REQUIRED_WEIGHT_KEYS = ("role", "repo", "revision", "path", "mount", "format")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_SECRET_HINT = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|_KEY$", re.IGNORECASE)
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
#: A git revision: a commit sha, a tag or a branch (``refs/pr/1``); it becomes a directory name when
#: staging from a local copy, so no ``..`` and nothing a shell or rsync would read.
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127}){0,3}\Z")
#: Paths on the host and in the container: they go into ``docker -v SRC:DST:ro`` and rsync arguments,
#: where ':' and ',' would add mount options and shell characters would be read.
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._+/-]+\Z")
#: An OCI repository name with an optional registry host[:port] (docker's reference grammar).
_IMAGE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?/)?"
                    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*\Z")
#: Flags fleetctl sets itself from other recipe fields; repeating them in vllm_args would conflict.
_OWN_FLAGS = ("--served-model-name",)


#: How a recipe that spans several Sparks is launched: a Ray head and workers (vLLM's
#: ``--distributed-executor-backend ray``), or vLLM's own multi-node launch (``--nnodes/--node-rank/
#: --master-addr``, the workers ``--headless``).
LAUNCH_MODES = ("native", "ray")
_TOPOLOGY_KEYS = {"nodes", "tensor_parallel_size", "pipeline_parallel_size", "launch", "master_port", "ray_port"}
#: vLLM's flags fleetctl renders per member from the topology and the fabric (never in vllm_args of a
#: multi-node recipe: one value for every member would be wrong on all but one).
_MEMBER_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless",
                 "--distributed-executor-backend", "--data-parallel-address")
_TP_FLAGS = ("--tensor-parallel-size", "-tp")
_PP_FLAGS = ("--pipeline-parallel-size", "-pp")
#: The environment rendered from a member's fabric (a recipe's env may not set them for a unit).
FABRIC_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "TP_SOCKET_IFNAME", "NCCL_IB_HCA",
              "NCCL_IB_DISABLE", "VLLM_HOST_IP", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Topology:
    """How many Sparks a recipe spans and how the model is split across them (one GB10 GPU each)."""

    nodes: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    launch: str = "native"
    #: The head's torch.distributed port (native launch).
    master_port: int = 29501
    #: The Ray head's GCS port (ray launch).
    ray_port: int = 6379

    def start_order(self, unit: Unit) -> tuple[str, ...]:
        """Members in the order to start them: Ray's head first (workers join it; vLLM on the head waits for
        their GPUs), natively the headless workers first (the head serves once every rank has joined)."""
        return unit.members if self.launch == "ray" else (*unit.workers, unit.head)


@dataclass(frozen=True)
class MemberLaunch:
    """What one member runs: ``docker run --entrypoint ENTRYPOINT IMAGE ARGV...`` with ``env``."""

    host: str | None
    rank: int
    #: "head" (serves the API), "worker", or "single" (a recipe of one node).
    role: str
    entrypoint: str
    argv: tuple[str, ...]
    env: Mapping[str, str]


#: The marker a verified, staged weight set carries in its directory on a host (written by the
#: stage just before its atomic swap; the rollout refuses a host whose sets lack it). The weights
#: role's modules, which run on the hosts, keep their own copy of this name.
STAGED_MARKER = ".fleetctl-staged.json"


@dataclass(frozen=True)
class WeightSet:
    """One directory of weights a recipe needs: the body checkpoint or the drafter."""

    role: str
    #: Hub repository, ``owner/name``.
    repo: str
    #: Pinned revision (commit sha, tag or branch) fetched from the hub or the mirror.
    revision: str
    #: Directory on the host, under /opt.
    path: str
    #: Where the directory is bind-mounted (read-only) inside the container.
    mount: str
    #: Checkpoint format: compressed-tensors, modelopt or bf16.
    format: str
    #: Oldest acceptable revision date (drafters fetched before a fix crash; docs/domain.md#weights).
    min_date: date | None = None
    #: Expected size in GB (preflight before the exact size is known from a manifest).
    size_gb: float = 0.0
    #: sha256 of the mirror's manifest.json for this set, pinned out of band: with it a plain-http
    #: mirror is trusted (every file is checked against the manifest); without it, only https is.
    manifest_sha256: str | None = None


@dataclass(frozen=True)
class CacheDir:
    """One compile-cache directory the server writes while it loads (torch.compile, Triton, FlashInfer).

    Bind-mounted read-write from the host's keyed cache (fleetctl.warmcache) at ``mount``, so that a
    host started after the canary reuses the kernels the canary compiled (docs/warm-start.md)."""

    #: Short name, the directory's name under the host's keyed cache (``vllm``, ``triton``...).
    name: str
    #: Where the server looks for it inside the container (``/root/.cache/vllm``...).
    mount: str


_CACHE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}\Z")


@dataclass(frozen=True)
class Recipe:
    """A model profile: what to run, with which weights and flags, and how to soak it."""

    name: str
    #: Image repository without a tag (the rollout picks the tag).
    image: str
    served_model_names: tuple[str, ...]
    port: int
    weights: tuple[WeightSet, ...]
    #: vLLM flags after ``serve MODEL``, verbatim from the recipe.
    vllm_args: tuple[str, ...]
    #: Non-secret container environment.
    env: Mapping[str, str] = field(default_factory=dict)
    #: Names of secret variables whose values come from the controller's environment, never stored.
    secret_env: tuple[str, ...] = ()
    #: Extra ``docker run`` arguments (``--shm-size=16g`` ...).
    docker_args: tuple[str, ...] = ()
    #: Raw soak settings, parsed by ``fleetctl.soak.config``.
    soak: Mapping[str, Any] = field(default_factory=dict)
    #: Free disk the host needs for image + weights + headroom (GB).
    min_free_gb: float = 0.0
    #: Where weights come from: "hub", "mirror", or None (the mirror if the inventory has one).
    source: str | None = None
    description: str = ""
    #: The operator's opt-in to model code from the hub: ``--trust-remote-code`` is refused without it,
    #: and staging refuses weights carrying code (``*.py``, an ``auto_map`` in config.json).
    trust_remote_code: bool = False
    #: How many Sparks the recipe spans and how it is launched across them.
    topology: Topology = field(default_factory=Topology)
    #: The server's compile caches, shared from the canary to the waves (empty: every host compiles).
    compile_cache: tuple[CacheDir, ...] = ()

    def parallel_args(self) -> list[str]:
        """The tensor/pipeline parallel flags of a multi-node recipe, unless vllm_args gives them."""
        t = self.topology
        out: list[str] = []
        if not any(has_flag(self.vllm_args, f) for f in _TP_FLAGS):
            out += ["--tensor-parallel-size", str(t.tensor_parallel_size)]
        if not any(has_flag(self.vllm_args, f) for f in _PP_FLAGS):
            out += ["--pipeline-parallel-size", str(t.pipeline_parallel_size)]
        return out

    def launch(self, unit: Unit | None = None, host: str | None = None) -> MemberLaunch:
        """The command and environment of ``host`` as a member of ``unit`` (or of a single host).

        The environment pins every collective to the fabric: NCCL's, Gloo's, UCX's and torch's sockets
        to the member's QSFP netdev, NCCL's RDMA to both of the port's HCAs, and vLLM's own address
        (``VLLM_HOST_IP``) to its fabric address, so that nothing falls back to the management network.
        """
        t = self.topology
        if t.nodes == 1 or unit is None:
            return MemberLaunch(host, 0, "single", "vllm", tuple(self.serve_argv()), dict(self.env))
        if host not in unit.members:
            raise RecipeError(f"{host} is not a member of unit {unit.name!r} ({', '.join(unit.members)})",
                              host=host, fix="launch the unit's own members")
        rank = unit.rank(host)
        f = unit.fabric[host]
        head = unit.fabric[unit.head].address
        env = {**self.env, "NCCL_SOCKET_IFNAME": f.interface, "GLOO_SOCKET_IFNAME": f.interface,
               "UCX_NET_DEVICES": f.interface, "TP_SOCKET_IFNAME": f.interface, "NCCL_IB_HCA": ",".join(f.hcas),
               "NCCL_IB_DISABLE": "0", "VLLM_HOST_IP": f.address, "MASTER_ADDR": head,
               "MASTER_PORT": str(t.master_port)}
        role = "head" if rank == 0 else "worker"
        serve = [*self.serve_argv(), *self.parallel_args()]
        if t.launch == "native":
            argv = [*serve, "--nnodes", str(t.nodes), "--node-rank", str(rank), "--master-addr", head,
                    "--master-port", str(t.master_port)]
            if rank:
                argv.append("--headless")
            return MemberLaunch(host, rank, role, "vllm", tuple(argv), env)
        if rank == 0:
            script = (f"ray start --head --node-ip-address={f.address} --port={t.ray_port} && "
                      f"exec vllm {shlex.join([*serve, '--distributed-executor-backend', 'ray'])}")
        else:
            script = f"exec ray start --block --address={head}:{t.ray_port} --node-ip-address={f.address}"
        return MemberLaunch(host, rank, role, "/bin/sh", ("-c", script), env)

    @property
    def body(self) -> WeightSet:
        """The body (target model) weight set."""
        return next(w for w in self.weights if w.role == "body")

    @property
    def drafter(self) -> WeightSet | None:
        """The drafter weight set, if the recipe uses one."""
        return next((w for w in self.weights if w.role == "drafter"), None)

    def flag(self, name: str) -> str | None:
        """The value of vLLM flag ``name`` (``--x v`` or ``--x=v``), or None when absent."""
        return flag_value(self.vllm_args, name)

    def speculative_config(self) -> dict[str, Any] | None:
        """The parsed ``--speculative-config`` JSON, or None."""
        raw = self.flag("--speculative-config")
        if raw is None:
            return None
        parsed = json.loads(raw)
        return parsed if isinstance(parsed, dict) else None

    def serve_argv(self) -> list[str]:
        """Everything after the image in ``docker run ... --entrypoint vllm IMAGE``."""
        argv = ["serve", self.body.mount, "--served-model-name", *self.served_model_names, *self.vllm_args]
        if not has_flag(self.vllm_args, "--port"):
            argv += ["--port", str(self.port)]
        return argv

    @property
    def warnings(self) -> tuple[str, ...]:
        """Settings that work but weaken the fleet's security, each with its fix (shown, not refused)."""
        out: list[str] = []
        if secretenv.HUB_TOKEN_ENV in self.secret_env:
            out.append(
                f"recipe {self.name!r} lists {secretenv.HUB_TOKEN_ENV} in secret_env: serving containers do "
                f"not get it (anyone in the docker group could read it with `docker inspect`, and weights "
                f"are staged before by `fleetctl stage`, which reads ${secretenv.HUB_TOKEN_ENV} itself); "
                f"remove it from secret_env")
        host = self.flag("--host")
        if secretenv.API_KEY_ENV not in self.secret_env and host in (None, "0.0.0.0", "::", ""):
            out.append(
                f"recipe {self.name!r} serves an API without a key on every interface of the host "
                f"(--network host, --host {host or '0.0.0.0 (vLLM default)'}); list {secretenv.API_KEY_ENV} in "
                f"secret_env and set it on the controller (docs/security.md)")
        return tuple(out)

    def mounts(self) -> list[tuple[str, str]]:
        """``(host path, container path)`` pairs to bind-mount read-only."""
        return [(w.path, w.mount) for w in self.weights]


@dataclass(frozen=True)
class RecipeProblem:
    """One thing wrong with one recipe: where, what, and how to fix it."""

    recipe: str
    field: str
    problem: str
    fix: str

    def line(self) -> str:
        """``recipe 'x', field 'y': problem (fix: ...)``."""
        return f"recipe {self.recipe!r}, {self.field}: {self.problem} (fix: {self.fix})"


class RecipeValidationError(RecipeError):
    """One or more recipes are invalid; ``problems`` lists every one."""

    def __init__(self, problems: Sequence[RecipeProblem], where: str) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p.line()}" for p in self.problems)
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in the recipes of {where}:\n{lines}")


def flag_value(args: Sequence[str], name: str) -> str | None:
    """The value given to ``name`` in an argv (last one wins, as in argparse)."""
    value: str | None = None
    for i, a in enumerate(args):
        if a == name:
            value = args[i + 1] if i + 1 < len(args) else ""
        elif a.startswith(name + "="):
            value = a[len(name) + 1 :]
    return value


def has_flag(args: Sequence[str], name: str) -> bool:
    """True when ``name`` appears in an argv, with or without ``=value``."""
    return any(a == name or a.startswith(name + "=") for a in args)


def load_recipes(inventory: Inventory) -> dict[str, Recipe]:
    """Every recipe of the inventory (``fleetctl_recipes``), validated; raises on any problem."""
    raw = inventory.vars.get("fleetctl_recipes")
    if raw is None:
        raise RecipeError(
            f"the inventory {inventory.path} defines no fleetctl_recipes",
            fix="add group_vars/all/recipes.yml (see inventory/lab/group_vars/all/recipes.yml)",
        )
    return parse_recipes(raw, where=str(recipes_source(inventory) or inventory.path))


def recipes_source(inventory: Inventory) -> Path | None:
    """The group_vars file that defines ``fleetctl_recipes`` (the last one, as Ansible's precedence
    takes it), so that messages name the file to edit, not hosts.yml. A recipe name given twice in
    one file is refused here: YAML keeps the last silently, and Ansible only warns."""
    base = inventory.path if inventory.path.is_dir() else inventory.path.parent
    found: Path | None = None
    root = base / "group_vars"
    if not root.is_dir():
        return None
    for f in sorted(root.rglob("*")):
        if not f.is_file() or f.suffix not in ("", ".yml", ".yaml", ".json") or f.name.startswith("."):
            continue
        try:
            node = yaml.compose(f.read_text(), Loader=yaml.SafeLoader)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # the inventory's own check reports these
        if not isinstance(node, yaml.MappingNode):
            continue
        for key, value in node.value:
            if key.value != "fleetctl_recipes" or not isinstance(value, yaml.MappingNode):
                continue
            found = f.resolve() if f.is_symlink() else f
            seen: dict[str, int] = {}
            for k, _ in value.value:
                if k.value in seen:
                    raise RecipeValidationError([RecipeProblem(
                        str(k.value), "(name)", f"is defined twice (lines {seen[k.value]} and {k.start_mark.line + 1})",
                        "give each recipe its own name; only the last definition would count")], str(found))
                seen[str(k.value)] = k.start_mark.line + 1
    return found


def parse_recipes(raw: Any, where: str = "the inventory") -> dict[str, Recipe]:
    """Build and validate recipes from the raw ``fleetctl_recipes`` mapping."""
    if not isinstance(raw, Mapping) or not raw:
        raise RecipeValidationError(
            [RecipeProblem("*", "fleetctl_recipes", "must be a non-empty mapping of name: recipe",
                           "write fleetctl_recipes: {NAME: {image: ..., weights: [...], ...}}")], where)
    problems: list[RecipeProblem] = []
    recipes: dict[str, Recipe] = {}
    for name, body in raw.items():
        recipe = _build(str(name), body, problems)
        if recipe is not None:
            problems.extend(check_rules(recipe))
            recipes[recipe.name] = recipe
    if problems:
        raise RecipeValidationError(problems, where)
    return recipes


def default_recipe_name(inventory: Inventory, host: Host | None = None) -> str:
    """The recipe a host serves by default (``fleetctl_recipe``), or the fleet's."""
    name = (host.vars if host is not None else inventory.vars).get("fleetctl_recipe")
    if not name:
        raise RecipeError(
            f"no default recipe: fleetctl_recipe is not set in {inventory.path}",
            host=host.name if host else None,
            fix="set fleetctl_recipe in group_vars/all or pass --recipe NAME",
        )
    return str(name)


def get_recipe(recipes: Mapping[str, Recipe], name: str) -> Recipe:
    """The recipe called ``name``, or a RecipeError listing the known ones."""
    try:
        return recipes[name]
    except KeyError:
        raise RecipeError(
            f"no recipe {name!r}", fix=f"use one of: {', '.join(sorted(recipes)) or '(none)'}"
        ) from None


def recipe_for(inventory: Inventory, name: str | None = None, host: Host | None = None) -> Recipe:
    """Load the inventory's recipes and return ``name`` (default: the host's or fleet's)."""
    recipes = load_recipes(inventory)
    return get_recipe(recipes, name or default_recipe_name(inventory, host))


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


# ---- building (schema) -------------------------------------------------------------------------


def _build(name: str, body: Any, problems: list[RecipeProblem]) -> Recipe | None:
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
    weights = _build_weights(body.get("weights"), "weights" in body, bad)
    topology = _build_topology(body.get("topology"), args, env, bad)
    caches = _build_caches(body.get("compile_cache"), [w.mount for w in weights], bad)

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


def _build_caches(raw: object, weight_mounts: Sequence[str], bad: Callable[[str, str, str], None]) -> tuple[CacheDir, ...]:
    """``compile_cache: [{name: vllm, mount: /root/.cache/vllm}, ...]``: unique names and container paths."""
    if raw is None:
        return ()
    fix = "e.g. compile_cache: [{name: vllm, mount: /root/.cache/vllm}, {name: triton, mount: /root/.triton}]"
    if not isinstance(raw, list):
        bad("compile_cache", "must be a list of {name, mount}", fix)
        return ()
    out: list[CacheDir] = []
    for i, c in enumerate(raw):
        where = f"compile_cache[{i}]"
        if not isinstance(c, Mapping) or set(c) != {"name", "mount"}:
            bad(where, "must be a mapping with exactly name and mount", fix)
            continue
        name, mount = str(c["name"]), str(c["mount"]).rstrip("/")
        if not _CACHE_NAME.match(name):
            bad(f"{where}.name", f"{name!r} is not a short lower-case name", "use letters, digits, _ and -, e.g. triton")
        elif not mount.startswith("/") or ".." in mount.split("/") or not _SAFE_PATH.match(mount):
            bad(f"{where}.mount", f"{mount!r} is not an absolute container path of plain characters",
                "use e.g. /root/.cache/vllm")
        elif mount in weight_mounts:
            bad(f"{where}.mount", f"{mount!r} is a weight set's mount", "give the cache its own directory")
        else:
            out.append(CacheDir(name, mount))
    if len({c.name for c in out}) != len(out) or len({c.mount for c in out}) != len(out):
        bad("compile_cache", "two cache directories share a name or a mount", "give each its own name and mount")
        return ()
    return tuple(out)


def _int_flag(args: Sequence[str], names: Sequence[str]) -> int | None:
    for n in names:
        v = flag_value(args, n)
        if v is not None:
            try:
                return int(v)
            except ValueError:
                return None
    return None


def _build_topology(raw: Any, args: Sequence[str], env: Mapping[str, str],
                    bad: Callable[[str, str, str], None]) -> Topology:
    """The recipe's topology (one node when absent); the parallel sizes default to vllm_args' flags."""
    if raw is None:
        return Topology()
    if not isinstance(raw, Mapping):
        bad("topology", "must be a mapping", "e.g. topology: {nodes: 2, tensor_parallel_size: 2, launch: native}")
        return Topology()
    for key in sorted(set(raw) - _TOPOLOGY_KEYS):
        bad(f"topology.{key}", "unknown field", f"use one of: {', '.join(sorted(_TOPOLOGY_KEYS))}")

    def number(key: str, default: int, high: int) -> int:
        v = raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= high:
            bad(f"topology.{key}", f"{v!r} is not a number from 1 to {high}", f"e.g. {key}: {default}")
            return default
        return v

    nodes = number("nodes", 1, 64)
    tp_flag, pp_flag = _int_flag(args, _TP_FLAGS), _int_flag(args, _PP_FLAGS)
    tp = number("tensor_parallel_size", tp_flag or (nodes if not pp_flag else 1), 512)
    pp = number("pipeline_parallel_size", pp_flag or max(1, nodes // tp), 512)
    for key, flag, value in (("tensor_parallel_size", tp_flag, tp), ("pipeline_parallel_size", pp_flag, pp)):
        if flag is not None and flag != value:
            bad(f"topology.{key}", f"{value} disagrees with vllm_args' {flag}",
                "drop the flag from vllm_args (fleetctl renders it from the topology), or make them equal")
    launch = raw.get("launch", "native")
    if launch not in LAUNCH_MODES:
        bad("topology.launch", f"{launch!r} is not a launch mode",
            "use native (vLLM's --nnodes/--node-rank/--master-addr, headless workers) or ray (a Ray head and workers)")
        launch = "native"
    master_port, ray_port = number("master_port", 29501, 65535), number("ray_port", 6379, 65535)
    if tp * pp != nodes:
        bad("topology", f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} needs {tp * pp} GPUs, but "
            f"{nodes} node(s) have {nodes} (one GB10 each)",
            f"make tensor_parallel_size x pipeline_parallel_size equal nodes (e.g. {nodes} x 1)")
    if nodes > 1:
        for own in _MEMBER_FLAGS:
            if has_flag(args, own):
                bad(f"vllm_args {own}", "differs per member of a unit: fleetctl renders it from the topology "
                    "and the fabric", f"remove {own} from vllm_args")
        for name in FABRIC_ENV:
            if name in env:
                bad(f"env.{name}", "is rendered from each member's fabric (fleetctl_fabric in the inventory)",
                    f"remove {name} from env; set the member's interfaces/hcas/addresses in fleetctl_fabric instead")
    return Topology(nodes, tp, pp, str(launch), master_port, ray_port)


def _build_weights(raw: Any, present: bool, bad: Callable[[str, str, str], None]) -> list[WeightSet]:
    if not isinstance(raw, list) or not raw:
        if present:
            bad("weights", "must be a non-empty list of weight sets", "give at least the body: - {role: body, repo: ..., ...}")
        return []
    out: list[WeightSet] = []
    for i, w in enumerate(raw):
        where = f"weights[{i}]"
        if not isinstance(w, Mapping):
            bad(where, "must be a mapping", "give role, repo, revision, path, mount and format")
            continue
        n_bad = 0

        def wbad(fld: str, problem: str, fix: str, where: str = where) -> None:
            nonlocal n_bad
            n_bad += 1
            bad(f"{where}.{fld}", problem, fix)

        for key in sorted(set(w) - _WEIGHT_KEYS):
            wbad(str(key), "unknown field", f"use one of: {', '.join(sorted(_WEIGHT_KEYS))}")
        for key in _REQUIRED_WEIGHT_KEYS:
            if not isinstance(w.get(key), str) or not w.get(key):
                wbad(key, "is missing or not a string", f"add {key}: to the weight set")
        role, repo, path, mount, fmt = (str(w.get(k, "")) for k in ("role", "repo", "path", "mount", "format"))
        if role and role not in ROLES:
            wbad("role", f"{role!r} is not a weight role", f"use one of: {', '.join(ROLES)}")
        if repo and not _REPO.match(repo):
            wbad("repo", f"{repo!r} is not a hub repository", "write owner/name, e.g. z-lab/Qwen3.6-35B-A3B-DFlash")
        if path and (not path.startswith(WEIGHTS_ROOT) or ".." in path.split("/") or path.rstrip("/") + "/" == WEIGHTS_ROOT):
            wbad("path", f"{path!r} is not a directory under {WEIGHTS_ROOT}", "use e.g. /opt/qwen36/qwen36-nvfp4")
        elif path and not _SAFE_PATH.match(path):
            wbad("path", f"{path!r} has characters other than letters, digits and . _ + - /",
                 "name the directory plainly, e.g. /opt/qwen36/qwen36-nvfp4")
        if mount and (not mount.startswith("/") or mount == "/" or ".." in mount.split("/")):
            wbad("mount", f"{mount!r} is not an absolute container path", "use e.g. /model or /drafter")
        elif mount and not _SAFE_PATH.match(mount):
            wbad("mount", f"{mount!r} has characters other than letters, digits and . _ + - / "
                 "(':' or ',' would add docker mount options)", "use e.g. /model or /drafter")
        pin = w.get("manifest_sha256")
        if pin is not None and not (isinstance(pin, str) and re.fullmatch(r"[0-9a-f]{64}", pin)):
            wbad("manifest_sha256", f"{pin!r} is not a sha256 (64 lowercase hex digits)",
                 "copy it from `sha256sum manifest.json` of the mirror's copy you verified")
        rev = w.get("revision")
        if isinstance(rev, str) and rev and (not _REVISION.match(rev) or ".." in rev):
            wbad("revision", f"{rev!r} is not a git revision (a commit sha, tag or branch)",
                 "pin the commit sha from the model's page on the hub (40 hex digits)")
        if fmt and fmt not in FORMAT_QUANTIZATION:
            wbad("format", f"{fmt!r} is not a known checkpoint format", f"use one of: {', '.join(FORMAT_QUANTIZATION)}")
        min_date: date | None = None
        md = w.get("min_date")
        if isinstance(md, date):
            min_date = md
        elif md is not None:
            try:
                min_date = date.fromisoformat(str(md))
            except ValueError:
                wbad("min_date", f"{md!r} is not a date", "write YYYY-MM-DD, e.g. 2026-04-19")
        size = w.get("size_gb", 0)
        if isinstance(size, bool) or not isinstance(size, int | float) or size < 0:
            wbad("size_gb", f"{size!r} is not a size in GB", "e.g. size_gb: 22")
            size = 0
        if n_bad:
            continue
        out.append(WeightSet(role=role, repo=repo, revision=str(w["revision"]), path=path.rstrip("/"),
                             mount=mount.rstrip("/"), format=fmt, min_date=min_date, size_gb=float(size),
                             manifest_sha256=pin if isinstance(pin, str) else None))
    paths = [w.path for w in out]
    mounts = [w.mount for w in out]
    if len(set(paths)) != len(paths):
        bad("weights", "two weight sets share a host path", "give each set its own directory under /opt")
    if len(set(mounts)) != len(mounts):
        bad("weights", "two weight sets share a container mount", "mount the body at /model and the drafter at /drafter")
    if sum(w.role == "drafter" for w in out) > 1:
        bad("weights", "has more than one drafter", "keep one weight set with role: drafter")
    return out


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


# ---- rules (docs/domain.md#recipes) -------------------------------------------------------------------------


def check_rules(r: Recipe) -> list[RecipeProblem]:
    """The rules of docs/domain.md#recipes a well-formed recipe must still obey, each a problem with its fix."""
    out: list[RecipeProblem] = []

    def bad(fld: str, problem: str, fix: str) -> None:
        out.append(RecipeProblem(r.name, fld, problem, fix))

    if has_flag(r.vllm_args, "--trust-remote-code") and not r.trust_remote_code:
        bad("vllm_args --trust-remote-code", "lets the model's repository run its own Python code on every host",
            "drop the flag (most architectures need none), or review the repository's code at the pinned revision "
            "and set trust_remote_code: true in the recipe")
    gmu = r.flag("--gpu-memory-utilization")
    if gmu is not None:
        try:
            value = float(gmu)
        except ValueError:
            bad("vllm_args --gpu-memory-utilization", f"{gmu!r} is not a number", "give a fraction, e.g. 0.70")
        else:
            if not value > 0:
                bad("vllm_args --gpu-memory-utilization", f"{gmu} is not a fraction above 0",
                    "give a fraction of the GPU's memory, e.g. 0.70")
            elif value > MAX_GPU_MEMORY_UTILIZATION:
                bad("vllm_args --gpu-memory-utilization",
                    f"{gmu} is above {MAX_GPU_MEMORY_UTILIZATION}: GB10's unified memory thrashes",
                    f"use at most {MAX_GPU_MEMORY_UTILIZATION} (the published recipes use 0.60-0.80)")

    if has_flag(r.vllm_args, "--api-key"):
        bad("vllm_args --api-key",
            "puts the API key on the command line, where `ps`, `docker inspect`, the ledger and "
            "vLLM's startup log show it",
            f"remove --api-key and its value, list {secretenv.API_KEY_ENV} in secret_env and set "
            f"${secretenv.API_KEY_ENV} (or ${secretenv.file_var(secretenv.API_KEY_ENV)}, a 0600 file) on the controller")

    port_flag = r.flag("--port")
    if port_flag is not None and port_flag != str(r.port):
        bad("vllm_args --port", f"--port {port_flag} disagrees with port: {r.port}", "set one of them to match the other")

    spec: dict[str, Any] | None = None
    raw_spec = r.flag("--speculative-config")
    if raw_spec is not None:
        try:
            parsed = json.loads(raw_spec)
        except json.JSONDecodeError as e:
            bad("vllm_args --speculative-config", f"is not valid JSON ({e.msg} at column {e.colno})",
                "quote the JSON in single quotes in YAML: '{\"method\":\"dflash\",...}'")
        else:
            if isinstance(parsed, dict):
                spec = parsed
            else:
                bad("vllm_args --speculative-config", "must be a JSON object", "write {\"method\": ..., ...}")

    kv = r.flag("--kv-cache-dtype")
    drafter = r.drafter
    if spec is not None and str(spec.get("method", "")).lower() == "dflash":
        for needed in ("--max-num-seqs", "--max-num-batched-tokens"):
            if r.flag(needed) is None:
                bad(f"vllm_args {needed}", "is missing: with DFlash the scheduler computes a negative token budget "
                    "and the server never boots (max_num_scheduled_tokens is set to -512)",
                    f"set {needed} (the published recipes use --max-num-seqs 64 --max-num-batched-tokens 32768)")
        if kv is not None and kv.lower().startswith("nvfp4"):
            bad("vllm_args --kv-cache-dtype", "nvfp4 KV cannot pair with the non-causal DFlash drafter "
                "(vLLM: No valid attention backend found)", "use --kv-cache-dtype fp8_e4m3 or auto, or a causal speculator")
        if drafter is None:
            bad("weights", "the speculative config uses DFlash but no weight set has role: drafter",
                "add the drafter: - {role: drafter, repo: z-lab/..., mount: /drafter, ...}")
        elif spec.get("model") != drafter.mount:
            bad("vllm_args --speculative-config", f"its model {spec.get('model')!r} is not the drafter's mount {drafter.mount!r}",
                f"set \"model\":\"{drafter.mount}\" in the speculative config")
    elif drafter is not None and (spec is None or "model" not in spec):
        bad("weights", "a drafter is staged but no speculative config uses it",
            "add --speculative-config with \"model\" set to the drafter's mount, or drop the drafter")

    quant = r.flag("--quantization")
    fmt = r.body.format
    expected = FORMAT_QUANTIZATION.get(fmt)
    if quant is not None and expected is None:
        bad("vllm_args --quantization", f"--quantization {quant} on a {fmt} checkpoint fails at load",
            "remove --quantization for an unquantized (bf16) body")
    elif quant is not None and quant != expected:
        bad("vllm_args --quantization", f"--quantization {quant} does not match the body's {fmt} checkpoint: it fails at load",
            f"use --quantization {expected} (or correct weights[body].format)")
    return out


# ---- placement on units (docs/units.md) ------------------------------------------------------------------------


def placement_problems(inventory: Inventory, recipes: Mapping[str, Recipe]) -> list[RecipeError]:
    """Each recipe's node count against where it is placed: a unit of that many members, or a single host.

    One error per unit or host, naming it, the recipe, the two counts and the fix. A host's recipe that
    does not exist is left to the caller (``fleetctl recipes`` names those first).
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
            out.append(RecipeError(f"the members of unit {unit.name!r} serve different recipes ({listed})",
                                   host=unit.head, fix="set fleetctl_recipe once for the unit's group, not per member"))
            continue
        name = names[unit.head]
        r = recipes.get(name) if name else None
        if r is not None and r.topology.nodes != unit.size:
            out.append(RecipeError(
                f"recipe {r.name!r} spans {r.topology.nodes} node(s) but unit {unit.name!r} has {unit.size} members "
                f"({', '.join(unit.members)})", host=unit.head,
                fix=f"give the unit a recipe with topology: {{nodes: {unit.size}}}, or change the unit's members"))
    for h in inventory.hosts.values():
        name = recipe_of(h)
        r = recipes.get(name) if name else None
        if h.unit is None and r is not None and r.topology.nodes > 1:
            out.append(RecipeError(
                f"recipe {r.name!r} spans {r.topology.nodes} nodes but the host is in no unit", host=h.name,
                fix=f"put it in a unit of {r.topology.nodes} hosts (fleetctl_unit), or give it a single-node recipe"))
    return out
