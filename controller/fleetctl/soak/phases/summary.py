"""One level's client-side figures from its samples: percentiles, throughput, goodput."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetctl.soak.verdict import (
    LevelSummary,
    Sample,
)


def _pctl(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def meets(s: Sample, slo: Mapping[str, float]) -> bool:
    """True when a successful request met every SLO (``ttft_ms``, ``tpot_ms``, ``e2el_ms``) it can
    be judged on."""
    got = {"ttft_ms": s.ttft, "tpot_ms": s.tpot, "e2el_ms": s.e2e}
    return s.ok and all((x := got[k]) is None or x * 1000 <= v for k, v in slo.items())


@dataclass(frozen=True)
class LevelKey:
    """Which level a summary is of: its phase, its label, the concurrency it ran at."""

    phase: str
    label: str
    concurrency: int


def summarize(key: LevelKey, samples: Sequence[Sample], seconds: float, stopped: str = "",
              slo: Mapping[str, float] | None = None,
              warm: Sequence[Sample] = ()) -> LevelSummary:
    """Client-side figures of one level from its samples (goodput against ``slo`` when given).

    ``warm`` samples (warm-up requests) count in requests, errors and throughput, not in the
    latency percentiles: a first request pays for compiled graphs and cold caches.
    """
    ok = [s for s in samples if s.ok]
    good = sum(1 for s in samples if meets(s, slo)) if slo else None
    errs = [s for s in samples if not s.ok]
    warm_ids = {id(s) for s in warm}
    timed = [s for s in ok if id(s) not in warm_ids] or ok
    ttft = [s.ttft for s in timed if s.ttft is not None]
    tpot = [s.tpot for s in timed if s.tpot is not None]
    e2e = [s.e2e for s in timed if s.e2e is not None]
    itl50 = [s.itl_p50 for s in timed if s.itl_p50 is not None]
    itl99 = [s.itl_p99 for s in timed if s.itl_p99 is not None]
    out_tokens = sum(s.output_tokens or 0 for s in ok)
    return LevelSummary(
        phase=key.phase,
        label=key.label,
        concurrency=key.concurrency,
        requests=len(samples),
        errors=len(errs),
        seconds=round(seconds, 3),
        tok_s=out_tokens / seconds if ok and seconds > 0 else None,
        ttft_p50=_pctl(ttft, 0.5),
        ttft_p95=_pctl(ttft, 0.95),
        ttft_p99=_pctl(ttft, 0.99),
        tpot_p50=_pctl(tpot, 0.5),
        tpot_p95=_pctl(tpot, 0.95),
        e2e_p50=_pctl(e2e, 0.5),
        e2e_p95=_pctl(e2e, 0.95),
        e2e_p99=_pctl(e2e, 0.99),
        itl_p50=_pctl(itl50, 0.5),
        itl_p99=_pctl(itl99, 0.99),
        warmup=len(warm_ids & {id(s) for s in samples}),
        slo_met=good / len(samples) if good is not None and samples else None,
        goodput_rps=good / seconds if good is not None and seconds > 0 else None,
        output_tokens=out_tokens,
        first_error=errs[0].error if errs else "",
        stopped=stopped,
    )
