"""One check type, one registry (issue 37): a check registered here, from the test only, is judged
by the soak (its verdict, the JSON, JUnit and HTML reports) and by ``fleetctl watch``, its
parameter defaulted per profile and overridden per recipe, without another file edited; and a
probe runs only when a registered, enabled check needs it. Against the loopback emulator."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.cli.main import main
from fleetctl.soak.checks.check import Check, CheckContext
from fleetctl.soak.checks.judge import F, P, decide, skipped
from fleetctl.soak.checks.registry import REGISTRY
from fleetctl.soak.checks.watching import Interval, WatchJudge, WatchSettings
from fleetctl.soak.config import CheckSpec
from fleetctl.soak.recipe_soak import load_config
from fleetctl.soak.run import run_soak
from fleetctl.soak.verdict import CheckResult, Measurement, Outcome
from fleetctl.soak.watch import WatchTarget, run_watch

from .conftest import SERVED, Served


# The toy check, as docs/design.md ("Adding a check") shows it: the server names its version, at
# least ``min_chars`` characters long (a parameter with a default per profile); in a watch, every
# interval's streamed request names a first token.
def check_version(spec: CheckSpec, ctx: CheckContext) -> CheckResult:
    """The server's /version names a version of at least ``min_chars`` characters."""
    ident = ctx.evidence.identity
    if ident is None or not ident.reachable:
        return skipped(spec, "not run: the server never answered")
    least = int(spec.params["min_chars"])
    ok = len(ident.version) >= least
    m = Measurement("/version", P if ok else F,
                    f"version {ident.version!r} on {ctx.evidence.host}"
                    + ("" if ok else f" is shorter than {least} characters"),
                    len(ident.version), least)
    return decide(spec, [m], ok_message=f"version {ident.version!r}")


def watch_version(iv: Interval) -> list[Measurement]:
    """The interval's streamed request got its first token."""
    ok = iv.stream.ok and iv.stream.ttft is not None
    return [Measurement(iv.label, P if ok else F, f"{iv.label}: stream {'ok' if ok else 'failed'}")]


TOY = Check(
    "toy_version", check_version, needs=("identity",), smoke=True,
    params={"min_chars": "count"},
    defaults={"spark": {"min_chars": 1}, "lab": {"min_chars": 2}},
    watch=WatchJudge("toy_version", watch_version, lambda t: f"{t.intervals} interval(s) streamed",
                     "no interval"),
)


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path / "state"))


def test_a_check_registered_from_a_test_is_in_the_soak_its_reports_and_the_watch(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    served = emulator(EMU_SPEED="4")
    out = tmp_path / "out"
    with REGISTRY.added(TOY):
        code = main(["soak", "--endpoint", served.target.base_url, "--profile", "lab",
                     "--model", SERVED[0], "--concurrency", "1", "--duration", "3s",
                     "--json-report", str(out / "soak.json"), "--junit", str(out / "soak.xml"),
                     "--html", str(out / "soak.html")])
        data = json.loads((out / "soak.json").read_text())
        assert code == 0, data["verdicts"][0]["summary"]
        (v,) = data["verdicts"]
        toy = next(c for c in v["checks"] if c["name"] == "toy_version")
        # Reported after the built-ins, judged on what the soak gathered, its lab default applied.
        assert v["checks"][-1] is toy and toy["outcome"] == "pass", toy
        assert toy["measurements"][0]["bound"] == 2 and toy["measurements"][0]["measured"] >= 2
        cases = {c.get("name") for c in ET.parse(out / "soak.xml").getroot().iter("testcase")}
        assert any(n and "toy_version" in n for n in cases), cases
        assert "toy_version" in (out / "soak.html").read_text()

        # Overridden per recipe like any check: a bound no version meets fails the soak.
        cfg = load_config({"checks": {"toy_version": {"min_chars": 99}}}, profile="lab",
                          served_model_names=SERVED)
        strict = run_soak(served.target, cfg.with_duration(0), artifacts_dir=tmp_path / "strict")
        assert strict.check("toy_version").outcome is Outcome.FAIL
        assert "shorter than 99 characters" in strict.check("toy_version").message
        assert strict.outcome is Outcome.FAIL and "toy_version" in strict.summary

        # The watch judges it too, beside its own checks.
        [w] = run_watch([WatchTarget(served.target, load_config({}, profile="lab",
                                                                served_model_names=SERVED),
                                     tmp_path / "watch", "watch-toy")],
                        WatchSettings(duration=2.5, interval=1.0))
        assert w.check("toy_version").outcome is Outcome.PASS, w.check("toy_version")
        assert "interval(s) streamed" in w.check("toy_version").message
    # Gone with the block: no spec, no result, a recipe naming it is refused.
    assert "toy_version" not in REGISTRY.names()
    assert "toy_version" not in load_config({}, profile="lab").checks


def test_a_probe_runs_only_when_an_enabled_check_needs_it(
    emulator: Callable[..., Served], tmp_path: Path
) -> None:
    """Every check that reads /metrics, the canaries, the long decode, the long prompts and the
    reference answers disabled: none of those requests or scrapes is made; the load still runs
    for the checks that need it."""
    served = emulator(EMU_SPEED="4")
    off = ("server_errors", "acceptance", "acceptance_decay", "long_context", "preemptions",
           "throughput", "correctness", "long_decode", "long_prompts", "known_good")
    cfg = load_config({"checks": dict.fromkeys(off, False), "concurrency": [1]}, profile="lab",
                      served_model_names=SERVED).with_duration(2)
    v = run_soak(served.target, cfg, artifacts_dir=tmp_path / "run")
    assert v.outcome is Outcome.PASS, v.summary
    assert all(v.check(n).outcome is Outcome.SKIPPED for n in off)
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().split("\n")
               if x]
    phases = {s["phase"] for s in samples}
    assert {"smoke", "classes", "sweep", "sustained"} <= phases, phases
    assert not phases & {"canary", "long_decode", "long_prompt", "answers"}, phases
    assert not any(s["cls"].startswith("canary-") for s in samples)
    assert not (tmp_path / "run" / "scrapes").exists() or not any(
        (tmp_path / "run" / "scrapes").iterdir())
    assert v.windows == ()
    # With the defaults every one of them runs.
    full = REGISTRY.needed(load_config({}, profile="lab").checks)
    assert {"metrics", "canaries", "long_decode", "long_prompts", "answer_set"} <= full
    assert not {"metrics", "canaries", "answer_set"} & REGISTRY.needed(cfg.checks)


def test_the_design_doc_shows_this_toy_check() -> None:
    """docs/design.md's "Adding a check" ends with the toy check, as this test has it."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    section = doc.split("## Adding a check", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert block.strip() and block in Path(__file__).read_text()
