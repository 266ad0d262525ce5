"""The gate's checks: evidence from one soak in, one CheckResult per check out.

Each check turns its evidence into measurements (one per level, window, class
or prompt), each pass / fail / inconclusive / error with the measured value and
its bound, then applies the check's limits as Argo Rollouts' analysis does:
more failures than ``failure_limit`` fails it, more consecutive errors than
``consecutive_error_limit`` errors it, more inconclusive measurements than
``inconclusive_limit`` makes it inconclusive. No measurements at all is
inconclusive: missing data never passes. ``observe_only`` checks are reported
but do not count toward the verdict.

Why one file of ~800 lines: every check's evaluator reads the same Evidence and shares the
measurement helpers and outcome rules; split per check they would import each other.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fleetctl.container import Container
from fleetctl.soak import metrics, prompts
from fleetctl.soak.config import CHECKS, CheckSpec, SoakConfig
from fleetctl.soak.loops import find_loop
from fleetctl.soak.verdict import (
    CheckResult,
    LevelSummary,
    Measurement,
    Outcome,
    Readiness,
    Sample,
    Verdict,
    Window,
)

P, F, INC, ERR, SKIP = Outcome.PASS, Outcome.FAIL, Outcome.INCONCLUSIVE, Outcome.ERROR, Outcome.SKIPPED


@dataclass(frozen=True)
class Identity:
    """What the server says it is."""

    reachable: bool
    models: tuple[str, ...] = ()
    version: str = ""
    max_model_len: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class SmokeResult:
    """One smoke prompt: the request as measured and what the answer had to contain."""

    name: str
    expect: str
    sample: Sample
    max_tokens: int


@dataclass(frozen=True)
class CanaryResult:
    """One greedy canary: where it ran, what it had to say, and its prompt's answer at c=1."""

    name: str
    expect: str
    #: The level it ran in ("c=16", "sustained") or "reference" for the c=1 reference run.
    level: str
    sample: Sample
    #: The same prompt's text at c=1 (None for the reference itself, or when that failed).
    reference: str | None = None


@dataclass(frozen=True)
class LoopResult:
    """An answer that ended in a phrase loop, and the same prompt's reference answer.

    The reference is the same request at c=1, greedy, without ``ignore_eos`` (the model may stop
    by itself): a loop the reference shares, or one that starts where the reference stopped, is
    the model's, not the server's.
    """

    sample: Sample
    #: Where it ran ("c=16", "sustained", "long_decode").
    where: str
    reference: Sample | None
    #: Answers to this same prompt that looped (the sample is the first).
    count: int = 1


#: A loop starting at or past this share of the reference's natural length is past the model's end.
NATURAL_END_SHARE = 0.8


@dataclass(frozen=True)
class LongPrompt:
    """One long-prompt probe: its target size, how it was sized, and the answer (None when skipped)."""

    tokens: int
    how: str = ""
    sample: Sample | None = None
    skipped: str = ""


@dataclass(frozen=True)
class Wedge:
    """A request that got no token for the liveness bound while /health answered 200."""

    host: str
    #: The phase or level it ran in ("c=16", "sustained", "the long decode").
    where: str
    #: Seconds the request waited in all (its last token, or its start, was this long before the end).
    seconds: float
    #: When the request started, seconds into the soak.
    start: float
    detail: str = ""


@dataclass(frozen=True)
class Evidence:
    """Everything one soak observed; the engine builds it, the checks judge it."""

    readiness: Readiness
    identity: Identity | None = None
    smoke: tuple[SmokeResult, ...] = ()
    levels: tuple[LevelSummary, ...] = ()
    windows: tuple[Window, ...] = ()
    #: Phases that were meant to run and did not (crash, readiness failure, smoke-only).
    load_ran: bool = False
    #: Non-empty when the server crashed during the soak: what happened, with the log's cause.
    crash: str = ""
    container_before: Container | None = None
    container_after: Container | None = None
    #: Why container state could not be read (empty when it was, or when there is no access).
    container_error: str = ""
    has_container: bool = False
    #: Whether the server exports spec-decode counters (None: no scrape succeeded).
    spec_seen: bool | None = None
    scrape_errors: tuple[str, ...] = ()
    #: The host (target name), named in correctness findings.
    host: str = ""
    canaries: tuple[CanaryResult, ...] = ()
    #: Load and long-decode samples whose streamed text was flagged as garbage.
    garbage_samples: tuple[Sample, ...] = ()
    #: Load streams whose text was checked (flagged or not).
    streams_checked: int = 0
    #: The soak's one long decode (None when it did not run).
    long_decode: Sample | None = None
    #: Prompts sized in tokens: name -> (target tokens, tokens the server counted, "tokenize"|"estimate").
    prompt_sizes: Mapping[str, tuple[int, int | None, str]] = field(default_factory=dict)
    #: The server's prefix-cache block in tokens (vllm:cache_config_info), when it states one.
    cache_block_tokens: int | None = None
    #: Why the soak stopped before its end (empty when it ran its course).
    halted: str = ""
    #: True when the hard deadline stopped it.
    deadline_hit: bool = False
    wedges: tuple[Wedge, ...] = ()
    #: The liveness bound the streams were held to (None: not watched).
    token_timeout: float | None = None
    #: Streams watched for liveness.
    streams_timed: int = 0
    #: Looping answers judged against their reference; looping answers left unjudged (past the cap).
    loops: tuple[LoopResult, ...] = ()
    loops_unjudged: int = 0
    long_prompts: tuple[LongPrompt, ...] = ()


def pct(x: float | None) -> str:
    """0.523 -> '52.3%' ('n/a' for None)."""
    return "n/a" if x is None else f"{100 * x:.1f}%"


