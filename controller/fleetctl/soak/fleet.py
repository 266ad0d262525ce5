"""Soaking the hosts of an inventory: which soak config a host gets and what is soaked on it.

``fleetctl soak`` and the rollout's gate (``rollout/gate.py``) both call these, so that a host is
judged the same way by both: the same profile choice, the same URL, the same container access.
Baselines are kept by ``soak/baselines.py`` (a passing verdict joins its host's window).
"""

from __future__ import annotations

from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.serving import container_name
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.container import DockerOverSSH
from fleetctl.soak.recipe_soak import from_recipe
from fleetctl.soak.verdict import SoakTarget
from fleetctl.urls import http_url


def host_config(recipe: Recipe, host: Host, profile: str | None = None) -> SoakConfig:
    """The recipe's soak config for ``host``.

    The profile is ``profile`` when given (``fleetctl soak --profile``), else the host's
    ``fleetctl_soak_profile`` (the lab sets ``lab``), else the recipe's own.
    """
    chosen = profile or host.vars.get("fleetctl_soak_profile")
    return from_recipe(recipe, profile=str(chosen) if chosen else None)


def host_target(host: Host, recipe: Recipe, tag: str, api_key: str | None = None) -> SoakTarget:
    """The soak target of ``host``'s serving container: its API at the recipe's port, its logs and
    state read over SSH. ``api_key`` is sent as ``Authorization: Bearer`` when the recipe requires
    one."""
    return SoakTarget(host.name, http_url(host.address, recipe.port),
                      DockerOverSSH(host, container_name(host)), tag, api_key=api_key)
