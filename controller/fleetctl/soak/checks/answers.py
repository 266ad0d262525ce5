"""The checks that the answers are right: no garbage under load, canaries equal to their c=1
answer, loops judged against their reference, the deep long decode and the long prompts."""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl.soak import prompts
from fleetctl.soak.checks.check import Check, CheckContext
from fleetctl.soak.checks.evidence import CanaryResult, LoopResult
from fleetctl.soak.checks.judge import INC, F, P, decide, garbage, skipped, snippet
from fleetctl.soak.checks.watching import Burst, Interval, WatchJudge
from fleetctl.soak.config import CheckSpec
from fleetctl.soak.loops import find_loop
from fleetctl.soak.verdict import (
    CheckResult,
    Measurement,
    Sample,
)

#: A loop starting at or past this share of the reference's natural length is past the model's end.
NATURAL_END_SHARE = 0.8


def _where(s: Sample) -> str:
    if s.phase == "sweep":
        return f"c={s.concurrency}"
    return s.phase if s.phase in ("sustained", "long_decode") else f"{s.phase} {s.cls}"


def same_answer(a: str, b: str) -> bool:
    """Two answers equal up to case and whitespace (a greedy canary repeats its reference)."""
    return " ".join(a.split()).lower() == " ".join(b.split()).lower()


