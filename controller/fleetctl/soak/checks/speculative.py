"""The checks of speculative decoding: draft acceptance per class, its decay across the sustained
phase, and its hold on long contexts."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from fleetctl.soak import metrics
from fleetctl.soak.checks.check import Check, CheckContext
from fleetctl.soak.checks.evidence import Evidence
from fleetctl.soak.checks.judge import (
    INC,
    F,
    P,
    decide,
    foreign_traffic,
    inconsistent,
    pct,
    size_measurements,
    skipped,
)
from fleetctl.soak.checks.watching import Interval, WatchJudge, WatchTotals
from fleetctl.soak.config import CheckSpec, SoakConfig
from fleetctl.soak.profiles import CLASSES
from fleetctl.soak.verdict import (
    CheckResult,
    Measurement,
    Verdict,
    Window,
)

#: The /metrics series that speculative decoding exports.
SPEC_SERIES = metrics.SPEC_SERIES


def _spec_applies(spec: CheckSpec, ev: Evidence, config: SoakConfig) -> CheckResult | None:
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    if config.speculative is False:
        return skipped(spec, "the recipe has no speculative decoding")
    if ev.spec_seen is False and config.speculative is None:
        return skipped(
            spec, "the server exports no vllm:spec_decode_* counters (no speculative config)"
        )
    if ev.spec_seen is False:
        return decide(
            spec,
            [
                Measurement(
                    "spec",
                    INC,
                    "the recipe uses speculative decoding but /metrics has "
                    "no vllm:spec_decode_* counters",
                )
            ],
        )
    return None


def check_acceptance(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """Draft acceptance rate per prompt class above its floor (per-class /metrics windows).

    Also: every sweep/sustained window above ``phase_floor``, and the sustained phase's
    median within ``min_ratio`` of this run's short classes and of the baseline's sustained phase.
    """
    ev, config, baseline = ctx.evidence, ctx.config, ctx.baseline
    if (r := _spec_applies(spec, ev, config)) is not None:
        return r
    floors = spec.params.get("floor", {})
    out: list[Measurement] = []
    for w in (w for w in ev.windows if w.phase == "classes"):
        floor = floors.get(w.label)
        if floor is None:
            continue
        acc = position0(w)
        if acc is None:
            out.append(
                Measurement(w.label, INC, f"{w.label}: no draft tokens in its window", None, floor)
            )
        elif acc < floor:
            out.append(
                Measurement(
                    w.label,
                    F,
                    f"{w.label}: position-0 acceptance {pct(acc)} < floor {pct(floor)}",
                    round(acc, 4),
                    floor,
                )
            )
        else:
            out.append(Measurement(w.label, P, f"{w.label}: position-0 acceptance {pct(acc)}",
                                   round(acc, 4), floor))
    rates = ", ".join(
        f"{m.label} {pct(m.measured if isinstance(m.measured, float) else None)}" for m in out
    )
    phase_floor = spec.params.get("phase_floor")
    if phase_floor is not None:
        out.extend(_phase_floor(ev.windows, float(phase_floor)))
    ratio = spec.params.get("min_ratio")
    if ratio is not None:
        out.extend(_sustained_ratio(ev.windows, baseline, float(ratio)))
    out.extend(foreign_traffic(ev, ("classes", "sweep", "sustained")))
    out.extend(inconsistent(ev, SPEC_SERIES))
    return decide(spec, out, ok_message=f"above the floors: {rates}", no_data="no per-class window")


def _sustained_median(windows: Sequence[Window]) -> float | None:
    rates = [a for w in windows if w.phase == "sustained" and (a := position0(w)) is not None]
    return statistics.median(rates) if rates else None


def _sustained_ratio(
    windows: Sequence[Window], baseline: Verdict | None, ratio: float
) -> list[Measurement]:
    """The sustained phase's median acceptance against this run's classes and the baseline's.

    The median of windows, not their mean: one window straddling a phase edge must not decide.
    """
    sus = _sustained_median(windows)
    if sus is None:
        return []
    out: list[Measurement] = []
    short = [a for w in windows if w.phase == "classes" and w.label != "long_context"
             and (a := position0(w)) is not None]
    refs = [("classes", "this run's short classes", statistics.fmean(short) if short else None)]
    if baseline is not None:
        refs.append(("baseline", f"baseline {baseline.run_id}'s sustained phase",
                     _sustained_median(baseline.windows)))
    for label, what, ref in refs:
        if not ref:
            continue
        held = sus / ref
        out.append(
            Measurement(
                f"sustained vs {label}",
                F if held < ratio else P,
                f"sustained acceptance {pct(sus)} is {held:.0%} of {what} {pct(ref)} "
                f"(bound {ratio:.0%})",
                round(held, 4),
                ratio,
            )
        )
    return [m for m in out if m.outcome is F]


def _phase_floor(windows: Sequence[Window], floor: float) -> list[Measurement]:
    """The absolute floor on every sweep and sustained window that saw drafts.

    The per-class floors only judge the classes phase; a collapse during the sweep,
    or a decay that plateaus low in the sustained phase, would otherwise pass.
    Windows without drafts say nothing here (the decay check reports missing data).
    """
    out: list[Measurement] = []
    for w in windows:
        if w.phase not in ("sweep", "sustained") or (acc := position0(w)) is None:
            continue
        if acc < floor:
            out.append(Measurement(w.label, F, f"{w.label}: position-0 acceptance {pct(acc)} < "
                                   f"absolute floor {pct(floor)}", round(acc, 4), floor))
    return out


def position0(w: Window) -> float | None:
    """Position-0 acceptance of a window (the published figure), else the overall rate."""
    if w.per_position:
        return w.per_position[0]
    return w.acceptance_rate


def acceptance_trend(windows: Sequence[Window]) -> tuple[float, float] | None:
    """Mean acceptance of the first and the last third of ``windows`` (None if < 2 usable)."""
    rates = [w.acceptance_rate for w in windows if w.acceptance_rate is not None]
    if len(rates) < 2:
        return None
    k = max(1, len(rates) // 3)
    return statistics.fmean(rates[:k]), statistics.fmean(rates[-k:])


def _drop_z(windows: Sequence[Window]) -> float | None:
    """z of the acceptance drop from the first third of ``windows`` to the last (None without
    counts).

    Proportions are accepted / draft tokens; the sample sizes are the drafts (tokens of one
    draft are accepted together or not, so counting tokens would overstate the evidence).
    """
    k = max(1, len(windows) // 3)

    def pooled(ws: Sequence[Window]) -> tuple[float, float, float] | None:
        acc = sum(w.accepted_tokens or 0.0 for w in ws)
        tok = sum(w.draft_tokens or 0.0 for w in ws)
        n = sum(w.drafts or 0.0 for w in ws)
        return (acc / tok, n, tok) if tok > 0 and n > 0 else None

    a, b = pooled(windows[:k]), pooled(windows[-k:])
    if a is None or b is None:
        return None
    p = (a[0] * a[2] + b[0] * b[2]) / (a[2] + b[2])
    se = math.sqrt(max(p * (1 - p), 1e-12) * (1 / a[1] + 1 / b[1]))
    return (a[0] - b[0]) / se


def _decay_context(ws: Sequence[Window], ev: Evidence) -> list[Measurement]:
    """The sustained phase's prefix-cache hits, shared-prefix sizes and foreign traffic."""
    out: list[Measurement] = []
    queries = [w.prefix_cache_queries for w in ws if w.prefix_cache_queries is not None]
    hits = sum(w.prefix_cache_hits or 0.0 for w in ws)
    if queries and sum(queries) > 0:
        # The known decay comes from prefix-cache hits (rejected drafts in the drafter's cached KV):
        # a window that never hit the cache cannot show it, so a steady trend proves nothing.
        out.append(
            Measurement(
                "prefix cache",
                P if hits > 0 else INC,
                f"sustained prefix-cache hits {hits:.0f} of {sum(queries):.0f} prompt tokens "
                f"({hits / sum(queries):.0%})"
                + (
                    ""
                    if hits > 0
                    else ": the decay that needs cache hits was never exercised (shared prefixes "
                    "shorter than the model's cache block?)"
                ),
                round(hits / sum(queries), 4),
                None,
            )
        )
    out += size_measurements(ev, "shared_prefix")
    block = ev.cache_block_tokens
    if (
        block
        and "shared_prefix" in ev.prompt_sizes
        and ev.prompt_sizes["shared_prefix"][0] <= block
    ):
        out.append(
            Measurement(
                "cache block",
                INC,
                f"the shared prefix ({ev.prompt_sizes['shared_prefix'][0]} tokens) "
                f"is not longer than the server's prefix-cache block ({block} tokens): no request "
                "can "
                "hit the cache (the model's max_model_len leaves no room for a longer one)",
                ev.prompt_sizes["shared_prefix"][0],
                block,
            )
        )
    out += foreign_traffic(ev, ("sustained",))
    return out


