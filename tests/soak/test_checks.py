"""The checks from data: limits (Argo style), missing data, garbage, decay, baselines."""

from __future__ import annotations

import dataclasses

from fleetctl.soak.checks.check import CheckContext
from fleetctl.soak.checks.evidence import Evidence, SmokeResult
from fleetctl.soak.checks.health import check_container, check_errors, check_smoke
from fleetctl.soak.checks.judge import decide, garbage, overall, size_measurements
from fleetctl.soak.checks.performance import check_throughput
from fleetctl.soak.checks.speculative import (
    check_acceptance,
    check_acceptance_decay,
    check_long_context,
)
from fleetctl.soak.config import CheckSpec, SoakConfig
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.verdict import LevelSummary, Measurement, Outcome, Readiness, Verdict, Window

P, F, INC, ERR = Outcome.PASS, Outcome.FAIL, Outcome.INCONCLUSIVE, Outcome.ERROR
READY = Readiness(P, "ok", 1.0)
LAB = load_config(profile="lab")


def ctx(ev: Evidence, config: SoakConfig = LAB, baseline: Verdict | None = None) -> CheckContext:
    """The context a check is evaluated in: ``ev``, under ``config``, against ``baseline``."""
    return CheckContext(ev, config, baseline)


def m(o: Outcome) -> Measurement:
    return Measurement("x", o, f"measured {o.value}")


def test_limits_follow_argo_analysis() -> None:
    spec = CheckSpec("t")
    assert decide(spec, [m(P), m(P)]).outcome is P
    assert decide(spec, [m(P), m(F)]).outcome is F
    assert decide(dataclasses.replace(spec, failure_limit=1), [m(P), m(F)]).outcome is P
    assert decide(spec, [m(P), m(INC)]).outcome is INC
    assert decide(dataclasses.replace(spec, inconclusive_limit=1), [m(INC), m(P)]).outcome is P
    assert decide(spec, [m(ERR)]).outcome is ERR
    assert (
        decide(dataclasses.replace(spec, consecutive_error_limit=1), [m(ERR), m(P), m(ERR)]).outcome
        is P
    )
    assert (
        decide(dataclasses.replace(spec, consecutive_error_limit=1), [m(ERR), m(ERR)]).outcome
        is ERR
    )
    # Missing data is never a pass.
    assert decide(spec, []).outcome is INC


def test_observe_only_checks_do_not_decide_the_verdict() -> None:
    failing = decide(CheckSpec("lat", observe_only=True), [m(F)])
    assert failing.outcome is F
    assert overall([failing, decide(CheckSpec("x"), [m(P)])]) is P
    assert (
        overall([decide(CheckSpec("a"), [m(INC)]), decide(CheckSpec("b"), [m(ERR)])]) is ERR
    )
    assert overall([decide(CheckSpec("a"), [m(ERR)]), decide(CheckSpec("b"), [m(F)])]) is F


def test_garbage_detection() -> None:
    assert garbage("!!!!!!!!!!!!!!!!!!!!!!!!") != ""
    assert "'!'" in garbage("The answer is !!!!!!!!!!!!")
    assert garbage("?" * 40) != ""
    assert garbage("17 × 23 = 391.") == ""
    assert garbage("```python\ndef f():\n    return 1\n```\n----------------\n") == ""
    assert garbage("") == ""


def _level(
    c: int, tok_s: float | None, errors: int = 0, ttft: float = 0.1, tpot: float = 0.01
) -> LevelSummary:
    return LevelSummary(
        "sweep",
        f"c={c}",
        c,
        requests=8,
        errors=errors,
        seconds=2.0,
        tok_s=tok_s,
        ttft_p50=ttft,
        ttft_p95=ttft,
        tpot_p50=tpot,
        first_error="boom" if errors else "",
    )


def _verdict(levels: tuple[LevelSummary, ...]) -> Verdict:
    return Verdict("base-run", "h", "u", P, "pass", "s", "f", 1.0, levels=levels)


def test_throughput_against_a_baseline_and_without() -> None:
    cfg = load_config()
    ev = Evidence(READY, levels=(_level(1, 70.0), _level(4, 180.0)), load_ran=True)
    base = _verdict((_level(1, 100.0), _level(4, 200.0)))
    r = check_throughput(cfg.check("throughput"), ctx(ev, baseline=base))
    assert r.outcome is F
    assert [x.label for x in r.measurements if x.outcome is F] == ["c=1"]
    assert "70.0 tok/s vs baseline 100.0 (-30%" in r.message
    assert check_throughput(cfg.check("throughput"), ctx(ev, baseline=None)).outcome is P
    # The lab profile is looser (half the baseline) and forgives one level, not two.
    lab = load_config(profile="lab").check("throughput")
    assert lab.params["tolerance"] == 0.5
    assert check_throughput(lab, ctx(ev, baseline=base)).outcome is P
    ev_one = Evidence(READY, levels=(_level(1, 40.0), _level(4, 180.0)), load_ran=True)
    assert lab.failure_limit == 1 and check_throughput(lab, ctx(ev_one, baseline=base)).outcome is P
    ev_all = Evidence(READY, levels=(_level(1, 40.0), _level(4, 80.0)), load_ran=True)
    assert check_throughput(lab, ctx(ev_all, baseline=base)).outcome is F
    # A level with no successful request is missing data.
    ev2 = Evidence(READY, levels=(_level(1, None, errors=8),), load_ran=True)
    assert check_throughput(cfg.check("throughput"), ctx(ev2, baseline=None)).outcome is INC


