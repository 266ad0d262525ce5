"""What to test, from what the recipe serves: nothing new is written in the recipe.

Each capability the gate can probe is read off the recipe's own words:

==============  ======================================================================
served_names    every name of ``served_model_names`` (each must answer one request)
tool_calls      ``--tool-call-parser P`` with ``--enable-auto-tool-choice``
reasoning       ``--reasoning-parser P``
images          the body's ``modalities`` (or its config.json's ``vision_config``), or a
                multimodal flag (``--limit-mm-per-prompt`` with images, ``--mm-*``), unless
                ``--language-model-only`` or ``--limit-mm-per-prompt`` gives no image
sampling        ``soak.sampling`` (alias -> its temperature ...)
spec_tiers      ``--speculative-config`` (acceptance per context length)
prefix_cache    ``--enable-prefix-caching`` (vLLM's default too), unless
                ``--no-enable-prefix-caching``
==============  ======================================================================

``soak.capabilities`` overrides one: ``false`` turns its probe off ("off by recipe" in every
report), ``true`` probes it where the flags do not show it (an ``--endpoint`` whose body's
config the controller cannot read).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetctl.recipes.argv import flag_value, has_flag
from fleetctl.recipes.capabilities import CAPABILITIES, DESCRIPTIONS, check_modalities

#: How a capability stands for one recipe (its report row says so).
TESTED = "tested"
OFF_BY_RECIPE = "off by recipe"
NOT_SERVED = "not served"

#: Requests each probe sends at most (soak/capabilities/probes.py; served_names: one per name):
#: the soak's hard deadline counts them.
PROBE_REQUESTS = {"tool_calls": 4, "reasoning": 2, "images": 3}

#: Flags that only a multimodal server takes (vLLM's multimodal options).
_MM_FLAGS = ("--mm-encoder-tp-mode", "--mm-processor-kwargs", "--mm-processor-cache-gb")


class Served(Protocol):
    """What derivation reads of a recipe (a ``fleetctl.recipes.Recipe``)."""

    @property
    def served_model_names(self) -> tuple[str, ...]: ...

    @property
    def vllm_args(self) -> tuple[str, ...]: ...

    @property
    def soak(self) -> Mapping[str, Any]: ...

    @property
    def modalities(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Capability:
    """One capability of one recipe: whether the gate probes it, and from what that follows."""

    name: str
    #: :data:`TESTED`, :data:`OFF_BY_RECIPE` or :data:`NOT_SERVED`.
    status: str
    #: The recipe's words it was derived from (``--tool-call-parser qwen3_coder + ...``), or why
    #: it is not served.
    source: str
    #: What the probe needs: the parser's name, the served names, each alias's sampling, the
    #: speculative method.
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def tested(self) -> bool:
        """True when the gate probes it."""
        return self.status == TESTED

    @property
    def requests(self) -> int:
        """Requests its probe sends at most (0: not tested, or probed elsewhere)."""
        if not self.tested:
            return 0
        if self.name == "served_names":
            return len(self.params.get("names", ()))
        return PROBE_REQUESTS.get(self.name, 0)

    def describe(self) -> str:
        """``tool_calls: tested (--tool-call-parser qwen3_coder ...)``, one line."""
        return f"{self.name}: {self.status} ({self.source})"


@dataclass(frozen=True)
class CapabilityPlan:
    """Every capability of one recipe, in report order."""

    capabilities: tuple[Capability, ...]

    def get(self, name: str) -> Capability:
        """The capability ``name`` (one of :data:`CAPABILITIES`)."""
        return next(c for c in self.capabilities if c.name == name)

    def tested(self) -> tuple[Capability, ...]:
        """The capabilities the gate probes."""
        return tuple(c for c in self.capabilities if c.tested)


def derive(recipe: Served, body_config: Mapping[str, Any] | None = None) -> CapabilityPlan:
    """What the gate tests for ``recipe``; ``body_config``: the body's config.json when the caller
    has it (its ``vision_config`` shows a multimodal body)."""
    args = list(recipe.vllm_args)
    soak = recipe.soak if isinstance(recipe.soak, Mapping) else {}
    found: dict[str, tuple[bool, str, dict[str, Any]]] = {
        "served_names": _served_names(recipe.served_model_names),
        "tool_calls": _tool_calls(args),
        "reasoning": _reasoning(args),
        "images": _images(args, recipe.modalities, body_config),
        "sampling": _sampling(soak.get("sampling")),
        "spec_tiers": _speculative(args),
        "prefix_cache": _prefix_cache(args),
    }
    given = soak.get("capabilities")
    overrides = given if isinstance(given, Mapping) else {}
    out: list[Capability] = []
    for name in CAPABILITIES:
        served, source, params = found[name]
        forced = overrides.get(name)
        if forced is False:
            out.append(Capability(name, OFF_BY_RECIPE,
                                  f"soak.capabilities.{name}: false; {source}", params))
        elif forced is True and not served:
            out.append(Capability(name, TESTED, f"soak.capabilities.{name}: true", params))
        else:
            out.append(Capability(name, TESTED if served else NOT_SERVED, source, params))
    return CapabilityPlan(tuple(out))


def rows(plan: CapabilityPlan) -> list[dict[str, str]]:
    """The plan as report rows: capability, status, what it probes, where it was derived from."""
    return [{"capability": c.name, "status": c.status, "probes": DESCRIPTIONS[c.name],
             "source": c.source} for c in plan.capabilities]


def _served_names(names: Sequence[str]) -> tuple[bool, str, dict[str, Any]]:
    return (bool(names), f"served_model_names: {', '.join(names) or '(none)'}",
            {"names": list(names)})


def _tool_calls(args: Sequence[str]) -> tuple[bool, str, dict[str, Any]]:
    parser = flag_value(args, "--tool-call-parser")
    auto = has_flag(args, "--enable-auto-tool-choice")
    if parser and auto:
        return True, f"--tool-call-parser {parser} + --enable-auto-tool-choice", {"parser": parser}
    if parser:
        return (False, f"--tool-call-parser {parser} without --enable-auto-tool-choice (vLLM "
                "refuses tool_choice auto)", {"parser": parser})
    return False, "no --tool-call-parser", {}


def _reasoning(args: Sequence[str]) -> tuple[bool, str, dict[str, Any]]:
    parser = flag_value(args, "--reasoning-parser")
    if parser:
        return True, f"--reasoning-parser {parser}", {"parser": parser}
    return False, "no --reasoning-parser", {}


def _images(args: Sequence[str], modalities: Sequence[str],
            body_config: Mapping[str, Any] | None) -> tuple[bool, str, dict[str, Any]]:
    limit = _image_limit(flag_value(args, "--limit-mm-per-prompt"))
    if has_flag(args, "--language-model-only"):
        return False, "--language-model-only (the vision tower is not loaded)", {}
    if limit == 0:
        return False, "--limit-mm-per-prompt allows no image", {}
    if "image" in check_modalities(list(modalities) or None, _ignore):
        return True, "modalities: image", {}
    if isinstance(body_config, Mapping) and isinstance(body_config.get("vision_config"), Mapping):
        return True, "the body's config.json has a vision_config", {}
    if limit is not None and limit > 0:
        return True, f"--limit-mm-per-prompt allows {limit} image(s)", {}
    mm = next((f for f in _MM_FLAGS if has_flag(args, f)), None)
    if mm is not None:
        return True, f"{mm} (a multimodal server's flag)", {}
    return False, "no image modality, vision_config or multimodal flag", {}


def _image_limit(raw: str | None) -> int | None:
    """Images a prompt may carry under ``--limit-mm-per-prompt`` (None: not given or unread)."""
    if raw is None:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    value = parsed.get("image") if isinstance(parsed, dict) else None
    if isinstance(value, dict):  # {"image": {"count": 2, "width": 512, ...}}
        value = value.get("count")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _sampling(raw: Any) -> tuple[bool, str, dict[str, Any]]:
    if isinstance(raw, Mapping) and raw:
        aliases = {str(k): dict(v) for k, v in raw.items() if isinstance(v, Mapping)}
        shown = ", ".join(f"{k} {_params(v)}" for k, v in aliases.items())
        return bool(aliases), f"soak.sampling: {shown}", {"aliases": aliases}
    return False, "no soak.sampling (every alias is asked greedily)", {}


def _params(values: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in values.items()) + "}"


def _speculative(args: Sequence[str]) -> tuple[bool, str, dict[str, Any]]:
    raw = flag_value(args, "--speculative-config")
    if raw is None:
        return False, "no --speculative-config", {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = {}
    method = str(parsed.get("method", "draft_model")) if isinstance(parsed, dict) else "?"
    tokens = parsed.get("num_speculative_tokens") if isinstance(parsed, dict) else None
    return (True, f"--speculative-config (method {method}, {tokens} tokens)",
            {"method": method, "num_speculative_tokens": tokens})


def _prefix_cache(args: Sequence[str]) -> tuple[bool, str, dict[str, Any]]:
    if has_flag(args, "--no-enable-prefix-caching"):
        return False, "--no-enable-prefix-caching", {}
    if has_flag(args, "--enable-prefix-caching"):
        return True, "--enable-prefix-caching", {}
    return True, "vLLM's default (prefix caching on)", {}


def _ignore(_field: str, _problem: str, _fix: str) -> None:
    """The recipe's load reported a bad ``modalities`` already: here it counts as none."""
