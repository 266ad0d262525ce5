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

The concept's parts live beside this module: ``recipe`` (the Recipe and its rendering),
``topology``, ``weights`` (weight sets and compile caches), ``schema`` (a recipe's YAML checked and
built), ``rules`` (docs/domain.md#recipes and placement on units), ``problems`` and ``argv``. Their
public names stay reachable here (``recipes.Recipe``, ``recipes.STAGED_MARKER``).
"""

from __future__ import annotations

import functools
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from fleetctl.errors import RecipeError
from fleetctl.inventory import Host, Inventory
from fleetctl.recipes.argv import flag_value, has_flag
from fleetctl.recipes.problems import RecipeProblem, RecipeValidationError
from fleetctl.recipes.recipe import Recipe
from fleetctl.recipes.rules import MAX_GPU_MEMORY_UTILIZATION, check_rules, placement_problems
from fleetctl.recipes.schema import build_recipe
from fleetctl.recipes.topology import (
    FABRIC_ENV,
    LAUNCH_MODES,
    PP_FLAGS,
    TP_FLAGS,
    MemberLaunch,
    Topology,
)
from fleetctl.recipes.weights import (
    FORMAT_QUANTIZATION,
    ROLES,
    SOURCES,
    STAGED_MARKER,
    WEIGHTS_ROOT,
    CacheDir,
    WeightSet,
)

# The parts' public names, reachable as recipes.NAME as when they were all in one module.
__all__ = [
    "FABRIC_ENV",
    "FORMAT_QUANTIZATION",
    "LAUNCH_MODES",
    "MAX_GPU_MEMORY_UTILIZATION",
    "PP_FLAGS",
    "ROLES",
    "SOURCES",
    "STAGED_MARKER",
    "TP_FLAGS",
    "WEIGHTS_ROOT",
    "CacheDir",
    "MemberLaunch",
    "Recipe",
    "RecipeProblem",
    "RecipeValidationError",
    "Topology",
    "WeightSet",
    "check_rules",
    "configured_recipe",
    "default_recipe_name",
    "flag_value",
    "get_recipe",
    "has_flag",
    "hosts_by_recipe",
    "load_recipes",
    "parse_recipes",
    "placement_problems",
    "recipe_for",
    "recipes_source",
]


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
        if f.suffix not in ("", ".yml", ".yaml", ".json") or f.name.startswith("."):
            continue
        try:
            st = f.stat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        names = _recipe_names(str(f), st.st_mtime_ns, st.st_size)
        if names is None:
            continue
        found = f.resolve() if f.is_symlink() else f
        seen: dict[str, int] = {}
        for name, line in names:
            if name in seen:
                raise RecipeValidationError(
                    [
                        RecipeProblem(
                            name,
                            "(name)",
                            f"is defined twice (lines {seen[name]} and {line})",
                            "give each recipe its own name; only the last definition would count",
                        )
                    ],
                    str(found),
                )
            seen[name] = line
    return found


#: libyaml's parser where PyYAML has it (ansible-core wants it): the pure-Python one took a second
#: per command on the example inventory.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=256)
def _recipe_names(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, int], ...] | None:
    """The recipe names (and their lines) of the ``fleetctl_recipes`` mapping in the vars file
    ``path``, in file order; None for a file without one. Cached by the file's mtime and size: a
    run reads the recipes many times, the file rarely changes."""
    del mtime_ns, size  # the cache key
    try:
        node = yaml.compose(Path(path).read_text(), Loader=_LOADER)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # the inventory's own check reports these
    if not isinstance(node, yaml.MappingNode):
        return None
    found = None
    for key, value in node.value:
        if key.value == "fleetctl_recipes" and isinstance(value, yaml.MappingNode):
            found = tuple((str(k.value), k.start_mark.line + 1) for k, _ in value.value)
    return found


def parse_recipes(raw: Any, where: str = "the inventory") -> dict[str, Recipe]:
    """Build and validate recipes from the raw ``fleetctl_recipes`` mapping."""
    if not isinstance(raw, Mapping) or not raw:
        raise RecipeValidationError(
            [
                RecipeProblem(
                    "*",
                    "fleetctl_recipes",
                    "must be a non-empty mapping of name: recipe",
                    "write fleetctl_recipes: {NAME: {image: ..., weights: [...], ...}}",
                )
            ],
            where,
        )
    problems: list[RecipeProblem] = []
    recipes: dict[str, Recipe] = {}
    for name, body in raw.items():
        recipe = build_recipe(str(name), body, problems)
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


def configured_recipe(inventory: Inventory, host: Host) -> str:
    """The recipe ``host`` is configured to serve: its unit's (its head's ``fleetctl_recipe``), else
    its own ``fleetctl_recipe`` (host_vars, group_vars, all: Ansible's precedence)."""
    unit = inventory.unit_of(host.name)
    return default_recipe_name(inventory, inventory.host(unit.head) if unit is not None else host)


def hosts_by_recipe(inventory: Inventory, hosts: Sequence[Host]) -> dict[str, list[Host]]:
    """``hosts`` grouped by the recipe each is configured to serve, groups and hosts in the order
    given (a unit's members always in one group: their unit's)."""
    out: dict[str, list[Host]] = {}
    for h in hosts:
        out.setdefault(configured_recipe(inventory, h), []).append(h)
    return out


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