def test_errors_fail_the_level_they_happen_at() -> None:
    cfg = load_config(profile="lab")
    ev = Evidence(
        READY, levels=(_level(16, 100.0), _level(32, 10.0, errors=8)), load_ran=True, crash=""
    )
    r = check_errors(cfg.check("errors"), ctx(ev, cfg))
    assert r.outcome is F and r.message.startswith("c=32: 8/8 requests failed (boom)")


def _sus(i: int, rate: float | None) -> Window:
    return Window(f"sustained #{i}", "sustained", i * 5.0, i * 5.0 + 5, acceptance_rate=rate,
                  per_position=(rate,) if rate is not None else ())


def test_decay_is_judged_on_the_trend_of_windows() -> None:
    cfg = load_config()
    spec = cfg.check("acceptance_decay")
    decaying = Evidence(
        READY,
        windows=tuple(_sus(i, r) for i, r in enumerate((0.5, 0.45, 0.3, 0.2, 0.1, 0.02))),
        load_ran=True,
        spec_seen=True,
    )
    r = check_acceptance_decay(spec, ctx(decaying, cfg))
    assert r.outcome is F and "fell" in r.message
    steady = Evidence(
        READY,
        windows=tuple(_sus(i, r) for i, r in enumerate((0.5, 0.48, 0.52, 0.49))),
        load_ran=True,
        spec_seen=True,
    )
    assert check_acceptance_decay(spec, ctx(steady, cfg)).outcome is P
    short = Evidence(READY, windows=(_sus(0, 0.5), _sus(1, 0.5)), load_ran=True, spec_seen=True)
    assert check_acceptance_decay(spec, ctx(short, cfg)).outcome is INC


def test_spec_checks_when_the_server_has_no_speculative_decoding() -> None:
    ev = Evidence(READY, load_ran=True, spec_seen=False)
    recipe_says_spec = load_config(speculative=True)
    assert (
        check_acceptance(recipe_says_spec.check("acceptance"), ctx(ev, recipe_says_spec)).outcome
        is INC
    )
    unknown = load_config()
    assert (
        check_acceptance(unknown.check("acceptance"), ctx(ev, unknown)).outcome is Outcome.SKIPPED
    )
    plain = load_config(speculative=False)
    assert (
        check_long_context(plain.check("long_context"), ctx(ev, plain)).outcome is Outcome.SKIPPED
    )


def test_long_context_collapse_fails() -> None:
    cfg = load_config(profile="lab")
    ws = (Window("coding", "classes", 0, 1, acceptance_rate=0.4, per_position=(0.5,)),
          Window("long_context", "classes", 1, 2, acceptance_rate=0.01, per_position=(0.02,)))
    r = check_long_context(
        cfg.check("long_context"),
        ctx(Evidence(READY, windows=ws, load_ran=True, spec_seen=True), cfg),
    )
    assert r.outcome is F and "collapses" in r.message


def test_a_crash_fails_the_container_check_even_without_container_access() -> None:
    r = check_container(
        CheckSpec("container"), ctx(Evidence(READY, crash="server crashed during c=32"))
    )
    assert r.outcome is F
    assert (
        check_container(CheckSpec("container"), ctx(Evidence(READY))).outcome is Outcome.SKIPPED
    )


def _smoke(text: str, reason: str = "stop", ok: bool = True) -> SmokeResult:
    from fleetctl.soak.verdict import Sample
    s = Sample("smoke", "multiply", 1, 0.0, ok, 200, text=text, finish_reason=reason,
               error="" if ok else "connection refused", error_kind="" if ok else "connect")
    return SmokeResult("multiply", "391", s, 2048)


