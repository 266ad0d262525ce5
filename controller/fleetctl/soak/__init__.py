"""Soak gates: judge a vLLM server with its own load (used by ``fleetctl soak`` and the rollout).

The API (docs/design.md, "Soak")::

    from fleetctl.soak import Against, SoakTarget, load_config, run_soak, wait_ready, smoke_check
    verdict = run_soak(SoakTarget("spark-01", "http://10.0.0.11:8000", container), config,
                       Against(baseline, reference), progress, artifacts_dir=...)
    verdict.outcome  # Outcome.PASS | FAIL | INCONCLUSIVE | ERROR

``wait_ready`` waits for /health on its own (the rollout waits, then gates);
``smoke_check`` is readiness + identity + smoke without load (after a rollback);
``fleetctl.soak.baselines`` keeps the last passing verdict per host and tag.
"""

from __future__ import annotations

from fleetctl.soak.config import SoakConfig, SoakConfigError
from fleetctl.soak.readiness import wait_ready
from fleetctl.soak.recipe_soak import from_recipe, load_config
from fleetctl.soak.run import Against, run_soak, smoke_check
from fleetctl.soak.verdict import (
    CheckResult,
    ContainerAccess,
    Outcome,
    Readiness,
    SoakTarget,
    Verdict,
)

__all__ = [
    "Against",
    "CheckResult",
    "ContainerAccess",
    "Outcome",
    "Readiness",
    "SoakConfig",
    "SoakConfigError",
    "SoakTarget",
    "Verdict",
    "from_recipe",
    "load_config",
    "run_soak",
    "smoke_check",
    "wait_ready",
]