def ms(x: float | None) -> str:
    """Seconds as a readable duration."""
    if x is None:
        return "n/a"
    return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"


def decide(spec: CheckSpec, ms_: Sequence[Measurement], ok_message: str = "",
           no_data: str = "no data to judge") -> CheckResult:
    """Apply ``spec``'s limits to the measurements (Argo Rollouts' analysis semantics)."""
    name = spec.name
    if not ms_:
        return CheckResult(name, INC, f"inconclusive: {no_data}", spec.observe_only)
    fails = [m for m in ms_ if m.outcome is F]
    incs = [m for m in ms_ if m.outcome is INC]
    errs = [m for m in ms_ if m.outcome is ERR]
    run = worst = 0
    for m in ms_:
        run = run + 1 if m.outcome is ERR else 0
        worst = max(worst, run)
    if len(fails) > spec.failure_limit:
        outcome, shown = F, fails
    elif worst > spec.consecutive_error_limit:
        outcome, shown = ERR, errs
    elif len(incs) > spec.inconclusive_limit:
        outcome, shown = INC, incs
    elif all(m.outcome is SKIP for m in ms_):
        outcome, shown = SKIP, list(ms_)
    else:
        outcome, shown = P, []
    if outcome is P:
        message = ok_message or f"{sum(m.outcome is P for m in ms_)} measurement(s) within bounds"
        tolerated = len(fails) + len(incs) + len(errs)
        if tolerated:
            message += f" ({tolerated} tolerated by the check's limits)"
    else:
        message = "; ".join(m.message for m in shown[:3])
        if len(shown) > 3:
            message += f"; and {len(shown) - 3} more"
    return CheckResult(name, outcome, message, spec.observe_only, tuple(ms_))


def skipped(spec: CheckSpec, why: str) -> CheckResult:
    """A check that does not apply to this soak."""
    return CheckResult(spec.name, SKIP, why, spec.observe_only)


# --- garbage ------------------------------------------------------------------------------------

_RUN = re.compile(r"(\S)\1{7,}")


def garbage(text: str) -> str:
    """Why ``text`` looks like garbage output (``!!!!``...), or '' when it does not.

    A long run of one repeated non-space character, or one character making up
    most of the reply, is what a model with mis-loaded weights emits.
    """
    stripped = "".join(text.split())
    if not stripped:
        return ""
    m = _RUN.search(stripped)
    if m and not m.group(1).isalnum() and len(m.group(0)) >= 8 and m.group(1) not in "-=_*#.`~":
        return f"a run of {len(m.group(0))} {m.group(1)!r}"
    if len(stripped) >= 16:
        top = max(set(stripped), key=stripped.count)
        share = stripped.count(top) / len(stripped)
        if share >= 0.8:
            return f"{share:.0%} of the reply is {top!r}"
    return ""


def _snippet(text: str, n: int = 60) -> str:
    one = " ".join(text.split())
    return repr(one if len(one) <= n else one[: n - 1] + "…")


# --- the checks ---------------------------------------------------------------------------------


#: With thinking off, the smoke answer must appear within this many characters of the reply.
ANSWER_WINDOW = 1000


def check_readiness(spec: CheckSpec, ev: Evidence) -> CheckResult:
    """/health answered 200 before the readiness deadline (boot failures name the log's cause)."""
    r = ev.readiness
    m = Measurement("health", r.outcome, r.message, round(r.seconds, 1), None)
    return decide(spec, [m], ok_message=r.message)


def check_identity(spec: CheckSpec, ev: Evidence, config: SoakConfig) -> CheckResult:
    """/v1/models lists every served name of the recipe."""
    ident = ev.identity
    if ident is None:
        return skipped(spec, "not run: the server never became ready")
    if not ident.reachable:
        return decide(spec, [Measurement("models", ERR, f"/v1/models could not be read: {ident.detail}")])
    want = config.served_model_names
    listed = ", ".join(ident.models) or "(none)"
    if not want:
        return decide(spec, [Measurement("models", P if ident.models else F,
                                         f"serves {listed}" if ident.models else "/v1/models lists no model")],
                      ok_message=f"serves {listed} (no recipe names to compare); version {ident.version or 'n/a'}")
    missing = [n for n in want if n not in ident.models]
    if missing:
        return decide(spec, [Measurement("models", F, f"/v1/models lacks {', '.join(missing)} (lists {listed})",
                                         listed, ", ".join(want))])
    return decide(spec, [Measurement("models", P, "ok", listed, ", ".join(want))],
                  ok_message=f"serves {', '.join(want)}; version {ident.version or 'n/a'}")


def check_smoke(spec: CheckSpec, ev: Evidence) -> CheckResult:
    """Fixed prompts at temperature 0 answer correctly; garbage fails; a length cut is not a crash."""
    if not ev.smoke:
        return skipped(spec, "not run: the identity check failed first" if ev.readiness.ready
                       else "not run: the server never became ready")
    out: list[Measurement] = []
    for sr in ev.smoke:
        s = sr.sample
        text = s.text or ""
        if not s.ok:
            out.append(Measurement(sr.name, F, f"{sr.name}: request failed: {s.error}", s.error_kind, sr.expect))
        elif why := garbage(text):
            out.append(Measurement(sr.name, F, f"{sr.name}: garbage output ({why}): {_snippet(text)}",
                                   _snippet(text), sr.expect))
        elif sr.expect in text[:ANSWER_WINDOW]:
            out.append(Measurement(sr.name, P, f"{sr.name}: answer contains {sr.expect}", _snippet(text), sr.expect))
        elif sr.expect in text:
            # A model emitting nonsense for 2048 tokens can hit "391" by chance: with thinking
            # off a healthy model answers near the start.
            out.append(Measurement(sr.name, F, f"{sr.name}: {sr.expect} only appears after {ANSWER_WINDOW} characters "
                                   f"of a {len(text)}-character reply: {_snippet(text)}", _snippet(text), sr.expect))
        elif not text.strip() and s.finish_reason == "length":
            # docs/domain.md#health (5): with thinking on, max_tokens < ~1500 gives content null + length: not a crash.
            out.append(Measurement(sr.name, INC, f"{sr.name}: no content (finish_reason length at "
                                   f"max_tokens {sr.max_tokens}): the model ran out of tokens, not a crash",
                                   "null", sr.expect))
        else:
            out.append(Measurement(sr.name, F, f"{sr.name}: answer lacks {sr.expect!r}: {_snippet(text)}",
                                   _snippet(text), sr.expect))
    return decide(spec, out, ok_message=f"{len(out)} smoke prompt(s) answered correctly")