def check_acceptance_decay(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """Acceptance does not decay across the sustained phase's windows (trend, not lifetime
    totals)."""
    ev, config = ctx.evidence, ctx.config
    if config.sustained_duration <= 0:
        return skipped(spec, "no sustained phase in this soak")
    if (r := _spec_applies(spec, ev, config)) is not None:
        return r
    ws = [w for w in ev.windows if w.phase == "sustained"]
    usable = [w for w in ws if w.acceptance_rate is not None]
    need = int(spec.params.get("min_windows", 3))
    max_drop = float(spec.params.get("max_drop", 0.5))
    series = " ".join(pct(w.acceptance_rate) for w in usable)
    # What the workload exercised is reported whatever the trend says: a slow server with too few
    # windows still shows whether its shared prefixes hit the cache and met their sizes.
    context = _decay_context(ws, ev) + inconsistent(ev, SPEC_SERIES, ("sustained",))
    if len(usable) < need:
        return decide(
            spec,
            [
                Measurement(
                    "trend",
                    INC,
                    f"only {len(usable)} sustained window(s) with drafts, "
                    f"need {need} (lengthen the sustained phase)",
                    len(usable),
                    need,
                ),
                *context,
            ],
        )
    trend = acceptance_trend(usable)
    assert trend is not None
    first, last = trend
    if first <= 0.01:
        return decide(
            spec,
            [
                Measurement(
                    "trend",
                    INC,
                    f"acceptance starts at {pct(first)}: too low to judge a trend ({series})",
                    round(first, 4),
                    None,
                ),
                *context,
            ],
        )
    drop = 1 - last / first
    # A drop is a decay only when the windows' draft counts make it significant: a short soak at
    # a sampled temperature has a few dozen drafts per window, and one window's reading can be
    # half the previous one's by chance (a healthy lab canary measured 11.6 % -> 4.8 % over 80
    # drafts). Two-proportion z-test of the first third against the last, on draft counts.
    z = _drop_z(usable)
    min_z = float(spec.params.get("min_z", 3.0))
    significant = z is None or z >= min_z
    outcome = F if drop > max_drop and significant else P
    msg = (
        f"acceptance fell {drop:.0%} from {pct(first)} to {pct(last)} across the sustained windows "
        f"({series}); bound {max_drop:.0%}"
        + (f", z={z:.1f}" if z is not None else "")
        + (
            ""
            if significant or drop <= max_drop
            else f": not significant (z < {min_z:g}) over this "
            "few drafts; a longer sustained phase would tell"
        )
    )
    out = [Measurement("trend", outcome, msg, round(drop, 4), max_drop), *context]
    hits = next((m.measured for m in context if m.label == "prefix cache"), None)
    return decide(
        spec,
        out,
        ok_message=f"no decay: {pct(first)} -> {pct(last)} over {len(usable)} windows"
        + (
            f", {hits:.0%} of prompt tokens from the prefix cache"
            if isinstance(hits, float)
            else ""
        ),
    )


def check_long_context(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """Long-context acceptance holds: above a floor and a share of short-context acceptance."""
    ev, config = ctx.evidence, ctx.config
    if "long_context" not in config.classes:
        return skipped(spec, "long_context class not in this soak's classes")
    if (r := _spec_applies(spec, ev, config)) is not None:
        return r
    cls_ws = {w.label: w for w in ev.windows if w.phase == "classes"}
    lw = cls_ws.get("long_context")
    floor = float(spec.params.get("floor", 0.15))
    ratio = float(spec.params.get("min_ratio", 0.5))
    acc = position0(lw) if lw is not None else None
    lies = inconsistent(ev, SPEC_SERIES, ("classes",))
    if acc is None:
        return decide(
            spec,
            [*lies]
            or [Measurement("long_context", INC, "no long-context window with draft tokens")],
        )
    short = [
        a for k, w in cls_ws.items() if k != "long_context" and (a := position0(w)) is not None
    ]
    ref = statistics.fmean(short) if short else None
    out = [Measurement("floor", F if acc < floor else P,
                       f"long-context position-0 acceptance {pct(acc)} vs floor {pct(floor)}",
                       round(acc, 4), floor)]
    if ref:
        held = acc / ref
        out.append(
            Measurement(
                "hold",
                F if held < ratio else P,
                f"long-context position-0 acceptance {pct(acc)} is {held:.0%} of short-context "
                f"{pct(ref)} (bound {ratio:.0%})"
                + (": it collapses on long histories" if held < ratio else ""),
                round(held, 4),
                ratio,
            )
        )
    out += size_measurements(ev, "long_context") + lies
    return decide(spec, out, ok_message=f"holds at {pct(acc)} (short context {pct(ref)})")


def _watch_acceptance(iv: Interval) -> list[Measurement]:
    """Acceptance over blocks of consecutive intervals holding ``min_draft_tokens`` drafted tokens
    stays above ``acceptance_ratio`` of the watch's first block (the reference, not judged)."""
    w, st, s, label = iv.window, iv.state, iv.settings, iv.label
    if w is None or iv.traffic is None:
        return []
    if w.accepted_tokens is not None and w.draft_tokens:
        st.block_from = st.block_from or label
        st.block[0] += w.accepted_tokens
        st.block[1] += w.draft_tokens
        if st.block[1] < s.min_draft_tokens:
            return []
        rate = st.block[0] / st.block[1]
        where = f"{st.block_from}-{label}" if st.block_from != label else label
        st.block, st.block_from = [0.0, 0.0], ""
        if st.first_acceptance is None:
            st.first_acceptance = rate  # the reference block: judged against, not judged
            return []
        lim = st.first_acceptance * s.acceptance_ratio
        return [Measurement(where, F if rate < lim else P,
                            f"{where}: acceptance {pct(rate)} (first block "
                            f"{pct(st.first_acceptance)}, floor {pct(lim)})",
                            round(rate, 4), round(lim, 4))]
    if any(x.startswith(metrics.SPEC_SERIES) for x in iv.traffic.problems):
        why = "; ".join(iv.traffic.problems)
        return [Measurement(label, INC, f"{label}: metrics inconsistent: {why}")]
    return []


def _watch_unjudged(t: WatchTotals) -> str:
    return (f"not judged: fewer than two blocks of {t.settings.min_draft_tokens} drafted tokens "
            "in the watch" if t.spec_seen else "no speculative decoding on this server")


ACCEPTANCE = Check(
    "acceptance", check_acceptance, needs=("load", "metrics"),
    params={"floor": "classes", "phase_floor": "fraction", "min_ratio": "fraction"},
    defaults={
        # Position-0 acceptance, about half the lowest published figure per class; every sweep
        # and sustained window over phase_floor (a collapse outside the per-class phase, or a
        # decay that plateaus low, must not pass); the sustained median at least min_ratio of the
        # run's own classes and of the baseline's sustained phase (a drop to half is a decay).
        "spark": {"floor": {"coding": 0.16, "math": 0.24, "reasoning": 0.22, "prose": 0.05,
                            "natural_language": 0.1, "extraction": 0.14, "long_context": 0.2},
                  "phase_floor": 0.03, "min_ratio": 0.5},
        # Few short requests per class: floors that only catch a collapse, not a class's mix.
        "lab": {"floor": dict.fromkeys(CLASSES, 0.05), "phase_floor": 0.02, "min_ratio": 0.5},
    },
    watch=WatchJudge("acceptance", _watch_acceptance,
                     lambda t: f"acceptance stayed above {t.settings.acceptance_ratio:.0%} of its "
                     "first block", unjudged=_watch_unjudged))
ACCEPTANCE_DECAY = Check(
    "acceptance_decay", check_acceptance_decay, needs=("load", "metrics"),
    params={"max_drop": "fraction", "min_windows": "count", "min_z": "number"},
    defaults={"spark": {"max_drop": 0.5, "min_windows": 3}})
LONG_CONTEXT = Check(
    "long_context", check_long_context, needs=("load", "metrics"),
    params={"floor": "fraction", "min_ratio": "fraction"},
    defaults={"spark": {"floor": 0.2, "min_ratio": 0.5}, "lab": {"floor": 0.05, "min_ratio": 0.5}})
