"""The checks that the server is up and whole: readiness, identity, smoke prompts, failed
requests, wedged streams, server-side errors, preemption storms and crashes or restarts."""

from __future__ import annotations

from dataclasses import replace

from fleetctl.soak import metrics
from fleetctl.soak.checks.check import Check, CheckContext
from fleetctl.soak.checks.evidence import Wedge
from fleetctl.soak.checks.judge import (
    ERR,
    INC,
    F,
    P,
    decide,
    garbage,
    inconsistent,
    ms,
    pct,
    skipped,
    snippet,
)
from fleetctl.soak.checks.watching import Burst, Interval, WatchJudge
from fleetctl.soak.config import CheckSpec
from fleetctl.soak.verdict import (
    CheckResult,
    Measurement,
)

#: With thinking off, the smoke answer must appear within this many characters of the reply.
ANSWER_WINDOW = 1000


def check_readiness(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """/health answered 200 before the readiness deadline (boot failures name the log's cause)."""
    ev = ctx.evidence
    r = ev.readiness
    m = Measurement("health", r.outcome, r.message, round(r.seconds, 1), None)
    return decide(spec, [m], ok_message=r.message)


def check_identity(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """/v1/models lists every served name of the recipe."""
    ev, config = ctx.evidence, ctx.config
    ident = ev.identity
    if ident is None:
        return skipped(spec, "not run: the server never became ready")
    if not ident.reachable:
        return decide(
            spec, [Measurement("models", ERR, f"/v1/models could not be read: {ident.detail}")]
        )
    want = config.served_model_names
    listed = ", ".join(ident.models) or "(none)"
    if not want:
        return decide(
            spec,
            [
                Measurement(
                    "models",
                    P if ident.models else F,
                    f"serves {listed}" if ident.models else "/v1/models lists no model",
                )
            ],
            ok_message=f"serves {listed} (no recipe names to compare); version "
                       f"{ident.version or 'n/a'}",
        )
    missing = [n for n in want if n not in ident.models]
    if missing:
        return decide(
            spec,
            [
                Measurement(
                    "models",
                    F,
                    f"/v1/models lacks {', '.join(missing)} (lists {listed})",
                    listed,
                    ", ".join(want),
                )
            ],
        )
    return decide(spec, [Measurement("models", P, "ok", listed, ", ".join(want))],
                  ok_message=f"serves {', '.join(want)}; version {ident.version or 'n/a'}")


def check_smoke(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """Fixed prompts at temperature 0 answer correctly; garbage fails; a length cut is not a
    crash."""
    ev = ctx.evidence
    if not ev.smoke:
        return skipped(spec, "not run: the identity check failed first" if ev.readiness.ready
                       else "not run: the server never became ready")
    out: list[Measurement] = []
    for sr in ev.smoke:
        s = sr.sample
        text = s.text or ""
        if not s.ok:
            out.append(
                Measurement(
                    sr.name, F, f"{sr.name}: request failed: {s.error}", s.error_kind, sr.expect
                )
            )
        elif why := garbage(text):
            out.append(
                Measurement(
                    sr.name,
                    F,
                    f"{sr.name}: garbage output ({why}): {snippet(text)}",
                    snippet(text),
                    sr.expect,
                )
            )
        elif sr.expect in text[:ANSWER_WINDOW]:
            out.append(Measurement(sr.name, P, f"{sr.name}: answer contains {sr.expect}",
                                   snippet(text), sr.expect))
        elif sr.expect in text:
            # A model emitting nonsense for 2048 tokens can hit "391" by chance: with thinking
            # off a healthy model answers near the start.
            out.append(
                Measurement(
                    sr.name,
                    F,
                    f"{sr.name}: {sr.expect} only appears after {ANSWER_WINDOW} characters "
                    f"of a {len(text)}-character reply: {snippet(text)}",
                    snippet(text),
                    sr.expect,
                )
            )
        elif not text.strip() and s.finish_reason == "length":
            # docs/domain.md#health (5): with thinking on, max_tokens < ~1500 gives content null +
            # length: not a crash.
            out.append(
                Measurement(
                    sr.name,
                    INC,
                    f"{sr.name}: no content (finish_reason length at "
                    f"max_tokens {sr.max_tokens}): the model ran out of tokens, not a crash",
                    "null",
                    sr.expect,
                )
            )
        else:
            out.append(
                Measurement(
                    sr.name,
                    F,
                    f"{sr.name}: answer lacks {sr.expect!r}: {snippet(text)}",
                    snippet(text),
                    sr.expect,
                )
            )
    return decide(spec, out, ok_message=f"{len(out)} smoke prompt(s) answered correctly")


def check_errors(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """No failed request at any level (HTTP errors, refusals, error events in 200 streams)."""
    ev = ctx.evidence
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    bound = float(spec.params.get("max_error_rate", 0.0))
    out: list[Measurement] = []
    for lv in ev.levels:
        if lv.requests == 0:
            out.append(Measurement(lv.label, INC, f"{lv.label}: no request completed"
                                   + (f" ({lv.stopped})" if lv.stopped else ""), None, bound))
            continue
        rate = lv.errors / lv.requests
        if rate > bound:
            msg = f"{lv.label}: {lv.errors}/{lv.requests} requests failed ({lv.first_error})"
            if ev.crash and lv.stopped:
                msg += f"; {ev.crash}"
            out.append(Measurement(lv.label, F, msg, round(rate, 4), bound))
        else:
            out.append(
                Measurement(
                    lv.label,
                    P,
                    f"{lv.label}: {lv.errors}/{lv.requests} failed",
                    round(rate, 4),
                    bound,
                )
            )
    if (
        ev.halted
        and not ev.wedges
        and not ev.crash
        and (ev.deadline_hit or not any(m.outcome is F for m in out))
    ):
        # A soak stopped early says so (a level whose every request failed already does): what it
        # did not run is not a pass.
        out.append(
            Measurement(
                "stopped", INC if ev.deadline_hit else F, f"soak stopped early: {ev.halted}"
            )
        )
    total = sum(lv.requests for lv in ev.levels)
    return decide(
        spec,
        out,
        ok_message=f"0 errors in {total} requests across {len(ev.levels)} levels",
        no_data="no load level ran" + (f" (soak stopped early: {ev.halted})" if ev.halted else ""),
    )


def stalled(label: str, what: str, w: Wedge, bound: float | None,
            health_ok: bool = True) -> Measurement:
    """THE liveness rule (the soak, the watch and the burst judge by it): a request (``what``)
    that got no token for the liveness ``bound`` is a wedged engine, a fail, while /health answers
    200; when /health does not answer either, the server is down: an error, not a wedge."""
    if not health_ok:
        return Measurement(label, ERR, f"{label}: no token for {bound or w.seconds:.0f}s and "
                           "/health does not answer (the server is down)", w.seconds, bound)
    return Measurement(
        label, F,
        f"engine wedged on {w.host}: {what} got no token for {bound or w.seconds:.0f}s while "
        "/health answered 200" + (f" ({w.detail})" if w.detail else ""),
        w.seconds, bound,
    )


def check_liveness(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """No request in flight went ``token_timeout`` seconds without a token while /health
    answered."""
    ev = ctx.evidence
    if not ev.readiness.ready:
        return skipped(spec, "not run: the server never became ready")
    bound = ev.token_timeout
    out = [
        stalled(w.where, f"a request of {w.where} (started at +{w.start:.0f}s)", w, bound)
        for w in ev.wedges
    ]
    if not out and ev.streams_timed:
        out.append(
            Measurement(
                "streams",
                P,
                f"{ev.streams_timed} streams, none {bound:.0f}s without a token"
                if bound
                else f"{ev.streams_timed} streams",
                ev.streams_timed,
                bound,
            )
        )
    return decide(
        spec,
        out,
        ok_message=f"no stream went {bound:.0f}s without a token ({ev.streams_timed} watched)"
        if bound
        else "no stream watched",
        no_data="no stream was watched",
    )


def check_server_errors(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """/metrics counts no request finished with reason ``error`` during the soak."""
    ev = ctx.evidence
    ws = [w for w in ev.windows if w.phase in ("classes", "sweep", "sustained")]
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    out: list[Measurement] = []
    for w in ws:
        if not w.success_by_reason:
            out.append(
                Measurement(w.label, INC, f"{w.label}: no vllm:request_success_total series")
            )
            continue
        errors = w.success_by_reason.get("error", 0.0)
        out.append(
            Measurement(
                w.label,
                F if errors > 0 else P,
                f"{w.label}: server finished {errors:.0f} request(s) with reason error",
                errors,
                0,
            )
        )
    done = sum(sum(w.success_by_reason.values()) for w in ws)
    out += inconsistent(ev, (metrics.SUCCESS,), ("classes", "sweep", "sustained"))
    return decide(spec, out, ok_message=f"{done:.0f} requests finished, none with reason error",
                  no_data="no /metrics window (scrapes failed)")


def check_preemptions(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """No preemption storm: preemptions per minute in every window under the bound."""
    ev = ctx.evidence
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    bound = float(spec.params.get("max_per_minute", 10.0))
    out: list[Measurement] = []
    for w in (w for w in ev.windows if w.phase in ("sweep", "sustained")):
        if w.preemptions is None:
            out.append(
                Measurement(w.label, INC, f"{w.label}: no vllm:num_preemptions_total series")
            )
            continue
        per_min = w.preemptions / max(w.end - w.start, 1e-9) * 60
        # A handful of preemptions in a short window is not a storm: judge the rate only past 10.
        bad = per_min > bound and w.preemptions > 10
        out.append(
            Measurement(
                w.label,
                F if bad else P,
                f"{w.label}: {w.preemptions:.0f} preemptions ({per_min:.0f}/min, bound "
                f"{bound:.0f}/min)",
                round(per_min, 1),
                bound,
            )
        )
    total = sum(w.preemptions or 0 for w in ev.windows if w.phase in ("sweep", "sustained"))
    out += inconsistent(ev, (metrics.PREEMPTIONS,), ("sweep", "sustained"))
    return decide(
        spec, out, ok_message=f"{total:.0f} preemptions, no storm", no_data="no /metrics window"
    )


def check_container(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """The server did not crash or restart during the soak."""
    ev = ctx.evidence
    if not ev.readiness.ready:
        return skipped(spec, "not run: the server never became ready")
    out: list[Measurement] = []
    if ev.crash:
        out.append(Measurement("crash", F, ev.crash))
    resets = [w.label for w in ev.windows if w.counter_reset]
    if resets:
        out.append(
            Measurement(
                "counters",
                F,
                f"/metrics counters went backwards in {', '.join(resets)}: "
                "the server restarted during the soak",
            )
        )
    if ev.has_container:
        a, b = ev.container_before, ev.container_after
        if a is None or b is None:
            out.append(
                Measurement("state", ERR, f"container state unreadable: {ev.container_error}")
            )
        elif not b.exists or not b.running:
            out.append(Measurement("state", F, f"container {b.status or 'gone'} after the soak"
                                   + (f" (exit code {b.exit_code})" if b.exit_code else "")))
        elif b.restart_count != a.restart_count or b.started_at != a.started_at:
            out.append(
                Measurement(
                    "state",
                    F,
                    f"container restarted during the soak (restarts "
                    f"{a.restart_count} -> {b.restart_count}, started {b.started_at})",
                    b.restart_count,
                    a.restart_count,
                )
            )
        else:
            out.append(
                Measurement(
                    "state", P, "same container throughout", b.restart_count, a.restart_count
                )
            )
    elif not out:
        return skipped(spec, "no container access (endpoint soak); /health stayed up")
    return decide(spec, out, ok_message="no crash, no restart")


def _watch_probes(iv: Interval) -> list[Measurement]:
    """The interval's canary and streamed request answered (a stall is liveness's)."""
    bad = [x for x in (iv.canary, iv.stream) if not x.ok and x.error_kind != "stall"]
    why = "; ".join(f"{x.cls} failed: {x.error}" for x in bad) if bad else \
        "canary and stream answered"
    return [Measurement(iv.label, F if bad else P, f"{iv.label}: {why}", len(bad), 0)]


def _watch_liveness(iv: Interval) -> list[Measurement]:
    """A probe that stalled (judged by :func:`stalled`), else the stream's first token."""
    stalls = [x for x in (iv.canary, iv.stream) if x.error_kind == "stall"]
    if stalls:
        x = stalls[0]
        w = Wedge(iv.host, iv.label, round(x.e2e or 0.0, 1), round(x.start, 1))
        return [stalled(iv.label, f"the {x.cls} request", w, iv.stall, iv.health_ok)]
    if iv.stream.ok:
        return [Measurement(iv.label, P, f"{iv.label}: first token after {ms(iv.stream.ttft)}",
                            iv.stream.ttft, iv.stall)]
    return []


def _watch_server_errors(iv: Interval) -> list[Measurement]:
    """The interval's server-side error rate (reason ``error`` / finished) under the bound."""
    label, t, s = iv.label, iv.traffic, iv.settings
    if iv.scrape_error:
        return [Measurement(label, ERR, f"{label}: {iv.scrape_error}")]
    if t is None:
        return []
    if t.finished is None or t.errors is None:
        why = "; ".join(t.problems)
        return [Measurement(label, INC, f"{label}: no request counts ({why or 'none'})")]
    rate = t.error_rate or 0.0
    bad = rate > s.max_server_error_rate and t.errors >= s.min_server_errors
    return [Measurement(label, F if bad else P,
                        f"{label}: server finished {t.errors:.0f} of {t.finished:.0f} request(s) "
                        f"with reason error ({pct(rate)})", round(rate, 4),
                        s.max_server_error_rate)]


def _watch_preemptions(iv: Interval) -> list[Measurement]:
    """No preemption storm in the interval (past 10 preemptions, over the bound per minute)."""
    t, label = iv.traffic, iv.label
    if t is None or t.preemptions is None:
        return []
    bound = iv.settings.max_preemptions_per_minute
    if bound is None:
        bound = float(iv.config.check("preemptions").params.get("max_per_minute", 10.0))
    per_min = t.preemptions / max(t.seconds, 1e-9) * 60
    bad = per_min > bound and t.preemptions > 10
    return [Measurement(label, F if bad else P, f"{label}: {t.preemptions:.0f} preemptions "
                        f"({per_min:.0f}/min, bound {bound:.0f}/min)", round(per_min, 1), bound)]


def _burst_load(b: Burst) -> list[CheckResult]:
    """No request of the burst failed (a stall is liveness's), and the burst ended in its bound."""
    failed = [s for s in b.samples if not s.ok and s.error_kind != "stall"]
    n = len(b.samples)
    return [CheckResult("load", F if failed or b.cut or not n else P,
                        f"{len(failed)} of {n} request(s) failed: {failed[0].error}" if failed
                        else "the burst outlived its bound (cut)" if b.cut
                        else "no request finished" if not n
                        else f"{n} request(s), none failed")]


def _burst_liveness(b: Burst) -> list[CheckResult]:
    """No request stalled (judged by :func:`stalled`), and every finished one streamed tokens."""
    bound = b.config.token_timeout()
    stalls = [
        stalled(s.cls, f"the {s.cls} request (started at +{s.start:.0f}s)",
                Wedge(b.host, s.cls, round(s.e2e or bound or 0.0, 1), round(s.start, 1)),
                bound, b.health_ok)
        for s in b.samples if s.error_kind == "stall"
    ]
    live = decide(CheckSpec("liveness"), stalls or [Measurement("burst", P, "")],
                  ok_message="every request streamed tokens")
    ok = [s for s in b.samples if s.ok]
    # No token: the usage says 0, or without usage no content ever came (no first token).
    dry = [s for s in ok if s.output_tokens == 0 or (s.output_tokens is None and s.ttft is None)]
    tokens = sum(s.output_tokens or 0 for s in ok)
    flow = CheckResult("tokens", F if dry or not ok else P,
                       f"{len(dry)} finished request(s) streamed no token" if dry else
                       "no request finished with tokens" if not ok else
                       f"{tokens} tokens over {len(ok)} request(s)")
    return [replace(live, measurements=()), flow]


READINESS = Check("readiness", check_readiness, needs=("readiness",), smoke=True)
IDENTITY = Check("identity", check_identity, needs=("identity",), smoke=True)
SMOKE = Check("smoke", check_smoke, needs=("smoke",), smoke=True)
ERRORS = Check(
    "errors", check_errors, needs=("load",), params={"max_error_rate": "fraction"},
    defaults={"spark": {"max_error_rate": 0.0}}, burst=_burst_load,
    watch=WatchJudge("probes", _watch_probes, lambda t: f"{t.requests} probe request(s) in "
                     f"{t.intervals} interval(s), none failed", "no interval completed"))
# A request in flight that gets no token for token_timeout seconds while /health answers is a
# wedged engine (vLLM #41725, MiaAI-Lab #87); the sustained phase sends a probe every half of it.
# Spark: past the slowest prefill a Spark does in this soak (a 16k-token prompt: seconds) and the
# c=64 TTFT p95 (11.2 s published) with room: a gap of two minutes is no queue, it is a wedge. The
# lab: the emulator's slowest request in the lab profile lasts seconds.
LIVENESS = Check(
    "liveness", check_liveness, needs=("load",), params={"token_timeout": "number"},
    defaults={"spark": {"token_timeout": 120.0}, "lab": {"token_timeout": 20.0}},
    watch=WatchJudge("liveness", _watch_liveness, lambda t: "every probe streamed tokens",
                     "no probe streamed"),
    burst=_burst_liveness)
SERVER_ERRORS = Check(
    "server_errors", check_server_errors, needs=("load", "metrics"),
    watch=WatchJudge("server_errors", _watch_server_errors,
                     lambda t: "no interval over the server error rate bound "
                     f"{pct(t.settings.max_server_error_rate)}", "fewer than two /metrics scrapes"))
PREEMPTIONS = Check(
    "preemptions", check_preemptions, needs=("load", "metrics"),
    params={"max_per_minute": "number"},
    defaults={"spark": {"max_per_minute": 10.0}, "lab": {"max_per_minute": 60.0}},
    watch=WatchJudge("preemptions", _watch_preemptions, lambda t: "no preemption storm",
                     "no preemption counter", server_series=True))
CONTAINER = Check("container", check_container, needs=("container",), smoke=True)