def _where(s: Sample) -> str:
    if s.phase == "sweep":
        return f"c={s.concurrency}"
    return s.phase if s.phase in ("sustained", "long_decode") else f"{s.phase} {s.cls}"


def same_answer(a: str, b: str) -> bool:
    """Two answers equal up to case and whitespace (a greedy canary repeats its reference)."""
    return " ".join(a.split()).lower() == " ".join(b.split()).lower()


def check_correctness(spec: CheckSpec, ev: Evidence) -> CheckResult:
    """No garbage in any streamed answer under load; canaries right and equal to their c=1 answer."""
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    host = f"{ev.host} " if ev.host else ""
    out: list[Measurement] = []
    for s in ev.garbage_samples:
        out.append(Measurement(
            _where(s), F, f"{host}{_where(s)}: garbage in a {s.cls} answer started at +{s.start:.1f}s "
            f"({s.garbage}): {_snippet(s.excerpt, 80)}", s.excerpt, "no garbage"))
    for c in ev.canaries:
        s, text = c.sample, c.sample.text or ""
        where = f"{host}canary {c.name} at {c.level}"
        if not s.ok:
            out.append(Measurement(c.level, F, f"{where}: request failed: {s.error}", s.error_kind, c.expect))
        elif s.garbage:
            out.append(Measurement(c.level, F, f"{where}: garbage ({s.garbage}): {_snippet(s.excerpt, 80)}",
                                   s.excerpt, c.expect))
        elif c.expect.lower() not in text.lower():
            out.append(Measurement(c.level, F, f"{where}: answer lacks {c.expect!r}: {_snippet(text, 80)}",
                                   _snippet(text), c.expect))
        elif c.reference is not None and not same_answer(text, c.reference):
            # Greedy decoding of the same prompt: a different answer under load is corruption
            # (or a batch-variant kernel worth knowing about), even when it still holds the fact.
            out.append(Measurement(c.level, F, f"{where}: answer {_snippet(text, 50)} differs from its c=1 "
                                   f"answer {_snippet(c.reference, 50)}", _snippet(text), _snippet(c.reference)))
        else:
            out.append(Measurement(c.level, P, f"{where}: ok", _snippet(text), c.expect))
    out += [_judge_loop(lr, host) for lr in ev.loops]
    if ev.loops_unjudged:
        # Reported, not counted: the first looping prompts were judged, and a server that loops
        # where the model does not shows it on those already.
        out.append(Measurement("loops", P, f"{ev.loops_unjudged} more looping answer(s) of other prompts not "
                               "judged against a reference (the soak re-runs the first few only)", ev.loops_unjudged))
    ld = ev.long_decode
    if ld is not None and not ld.garbage:
        if ld.ok:
            out.append(Measurement("long_decode", P, f"long decode: {ld.output_tokens} tokens clean",
                                   ld.output_tokens, None))
        else:
            out.append(Measurement("long_decode", F, f"{host}long decode failed: {ld.error}", ld.error_kind, None))
    if ev.streams_checked and not ev.garbage_samples:
        out.append(Measurement("streams", P, f"{ev.streams_checked} streamed answers clean",
                               ev.streams_checked, None))
    right = sum(m.outcome is P for m in out if m.label not in ("streams", "long_decode"))
    return decide(spec, out, ok_message=f"{ev.streams_checked} streamed answers clean, {right} canaries right"
                  + (f", long decode of {ld.output_tokens} tokens clean" if ld is not None and ld.ok else ""),
                  no_data="no streamed answer was checked")


def _judge_loop(lr: LoopResult, host: str) -> Measurement:
    """A looping answer against its reference: a finding only where the reference does not loop."""
    s, ref = lr.sample, lr.reference
    what = f"{host}{lr.where}: a {s.cls} answer" + (f" (and {lr.count - 1} more of the same prompt)"
                                                     if lr.count > 1 else "")
    shown = f"sample …{_snippet(s.excerpt, 100)}"
    if ref is None or not ref.ok:
        return Measurement(f"{lr.where} loop", INC, f"{what} ends in a loop ({s.loop}); its reference could not "
                           f"be run ({ref.error if ref else 'no reference'}): {shown}", s.loop, None)
    ref_text = ref.text or ""
    if ref.loop:
        return Measurement(f"{lr.where} loop", P, f"{what} loops, as its c=1 reference does (the model's "
                           f"behaviour, not the server's): {s.loop}", s.loop, ref.loop)
    if ref.finish_reason == "stop" and s.loop_start is not None and \
            s.loop_start >= NATURAL_END_SHARE * len(ref_text):
        return Measurement(f"{lr.where} loop", P, f"{what} loops from character {s.loop_start}, past where its "
                           f"reference stopped by itself ({len(ref_text)} characters): writing past the "
                           "model's natural end under ignore_eos", s.loop, len(ref_text))
    return Measurement(f"{lr.where} loop", F, f"{what} degenerates into a loop where its c=1 greedy reference "
                       f"does not: {s.loop}; {shown}; reference ({ref.finish_reason}, {len(ref_text)} characters) "
                       f"…{_snippet(ref_text[-EXCERPT_REF:], 100)}", s.loop, "no loop (as the reference)")