def test_smoke_answers() -> None:
    spec = CheckSpec("smoke")
    assert check_smoke(spec, ctx(Evidence(READY, smoke=(_smoke("17 × 23 = 391"),)))).outcome is P
    # content null with finish_reason length: the model ran out of tokens, not a crash.
    assert check_smoke(spec, ctx(Evidence(READY, smoke=(_smoke("", "length"),)))).outcome is INC
    assert check_smoke(spec, ctx(Evidence(READY, smoke=(_smoke("It is 401."),)))).outcome is F
    assert "garbage" in check_smoke(spec, ctx(Evidence(READY, smoke=(_smoke("!" * 64),)))).message
    # Nonsense that happens to contain 391 far into a long reply is not an answer.
    late = check_smoke(
        spec, ctx(Evidence(READY, smoke=(_smoke("st= y;{ " * 400 + "391", "length"),)))
    )
    assert late.outcome is F and "only appears after" in late.message
    assert check_smoke(spec, ctx(Evidence(READY, smoke=(_smoke("", ok=False),)))).outcome is F


def _acc_run(sustained: float, coding: float = 0.4) -> Evidence:
    """A coding class window, then four sustained windows at one acceptance rate."""
    classes = (Window("coding", "classes", 0, 1, acceptance_rate=coding, per_position=(coding,)),)
    return Evidence(
        READY,
        windows=classes + tuple(_sus(i, sustained) for i in range(4)),
        load_ran=True,
        spec_seen=True,
    )


def test_acceptance_has_an_absolute_floor_outside_the_class_phase() -> None:
    cfg = load_config()
    spec = cfg.check("acceptance")
    healthy = _acc_run(0.4)
    assert check_acceptance(spec, ctx(healthy, cfg)).outcome is P
    # A decay that finished and plateaued near zero: the trend check sees a flat line.
    r = check_acceptance(spec, ctx(_acc_run(0.01), cfg))
    assert r.outcome is F and "absolute floor" in r.message and "sustained #0" in r.message
    sweep = Window("c=16", "sweep", 0, 1, acceptance_rate=0.0, per_position=(0.0,))
    assert (
        check_acceptance(
            spec, ctx(dataclasses.replace(healthy, windows=(*healthy.windows, sweep)), cfg)
        ).outcome
        is F
    )
    # No drafts in a window is missing data, not a collapse.
    quiet = dataclasses.replace(healthy, windows=(*healthy.windows, _sus(9, None)))
    assert check_acceptance(spec, ctx(quiet, cfg)).outcome is P


def test_sustained_acceptance_is_compared_with_the_classes_and_the_baseline() -> None:
    cfg = load_config()
    spec = cfg.check("acceptance")
    held = _acc_run(0.38)
    assert check_acceptance(spec, ctx(held, cfg)).outcome is P
    # Above every absolute floor, yet a third of what the same run measured per class.
    r = check_acceptance(spec, ctx(_acc_run(0.12), cfg))
    assert r.outcome is F and "of this run's short classes" in r.message
    base = dataclasses.replace(_verdict(()), windows=tuple(_sus(i, 0.8) for i in range(4)))
    r = check_acceptance(spec, ctx(held, cfg, baseline=base))
    assert r.outcome is F and "baseline" in r.message and "sustained phase" in r.message


def _sweep_verdict(run: str, tok_s: float, fingerprint: str = "fp1") -> Verdict:
    return Verdict(
        run,
        "h1",
        "http://h1:8000",
        Outcome.PASS,
        "pass",
        "t0",
        "t1",
        1.0,
        tag="v1",
        fingerprint=fingerprint,
        levels=(LevelSummary("sweep", "c=4", 4, 40, 0, 10.0, tok_s=tok_s),),
    )


def test_regression_is_judged_against_the_baselines_spread() -> None:
    spec = load_config({}, profile="lab").check("throughput")
    spec = dataclasses.replace(
        spec, failure_limit=0, params={**spec.params, "tolerance": 0.1, "floor_tok_s": {}}
    )
    ev = Evidence(readiness=Readiness(Outcome.PASS, "ready", 1.0), load_ran=True,
                  levels=(LevelSummary("sweep", "c=4", 4, 40, 0, 10.0, tok_s=80.0),))
    steady = dataclasses.replace(
        _sweep_verdict("b", 100.0), baseline_runs=5, baseline_spread={"c=4": 2.0}
    )
    noisy = dataclasses.replace(steady, baseline_spread={"c=4": 8.0})
    # -20 %: beyond 10 % on a steady host, within 3 x spread (24 tok/s) on a noisy one.
    assert check_throughput(spec, ctx(ev, baseline=steady)).outcome is Outcome.FAIL
    r = check_throughput(spec, ctx(ev, baseline=noisy))
    assert r.outcome is Outcome.PASS, r.message
    failing = check_throughput(spec, ctx(dataclasses.replace(ev, levels=(
        LevelSummary("sweep", "c=4", 4, 40, 0, 10.0, tok_s=70.0),)), baseline=noisy))
    assert failing.outcome is Outcome.FAIL and "3 x spread 8.0" in failing.message, failing.message


