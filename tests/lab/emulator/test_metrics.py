"""The emulator's /metrics text: vLLM's names and labels, parsed by prometheus_client's own
parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from fleetctl.lab.emulator.metrics import FINISHED_REASONS, HISTOGRAMS, Metrics, buckets_1_2_5


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _labels(**extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"model_name": "qwen36-fast", "engine": "0", **extra}.items()))


def test_every_series_has_model_name_and_engine() -> None:
    m = Metrics("qwen36-fast", num_spec_tokens=3)
    for family in text_string_to_metric_families(m.render()):
        for s in family.samples:
            assert s.labels["model_name"] == "qwen36-fast"
            assert s.labels["engine"] == "0"


def test_counters_and_finish_reasons() -> None:
    m = Metrics("qwen36-fast", num_spec_tokens=None)
    m.inc("vllm:prompt_tokens", 14)
    m.inc("vllm:generation_tokens", 30)
    m.finished("stop")
    m.finished("length")
    m.finished("length")
    got = _samples(m.render())
    assert got[("vllm:prompt_tokens_total", _labels())] == 14
    assert got[("vllm:generation_tokens_total", _labels())] == 30
    assert got[("vllm:request_success_total", _labels(finished_reason="length"))] == 2
    for reason in FINISHED_REASONS:
        assert ("vllm:request_success_total", _labels(finished_reason=reason)) in got


def test_spec_decode_families_only_with_a_speculative_config() -> None:
    without = Metrics("qwen36-fast", num_spec_tokens=None).render()
    assert "spec_decode" not in without
    m = Metrics("qwen36-fast", num_spec_tokens=4)
    m.draft(4, 2)
    m.draft(4, 0)
    m.draft(4, 4)
    got = _samples(m.render())
    assert got[("vllm:spec_decode_num_drafts_total", _labels())] == 3
    assert got[("vllm:spec_decode_num_draft_tokens_total", _labels())] == 12
    assert got[("vllm:spec_decode_num_accepted_tokens_total", _labels())] == 6
    per_pos = [
        got[("vllm:spec_decode_num_accepted_tokens_per_pos_total", _labels(position=str(i)))]
        for i in range(4)
    ]
    assert per_pos == [2, 2, 1, 1]
    # The identity the soak's windows rely on: accepted = sum over positions.
    assert sum(per_pos) == got[("vllm:spec_decode_num_accepted_tokens_total", _labels())]


def test_histograms_are_cumulative_with_count_and_sum() -> None:
    m = Metrics("qwen36-fast", num_spec_tokens=None)
    for value in (0.05, 0.09, 0.3, 100.0):
        m.observe("vllm:time_to_first_token_seconds", value)
    got = _samples(m.render())
    name = "vllm:time_to_first_token_seconds"
    assert got[(name + "_count", _labels())] == 4
    assert abs(got[(name + "_sum", _labels())] - 100.44) < 1e-9
    assert got[(name + "_bucket", _labels(le="0.06"))] == 1
    assert got[(name + "_bucket", _labels(le="0.1"))] == 2
    assert got[(name + "_bucket", _labels(le="80.0"))] == 3
    assert got[(name + "_bucket", _labels(le="+Inf"))] == 4
    for hist in HISTOGRAMS:
        assert (hist + "_count", _labels()) in got


def test_gauges() -> None:
    m = Metrics("qwen36-fast", num_spec_tokens=None)
    m.set_gauge("vllm:num_requests_running", 5)
    m.set_gauge("vllm:kv_cache_usage_perc", 0.25)
    got = _samples(m.render())
    assert got[("vllm:num_requests_running", _labels())] == 5
    assert got[("vllm:num_requests_waiting", _labels())] == 0
    assert got[("vllm:kv_cache_usage_perc", _labels())] == 0.25


def test_text_format_matches_a_real_vllm_exposition() -> None:
    """Line for line as a real vLLM 0.32 writes them (labels sorted, _created as gauge families)."""
    m = Metrics("tiny", num_spec_tokens=1, now=1795321684.9770527)
    m.finished("length")
    lines = m.render().splitlines()
    assert (
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 1.0'
        in lines
    )
    assert "# TYPE vllm:request_success_created gauge" in lines
    assert (
        'vllm:prompt_tokens_created{engine="0",model_name="tiny"} 1.7953216849770527e+09' in lines
    )
    assert (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny"} 0.0'
        in lines
    )
    assert (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 0.0'  # noqa: E501 (an exposition line as vLLM prints it)
        in lines
    )


def test_request_token_buckets_follow_max_model_len() -> None:
    assert buckets_1_2_5(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    m = Metrics("tiny", num_spec_tokens=None, max_model_len=2048)
    m.observe("vllm:request_params_max_tokens", 300)
    m.observe("vllm:iteration_tokens_total", 3)
    got = _samples(m.render())
    assert ("vllm:request_params_max_tokens_bucket", _labels_tiny(le="2000.0")) in got
    assert ("vllm:request_params_max_tokens_bucket", _labels_tiny(le="5000.0")) not in got
    assert got[("vllm:iteration_tokens_total_bucket", _labels_tiny(le="8.0"))] == 1


def _labels_tiny(**extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"model_name": "tiny", "engine": "0", **extra}.items()))