#: Characters of a reference answer shown beside a looping sample.
EXCERPT_REF = 160


def long_decode_windows(text: str, tokens: int, window_tokens: int,
                        ends: Sequence[int] = ()) -> list[tuple[int, int, str]]:
    """``text`` of ``tokens`` tokens cut into windows of about ``window_tokens``: (first token, last, text).

    With ``ends`` (the text's length after each streamed delta) the cuts fall on delta boundaries,
    each delta counting ``tokens / len(ends)`` tokens (several per delta with speculative decoding);
    without, on characters in proportion.
    """
    if not text or tokens <= 0 or window_tokens <= 0:
        return [(0, tokens, text)] if text else []
    out = []
    for a in range(0, tokens, window_tokens):
        b = min(a + window_tokens, tokens)
        if ends:
            per = tokens / len(ends)
            i, j = round(a / per), round(b / per)
            lo = ends[i - 1] if i > 0 else 0
            hi = ends[min(j, len(ends)) - 1] if j > 0 else 0
        else:
            lo, hi = int(a * len(text) / tokens), int(b * len(text) / tokens)
        out.append((a, b, text[lo:hi]))
    return out


def check_long_decode(spec: CheckSpec, ev: Evidence, config: SoakConfig) -> CheckResult:
    """The deep long decode: it reaches its depth, and every window of its text is free of garbage,
    U+FFFD and loops before the model's natural end; the needle asked for at that end is intact."""
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    ld = ev.long_decode
    asked = config.long_decode_tokens()
    if ld is None:
        return decide(spec, [Measurement("long_decode", INC, "the long decode did not run"
                                         + (f" (soak stopped early: {ev.halted})" if ev.halted else ""))])
    host = f"{ev.host} " if ev.host else ""
    got = ld.output_tokens if isinstance(ld.output_tokens, int) else 0
    if not ld.ok:
        return decide(spec, [Measurement("long_decode", F, f"{host}long decode failed: {ld.error}",
                                         ld.error_kind, asked)])
    text = ld.text or ""
    out: list[Measurement] = []
    if ident_cap := (ev.identity.max_model_len if ev.identity else None):
        asked = min(asked, ident_cap - 512)
    if got < 0.9 * asked:
        out.append(Measurement("depth", INC, f"long decode reached {got} of {asked} tokens", got, asked))
    mark = text.find(prompts.NEEDLE_MARK)
    end_at = mark if mark >= 0 else None
    if mark >= 0:
        tail = text[mark:mark + len(prompts.NEEDLE_MARK) + len(prompts.NEEDLE) + 16]
        ok = prompts.NEEDLE in tail
        out.append(Measurement("needle", P if ok else F, f"{host}long decode: the needle at the model's end "
                               f"(character {mark}) is " + ("intact" if ok else f"garbled: {_snippet(tail)}"),
                               _snippet(tail), prompts.NEEDLE))
    window = int(spec.params.get("window_tokens", 2048) or 2048)
    offset = 0
    for a, b, win in long_decode_windows(text, got, window, ld.delta_ends):
        label = f"tokens {a}-{b}"
        bad = win.count("\ufffd")
        if bad >= 3:
            out.append(Measurement(label, F, f"{host}long decode, {label}: {bad} U+FFFD replacement characters: "
                                   f"{_snippet(win[win.index(chr(0xfffd)):], 80)}", bad, 2))
        elif why := garbage(win):
            out.append(Measurement(label, F, f"{host}long decode, {label}: garbage ({why}): {_snippet(win, 80)}",
                                   _snippet(win), "no garbage"))
        elif (loop := find_loop(win)) is not None and (end_at is None or offset + loop.start < end_at):
            # Before the needle (or without one): loops are judged against the reference by the
            # correctness check; here they are shown where they start.
            out.append(Measurement(label, P, f"long decode, {label}: ends in a loop ({loop.describe()}); "
                                   "judged against its reference by the correctness check", loop.phrase, None))
        else:
            out.append(Measurement(label, P, f"long decode, {label}: clean", None, None))
        offset += len(win)
    windows = sum(1 for m in out if m.label.startswith("tokens "))
    needle = next((m for m in out if m.label == "needle"), None)
    return decide(spec, out, ok_message=f"{got} tokens in {windows} windows of {window} free of garbage and "
                  "U+FFFD" + ("; the needle at the model's end intact" if needle else
                              "; no needle (the model had not ended)"), no_data="the long decode had no text")