def test_a_prompt_far_from_its_target_is_doubtful_only_when_the_server_sized_it() -> None:
    ev = Evidence(readiness=READY, prompt_sizes={"long_context": (3000, 6478, "tokenize")})
    m = size_measurements(ev, "long_context")[0]
    assert m.outcome is Outcome.INCONCLUSIVE and "not what the check assumes" in m.message
    est = size_measurements(
        dataclasses.replace(ev, prompt_sizes={"long_context": (3000, 6478, "estimate")}),
        "long_context",
    )[0]
    assert est.outcome is Outcome.PASS and "no /tokenize" in est.message
    near = size_measurements(
        dataclasses.replace(ev, prompt_sizes={"long_context": (3000, 3050, "tokenize")}),
        "long_context",
    )[0]
    assert near.outcome is Outcome.PASS and near.measured == 3050 and near.bound == 3000


def _counted(i: int, drafts: float, tokens: float, accepted: float) -> Window:
    return Window(
        f"sustained #{i}",
        "sustained",
        float(i),
        i + 1.0,
        drafts=drafts,
        draft_tokens=tokens,
        accepted_tokens=accepted,
        acceptance_rate=accepted / tokens,
    )


def test_a_decay_must_be_significant_for_its_draft_counts() -> None:
    cfg = load_config({"sustained": {"duration": 4, "window": 1}}, profile="lab", speculative=True)
    spec = cfg.check("acceptance_decay")
    # What a healthy lab canary measured in 4 s (CI, 08:08): 11.6 % -> 4.8 % over ~80 drafts a
    # window.
    noisy = (
        _counted(1, 82, 902, 105),
        _counted(2, 94, 1034, 137),
        _counted(3, 133, 1463, 156),
        _counted(4, 74, 814, 39),
    )
    ev = Evidence(readiness=READY, load_ran=True, spec_seen=True, windows=noisy)
    r = check_acceptance_decay(spec, ctx(ev, cfg))
    assert r.outcome is P and "not significant" in r.measurements[0].message, r.message
    # The same fall over ten times the drafts is a decay.
    big = tuple(
        _counted(
            int(w.start),
            (w.drafts or 0) * 10,
            (w.draft_tokens or 0) * 10,
            (w.accepted_tokens or 0) * 10,
        )
        for w in noisy
    )
    r = check_acceptance_decay(spec, ctx(dataclasses.replace(ev, windows=big), cfg))
    assert r.outcome is F and "fell" in r.message and "z=" in r.message, r.message


def test_a_short_sustained_phase_still_reports_its_prefix_cache_hits() -> None:
    # A slow server (the real vLLM on a loaded CPU) may give fewer windows with drafts than the
    # trend needs; whether the conversations hit the prefix cache is still known and reported.
    cfg = load_config()
    spec = cfg.check("acceptance_decay")
    ws = tuple(dataclasses.replace(_sus(i, r), prefix_cache_queries=1000.0, prefix_cache_hits=h)
               for i, (r, h) in enumerate(((0.5, 600.0), (None, 0.0))))
    r = check_acceptance_decay(
        spec, ctx(Evidence(READY, windows=ws, load_ran=True, spec_seen=True), cfg)
    )
    assert r.outcome is INC and "need" in r.message
    assert [(x.label, x.outcome) for x in r.measurements][:2] == [
        ("trend", INC),
        ("prefix cache", P),
    ]
    cold = tuple(dataclasses.replace(w, prefix_cache_hits=0.0) for w in ws)
    r = check_acceptance_decay(
        spec, ctx(Evidence(READY, windows=cold, load_ran=True, spec_seen=True), cfg)
    )
    assert next(x for x in r.measurements if x.label == "prefix cache").outcome is INC


def test_a_shared_prefix_within_one_cache_block_makes_the_decay_check_inconclusive() -> None:
    cfg = load_config()
    spec = cfg.check("acceptance_decay")
    ws = tuple(
        dataclasses.replace(_sus(i, 0.5), prefix_cache_queries=1000.0, prefix_cache_hits=0.0)
        for i in range(4)
    )
    ev = Evidence(READY, windows=ws, load_ran=True, spec_seen=True, cache_block_tokens=2048,
                  prompt_sizes={"shared_prefix": (1536, 1530, "tokenize")})
    r = check_acceptance_decay(spec, ctx(ev, cfg))
    block = next(x for x in r.measurements if x.label == "cache block")
    assert r.outcome is INC and block.outcome is INC and "2048" in block.message, r.message
    longer = dataclasses.replace(ev, prompt_sizes={"shared_prefix": (2560, 2555, "tokenize")})
    assert all(
        x.label != "cache block"
        for x in check_acceptance_decay(spec, ctx(longer, cfg)).measurements
    )
