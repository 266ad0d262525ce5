"""/metrics parsing and windows: deltas between scrapes, summed over engines, resets noticed."""

from __future__ import annotations

import pytest

from fleetctl.soak import metrics


def scrape(
    t: float,
    drafts: float,
    draft_tokens: float,
    accepted: float,
    pos: tuple[float, ...],
    stop: float,
    gen: float,
    preempt: float = 0,
    kv: float = 0.1,
    engines: int = 1,
) -> metrics.Scrape:
    lines = [
        "# TYPE vllm:spec_decode_num_drafts counter",
        "# TYPE vllm:spec_decode_num_draft_tokens counter",
        "# TYPE vllm:spec_decode_num_accepted_tokens counter",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
        "# TYPE vllm:request_success counter",
        "# TYPE vllm:generation_tokens counter",
        "# TYPE vllm:num_preemptions counter",
        "# TYPE vllm:kv_cache_usage_perc gauge",
    ]
    for e in range(engines):
        lab = f'model_name="m",engine="{e}"'
        lines += [
            f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts / engines}",
            f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {draft_tokens / engines}",
            f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {accepted / engines}",
            *(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} '
                f'{v / engines}'
                for i, v in enumerate(pos)
            ),
            f'vllm:request_success_total{{{lab},finished_reason="stop"}} {stop / engines}',
            f'vllm:request_success_total{{{lab},finished_reason="error"}} 0',
            f"vllm:generation_tokens_total{{{lab}}} {gen / engines}",
            f"vllm:num_preemptions_total{{{lab}}} {preempt / engines}",
            f"vllm:kv_cache_usage_perc{{{lab}}} {kv / engines}",
        ]
    return metrics.parse("\n".join(lines) + "\n", t)


def test_window_is_the_delta_not_the_lifetime_total() -> None:
    # Lifetime acceptance would read 900/1000 = 90%; the window's own is 10/100 = 10%.
    a = scrape(
        0, drafts=250, draft_tokens=1000, accepted=900, pos=(240, 230, 220, 210), stop=50, gen=2000
    )
    b = scrape(
        10, drafts=275, draft_tokens=1100, accepted=910, pos=(246, 232, 221, 211), stop=60, gen=2400
    )
    w = metrics.window(a, b, "x", "sweep")
    assert w.acceptance_rate == pytest.approx(0.10)
    assert w.mean_acceptance_length == pytest.approx(1 + 10 / 25)
    assert w.per_position == pytest.approx((6 / 25, 2 / 25, 1 / 25, 1 / 25))
    assert w.success_by_reason == {"error": 0.0, "stop": 10.0}
    assert w.generation_tok_s == pytest.approx(40.0)
    assert not w.counter_reset


def test_engines_are_summed() -> None:
    s = scrape(
        0, drafts=100, draft_tokens=400, accepted=200, pos=(60, 50), stop=8, gen=100, engines=2
    )
    assert s.value(metrics.DRAFTS) == pytest.approx(100)
    assert s.by_label(metrics.SUCCESS, "finished_reason")["stop"] == pytest.approx(8)
    assert s.has_spec_decode


def test_a_counter_going_backwards_is_a_restart() -> None:
    a = scrape(0, drafts=500, draft_tokens=2000, accepted=1000, pos=(400,), stop=90, gen=9000)
    b = scrape(5, drafts=10, draft_tokens=40, accepted=20, pos=(8,), stop=2, gen=80)
    assert metrics.window(a, b, "x", "sustained").counter_reset


def test_no_spec_decode_series_gives_no_acceptance() -> None:
    text = ('# TYPE vllm:generation_tokens '
            'counter\nvllm:generation_tokens_total{model_name="m",engine="0"} 5\n')
    a, b = metrics.parse(text, 0), metrics.parse(text.replace(" 5", " 9"), 1)
    w = metrics.window(a, b, "x", "sweep")
    assert w.acceptance_rate is None and w.per_position == () and not a.has_spec_decode
    assert w.generation_tokens == 4


def test_merge_windows_sums_deltas() -> None:
    s = [
        scrape(
            i,
            drafts=100 * i,
            draft_tokens=400 * i,
            accepted=100 * i * (i % 2 + 1),
            pos=(50 * i,),
            stop=i,
            gen=10 * i,
        )
        for i in range(4)
    ]
    ws = [metrics.window(s[i], s[i + 1], f"w{i}", "sustained") for i in range(3)]
    m = metrics.merge_windows(ws, "all", "sustained")
    assert m is not None
    assert m.drafts == 300 and m.draft_tokens == 1200
    assert m.accepted_tokens == sum(w.accepted_tokens or 0 for w in ws)
    assert metrics.merge_windows([], "none", "x") is None


def test_garbage_text_is_refused() -> None:
    with pytest.raises(metrics.MetricsError):
        metrics.parse('vllm:x{a="1" 3\n')