def check_long_prompts(spec: CheckSpec, ev: Evidence, config: SoakConfig) -> CheckResult:
    """Each long-prompt probe answers the fact hidden in the middle of its prompt, without garbage."""
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    if not config.long_prompt_tokens():
        return skipped(spec, "no sizes configured (long_prompts.tokens is empty)")
    host = f"{ev.host} " if ev.host else ""
    out: list[Measurement] = []
    for lp in ev.long_prompts:
        label = f"{lp.tokens} tokens"
        s = lp.sample
        if s is None:
            out.append(Measurement(label, P if lp.skipped else INC, f"{label}: not run ({lp.skipped or 'stopped'})",
                                   None, lp.tokens))
            continue
        text = s.text or ""
        size = f"{label} ({s.prompt_tokens or '?'} measured, sized by {lp.how})"
        if not s.ok:
            out.append(Measurement(label, F, f"{host}long prompt of {size}: request failed: {s.error}",
                                   s.error_kind, lp.tokens))
        elif s.garbage:
            out.append(Measurement(label, F, f"{host}long prompt of {size}: garbage ({s.garbage}): "
                                   f"{_snippet(s.excerpt, 80)}", _snippet(s.excerpt), prompts.VAULT_CODE))
        elif prompts.VAULT_CODE.lower() not in text.lower():
            out.append(Measurement(label, F, f"{host}long prompt of {size}: the answer lacks the code stated in "
                                   f"the prompt's middle ({prompts.VAULT_CODE!r}): {_snippet(text, 80)}",
                                   _snippet(text), prompts.VAULT_CODE))
        else:
            out.append(Measurement(label, P, f"long prompt of {size}: answered", _snippet(text), prompts.VAULT_CODE))
        if lp.how.startswith("estimate ("):
            out.append(Measurement(f"{label} size", INC, f"long prompt of {label}: {lp.how}", lp.how, lp.tokens))
    ran = [m.label for m in out if m.outcome is P and m.measured is not None]
    return decide(spec, out, ok_message=f"the hidden fact found at {', '.join(ran) or 'no size'}"
                  + ("" if len(ran) == len(out) else " (larger sizes skipped: max_model_len)"),
                  no_data="no long-prompt probe ran" + (f" (soak stopped early: {ev.halted})" if ev.halted else ""))


def check_errors(spec: CheckSpec, ev: Evidence, config: SoakConfig) -> CheckResult:
    """No failed request at any level (HTTP errors, refusals, error events in 200 streams)."""
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
            out.append(Measurement(lv.label, P, f"{lv.label}: {lv.errors}/{lv.requests} failed", round(rate, 4), bound))
    if ev.halted and not ev.wedges and not ev.crash and (ev.deadline_hit or not any(m.outcome is F for m in out)):
        # A soak stopped early says so (a level whose every request failed already does): what it
        # did not run is not a pass.
        out.append(Measurement("stopped", INC if ev.deadline_hit else F, f"soak stopped early: {ev.halted}"))
    total = sum(lv.requests for lv in ev.levels)
    return decide(spec, out, ok_message=f"0 errors in {total} requests across {len(ev.levels)} levels",
                  no_data="no load level ran" + (f" (soak stopped early: {ev.halted})" if ev.halted else ""))


def check_liveness(spec: CheckSpec, ev: Evidence) -> CheckResult:
    """No request in flight went ``token_timeout`` seconds without a token while /health answered."""
    if not ev.readiness.ready:
        return skipped(spec, "not run: the server never became ready")
    bound = ev.token_timeout
    out = [Measurement(w.where, F, f"engine wedged on {w.host}: a request of {w.where} (started at "
                       f"+{w.start:.0f}s) got no token for {bound or w.seconds:.0f}s while /health answered 200"
                       + (f" ({w.detail})" if w.detail else ""), w.seconds, bound) for w in ev.wedges]
    if not out and ev.streams_timed:
        out.append(Measurement("streams", P, f"{ev.streams_timed} streams, none {bound:.0f}s without a token"
                               if bound else f"{ev.streams_timed} streams", ev.streams_timed, bound))
    return decide(spec, out, ok_message=f"no stream went {bound:.0f}s without a token ({ev.streams_timed} "
                  "watched)" if bound else "no stream watched", no_data="no stream was watched")


def check_server_errors(spec: CheckSpec, ev: Evidence) -> CheckResult:
    """/metrics counts no request finished with reason ``error`` during the soak."""
    ws = [w for w in ev.windows if w.phase in ("classes", "sweep", "sustained")]
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    out: list[Measurement] = []
    for w in ws:
        if not w.success_by_reason:
            out.append(Measurement(w.label, INC, f"{w.label}: no vllm:request_success_total series"))
            continue
        errors = w.success_by_reason.get("error", 0.0)
        out.append(Measurement(w.label, F if errors > 0 else P,
                               f"{w.label}: server finished {errors:.0f} request(s) with reason error", errors, 0))
    done = sum(sum(w.success_by_reason.values()) for w in ws)
    out += inconsistent(ev, (metrics.SUCCESS,), ("classes", "sweep", "sustained"))
    return decide(spec, out, ok_message=f"{done:.0f} requests finished, none with reason error",
                  no_data="no /metrics window (scrapes failed)")


def check_latency(spec: CheckSpec, ev: Evidence) -> CheckResult:
    """TTFT p95 and TPOT p50 under the profile's bounds at each concurrency level."""
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    out: list[Measurement] = []
    for lv in (lv for lv in ev.levels if lv.phase == "sweep"):
        for key, value, what in (("ttft_p95_ms", lv.ttft_p95, "TTFT p95"), ("tpot_p50_ms", lv.tpot_p50, "TPOT p50")):
            bound_ms = spec.level_bound(key, lv.concurrency)
            if bound_ms is None:
                continue
            bound = bound_ms / 1000.0
            if value is None:
                out.append(Measurement(f"{lv.label} {what}", INC, f"{lv.label}: no {what} (no successful request)",
                                       None, bound_ms))
            elif value > bound:
                out.append(Measurement(f"{lv.label} {what}", F, f"{lv.label}: {what} {ms(value)} > bound {ms(bound)}",
                                       round(value * 1000, 1), bound_ms))
            else:
                out.append(Measurement(f"{lv.label} {what}", P, f"{lv.label}: {what} {ms(value)} <= {ms(bound)}",
                                       round(value * 1000, 1), bound_ms))
    return decide(spec, out, ok_message=f"TTFT p95 and TPOT p50 within bounds at {len(out) // 2} levels",
                  no_data="no sweep level completed")