def check_correctness(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """No garbage in any streamed answer under load; canaries right and equal to their c=1
    answer; loops judged against their c=1 reference (``known_good``: the version the
    known_good check compares with, empty on a first deploy)."""
    ev, known_good = ctx.evidence, ctx.known_good_label()
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    host = f"{ev.host} " if ev.host else ""
    out: list[Measurement] = []
    for s in ev.garbage_samples:
        out.append(
            Measurement(
                _where(s),
                F,
                f"{host}{_where(s)}: garbage in a {s.cls} answer started at +{s.start:.1f}s "
                f"({s.garbage}): {snippet(s.excerpt, 80)}",
                s.excerpt,
                "no garbage",
            )
        )
    out += [_judge_canary(c, host) for c in ev.canaries]
    out += [_judge_loop(lr, host, known_good) for lr in ev.loops]
    if ev.loops_unjudged:
        # Reported, not counted: the first looping prompts were judged, and a server that loops
        # where the model does not shows it on those already.
        out.append(
            Measurement(
                "loops",
                P,
                f"{ev.loops_unjudged} more looping answer(s) of other prompts not "
                "judged against a reference (the soak re-runs the first few only)",
                ev.loops_unjudged,
            )
        )
    ld = ev.long_decode
    if ld is not None and not ld.garbage:
        if ld.ok:
            out.append(
                Measurement(
                    "long_decode",
                    P,
                    f"long decode: {ld.output_tokens} tokens clean",
                    ld.output_tokens,
                    None,
                )
            )
        else:
            out.append(
                Measurement(
                    "long_decode", F, f"{host}long decode failed: {ld.error}", ld.error_kind, None
                )
            )
    if ev.streams_checked and not ev.garbage_samples:
        out.append(Measurement("streams", P, f"{ev.streams_checked} streamed answers clean",
                               ev.streams_checked, None))
    right = sum(m.outcome is P for m in out if m.label not in ("streams", "long_decode"))
    return decide(
        spec,
        out,
        ok_message=f"{ev.streams_checked} streamed answers clean, {right} canaries right"
        + (f", long decode of {ld.output_tokens} tokens clean" if ld is not None and ld.ok else ""),
        no_data="no streamed answer was checked",
    )


def _judge_canary(c: CanaryResult, host: str) -> Measurement:
    """A canary's answer: right, and equal to its c=1 answer."""
    s, text = c.sample, c.sample.text or ""
    where = f"{host}canary {c.name} at {c.level}"
    if not s.ok:
        return Measurement(c.level, F, f"{where}: request failed: {s.error}", s.error_kind,
                           c.expect)
    if s.garbage:
        return Measurement(c.level, F, f"{where}: garbage ({s.garbage}): {snippet(s.excerpt, 80)}",
                           s.excerpt, c.expect)
    if c.expect.lower() not in text.lower():
        return Measurement(c.level, F, f"{where}: answer lacks {c.expect!r}: {snippet(text, 80)}",
                           snippet(text), c.expect)
    if c.reference is not None and not same_answer(text, c.reference):
        # Greedy decoding of the same prompt: a different answer under load is corruption
        # (or a batch-variant kernel worth knowing about), even when it still holds the fact.
        return Measurement(
            c.level,
            F,
            f"{where}: answer {snippet(text, 50)} differs from its c=1 "
            f"answer {snippet(c.reference, 50)}",
            snippet(text),
            snippet(c.reference),
        )
    return Measurement(c.level, P, f"{where}: ok", snippet(text), c.expect)


def _judge_loop(lr: LoopResult, host: str, known_good: str = "") -> Measurement:
    """A looping answer against its reference: a finding where the reference does not loop;
    where it loops too, the server is not cleared by itself: the known-good version decides
    (the known_good check), and without one (a first deploy) the loop is inconclusive."""
    s, ref = lr.sample, lr.reference
    what = f"{host}{lr.where}: a {s.cls} answer" + (f" (and {lr.count - 1} more of the same prompt)"
                                                     if lr.count > 1 else "")
    shown = f"sample …{snippet(s.excerpt, 100)}"
    if ref is None or not ref.ok:
        return Measurement(
            f"{lr.where} loop",
            INC,
            f"{what} ends in a loop ({s.loop}); its reference could not "
            f"be run ({ref.error if ref else 'no reference'}): {shown}",
            s.loop,
            None,
        )
    ref_text = ref.text or ""
    if ref.loop and known_good:
        return Measurement(
            f"{lr.where} loop",
            P,
            f"{what} loops, as its c=1 reference on the same server does: judged against the "
            f"known-good {known_good} by the known_good check: {s.loop}",
            s.loop,
            ref.loop,
        )
    if ref.loop:
        return Measurement(
            f"{lr.where} loop",
            INC,
            f"{what} loops, and so does its c=1 reference on the same server, with no known-good "
            f"version to compare with (a first deploy): the model's behaviour or this build's, "
            f"not told apart: {s.loop}; {shown}",
            s.loop,
            ref.loop,
        )
    if ref.finish_reason == "stop" and s.loop_start is not None and \
            s.loop_start >= NATURAL_END_SHARE * len(ref_text):
        return Measurement(
            f"{lr.where} loop",
            P,
            f"{what} loops from character {s.loop_start}, past where its "
            f"reference stopped by itself ({len(ref_text)} characters): writing past the "
            "model's natural end under ignore_eos",
            s.loop,
            len(ref_text),
        )
    return Measurement(
        f"{lr.where} loop",
        F,
        f"{what} degenerates into a loop where its c=1 greedy reference "
        f"does not: {s.loop}; {shown}; reference ({ref.finish_reason}, {len(ref_text)} characters) "
        f"…{snippet(ref_text[-EXCERPT_REF:], 100)}",
        s.loop,
        "no loop (as the reference)",
    )


#: Characters of a reference answer shown beside a looping sample.
EXCERPT_REF = 160


def long_decode_windows(text: str, tokens: int, window_tokens: int,
                        ends: Sequence[int] = ()) -> list[tuple[int, int, str]]:
    """``text`` of ``tokens`` tokens cut into windows of about ``window_tokens``: (first token,
    last, text).

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


def check_long_decode(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """The deep long decode: it reaches its depth, and every window of its text is free of garbage,
    U+FFFD and loops before the model's natural end; the needle asked for at that end is intact."""
    ev, config = ctx.evidence, ctx.config
    if not ev.load_ran:
        return skipped(spec, "not run: no load phase")
    ld = ev.long_decode
    asked = config.long_decode_tokens()
    if ld is None:
        return decide(
            spec,
            [
                Measurement(
                    "long_decode",
                    INC,
                    "the long decode did not run"
                    + (f" (soak stopped early: {ev.halted})" if ev.halted else ""),
                )
            ],
        )
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
        out.append(
            Measurement("depth", INC, f"long decode reached {got} of {asked} tokens", got, asked)
        )
    mark = text.find(prompts.NEEDLE_MARK)
    end_at = mark if mark >= 0 else None
    if mark >= 0:
        tail = text[mark:mark + len(prompts.NEEDLE_MARK) + len(prompts.NEEDLE) + 16]
        ok = prompts.NEEDLE in tail
        out.append(
            Measurement(
                "needle",
                P if ok else F,
                f"{host}long decode: the needle at the model's end "
                f"(character {mark}) is " + ("intact" if ok else f"garbled: {snippet(tail)}"),
                snippet(tail),
                prompts.NEEDLE,
            )
        )
    window = int(spec.params.get("window_tokens", 2048) or 2048)
    offset = 0
    for a, b, win in long_decode_windows(text, got, window, ld.delta_ends):
        out.append(_judge_window(f"tokens {a}-{b}", win, offset, end_at, host))
        offset += len(win)
    windows = sum(1 for m in out if m.label.startswith("tokens "))
    needle = next((m for m in out if m.label == "needle"), None)
    return decide(
        spec,
        out,
        ok_message=f"{got} tokens in {windows} windows of {window} free of garbage and "
        "U+FFFD"
        + (
            "; the needle at the model's end intact"
            if needle
            else "; no needle (the model had not ended)"
        ),
        no_data="the long decode had no text",
    )


def _judge_window(label: str, win: str, offset: int, end_at: int | None, host: str) -> Measurement:
    """One window of the long decode's text (starting at character ``offset``; the model's end, the
    needle, at ``end_at``): free of U+FFFD and garbage; a loop before the end is shown."""
    bad = win.count("\ufffd")
    if bad >= 3:
        return Measurement(
            label,
            F,
            f"{host}long decode, {label}: {bad} U+FFFD replacement characters: "
            f"{snippet(win[win.index(chr(0xFFFD)) :], 80)}",
            bad,
            2,
        )
    if why := garbage(win):
        return Measurement(
            label,
            F,
            f"{host}long decode, {label}: garbage ({why}): {snippet(win, 80)}",
            snippet(win),
            "no garbage",
        )
    if (loop := find_loop(win)) is not None and (end_at is None or offset + loop.start < end_at):
        # Before the needle (or without one): loops are judged against the reference by the
        # correctness check; here they are shown where they start.
        return Measurement(
            label,
            P,
            f"long decode, {label}: ends in a loop ({loop.describe()}); "
            "judged against its reference by the correctness check",
            loop.phrase,
            None,
        )
    return Measurement(label, P, f"long decode, {label}: clean", None, None)


def check_long_prompts(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """Each long-prompt probe answers the fact hidden in the middle of its prompt, without
    garbage."""
    ev, config = ctx.evidence, ctx.config
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
            out.append(
                Measurement(
                    label,
                    P if lp.skipped else INC,
                    f"{label}: not run ({lp.skipped or 'stopped'})",
                    None,
                    lp.tokens,
                )
            )
            continue
        text = s.text or ""
        size = f"{label} ({s.prompt_tokens or '?'} measured, sized by {lp.how})"
        if not s.ok:
            out.append(
                Measurement(
                    label,
                    F,
                    f"{host}long prompt of {size}: request failed: {s.error}",
                    s.error_kind,
                    lp.tokens,
                )
            )
        elif s.garbage:
            out.append(
                Measurement(
                    label,
                    F,
                    f"{host}long prompt of {size}: garbage ({s.garbage}): {snippet(s.excerpt, 80)}",
                    snippet(s.excerpt),
                    prompts.VAULT_CODE,
                )
            )
        elif prompts.VAULT_CODE.lower() not in text.lower():
            out.append(
                Measurement(
                    label,
                    F,
                    f"{host}long prompt of {size}: the answer lacks the code stated in "
                    f"the prompt's middle ({prompts.VAULT_CODE!r}): {snippet(text, 80)}",
                    snippet(text),
                    prompts.VAULT_CODE,
                )
            )
        else:
            out.append(Measurement(label, P, f"long prompt of {size}: answered", snippet(text),
                                   prompts.VAULT_CODE))
        if lp.how.startswith("estimate ("):
            out.append(
                Measurement(
                    f"{label} size", INC, f"long prompt of {label}: {lp.how}", lp.how, lp.tokens
                )
            )
    ran = [m.label for m in out if m.outcome is P and m.measured is not None]
    return decide(
        spec,
        out,
        ok_message=f"the hidden fact found at {', '.join(ran) or 'no size'}"
        + ("" if len(ran) == len(out) else " (larger sizes skipped: max_model_len)"),
        no_data="no long-prompt probe ran"
        + (f" (soak stopped early: {ev.halted})" if ev.halted else ""),
    )


def _watch_canary(iv: Interval) -> list[Measurement]:
    """The interval's greedy canary holds its expected answer and repeats its first answer in this
    watch (its reference)."""
    canary, cp, label = iv.canary, iv.canary_prompt, iv.label
    if not canary.ok:
        return []
    text = canary.text or ""
    ref = iv.state.refs.get(cp.name)
    if cp.expect.lower() not in text.lower():
        return [Measurement(label, F, f"{label}: canary {cp.name} lacks {cp.expect!r}: "
                            f"{' '.join(text.split())[:80]!r}", text[:80], cp.expect)]
    if ref is None:
        iv.state.refs[cp.name] = text
        return [Measurement(label, P, f"{label}: canary {cp.name} answered (its reference)")]
    if not same_answer(text, ref):
        said, first = " ".join(text.split())[:80], " ".join(ref.split())[:80]
        return [Measurement(label, F, f"{label}: canary {cp.name} changed its greedy answer: "
                            f"{said!r}, first {first!r}", text[:80], ref[:80])]
    return [Measurement(label, P, f"{label}: canary {cp.name} same as its reference")]


def _burst_canary(b: Burst) -> list[CheckResult]:
    """Each canary of the burst answered right."""
    wrong = []
    for cp in prompts.CANARIES:
        s = next((x for x in b.samples if x.cls == f"canary-{cp.name}"), None)
        if s is None or not s.ok:
            wrong.append(f"{cp.name}: {s.error if s else 'not asked'}")
        elif cp.expect.lower() not in (s.text or "").lower():
            said = " ".join((s.text or "").split())[:60]
            wrong.append(f"{cp.name} lacks {cp.expect!r}: {said!r}")
    return [CheckResult("canary", F if wrong else P, "; ".join(wrong)[:300] if wrong else
                        f"{len(prompts.CANARIES)} canaries answered right")]


# Every 8th load request is a greedy canary; one long decode per soak (thousands of tokens:
# corruption that starts deep in a sequence), capped by max_model_len.
CORRECTNESS = Check(
    "correctness", check_correctness, needs=("load", "canaries", "long_decode"),
    params={"canary_every": "count", "canary_max_tokens": "count", "long_decode_tokens": "count"},
    defaults={
        "spark": {"canary_every": 8, "canary_max_tokens": 64, "long_decode_tokens": 4096},
        "lab": {"canary_every": 8, "canary_max_tokens": 64, "long_decode_tokens": 192},
    },
    watch=WatchJudge("canary", _watch_canary,
                     lambda t: f"{len(prompts.CANARIES)} greedy canaries kept their answers",
                     "no canary answered"),
    burst=_burst_canary)
# The deep long-decode probe (corruption that starts ~12k tokens into a sequence): its length,
# capped by max_model_len, and the windows its text is checked in. It replaces the correctness
# check's long decode (long_decode_tokens) when enabled; disable it to save its minutes. Spark:
# 16384 tokens, past the ~12k where corruption was reported (eugr/spark-vllm-docker #349): at a
# Spark's single-stream 41-124 tok/s it costs 2.2-6.7 minutes of the soak. The lab: the emulator
# decodes a 256-token probe in about a second at EMU_SPEED 4 (bench/soak_client.py measures it).
LONG_DECODE = Check(
    "long_decode", check_long_decode, needs=("long_decode",),
    params={"tokens": "count", "window_tokens": "count"},
    defaults={"spark": {"tokens": 16384, "window_tokens": 2048},
              "lab": {"tokens": 256, "window_tokens": 64}})
# Long-prompt probes: one request per size (tokens, by the server's /tokenize) whose answer is a
# fact hidden in the middle of the prompt; sizes past max_model_len are skipped. Each size costs
# its prefill (a 128k-token prompt: about a minute on a Spark): a CI soak lists what it can afford.
LONG_PROMPTS = Check(
    "long_prompts", check_long_prompts, needs=("long_prompts",), params={"tokens": "counts"},
    defaults={"spark": {"tokens": [32768, 65536, 131072]}, "lab": {"tokens": [6000]}})
