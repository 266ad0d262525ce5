"""What a soak gate is configured to do: :class:`SoakConfig` (everything a soak needs besides its
target) and :class:`CheckSpec` (one check's switches, limits and bounds).

A recipe's ``soak:`` mapping is read into one by ``soak/recipe_soak.py`` (``load_config``,
``from_recipe``), over the profile's defaults (``soak/profiles.py``) and each registered check's
own defaults (``soak/checks/``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.soak.capabilities.derive import Capability
from fleetctl.soak.profiles import WORKLOAD_VERSION


class SoakConfigError(FleetError):
    """A recipe's ``soak:`` mapping (or a soak option) is invalid."""


@dataclass(frozen=True)
class CheckSpec:
    """One check's switches, limits and bounds."""

    name: str
    enabled: bool = True
    #: Measured and reported, never counted toward the verdict.
    observe_only: bool = False
    #: Failed measurements tolerated before the check fails.
    failure_limit: int = 0
    #: Inconclusive measurements tolerated before the check is inconclusive.
    inconclusive_limit: int = 0
    #: Consecutive measurement errors tolerated before the check errors.
    consecutive_error_limit: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)

    def level_bound(self, key: str, concurrency: int) -> float | None:
        """A per-concurrency bound: the entry for the smallest level >= ``concurrency``.

        Levels above the largest key use the largest key's bound.
        """
        table: Mapping[int, float] | None = self.params.get(key)
        if not table:
            return None
        keys = sorted(table)
        for k in keys:
            if k >= concurrency:
                return float(table[k])
        return float(table[keys[-1]])


