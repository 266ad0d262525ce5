"""The soak gate's configuration: profiles, overrides, and the errors a typo gets."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from fleetctl.durations import DurationError, parse_duration
from fleetctl.soak.checks.registry import REGISTRY
from fleetctl.soak.config import SoakConfigError
from fleetctl.soak.recipe_soak import from_recipe, load_config


def test_spark_defaults_come_from_the_seed_figures() -> None:
    c = load_config()
    assert c.profile == "spark"
    assert c.concurrency == (1, 4, 16, 32, 64)
    assert c.readiness_timeout == 600  # startup takes 3-5 minutes
    assert c.smoke_max_tokens >= 2048  # content null + length below ~1500 with thinking on
    assert set(c.checks) == set(REGISTRY.names())
    assert c.check("errors").params["max_error_rate"] == 0.0
    lat = c.check("latency")
    assert lat.level_bound("ttft_p95_ms", 1) == 500
    assert lat.level_bound("ttft_p95_ms", 8) == 2000  # the next level up
    assert lat.level_bound("ttft_p95_ms", 128) == 15000  # beyond the table: the last bound
    # Enough requests per level for stable percentiles: 4 per worker, at least 32; three trials
    # each.
    assert c.level_requests(64) == 256 and c.level_requests(1) == 32 and c.trials == 3


def test_lab_profile_is_shorter_and_looser() -> None:
    spark, lab = load_config(), load_config(profile="lab")
    assert lab.sustained_duration < spark.sustained_duration
    assert lab.check("latency").level_bound("ttft_p95_ms", 1) > spark.check("latency").level_bound(
        "ttft_p95_ms", 1
    )
    assert lab.concurrency == spark.concurrency


def test_recipe_overrides_merge_over_the_profile() -> None:
    c = load_config(
        {
            "sustained": {"duration": "2m", "window": "20s"},
            "checks": {
                "latency": {"observe_only": True},
                "acceptance": {"floor": {"prose": 0.01}},
                "throughput": {"tolerance": 0.1, "failure_limit": 1},
            },
        }
    )
    assert c.sustained_duration == 120 and c.window == 20
    assert c.check("latency").observe_only
    floors = c.check("acceptance").params["floor"]
    assert floors["prose"] == 0.01 and floors["coding"] == 0.16  # a partial table keeps the rest
    assert (
        c.check("throughput").params["tolerance"] == 0.1
        and c.check("throughput").failure_limit == 1
    )


def test_a_check_can_be_switched_off_with_false() -> None:
    assert not load_config({"checks": {"preemptions": False}}).check("preemptions").enabled


@pytest.mark.parametrize(("raw", "says"), [
    ({"sustaned": {}}, "unknown key(s) sustaned"),
    ({"checks": {"latencyy": {}}}, "unknown key(s) latencyy"),
    ({"checks": {"latency": {"ttft_p95": {}}}}, "unknown key(s) ttft_p95"),
    ({"concurrency": [4, 1]}, "must rise strictly"),
    ({"concurrency": [0, 4]}, "not a list of positive integers"),
    ({"checks": {"throughput": {"tolerance": 15}}}, "not a fraction"),
    ({"checks": {"acceptance": {"floor": {"poetry": 0.1}}}}, "unknown prompt class 'poetry'"),
    ({"classes": ["coding", "haiku"]}, "unknown prompt class"),
    ({"profile": "h100"}, "is not a profile"),
    ({"sustained": {"duration": "ten minutes"}}, "is not a duration"),
    ({"checks": {"latency": {"ttft_p95_ms": {"high": 3}}}}, "is not a concurrency level"),
    ({"max_tokens": -1}, "whole number"),
])
def test_invalid_settings_name_the_key_and_the_fix(raw: dict[str, Any], says: str) -> None:
    with pytest.raises(SoakConfigError) as e:
        load_config(raw, recipe="qwen36")
    assert says in e.value.cause
    assert e.value.cause.startswith("recipe qwen36: soak")
    assert e.value.fix


def test_durations() -> None:
    assert (
        parse_duration("90s") == 90
        and parse_duration("10m") == 600
        and parse_duration("1h") == 3600
    )
    assert (
        parse_duration("1m30s") == 90 and parse_duration(45) == 45 and parse_duration("2.5") == 2.5
    )
    for bad in ("", "m", True, "5 parsecs"):
        with pytest.raises(DurationError, match="is not a duration"):
            parse_duration(bad)
    for negative in ("-3", "-5s", -2):
        with pytest.raises(DurationError, match="is negative"):
            parse_duration(negative, "--soak")


def test_a_bad_duration_in_a_soak_config_is_a_soak_config_error() -> None:
    with pytest.raises(SoakConfigError, match=r"sustained\.duration"):
        load_config({"sustained": {"duration": "soon"}})


def test_with_duration_keeps_three_windows() -> None:
    c = load_config().with_duration(30)
    assert c.sustained_duration == 30 and c.window == 10


class _Recipe:
    name = "qwen36"
    served_model_names = ("qwen36-35b-heretic", "qwen36-fast")
    vllm_args = ("--max-num-seqs", "64", "--speculative-config", '{"method": "dflash"}')
    soak: ClassVar[dict[str, str]] = {"profile": "lab"}


def test_from_recipe_reads_names_flags_and_profile() -> None:
    c = from_recipe(_Recipe())
    assert c.served_model_names == ("qwen36-35b-heretic", "qwen36-fast")
    assert c.speculative is True and c.profile == "lab" and c.recipe == "qwen36"
    r = _Recipe()
    r.vllm_args = ("--max-num-seqs", "64")
    assert from_recipe(r, profile="spark").speculative is False


def test_the_fingerprint_changes_with_what_makes_throughput_comparable() -> None:
    base = load_config(profile="lab")
    assert base.fingerprint() == load_config(profile="lab").fingerprint()
    # The sustained duration and check bounds do not change what a sweep level measures.
    assert base.with_duration(600).fingerprint() == base.fingerprint()
    assert (
        load_config({"checks": {"throughput": {"tolerance": 0.3}}}, profile="lab").fingerprint()
        == base.fingerprint()
    )
    for other in (load_config(profile="spark"), load_config({"max_tokens": 64}, profile="lab"),
                  load_config({"concurrency": [1, 4]}, profile="lab")):
        assert other.fingerprint() != base.fingerprint()


def test_load_requests_run_with_thinking_off_unless_the_recipe_says_so() -> None:
    assert load_config().thinking is False and load_config(profile="lab").thinking is False
    on = load_config({"thinking": True})
    assert on.thinking is True and on.fingerprint() != load_config().fingerprint()
    with pytest.raises(SoakConfigError, match="thinking"):
        load_config({"thinking": "no"})