def test_non_finite_values_are_missing_data_and_bad_positions_are_skipped() -> None:
    text = (
        "\n".join(
            [
                "# TYPE vllm:spec_decode_num_drafts counter",
                "# TYPE vllm:spec_decode_num_draft_tokens counter",
                "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
                'vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 10',
                'vllm:spec_decode_num_drafts_total{model_name="m",engine="1"} NaN',
                'vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} +Inf',
                'vllm:spec_decode_num_accepted_tokens_total{model_name="m",engine="0"} 5',
                'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="0",position="0"} 4',  # noqa: E501 (an exposition line as vLLM prints it)
                'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="0",position="first"} 1',  # noqa: E501 (an exposition line as vLLM prints it)
            ]
        )
        + "\n"
    )
    a, b = metrics.parse(text, 0), metrics.parse(text.replace(" 10\n", " 20\n"), 5)
    # One engine's NaN poisons the sum: absent, not a number a bound could pass.
    assert b.value(metrics.DRAFTS) is None and b.value(metrics.DRAFT_TOKENS) is None
    w = metrics.window(a, b, "w", "sweep")
    assert w.acceptance_rate is None and w.drafts is None
    assert b.by_label(metrics.ACCEPTED_PER_POS, "position") == {"0": 4.0, "first": 1.0}


def test_a_position_label_that_is_not_a_number_does_not_crash_the_window() -> None:
    def at(t: float, n: float) -> metrics.Scrape:
        return metrics.parse(
            "\n".join(
                [
                    "# TYPE vllm:spec_decode_num_drafts counter",
                    "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
                    f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {n}',
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="0"}} {n / 2}',  # noqa: E501 (an exposition line as vLLM prints it)
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="-1"}} {n}',  # noqa: E501 (an exposition line as vLLM prints it)
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="x"}} {n}',  # noqa: E501 (an exposition line as vLLM prints it)
                ]
            )
            + "\n",
            t,
        )
    w = metrics.window(at(0, 10), at(5, 30), "w", "sweep")
    assert w.per_position == (0.5,)


# What a real vLLM 0.32 (CPU, tiny Llama) wrote, cut to the labels that matter, and a hybrid's
# shape.
_REAL_CACHE_INFO = (
    '# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
    '# TYPE vllm:cache_config_info gauge\n'
    'vllm:cache_config_info{_block_size_resolved="True",block_size="128",cache_dtype="auto",'
    'cache_hit_alignment_tokens="None",effective_attention_block_size="128",enable_prefix_caching="True",'
    'engine="0",hash_block_size="None",mamba_block_size="None"} 1.0\n')


def test_the_cache_block_is_read_from_cache_config_info() -> None:
    assert metrics.cache_block_tokens(metrics.parse(_REAL_CACHE_INFO)) == 128
    hybrid = _REAL_CACHE_INFO.replace('mamba_block_size="None"', 'mamba_block_size="2096"')
    assert metrics.cache_block_tokens(metrics.parse(hybrid)) == 2096
    assert metrics.cache_block_tokens(metrics.parse("vllm:num_requests_running 0\n")) is None


def test_the_emulator_states_its_cache_block_like_vllm() -> None:
    from fleetctl.lab.emulator.metrics import Metrics
    text = Metrics("m", num_spec_tokens=None, cache_block_tokens=2048).render()
    assert metrics.cache_block_tokens(metrics.parse(text)) == 2048
    assert (
        metrics.cache_block_tokens(metrics.parse(Metrics("m", num_spec_tokens=None).render()))
        is None
    )


def _reference(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """What prometheus_client's own parser reads (the parser fleetctl used before its own), summed
    the same way."""
    import math

    from prometheus_client.parser import text_string_to_metric_families

    series: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("vllm:"):
                key = tuple(
                    sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))
                )
                b = series.setdefault(s.name, {})
                b[key] = (
                    math.nan
                    if not math.isfinite(s.value) or not math.isfinite(b.get(key, 0.0))
                    else b.get(key, 0.0) + s.value
                )
    return series


def _same(a: object, b: object) -> bool:
    return json_dump(a) == json_dump(b)


def json_dump(x: object) -> str:
    import json
    return json.dumps({k: sorted((list(map(list, kk)), str(v)) for kk, v in d.items())  # type: ignore[attr-defined]
                       for k, d in sorted(x.items())})  # type: ignore[attr-defined]


