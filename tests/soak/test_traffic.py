"""The bake's comparison and the histogram quantile, from data (soak/traffic.py,
soak/metrics.py)."""

from __future__ import annotations

import pytest

from fleetctl.soak import metrics
from fleetctl.soak.traffic import PROM_QUERIES, Limits, Traffic, compare, from_prometheus, traffic
from fleetctl.soak.verdict import Outcome
from tests.plugins.webhook import reply_json

P, F, INC, SKIP = Outcome.PASS, Outcome.FAIL, Outcome.INCONCLUSIVE, Outcome.SKIPPED


def scrape(
    t: float,
    ok: float,
    err: float,
    ttft: dict[str, float],
    drafts: float = 0,
    dt: float = 0,
    acc: float = 0,
) -> metrics.Scrape:
    lines = [f'vllm:request_success_total{{model_name="m",finished_reason="length"}} {ok}',
             f'vllm:request_success_total{{model_name="m",finished_reason="error"}} {err}']
    lines += [
        f'vllm:time_to_first_token_seconds_bucket{{model_name="m",le="{le}"}} {c}'
        for le, c in ttft.items()
    ]
    if drafts:
        lines += [f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {drafts}',
                  f'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {dt}',
                  f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {acc}']
    return metrics.parse("\n".join(lines) + "\n", t)


def test_histogram_quantile_interpolates_the_bucket_deltas_as_prometheus_does() -> None:
    a = scrape(0, 0, 0, {"0.1": 50, "0.5": 50, "1.0": 50, "+Inf": 50})
    # 100 new observations: 10 under 0.1 s, 80 in (0.1, 0.5], 10 in (0.5, 1.0].
    b = scrape(10, 0, 0, {"0.1": 60, "0.5": 140, "1.0": 150, "+Inf": 150})
    assert metrics.histogram_quantile(a, b, metrics.TTFT, 0.5) == pytest.approx(0.1 + 0.4 * 40 / 80)
    assert metrics.histogram_quantile(a, b, metrics.TTFT, 0.95) == pytest.approx(0.5 + 0.5 * 5 / 10)
    # Nothing observed, or a bucket that went backwards (a restart), is no figure.
    assert metrics.histogram_quantile(b, b, metrics.TTFT, 0.5) is None
    assert metrics.histogram_quantile(b, a, metrics.TTFT, 0.5) is None
    # Everything in +Inf answers the highest finite bound.
    c = scrape(20, 0, 0, {"0.1": 60, "0.5": 140, "1.0": 150, "+Inf": 160})
    assert metrics.histogram_quantile(b, c, metrics.TTFT, 0.9) == 1.0


def test_traffic_reads_finished_errors_latency_and_acceptance_deltas() -> None:
    a = scrape(0, 100, 1, {"0.1": 0, "1.0": 0, "+Inf": 0}, drafts=100, dt=400, acc=200)
    b = scrape(30, 190, 11, {"0.1": 50, "1.0": 100, "+Inf": 100}, drafts=200, dt=800, acc=300)
    t = traffic("spark-01", a, b)
    assert (t.finished, t.errors, t.error_rate) == (100, 10, 0.1)
    assert t.acceptance == pytest.approx(100 / 400)
    assert t.ttft_p50 == pytest.approx(0.1) and t.seconds == 30
    # A restart in the window: no counts (not a rate computed from the new process's totals).
    r = traffic("spark-01", b, a)
    assert r.finished is None and r.errors is None and r.problems


def t_(
    host: str,
    finished: float,
    errors: float,
    ttft: float | None = 0.2,
    tpot: float | None = 0.05,
    acc: float | None = None,
) -> Traffic:
    return Traffic(host, 60.0, finished, errors, ttft_p95=ttft, tpot_p50=tpot, acceptance=acc)


def test_a_new_host_failing_more_than_the_old_ones_fails_the_bake_with_the_numbers() -> None:
    c = compare([t_("spark-01", 40, 12)], [t_("spark-02", 40, 0), t_("spark-03", 40, 1)])
    assert c.outcome is F
    errs = c.checks[0]
    assert errs.name == "bake_errors" and errs.outcome is F
    assert "12 of 40 requests failed (30.0%)" in errs.message and "old hosts 1.2%" in errs.message
    assert errs.measurements[0].measured == 0.3 and errs.measurements[0].bound == pytest.approx(
        0.0225
    )
    assert c.reference["error_rate"] == pytest.approx(1 / 80)


def test_equal_hosts_pass_and_one_error_is_no_trend() -> None:
    c = compare([t_("spark-01", 40, 1)], [t_("spark-02", 40, 0)])
    assert c.outcome is P, c.summary()
    assert [x.outcome for x in c.checks] == [P, P, SKIP]
    assert "1 host(s) on the old version" in c.summary()


def test_latency_and_acceptance_are_held_to_the_old_hosts_median() -> None:
    old = [
        t_("b", 40, 0, ttft=0.2, acc=0.6),
        t_("c", 40, 0, ttft=0.3, acc=0.7),
        t_("d", 40, 0, ttft=0.25, acc=0.65),
    ]
    slow = compare([t_("a", 40, 0, ttft=0.5, acc=0.64)], old)
    lat = next(x for x in slow.checks if x.name == "bake_latency")
    assert lat.outcome is F and "TTFT p95 500 ms > 425 ms" in lat.message
    low = compare([t_("a", 40, 0, ttft=0.25, acc=0.4)], old)
    acc = next(x for x in low.checks if x.name == "bake_acceptance")
    assert acc.outcome is F and "acceptance 40.0% < 52.0%" in acc.message
    assert compare([t_("a", 40, 0, ttft=0.26, acc=0.6)], old).outcome is P


def test_too_little_traffic_is_inconclusive_never_a_pass() -> None:
    c = compare([t_("a", 3, 0)], [t_("b", 40, 0)])
    assert c.outcome is INC and "too little traffic" in c.checks[0].message
    assert (
        compare([Traffic("a", 10, None, None, problems=("counters went backwards",))], []).outcome
        is INC
    )


def test_with_no_old_host_errors_are_judged_against_the_absolute_bound() -> None:
    assert compare([t_("a", 100, 1)], []).outcome is P
    bad = compare([t_("a", 100, 5)], [], Limits(max_error_rate=0.02))
    assert bad.outcome is F and "no old host" in bad.checks[0].message
    assert [x.outcome for x in bad.checks[1:]] == [SKIP, SKIP]


def test_limits_from_a_mapping_refuse_unknown_keys_and_bad_values() -> None:
    assert (
        Limits.from_mapping({"min_requests": 10, "latency_ratio": 2}, "recipe r").latency_ratio
        == 2.0
    )
    from fleetctl.soak.config import SoakConfigError

    with pytest.raises(SoakConfigError, match="unknown bake setting"):
        Limits.from_mapping({"min_request": 10}, "recipe r")
    with pytest.raises(SoakConfigError, match="must be a number"):
        Limits.from_mapping({"min_requests": "ten"}, "recipe r")


class _Prometheus:
    """A Prometheus-compatible query API on loopback: answers each of the bake's queries from a
    table."""

    def __init__(self, table: dict[str, dict[str, float]], broken: str = "") -> None:
        import threading
        import urllib.parse
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.queries: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                u = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(u.query))
                outer.queries.append(q)
                name = _which(q["query"])
                if u.path != "/api/v1/query" or name == broken:
                    body = {
                        "status": "error",
                        "errorType": "bad_data",
                        "error": f"cannot parse {name}",
                    }
                    code = 400
                else:
                    body = {"status": "success", "data": {"resultType": "vector", "result": [
                        {"metric": {"instance": inst}, "value": [float(q["time"]), str(v)]}
                        for inst, v in table.get(name, {}).items()]}}
                    code = 200
                reply_json(self, code, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _which(q: str) -> str:
    """Which of the bake's queries ``q`` is."""
    for marker, name in (
        ("histogram_quantile(0.95", "ttft_p95"),
        ("histogram_quantile(0.5", "tpot_p50"),
        ("accepted", "acceptance"),
        ('finished_reason="error"', "errors"),
    ):
        if marker in q:
            return name
    return "finished"


def test_the_same_figures_come_from_a_prometheus_query_api() -> None:
    hosts = {"spark-01": "10.0.0.11:8000", "spark-02": "10.0.0.12:8000"}
    prom = _Prometheus({"finished": {"10.0.0.11:8000": 40, "10.0.0.12:8000": 40},
                        "errors": {"10.0.0.11:8000": 12},
                        "ttft_p95": {"10.0.0.11:8000": 0.3, "10.0.0.12:8000": 0.25},
                        "tpot_p50": {"10.0.0.11:8000": 0.05, "10.0.0.12:8000": 0.05},
                        "acceptance": {"10.0.0.11:8000": float("nan"), "10.0.0.12:8000": 0.6}})
    try:
        got = from_prometheus(prom.url, hosts, 600, 1_780_000_000.0)
    finally:
        prom.close()
    assert (got["spark-01"].finished, got["spark-01"].errors, got["spark-01"].ttft_p95) == (
        40,
        12,
        0.3,
    )
    assert got["spark-02"].errors == 0.0 and got["spark-02"].acceptance == 0.6
    assert got["spark-01"].acceptance is None  # NaN (no drafts) is no figure
    assert len(prom.queries) == len(PROM_QUERIES) and all(
        q["time"] == "1780000000.000" for q in prom.queries
    )
    assert (
        "[600s]" in prom.queries[0]["query"]
        and 'instance=~"10\\.0\\.0\\.11:8000|10\\.0\\.0\\.12:8000"' in prom.queries[0]["query"]
    )
    c = compare([got["spark-01"]], [got["spark-02"]])
    assert c.outcome is F and "12 of 40 requests failed" in c.checks[0].message


def test_a_failing_prometheus_query_leaves_its_figure_missing_never_a_pass() -> None:
    prom = _Prometheus({"errors": {}}, broken="finished")
    try:
        got = from_prometheus(prom.url, {"spark-01": "10.0.0.11:8000"}, 60, 1_780_000_000.0)
    finally:
        prom.close()
    t = got["spark-01"]
    assert (
        t.finished is None
        and t.errors is None
        and "Prometheus query finished failed" in t.problems[0]
    )
    assert compare([t], []).outcome is INC
