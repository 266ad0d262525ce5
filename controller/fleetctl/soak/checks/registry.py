"""THE registry of the soak's checks and of the probes that gather their evidence: the built-in
checks in the order reports show them, one line per check (its definition lives in its family's
module), and :func:`evaluate`, which judges one soak by every registered check.

A check registered later (``REGISTRY.register``) is reported after the built-ins.
"""

from __future__ import annotations

from fleetctl.soak.capabilities import checks as capabilities
from fleetctl.soak.checks import answers, health, known_good, performance, speculative
from fleetctl.soak.checks.check import Check, CheckContext, Probe, Registry
from fleetctl.soak.checks.judge import skipped
from fleetctl.soak.verdict import CheckResult

PROBES: tuple[Probe, ...] = (
    Probe("readiness", "waits for /health 200", always=True),
    Probe("identity", "reads /v1/models and /version", always=True),
    Probe("smoke", "the fixed smoke prompts at temperature 0"),
    Probe("container", "the container's state before and after the soak (with container access)"),
    Probe("load", "the per-class, concurrency-sweep, open-loop and sustained load phases, and the "
          "looping answers' references"),
    Probe("metrics", "/metrics scrapes around each load level and sustained window"),
    Probe("canaries", "greedy canaries among the load and their c=1 references"),
    Probe("long_decode", "the soak's one long decode"),
    Probe("long_prompts", "one long prompt per size, a fact hidden in its middle"),
    Probe("answer_set", "the reference set's greedy answers (compared with the known-good's)"),
    Probe("capabilities", "what the recipe serves besides text chat, a few requests each "
          "(soak/capabilities)"),
)

CHECKS: tuple[Check, ...] = (
    health.READINESS,
    health.IDENTITY,
    health.SMOKE,
    # What the recipe serves beyond greedy text (soak/capabilities), probed after the load.
    capabilities.SERVED_NAMES,
    capabilities.TOOL_CALLS,
    capabilities.REASONING,
    capabilities.IMAGES,
    # After smoke, before liveness: a crash's summary leads with the crash, not with the canaries
    # it broke.
    health.ERRORS,
    health.LIVENESS,
    answers.CORRECTNESS,
    answers.LONG_DECODE,
    answers.LONG_PROMPTS,
    health.SERVER_ERRORS,
    performance.LATENCY,
    performance.THROUGHPUT,
    speculative.ACCEPTANCE,
    speculative.ACCEPTANCE_DECAY,
    speculative.LONG_CONTEXT,
    health.PREEMPTIONS,
    health.CONTAINER,
    known_good.KNOWN_GOOD,
)

#: THE registry: the soak gate, ``fleetctl watch`` and the burst judge by its checks.
REGISTRY = Registry(PROBES, CHECKS)


def evaluate(ctx: CheckContext, registry: Registry = REGISTRY) -> tuple[CheckResult, ...]:
    """Every registered check, in report order: disabled ones (and, in a smoke-only soak, those
    that need load) are reported as skipped."""
    out: list[CheckResult] = []
    for check in registry.checks():
        spec = ctx.config.check(check.name)
        if not spec.enabled:
            out.append(skipped(spec, "disabled in the recipe's soak settings"))
        elif ctx.config.smoke_only and not check.smoke:
            out.append(skipped(spec, "smoke-only soak (no load)"))
        else:
            out.append(check.evaluate(spec, ctx))
    return tuple(out)