_HOSTILE = (
    '# HELP vllm:odd A help line with "quotes", {braces} and \\\\ backslashes\n'
    "# TYPE vllm:odd gauge\n"
    'vllm:odd{a="x,y}z",b="say \\"hi\\"",c="back\\\\slash",d="new\\nline",e="keep\\q"} 1.5\n'
    'vllm:odd{ a = "spaced" , } 2 1700000000000\n'
    'vllm:odd{a="1e3"} 1e3\n'
    "vllm:odd_inf +Inf\nvllm:odd_ninf -Inf\nvllm:odd_nan NaN\n"
    'vllm:odd{engine="0",model_name="m",a="sum"} 1\nvllm:odd{engine="1",model_name="m",a="sum"} '
    '2.25\n'
    "vllm:bare 7\n"
    'vllm:tight{a="1"}3\n'
    # A series seen before with another value (parsed from memory), then with a bad value.
    "vllm:bare 8\n"
    "\n   \n"
    'process_cpu_seconds_total 12.5\npython_info{implementation="CPython",version="3.12"} 1.0\n'
)


@pytest.mark.parametrize("kind", ["emulator", "emulator-busy", "real-cache-info", "hostile"])
def test_the_parser_reads_what_prometheus_client_reads(kind: str) -> None:
    from fleetctl.lab.emulator.metrics import Metrics

    if kind.startswith("emulator"):
        m = Metrics("qwen36-fast", num_spec_tokens=4, cache_block_tokens=2048)
        if kind == "emulator-busy":
            for i in range(50):
                m.draft(4, i % 5)
                m.finished("stop" if i % 7 else "length")
                m.observe("vllm:time_to_first_token_seconds", 0.01 * i)
                m.inc("vllm:generation_tokens", 17)
        text = m.render()
    else:
        text = _REAL_CACHE_INFO if kind == "real-cache-info" else _HOSTILE
    got = metrics.parse(text).series
    assert got and _same(got, _reference(text))


@pytest.mark.parametrize("bad", [
    'vllm:x{a="1" 3\n', 'vllm:x{a=1} 3\n', "vllm:x\n", "vllm:x one\n",
    "vllm:x 1 later\n", "{a=\"1\"} 3\n", 'vllm:x{a="1"\n} 3\n',
    "vllm:bare 7\nvllm:bare seven\n",  # a series known from the line before, a bad value
])
def test_malformed_lines_are_refused_like_prometheus_client_does(bad: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with pytest.raises(metrics.MetricsError, match="not Prometheus text"):
        metrics.parse(bad)
    with pytest.raises((ValueError, TypeError, IndexError)):
        for f in text_string_to_metric_families(bad):
            list(f.samples)


def test_accepted_beyond_drafted_is_inconsistent_not_a_rate() -> None:
    # 290 accepted of 250 drafted tokens: "115.9 %" is not a reading, it names the series instead.
    a = scrape(0, drafts=0, draft_tokens=0, accepted=0, pos=(0, 0), stop=0, gen=0)
    b = scrape(10, drafts=100, draft_tokens=250, accepted=290, pos=(90, 80), stop=10, gen=500)
    w = metrics.window(a, b, "c=4", "sweep")
    assert w.acceptance_rate is None and w.per_position == () and w.accepted_tokens is None
    assert any(f.startswith(metrics.ACCEPTED) and "116.0%" in f for f in w.inconsistent), (
        w.inconsistent
    )


def test_a_position_accepted_more_often_than_drafts_or_than_the_one_before_is_inconsistent() -> (
    None
):
    a = scrape(0, drafts=0, draft_tokens=0, accepted=0, pos=(0, 0), stop=0, gen=0)
    b = scrape(10, drafts=100, draft_tokens=400, accepted=200, pos=(120, 80), stop=10, gen=500)
    assert any('position="0"' in f for f in metrics.window(a, b, "x", "sweep").inconsistent)
    c = scrape(10, drafts=100, draft_tokens=400, accepted=150, pos=(50, 90), stop=10, gen=500)
    w = metrics.window(a, c, "x", "sweep")
    assert any('position="1"' in f and "exceeds position 0" in f for f in w.inconsistent), (
        w.inconsistent
    )


def test_a_counter_going_backwards_is_named() -> None:
    a = scrape(0, drafts=100, draft_tokens=400, accepted=200, pos=(80, 60), stop=10, gen=500)
    b = scrape(10, drafts=150, draft_tokens=600, accepted=150, pos=(100, 70), stop=20, gen=900)
    w = metrics.window(a, b, "x", "sustained")
    assert w.counter_reset
    assert any(
        f.startswith(metrics.ACCEPTED) and "went backwards (200 -> 150)" in f
        for f in w.inconsistent
    )


def test_a_healthy_window_has_no_inconsistency() -> None:
    a = scrape(
        0, drafts=250, draft_tokens=1000, accepted=900, pos=(240, 230, 220, 210), stop=50, gen=2000
    )
    b = scrape(
        10, drafts=275, draft_tokens=1100, accepted=910, pos=(246, 232, 221, 211), stop=60, gen=2400
    )
    assert metrics.window(a, b, "x", "sweep").inconsistent == ()