def check_throughput(spec: CheckSpec, ev: Evidence, baseline: Verdict | None,
                     baseline_note: str = "") -> CheckResult:
    """Aggregate tok/s per level above the floor and within tolerance of the host's baseline."""
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    tol = float(spec.params.get("tolerance", 0.15))
    k_sd = float(spec.params.get("spread_k", 3.0))
    out: list[Measurement] = []
    for lv in (lv for lv in ev.levels if lv.phase == "sweep"):
        floor = spec.level_bound("floor_tok_s", lv.concurrency)
        base = baseline.level("sweep", lv.label) if baseline else None
        if lv.tok_s is None:
            out.append(Measurement(lv.label, INC, f"{lv.label}: no throughput (no successful request)"))
            continue
        if floor is not None and lv.tok_s < floor:
            out.append(Measurement(lv.label, F, f"{lv.label}: {lv.tok_s:.1f} tok/s < floor {floor:.0f} tok/s",
                                   round(lv.tok_s, 1), floor))
            continue
        if base is not None and base.tok_s:
            # The allowed drop is the tolerance, or k times the baseline's own spread across its
            # runs when that is wider (a noisy host is not failed for its noise).
            sd = baseline.baseline_spread.get(lv.label, 0.0) if baseline else 0.0
            margin = max(tol * base.tok_s, k_sd * sd)
            need = base.tok_s - margin
            change = lv.tok_s / base.tok_s - 1
            ok = lv.tok_s >= need
            bound = f"-{margin / base.tok_s:.0%}" + (f" = {k_sd:g} x spread {sd:.1f}" if k_sd * sd > tol * base.tok_s
                                                      else "")
            what = (f"baseline median {base.tok_s:.1f} of {baseline.baseline_runs} runs"
                    if baseline and baseline.baseline_runs > 1 else f"baseline {base.tok_s:.1f}")
            out.append(Measurement(
                lv.label, P if ok else F,
                f"{lv.label}: {lv.tok_s:.1f} tok/s vs {what} ({change:+.0%}, "
                f"{'within' if ok else 'beyond'} {bound})", round(lv.tok_s, 1), round(need, 1)))
        else:
            out.append(Measurement(lv.label, P, f"{lv.label}: {lv.tok_s:.1f} tok/s >= floor {floor or 0:.0f}",
                                   round(lv.tok_s, 1), floor))
    out += foreign_traffic(ev, ("sweep",))
    if baseline is None:
        ok_msg = ("above the floors at every level ("
                  + (baseline_note or "no baseline recorded for this host and tag") + ")")
    else:
        ok_msg = f"within bounds of baseline {baseline.run_id} at every level"
    return decide(spec, out, ok_message=ok_msg, no_data="no sweep level completed")


def _spec_applies(spec: CheckSpec, ev: Evidence, config: SoakConfig) -> CheckResult | None:
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    if config.speculative is False:
        return skipped(spec, "the recipe has no speculative decoding")
    if ev.spec_seen is False and config.speculative is None:
        return skipped(spec, "the server exports no vllm:spec_decode_* counters (no speculative config)")
    if ev.spec_seen is False:
        return decide(spec, [Measurement("spec", INC, "the recipe uses speculative decoding but /metrics has "
                                                      "no vllm:spec_decode_* counters")])
    return None


def check_acceptance(spec: CheckSpec, ev: Evidence, config: SoakConfig,
                     baseline: Verdict | None = None) -> CheckResult:
    """Draft acceptance rate per prompt class above its floor (per-class /metrics windows).

    Also: every sweep/sustained window above ``phase_floor``, and the sustained phase's
    median within ``min_ratio`` of this run's short classes and of the baseline's sustained phase.
    """
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
            out.append(Measurement(w.label, INC, f"{w.label}: no draft tokens in its window", None, floor))
        elif acc < floor:
            out.append(Measurement(w.label, F, f"{w.label}: position-0 acceptance {pct(acc)} < floor {pct(floor)}",
                                   round(acc, 4), floor))
        else:
            out.append(Measurement(w.label, P, f"{w.label}: position-0 acceptance {pct(acc)}",
                                   round(acc, 4), floor))
    rates = ", ".join(f"{m.label} {pct(m.measured if isinstance(m.measured, float) else None)}" for m in out)
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


