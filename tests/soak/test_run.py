"""Pure helpers of the engine: root causes from vLLM logs, level summaries, run ids."""

from __future__ import annotations

from fleetctl.runids import new_run_id
from fleetctl.soak.phases.sizing import shared_prefix_tokens
from fleetctl.soak.phases.summary import LevelKey, summarize
from fleetctl.soak.readiness import boot_failure_cause
from fleetctl.soak.verdict import Sample

CRASH_LOG = """\
(APIServer pid=1) INFO 11-22 04:37:40 [api_server.py:1647] Starting vLLM API server 0 on http://0.0.0.0:8000
(APIServer pid=1) ERROR 11-22 04:37:49 [core.py:710] EngineCore encountered a fatal error.
(APIServer pid=1) ERROR 11-22 04:37:49 [core.py:710] RuntimeError: block_table must have shape (num_reqs, max_num_blocks_per_req)
(APIServer pid=1) ERROR 11-22 04:37:49 [serving.py:929] Error in chat completion stream generator.
(APIServer pid=1) ERROR 11-22 04:37:49 [serving.py:929] EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
(APIServer pid=1) ERROR 11-22 04:37:51 [api_server.py:1610] Engine core died; shutting down the API server.
INFO:     Shutting down
"""  # noqa: E501 (data: lines as the program reads them)

BOOT_LOG = """\
Traceback (most recent call last):
  File "/usr/lib/python3/vllm/config.py", line 12, in __post_init__
ValueError: max_num_scheduled_tokens is set to -512 based on the speculative decoding settings
(EngineCore pid=7) ERROR Engine core initialization failed. See root cause above.
"""


def test_the_root_cause_wins_over_generic_lines() -> None:
    assert boot_failure_cause(CRASH_LOG).startswith("RuntimeError: block_table must have shape")
    assert boot_failure_cause(BOOT_LOG).startswith(
        "ValueError: max_num_scheduled_tokens is set to -512"
    )
    assert boot_failure_cause("INFO all good\nINFO: Application startup complete.") == ""


def test_summarize_counts_errors_and_percentiles() -> None:
    ok = [
        Sample(
            "sweep",
            "coding",
            4,
            0.0,
            True,
            200,
            ttft=0.1 * i,
            e2e=1.0,
            tpot=0.01,
            output_tokens=100,
        )
        for i in range(1, 5)
    ]
    bad = Sample("sweep", "coding", 4, 0.0, False, 200, error_kind="stream_error", error="boom")
    lv = summarize(LevelKey("sweep", "c=4", 4), [*ok, bad], seconds=2.0)
    assert (lv.requests, lv.errors, lv.output_tokens, lv.first_error) == (5, 1, 400, "boom")
    assert lv.tok_s == 200.0 and lv.ttft_p50 is not None and abs(lv.ttft_p50 - 0.25) < 1e-9
    assert summarize(LevelKey("sweep", "c=1", 1), [bad], 1.0).tok_s is None


def test_run_ids_are_safe_and_unique() -> None:
    a, b = new_run_id("soak", "spark-01 / x"), new_run_id("soak", "spark-01 / x")
    assert a != b and "/" not in a and " " not in a and a.startswith("soak-spark-01")


def test_goodput_counts_the_requests_meeting_every_slo_and_e2el_has_percentiles() -> None:
    samples = [
        Sample(
            "sweep",
            "coding",
            4,
            0.0,
            True,
            200,
            ttft=0.1 * (i + 1),
            e2e=1.0 + i,
            tpot=0.02,
            output_tokens=50,
        )
        for i in range(10)
    ]
    samples.append(
        Sample("sweep", "coding", 4, 0.0, False, 200, error_kind="stream_error", error="boom")
    )
    lv = summarize(
        LevelKey("sweep", "c=4", 4),
        samples,
        10.0,
        slo={"ttft_ms": 500, "e2el_ms": 4500},
    )
    # ttft <= 0.5 s: i = 0..4; e2el <= 4.5 s: i = 0..3 -> 4 of 11 requests (the failed one never
    # counts).
    assert lv.slo_met == 4 / 11 and lv.goodput_rps == 0.4
    assert (
        lv.e2e_p50 == 5.5
        and lv.e2e_p95 is not None
        and lv.e2e_p99 is not None
        and lv.e2e_p95 < lv.e2e_p99
    )
    # No SLOs, no goodput.
    assert summarize(LevelKey("sweep", "c=4", 4), samples, 10.0).goodput_rps is None


def test_the_shared_context_grows_past_the_servers_cache_block() -> None:
    # Longer than the block already, or no shared context asked for, or no block known: as
    # configured.
    assert shared_prefix_tokens(2560, 2048, 262144, 1024, 4) == 2560
    assert shared_prefix_tokens(0, 2048, 262144, 1024, 4) == 0
    assert shared_prefix_tokens(512, None, 262144, 1024, 4) == 512
    # A hybrid's ~2k block: 1.25 blocks, so every turn after the first can hit the cache.
    assert shared_prefix_tokens(2048, 2096, 262144, 1024, 4) == 2620
    # As far as the model's context leaves room for every turn; never shorter than configured.
    assert shared_prefix_tokens(512, 2048, 4096, 256, 4) == 4096 - 5 * 512
    assert shared_prefix_tokens(512, 2048, 2048, 256, 4) == 512
