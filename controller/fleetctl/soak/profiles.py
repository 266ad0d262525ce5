"""The soak profiles' defaults, from the published DGX Spark figures (docs/domain.md#health), and
the ``lab`` profile that scales them for the simulated fleet; the prompt classes, the checks and
the parameters each check takes (with their kinds)."""

from __future__ import annotations

import copy
from typing import Any

#: Prompt classes in the order the per-class phase runs them (long_context last: it is slow).
CLASSES = ("coding", "math", "reasoning", "prose", "natural_language", "extraction", "long_context")


PROFILES = ("spark", "lab")


#: Bumped whenever prompts or phases change what a level measures: older baselines stop comparing.
WORKLOAD_VERSION = 3


COMMON_PARAMS = ("enabled", "observe_only", "failure_limit", "inconclusive_limit",
                 "consecutive_error_limit")


#: THE declaration of the soak's checks: each check's name and its own parameters with their kinds
#: (validated by :func:`_check_param`), in the order reports show them. ``CHECKS`` is derived from
#: it, a profile's defaults give values only where a check has parameters, and ``checks.evaluate``
#: has one evaluator per name here (a test holds it to that).
CHECK_PARAMS: dict[str, dict[str, str]] = {
    "readiness": {},
    "identity": {},
    "smoke": {},
    # After errors: a crash's summary leads with the crash, not with the canaries it broke.
    "errors": {"max_error_rate": "fraction"},
    # A request in flight that gets no token for token_timeout seconds while /health answers is a
    # wedged engine (vLLM #41725, MiaAI-Lab #87); the sustained phase sends a probe every half of
    # it.
    "liveness": {"token_timeout": "number"},
    "correctness": {
        "canary_every": "count",
        "canary_max_tokens": "count",
        "long_decode_tokens": "count",
    },
    # The deep long-decode probe (corruption that starts ~12k tokens into a sequence): its length,
    # capped by max_model_len, and the windows its text is checked in. It replaces the correctness
    # check's long decode (long_decode_tokens) when enabled; disable it to save its minutes.
    "long_decode": {"tokens": "count", "window_tokens": "count"},
    # Long-prompt probes: one request per size (tokens, by the server's /tokenize) whose answer is a
    # fact hidden in the middle of the prompt; sizes past max_model_len are skipped. Each size costs
    # its prefill (a 128k-token prompt: about a minute on a Spark): a CI soak lists what it can
    # afford.
    "long_prompts": {"tokens": "counts"},
    "server_errors": {},
    "latency": {"ttft_p95_ms": "levels", "tpot_p50_ms": "levels"},
    "throughput": {"tolerance": "fraction", "floor_tok_s": "levels", "spread_k": "number"},
    "acceptance": {"floor": "classes", "phase_floor": "fraction", "min_ratio": "fraction"},
    "acceptance_decay": {"max_drop": "fraction", "min_windows": "count", "min_z": "number"},
    "long_context": {"floor": "fraction", "min_ratio": "fraction"},
    "preemptions": {"max_per_minute": "number"},
    "container": {},
    # The fixed greedy prompts with natural ends (soak/answerset.py) against the last known-good
    # version's answers (soak/checks/known_good.py): how many per class, their max_tokens and
    # concurrency (1: batch-invariant greedy answers), the length bounds, and the token-agreement
    # bounds (unset: reported only, kernels change numerics across versions).
    "known_good": {"prompts_per_class": "count", "max_tokens": "count", "concurrency": "count",
                   "max_length_ratio": "number", "min_length_delta": "count",
                   "min_prefix_share": "fraction", "min_exact_share": "fraction"},
}