def _sustained_ratio(windows: Sequence[Window], baseline: Verdict | None, ratio: float) -> list[Measurement]:
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
        out.append(Measurement(f"sustained vs {label}", F if held < ratio else P,
                               f"sustained acceptance {pct(sus)} is {held:.0%} of {what} {pct(ref)} "
                               f"(bound {ratio:.0%})", round(held, 4), ratio))
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
    """z of the acceptance drop from the first third of ``windows`` to the last (None without counts).

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
        out.append(Measurement("prefix cache", P if hits > 0 else INC,
                               f"sustained prefix-cache hits {hits:.0f} of {sum(queries):.0f} prompt tokens "
                               f"({hits / sum(queries):.0%})" + ("" if hits > 0 else
                               ": the decay that needs cache hits was never exercised (shared prefixes "
                               "shorter than the model's cache block?)"),
                               round(hits / sum(queries), 4), None))
    out += _size_measurements(ev, "shared_prefix")
    block = ev.cache_block_tokens
    if block and "shared_prefix" in ev.prompt_sizes and ev.prompt_sizes["shared_prefix"][0] <= block:
        out.append(Measurement("cache block", INC, f"the shared prefix ({ev.prompt_sizes['shared_prefix'][0]} tokens) "
                               f"is not longer than the server's prefix-cache block ({block} tokens): no request can "
                               "hit the cache (the model's max_model_len leaves no room for a longer one)",
                               ev.prompt_sizes["shared_prefix"][0], block))
    out += foreign_traffic(ev, ("sustained",))
    return out


def check_acceptance_decay(spec: CheckSpec, ev: Evidence, config: SoakConfig) -> CheckResult:
    """Acceptance does not decay across the sustained phase's windows (trend, not lifetime totals)."""
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
        return decide(spec, [Measurement("trend", INC, f"only {len(usable)} sustained window(s) with drafts, "
                                         f"need {need} (lengthen the sustained phase)", len(usable), need),
                             *context])
    trend = acceptance_trend(usable)
    assert trend is not None
    first, last = trend
    if first <= 0.01:
        return decide(spec, [Measurement("trend", INC, f"acceptance starts at {pct(first)}: too low to judge "
                                         f"a trend ({series})", round(first, 4), None), *context])
    drop = 1 - last / first
    # A drop is a decay only when the windows' draft counts make it significant: a short soak at
    # a sampled temperature has a few dozen drafts per window, and one window's reading can be
    # half the previous one's by chance (a healthy lab canary measured 11.6 % -> 4.8 % over 80
    # drafts). Two-proportion z-test of the first third against the last, on draft counts.
    z = _drop_z(usable)
    min_z = float(spec.params.get("min_z", 3.0))
    significant = z is None or z >= min_z
    outcome = F if drop > max_drop and significant else P
    msg = (f"acceptance fell {drop:.0%} from {pct(first)} to {pct(last)} across the sustained windows "
           f"({series}); bound {max_drop:.0%}" + (f", z={z:.1f}" if z is not None else "")
           + ("" if significant or drop <= max_drop else f": not significant (z < {min_z:g}) over this "
              "few drafts; a longer sustained phase would tell"))
    out = [Measurement("trend", outcome, msg, round(drop, 4), max_drop), *context]
    hits = next((m.measured for m in context if m.label == "prefix cache"), None)
    return decide(spec, out, ok_message=f"no decay: {pct(first)} -> {pct(last)} over {len(usable)} windows"
                  + (f", {hits:.0%} of prompt tokens from the prefix cache" if isinstance(hits, float) else ""))


def check_long_context(spec: CheckSpec, ev: Evidence, config: SoakConfig) -> CheckResult:
    """Long-context acceptance holds: above a floor and a share of short-context acceptance."""
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
        return decide(spec, [*lies] or [Measurement("long_context", INC, "no long-context window with draft tokens")])
    short = [a for k, w in cls_ws.items() if k != "long_context" and (a := position0(w)) is not None]
    ref = statistics.fmean(short) if short else None
    out = [Measurement("floor", F if acc < floor else P,
                       f"long-context position-0 acceptance {pct(acc)} vs floor {pct(floor)}",
                       round(acc, 4), floor)]
    if ref:
        held = acc / ref
        out.append(Measurement("hold", F if held < ratio else P,
                               f"long-context position-0 acceptance {pct(acc)} is {held:.0%} of short-context "
                               f"{pct(ref)} (bound {ratio:.0%})" + (": it collapses on long histories"
                                                                    if held < ratio else ""),
                               round(held, 4), ratio))
    out += _size_measurements(ev, "long_context") + lies
    return decide(spec, out, ok_message=f"holds at {pct(acc)} (short context {pct(ref)})")


def foreign_traffic(ev: Evidence, phases: Sequence[str]) -> list[Measurement]:
    """Inconclusive measurements for windows of ``phases`` where another client's requests ran.

    /metrics counts every client's tokens and drafts: with foreign traffic in a window, the
    throughput and acceptance figures of that window are not this soak's.
    """
    out = []
    for w in ev.windows:
        if w.phase not in phases or w.foreign_requests is None:
            continue
        mine = sum(w.success_by_reason.values()) - w.foreign_requests
        if w.foreign_requests > max(FOREIGN_MIN, FOREIGN_SHARE * mine):
            out.append(Measurement(f"{w.label} foreign", INC,
                                   f"{w.label}: the server finished {w.foreign_requests:.0f} requests besides this "
                                   f"soak's {mine:.0f}: another client is using it, its figures are not this "
                                   "server's alone (soak a host out of rotation: with fleetctl_front_door set, "
                                   "a rollout drains it at the front door first, docs/frontdoor.md)",
                                   w.foreign_requests, None))
    return out


def inconsistent(ev: Evidence, series: Sequence[str], phases: Sequence[str] = ()) -> list[Measurement]:
    """Inconclusive measurements for windows whose ``series`` read impossibly (see metrics.inconsistencies).

    A ratio over 100 %, a counter going backwards, accepted > drafted: the server's figures are not
    numbers a bound can pass or fail, so the check says which series lied instead of judging them.
    """
    out = []
    for w in ev.windows:
        if phases and w.phase not in phases:
            continue
        for finding in w.inconsistent:
            if finding.startswith(tuple(series)):
                out.append(Measurement(f"{w.label} metrics", INC, f"metrics inconsistent in {w.label}: {finding}",
                                       finding.split(" ", 1)[0], None))
    return out


SPEC_SERIES = metrics.SPEC_SERIES


#: Foreign requests in a window tolerated before its figures are doubted: boundary effects
#: (a request finishing as the window is scraped) account for one or two.
FOREIGN_MIN = 3
FOREIGN_SHARE = 0.1

#: How far a prompt's measured length may miss its target before the check built on it is doubtful.
SIZE_TOLERANCE = 0.25


