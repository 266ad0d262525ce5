"""What a recipe says about the capabilities its server has beyond greedy text chat: the body's
``modalities``, and the gate's ``soak.capabilities`` (a probe turned off, or on where the recipe's
flags cannot show it) and ``soak.sampling`` (each alias's sampling parameters).

The gate derives what to test from the recipe's flags (``fleetctl.soak.capabilities``); these are
the only words a recipe may add, each checked here once, for the recipe's load (every problem
listed) and for the soak's config (the first one raised)::

    modalities: [text, image]            # the body takes images (its config.json's vision part)
    soak:
      capabilities: {images: false}      # shown in every report as "off by recipe"
      sampling:
        qwen36-deep: {temperature: 0.7, top_p: 0.95}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleetctl.recipes.problems import Bad

#: The capabilities the gate can probe, in report order.
CAPABILITIES = (
    "served_names",
    "tool_calls",
    "reasoning",
    "images",
    "sampling",
    "spec_tiers",
    "prefix_cache",
)

#: What each capability probes, as reports and errors name it.
DESCRIPTIONS: Mapping[str, str] = {
    "served_names": "every served name answers a request",
    "tool_calls": "tool calls arrive as tool_calls (single, parallel, chained)",
    "reasoning": "the reasoning arrives apart from the answer",
    "images": "image input: colour and shape of drawn PNGs",
    "sampling": "sampled requests at each alias's temperature",
    "spec_tiers": "speculative acceptance per context length",
    "prefix_cache": "prefix-cache hits answer as cold requests do",
}

#: The modalities a body may declare (vLLM's names for its multimodal inputs).
MODALITIES = ("text", "image", "video", "audio")

#: Sampling parameters an alias may set: (lowest, highest) of each, as vLLM accepts them.
SAMPLING_PARAMS: Mapping[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "top_k": (-1.0, 100_000.0),
    "min_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "repetition_penalty": (0.0, 2.0),
}


def check_modalities(raw: Any, bad: Bad) -> tuple[str, ...]:
    """The recipe's ``modalities``: a list of :data:`MODALITIES` (empty when absent or wrong)."""
    if raw is None:
        return ()
    if (not isinstance(raw, list) or not raw
            or any(not isinstance(m, str) or m not in MODALITIES for m in raw)):
        bad("modalities", f"{raw!r} is not a list of modalities",
            f"list what the body takes, from: {', '.join(MODALITIES)} (e.g. [text, image])")
        return ()
    return tuple(dict.fromkeys(raw))


def check_capabilities(raw: Any, bad: Bad) -> dict[str, bool]:
    """``soak.capabilities``: capability -> true (probe it) / false (off by recipe)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        bad("soak.capabilities", f"{raw!r} is not a mapping",
            "e.g. capabilities: {images: false}")
        return {}
    out: dict[str, bool] = {}
    for name, value in raw.items():
        if name not in CAPABILITIES:
            bad(f"soak.capabilities.{name}", "is not a capability the gate probes",
                f"use one of: {', '.join(CAPABILITIES)}")
        elif not isinstance(value, bool):
            bad(f"soak.capabilities.{name}", f"{value!r} is not true or false",
                f"{name}: false turns the probe off (shown as 'off by recipe'); true probes it "
                "even where the recipe's flags do not show it")
        else:
            out[str(name)] = value
    return out


def check_sampling(raw: Any, served: Sequence[str], bad: Bad) -> dict[str, dict[str, float]]:
    """``soak.sampling``: served name -> its sampling parameters, each within vLLM's range."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        bad("soak.sampling", f"{raw!r} is not a mapping of served name -> sampling",
            "e.g. sampling: {qwen36-deep: {temperature: 0.7}}")
        return {}
    out: dict[str, dict[str, float]] = {}
    for alias, params in raw.items():
        where = f"soak.sampling.{alias}"
        if served and alias not in served:
            bad(where, f"{alias!r} is not one of the recipe's served_model_names",
                f"use one of: {', '.join(served)}")
            continue
        if not isinstance(params, Mapping) or not params:
            bad(where, f"{params!r} is not a mapping of sampling parameters",
                f"e.g. {alias}: {{temperature: 0.7}}")
            continue
        got: dict[str, float] = {}
        for key, value in params.items():
            if key not in SAMPLING_PARAMS:
                bad(f"{where}.{key}", "is not a sampling parameter the gate sends",
                    f"use: {', '.join(SAMPLING_PARAMS)}")
                continue
            low, high = SAMPLING_PARAMS[key]
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not low <= value <= high):
                bad(f"{where}.{key}", f"{value!r} is not a number from {low:g} to {high:g}",
                    f"e.g. {key}: {0.7 if key == 'temperature' else high:g}")
                continue
            got[str(key)] = float(value)
        out[str(alias)] = got
    return out
