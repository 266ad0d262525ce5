"""The soak profiles' defaults, from the published DGX Spark figures (docs/domain.md#health), and
the ``lab`` profile that scales them for the simulated fleet, and the prompt classes. Each check's
own parameters and their defaults per profile are declared with the check (soak/checks/)."""

from __future__ import annotations

import copy
from typing import Any

#: Prompt classes in the order the per-class phase runs them (long_context last: it is slow).
CLASSES = ("coding", "math", "reasoning", "prose", "natural_language", "extraction", "long_context")


PROFILES = ("spark", "lab")


#: Bumped whenever prompts or phases change what a level measures: older baselines stop comparing.
WORKLOAD_VERSION = 3


#: The limits every check takes (as in Argo Rollouts' analysis), beside its own parameters (each
#: check declares those, their kinds and their defaults per profile: soak/checks/check.py).
COMMON_PARAMS = ("enabled", "observe_only", "failure_limit", "inconclusive_limit",
                 "consecutive_error_limit")


# The published figures for the Qwen3.6-35B-A3B on one Spark, with headroom (docs/domain.md#health):
# single stream 75-124 tok/s (min 41), TTFT 88-145 ms; c=4 191 ms / 48 tok/s per request;
# c=16 ~500 ms / 19 tok/s; c=64 p95 11.2 s / 7 tok/s, ~313 tok/s aggregate on the older
# image and 430-800 on 0.23/0.24; DFlash acceptance 32-78% (position 0) short context,
# 41-58% at 16-32K; prose/creative classes far lower (~11-27%).
SPARK: dict[str, Any] = {
    # What a model's load is expected to take (docs/domain.md: 3-5 minutes): the rollout's plan
    # estimates its wall time from it. Not a bound: readiness_timeout is.
    "load_time": 240.0,
    "readiness_timeout": 600.0,
    "readiness_poll": 2.0,
    "request_timeout": 180.0,
    "max_tokens": 256,
    "temperature": 0.0,
    # The published reference figures (throughput and acceptance floors) were measured with
    # thinking off; Qwen3.6's template turns it on by default.
    "thinking": False,
    "concurrency": [1, 4, 16, 32, 64],
    # Enough requests for stable percentiles (a p95 of 4 requests is their maximum), and three
    # trials per sweep level whose median tok/s is the level's: one slow trial does not flap a gate.
    "requests_per_level": 4,
    "min_requests_per_level": 32,
    "trials": 3,
    # Workers start this far apart (seconds) instead of in lockstep; each one's first request
    # is warm-up (kept in the error and correctness checks, out of the latency percentiles).
    "stagger": 0.05,
    # Open-loop levels (requests/s, Poisson arrivals) after the concurrency sweep; none by default.
    "request_rates": [],
    "level_timeout": 300.0,
    "classes": list(CLASSES),
    "class_requests": 2,
    "long_context_tokens": 16000,
    "smoke_max_tokens": 2048,
    # Multi-turn conversations sharing a context longer than a hybrid model's attention block
    # (~2k tokens on Qwen3.5/3.6): without whole-block prefix-cache hits the known decay (rejected
    # drafts written into the drafter's cached KV) is never exercised.
    "sustained": {
        "duration": 600.0,
        "concurrency": 16,
        "window": 60.0,
        "max_requests": 20000,
        "shared_prefix_tokens": 2560,
        "turns": 4,
    },
}


def _lab_profile() -> dict[str, Any]:
    # The lab's emulator runs on two cores shared by the controller and every test, at
    # a fraction of a Spark's speed: same phases and checks, seconds instead of minutes,
    # latency bounds ~20x looser and throughput floors that only catch a stall (the checks' lab
    # defaults).
    lab = copy.deepcopy(SPARK)
    lab.update({
        "load_time": 5.0,
        "readiness_timeout": 120.0,
        "readiness_poll": 0.5,
        "request_timeout": 60.0,
        "max_tokens": 48,
        "requests_per_level": 1,
        "min_requests_per_level": 2,
        "trials": 1,
        # No ramp in the lab: its requests last a fraction of a second, so workers started apart
        # never all run at once and a crash that needs K concurrent requests would not happen at K.
        "stagger": 0.0,
        "level_timeout": 60.0,
        "class_requests": 2,
        "long_context_tokens": 3000,
        "smoke_max_tokens": 2048,
        "sustained": {"duration": 15.0, "concurrency": 8, "window": 3.0, "max_requests": 2000,
                      "shared_prefix_tokens": 2560, "turns": 4},
    })
    return lab


DEFAULTS: dict[str, dict[str, Any]] = {"spark": SPARK, "lab": _lab_profile()}
