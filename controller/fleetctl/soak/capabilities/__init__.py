"""The gate's capability probes: what the recipe serves beyond greedy text chat, tested.

``derive`` reads what to test off the recipe (its flags, served names, modalities and
``soak.sampling``); ``soak.capabilities`` turns one off ("off by recipe").
"""

from __future__ import annotations

from fleetctl.recipes.capabilities import CAPABILITIES, DESCRIPTIONS
from fleetctl.soak.capabilities.derive import (
    NOT_SERVED,
    OFF_BY_RECIPE,
    TESTED,
    Capability,
    CapabilityPlan,
    derive,
    rows,
)

__all__ = [
    "CAPABILITIES",
    "DESCRIPTIONS",
    "NOT_SERVED",
    "OFF_BY_RECIPE",
    "TESTED",
    "Capability",
    "CapabilityPlan",
    "derive",
    "rows",
]