@dataclass(frozen=True)
class SoakConfig:
    """Everything a soak needs to know besides the target; build it with :func:`load_config`."""

    profile: str
    #: The recipe's served model names: identity checks them, requests use the first.
    served_model_names: tuple[str, ...]
    #: The model name requests use (default: the first served name, else what /v1/models lists).
    model: str | None
    #: True/False when known from the recipe; None = decide from /metrics.
    speculative: bool | None
    readiness_timeout: float
    readiness_poll: float
    request_timeout: float
    max_tokens: int
    temperature: float
    concurrency: tuple[int, ...]
    #: Requests per sweep level = max(requests_per_level * c, min_requests_per_level).
    requests_per_level: int
    min_requests_per_level: int
    level_timeout: float
    classes: tuple[str, ...]
    class_requests: int
    long_context_tokens: int
    smoke_max_tokens: int
    sustained_duration: float
    sustained_concurrency: int
    window: float
    sustained_max_requests: int
    checks: Mapping[str, CheckSpec]
    #: Tokens of the context every sustained conversation shares (0: no shared context).
    shared_prefix_tokens: int = 0
    #: Exchanges in a sustained conversation before a worker starts a new one.
    turns: int = 1
    #: Readiness, identity and smoke only (no load): a rollback's quick check.
    smoke_only: bool = False
    #: The chat template's thinking for load requests (classes, sweep, sustained).
    thinking: bool = False
    recipe: str = ""
    #: Seconds a server is expected to take from start to ready (a plan's estimate, not a bound).
    load_time: float = 240.0
    #: Service-level objectives (``ttft_ms``, ``tpot_ms``, ``e2el_ms``): each level reports the
    #: share of its requests meeting all of them, and that goodput in requests/s (reported, not
    #: gated).
    slo: Mapping[str, float] = field(default_factory=dict)
    #: Trials per sweep level (their median tok/s is the level's).
    trials: int = 1
    #: Seconds between workers' starts.
    stagger: float = 0.0
    #: Open-loop levels: requests per second with Poisson arrivals.
    request_rates: tuple[float, ...] = ()
    #: The soak's hard overall deadline in seconds (0: derived from the phases,
    #: :meth:`hard_deadline`).
    deadline: float = 0.0
    #: ``soak.capabilities``: a capability probe turned on or off by the recipe (absent: derived
    #: from the recipe's flags, fleetctl.soak.capabilities).
    capabilities: Mapping[str, bool] = field(default_factory=dict)
    #: ``soak.sampling``: served name -> the sampling parameters its requests carry.
    sampling: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: What the gate tests of what the recipe serves (fleetctl.soak.capabilities.derive), every
    #: capability in report order with its status and where it was derived from.
    plan: tuple[Capability, ...] = ()

    def fingerprint(self) -> str:
        """What makes two soaks' throughput comparable: profile, max_tokens, levels, workload.

        A baseline made with another fingerprint is not compared (a lab-profile soak
        or one at other levels says nothing about this one's tok/s).
        """
        key = {
            "profile": self.profile,
            "max_tokens": self.max_tokens,
            "levels": list(self.concurrency),
            "thinking": self.thinking,
            "requests": [self.requests_per_level, self.min_requests_per_level],
            "classes": list(self.classes),
            "workload": WORKLOAD_VERSION,
            "conversation": [self.shared_prefix_tokens, self.turns],
            "trials": self.trials,
            "rates": list(self.request_rates),
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]

    def check(self, name: str) -> CheckSpec:
        """The spec of check ``name``."""
        return self.checks[name]

    def long_decode_tokens(self) -> int:
        """Tokens of the soak's one long decode: the long_decode probe's, else correctness' (0:
        none)."""
        probe = self.checks.get("long_decode")
        if probe is not None and probe.enabled and int(probe.params.get("tokens", 0) or 0) > 0:
            return int(probe.params["tokens"])
        spec = self.checks.get("correctness")
        return (
            int(spec.params.get("long_decode_tokens", 0) or 0)
            if spec is not None and spec.enabled
            else 0
        )

    def long_prompt_tokens(self) -> tuple[int, ...]:
        """The long-prompt probes' sizes in tokens (empty: none)."""
        spec = self.checks.get("long_prompts")
        return tuple(spec.params.get("tokens", ())) if spec is not None and spec.enabled else ()

    def long_prompt_timeout(self, tokens: int) -> float:
        """One long-prompt probe's deadline: the request's own plus its prefill at >= 500
        tokens/s."""
        return self.request_timeout + tokens / 500

    def long_prompt_seconds(self) -> float:
        return sum(self.long_prompt_timeout(t) for t in self.long_prompt_tokens())

    def token_timeout(self) -> float | None:
        """Seconds without a token before a request is a stall (None: the liveness check is
        disabled)."""
        spec = self.checks.get("liveness")
        if spec is None or not spec.enabled:
            return None
        t = float(spec.params.get("token_timeout", 0.0))
        return t if t > 0 else None

    def hard_deadline(self) -> tuple[float, str]:
        """The most one soak may last, and how it was derived (``deadline`` when the recipe sets
        it).

        Every phase's own bound added up (readiness, smoke, canaries, each class and sweep trial
        bounded by ``level_timeout`` plus the request that may still be running, the long decode,
        the sustained phase), plus a minute for scrapes and container reads: a soak reaching it
        is stopped whatever phase it is in, so no server can hold the controller longer.
        """
        if self.deadline > 0:
            return self.deadline, "set by the recipe's soak.deadline"
        per_level = self.level_timeout + self.request_timeout
        long_decode = self.long_decode_tokens()
        parts = {
            "readiness": self.readiness_timeout,
            "smoke and canaries": 4 * self.request_timeout,
            "classes": len(self.classes) * per_level,
            "sweep": len(self.concurrency) * self.trials * per_level
            + len(self.request_rates) * per_level,
            "long decode": max(self.request_timeout, long_decode / 10) if long_decode else 0.0,
            "long prompts": self.long_prompt_seconds(),
            "capabilities": sum(c.requests for c in self.plan) * self.request_timeout,
            # Up to 3 looping prompts re-run as references (MAX_LOOP_REFERENCES in
            # soak/phases/soak_state.py): two load prompts and the long decode at most.
            "loop references": 2 * self.request_timeout
            + (max(self.request_timeout, long_decode / 10) if long_decode else 0.0),
            "sustained": self.sustained_duration + self.request_timeout
            if self.sustained_duration
            else 0.0,
            "scrapes and slack": 60.0,
        }
        if self.smoke_only:
            parts = {
                k: v
                for k, v in parts.items()
                if k in ("readiness", "smoke and canaries", "scrapes and slack")
            }
        total = sum(parts.values())
        return total, " + ".join(f"{k} {v:.0f}s" for k, v in parts.items() if v)

    def level_requests(self, concurrency: int) -> int:
        """How many requests one sweep level sends."""
        return max(self.requests_per_level * concurrency, self.min_requests_per_level)

    def with_duration(self, seconds: float) -> SoakConfig:
        """This config with the sustained phase lasting ``seconds`` (windows shrink to fit >= 3)."""
        if seconds < 0:
            raise SoakConfigError(
                f"soak duration {seconds}s is negative", fix="give a duration like 90s or 10m"
            )
        window = min(self.window, max(seconds / 3.0, 1.0)) if seconds > 0 else self.window
        return dataclasses.replace(self, sustained_duration=float(seconds), window=window)
