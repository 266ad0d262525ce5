"""The capability checks, one :class:`Check` each: the plan says whether it applies (tested, off
by recipe, not served), the probe's exchanges are judged by the capability's own module."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleetctl.soak.capabilities import images, names, reasoning, tools
from fleetctl.soak.capabilities.derive import Capability
from fleetctl.soak.capabilities.exchange import Exchange
from fleetctl.soak.checks.check import Check, CheckContext
from fleetctl.soak.checks.judge import decide, skipped
from fleetctl.soak.config import CheckSpec
from fleetctl.soak.verdict import CheckResult, Measurement

#: ``judge(exchanges, capability)`` -> one measurement per image, scenario, name ...
Judge = Callable[[Sequence[Exchange], Capability], list[Measurement]]


def _evaluate(judge: Judge) -> Callable[[CheckSpec, CheckContext], CheckResult]:
    def evaluate(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
        cap = next((c for c in ctx.config.plan if c.name == spec.name), None)
        if cap is None or not cap.tested:
            status = f"{cap.status}: {cap.source}" if cap else "not derived (no recipe)"
            return skipped(spec, status)
        run = next((r for r in ctx.evidence.capabilities if r.name == spec.name), None)
        if run is None:
            why = ("not run: the soak stopped before the capability probes"
                   if ctx.evidence.readiness.ready else "not run: the server never became ready")
            return skipped(spec, why)
        ms = judge(run.exchanges, cap)
        return decide(spec, ms, ok_message=f"{len(ms)} probe(s) right ({cap.source}; "
                      f"{run.requests} request(s), {run.seconds:.1f}s)",
                      no_data=f"the probe sent no request ({cap.source})")

    return evaluate


def _parser(cap: Capability) -> str:
    return str(cap.params.get("parser", "?"))


SERVED_NAMES = Check("served_names", _evaluate(lambda xs, _c: names.judge(xs)),
                     needs=("capabilities",))
TOOL_CALLS = Check("tool_calls", _evaluate(lambda xs, c: tools.judge(xs, _parser(c))),
                   needs=("capabilities",))
REASONING = Check("reasoning", _evaluate(lambda xs, c: reasoning.judge(xs, _parser(c))),
                  needs=("capabilities",))
IMAGES = Check("images", _evaluate(lambda xs, _c: images.judge(xs)), needs=("capabilities",))