#: Checks in the order they appear in reports.
CHECKS = tuple(CHECK_PARAMS)


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
    "checks": {
        # Every 8th load request is a greedy canary; one long decode per soak (thousands of
        # tokens: corruption that starts deep in a sequence), capped by max_model_len.
        "correctness": {"canary_every": 8, "canary_max_tokens": 64, "long_decode_tokens": 4096},
        # 16384 tokens, past the ~12k where corruption was reported (eugr/spark-vllm-docker #349):
        # at a Spark's single-stream 41-124 tok/s it costs 2.2-6.7 minutes of the soak.
        "long_decode": {"tokens": 16384, "window_tokens": 2048},
        "long_prompts": {"tokens": [32768, 65536, 131072]},
        "errors": {"max_error_rate": 0.0},
        # Past the slowest prefill a Spark does in this soak (a 16k-token prompt: seconds) and the
        # c=64 TTFT p95 (11.2 s published) with room: a gap of two minutes is no queue, it is a
        # wedge.
        "liveness": {"token_timeout": 120.0},
        "latency": {
            "ttft_p95_ms": {1: 500, 4: 1000, 16: 2000, 32: 6000, 64: 15000},
            "tpot_p50_ms": {1: 30, 4: 60, 16: 100, 32: 200, 64: 300},
        },
        "throughput": {
            "tolerance": 0.15,
            "floor_tok_s": {1: 40, 4: 100, 16: 180, 32: 220, 64: 250},
        },
        # Position-0 acceptance, about half the lowest published figure per class.
        "acceptance": {
            "floor": {
                "coding": 0.16,
                "math": 0.24,
                "reasoning": 0.22,
                "prose": 0.05,
                "natural_language": 0.1,
                "extraction": 0.14,
                "long_context": 0.2,
            },
            # Every sweep and sustained window: a collapse that happens outside the
            # per-class phase (or a decay that plateaus low) must not pass.
            "phase_floor": 0.03,
            # Sustained median against the run's own classes and the baseline's
            # sustained phase: a drop to half is a decay, whatever the floors say.
            "min_ratio": 0.5,
        },
        "acceptance_decay": {"max_drop": 0.5, "min_windows": 3},
        "long_context": {"floor": 0.2, "min_ratio": 0.5},
        "preemptions": {"max_per_minute": 10.0},
        "known_good": {"prompts_per_class": 2, "max_tokens": 1024, "concurrency": 1},
    },
}


def _lab_profile() -> dict[str, Any]:
    # The lab's emulator runs on two cores shared by the controller and every test, at
    # a fraction of a Spark's speed: same phases and checks, seconds instead of minutes,
    # latency bounds ~20x looser and throughput floors that only catch a stall.
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
    checks = lab["checks"]
    checks["latency"] = {
        "ttft_p95_ms": {1: 5000, 4: 8000, 16: 15000, 32: 25000, 64: 40000},
        "tpot_p50_ms": {1: 500, 4: 800, 16: 1500, 32: 2500, 64: 4000},
    }
    # Two short requests at c=1 on a shared 2-core box swing by ~30% run to run: a looser
    # tolerance and one noisy level forgiven; a 30% slower image still fails the other levels.
    checks["throughput"] = {"tolerance": 0.2, "failure_limit": 1, "floor_tok_s": {1: 2, 64: 5}}
    checks["preemptions"] = {"max_per_minute": 60.0}
    # The emulator's slowest request in the lab profile lasts seconds.
    checks["liveness"] = {"token_timeout": 20.0}
    checks["correctness"] = {"canary_every": 8, "canary_max_tokens": 64, "long_decode_tokens": 192}
    # The emulator decodes a 256-token probe in about a second at EMU_SPEED 4 (bench/soak_client.py
    # measures it): windows of 64 tokens.
    checks["long_decode"] = {"tokens": 256, "window_tokens": 64}
    checks["long_prompts"] = {"tokens": [6000]}
    # Few short requests per class: floors that only catch a collapse, not a class's mix.
    checks["acceptance"] = {
        "floor": dict.fromkeys(CLASSES, 0.05),
        "phase_floor": 0.02,
        "min_ratio": 0.5,
    }
    checks["long_context"] = {"floor": 0.05, "min_ratio": 0.5}
    # One prompt per class; the emulator's answers run 150-600 tokens and are the same at any
    # concurrency, so the set is asked four at a time (seconds).
    checks["known_good"] = {"prompts_per_class": 1, "max_tokens": 768, "concurrency": 4}
    return lab


DEFAULTS: dict[str, dict[str, Any]] = {"spark": SPARK, "lab": _lab_profile()}