def _size_measurements(ev: Evidence, name: str) -> list[Measurement]:
    """The prompt ``name`` as measured by the server's usage against its target (inconclusive when far off)."""
    if name not in ev.prompt_sizes:
        return []
    target, got, how = ev.prompt_sizes[name]
    if got is None or target <= 0:
        return [Measurement(f"{name} prompt", INC, f"{name} prompt: no usage figure to check its {target} "
                            f"target tokens ({how})")]
    off = abs(got - target) / target
    # Sized by the server's own /tokenize and still far off: something is wrong with the server's
    # counting, inconclusive. Sized by a character estimate (a server without /tokenize): reported.
    # A /tokenize whose answers were not believed (estimate (...)): the server's counting is suspect.
    doubtful = (off > SIZE_TOLERANCE and how == "tokenize") or how.startswith("estimate (")
    return [Measurement(f"{name} prompt", INC if doubtful else P,
                        f"{name} prompt {got} tokens measured, target {target} (sized by {how})"
                        + (": the prompt is not what the check assumes" if doubtful else
                           f": {off:.0%} off, the server has no /tokenize" if off > SIZE_TOLERANCE else ""),
                        got, target)]


def check_preemptions(spec: CheckSpec, ev: Evidence) -> CheckResult:
    """No preemption storm: preemptions per minute in every window under the bound."""
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    bound = float(spec.params.get("max_per_minute", 10.0))
    out: list[Measurement] = []
    for w in (w for w in ev.windows if w.phase in ("sweep", "sustained")):
        if w.preemptions is None:
            out.append(Measurement(w.label, INC, f"{w.label}: no vllm:num_preemptions_total series"))
            continue
        per_min = w.preemptions / max(w.end - w.start, 1e-9) * 60
        # A handful of preemptions in a short window is not a storm: judge the rate only past 10.
        bad = per_min > bound and w.preemptions > 10
        out.append(Measurement(w.label, F if bad else P,
                               f"{w.label}: {w.preemptions:.0f} preemptions ({per_min:.0f}/min, bound {bound:.0f}/min)",
                               round(per_min, 1), bound))
    total = sum(w.preemptions or 0 for w in ev.windows if w.phase in ("sweep", "sustained"))
    out += inconsistent(ev, (metrics.PREEMPTIONS,), ("sweep", "sustained"))
    return decide(spec, out, ok_message=f"{total:.0f} preemptions, no storm", no_data="no /metrics window")


def check_container(spec: CheckSpec, ev: Evidence) -> CheckResult:
    """The server did not crash or restart during the soak."""
    if not ev.readiness.ready:
        return skipped(spec, "not run: the server never became ready")
    out: list[Measurement] = []
    if ev.crash:
        out.append(Measurement("crash", F, ev.crash))
    resets = [w.label for w in ev.windows if w.counter_reset]
    if resets:
        out.append(Measurement("counters", F, f"/metrics counters went backwards in {', '.join(resets)}: "
                                              "the server restarted during the soak"))
    if ev.has_container:
        a, b = ev.container_before, ev.container_after
        if a is None or b is None:
            out.append(Measurement("state", ERR, f"container state unreadable: {ev.container_error}"))
        elif not b.exists or not b.running:
            out.append(Measurement("state", F, f"container {b.status or 'gone'} after the soak"
                                   + (f" (exit code {b.exit_code})" if b.exit_code else "")))
        elif b.restart_count != a.restart_count or b.started_at != a.started_at:
            out.append(Measurement("state", F, f"container restarted during the soak (restarts "
                                   f"{a.restart_count} -> {b.restart_count}, started {b.started_at})",
                                   b.restart_count, a.restart_count))
        else:
            out.append(Measurement("state", P, "same container throughout", b.restart_count, a.restart_count))
    elif not out:
        return skipped(spec, "no container access (endpoint soak); /health stayed up")
    return decide(spec, out, ok_message="no crash, no restart")


def evaluate(ev: Evidence, config: SoakConfig, baseline: Verdict | None,
             baseline_note: str = "") -> tuple[CheckResult, ...]:
    """Every enabled check, in report order (disabled ones are reported as skipped).

    ``baseline_note``: why there is no baseline to compare with, when one was set aside.
    """
    fns: dict[str, Callable[[CheckSpec], CheckResult]] = {
        "readiness": lambda s: check_readiness(s, ev),
        "identity": lambda s: check_identity(s, ev, config),
        "smoke": lambda s: check_smoke(s, ev),
        "errors": lambda s: check_errors(s, ev, config),
        "liveness": lambda s: check_liveness(s, ev),
        "correctness": lambda s: check_correctness(s, ev),
        "long_decode": lambda s: check_long_decode(s, ev, config),
        "long_prompts": lambda s: check_long_prompts(s, ev, config),
        "server_errors": lambda s: check_server_errors(s, ev),
        "latency": lambda s: check_latency(s, ev),
        "throughput": lambda s: check_throughput(s, ev, baseline, baseline_note),
        "acceptance": lambda s: check_acceptance(s, ev, config, baseline),
        "acceptance_decay": lambda s: check_acceptance_decay(s, ev, config),
        "long_context": lambda s: check_long_context(s, ev, config),
        "preemptions": lambda s: check_preemptions(s, ev),
        "container": lambda s: check_container(s, ev),
    }
    out: list[CheckResult] = []
    if fns.keys() != set(CHECKS):  # the declaration in soak/config.py and the evaluators must agree
        raise AssertionError(f"soak checks without an evaluator or a declaration: {set(CHECKS) ^ fns.keys()}")
    for name in CHECKS:
        fn = fns[name]
        spec = config.check(name)
        if not spec.enabled:
            out.append(skipped(spec, "disabled in the recipe's soak settings"))
        elif config.smoke_only and name not in ("readiness", "identity", "smoke", "container"):
            out.append(skipped(spec, "smoke-only soak (no load)"))
        else:
            out.append(fn(spec))
    return tuple(out)


def overall(checks: Sequence[CheckResult]) -> Outcome:
    """The verdict: any fail -> fail; else any error -> error; else any inconclusive; else pass."""
    counted = [c.outcome for c in checks if not c.observe_only]
    for o in (F, ERR, INC):
        if o in counted:
            return o
    return P
