"""Live traffic as each server's /metrics saw it, and a new version's hosts judged against the old
ones.

The rollout's bake (``--bake D``) and ``fleetctl watch`` read the same figures: between two scrapes
of a host, the requests it finished, those finished with reason ``error``, TTFT and TPOT percentiles
from its histograms' bucket deltas, spec-decode acceptance and preemptions (all deltas, never
lifetime totals: docs/domain.md). :func:`compare` is pure: figures in, one CheckResult per check
out, with the same limits semantics as the soak's checks (``judge.decide``). See docs/watch.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetctl.soak import metrics
from fleetctl.soak.checks.judge import decide, ms, pct, skipped
from fleetctl.soak.config import CheckSpec
from fleetctl.soak.verdict import CheckResult, Measurement, Outcome

P, F, INC = Outcome.PASS, Outcome.FAIL, Outcome.INCONCLUSIVE


@dataclass(frozen=True)
class Traffic:
    """One host's traffic between two /metrics scrapes (seconds apart)."""

    host: str
    seconds: float
    #: Requests the server finished (every finished_reason), and those with reason ``error``.
    finished: float | None = None
    errors: float | None = None
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    tpot_p50: float | None = None
    tpot_p95: float | None = None
    #: d(accepted) / d(draft tokens); None without speculative decoding or with impossible counters.
    acceptance: float | None = None
    #: Draft tokens proposed in the window (how much the acceptance figure rests on).
    drafted: float | None = None
    preemptions: float | None = None
    #: Why a figure is missing: a restart (counters went backwards) or impossible counters.
    problems: tuple[str, ...] = ()

    @property
    def error_rate(self) -> float | None:
        """errors / finished (None with no finished request)."""
        if not self.finished or self.errors is None:
            return None
        return self.errors / self.finished


def traffic(host: str, a: metrics.Scrape, b: metrics.Scrape) -> Traffic:
    """What ``host`` served between scrapes ``a`` and ``b``."""
    w = metrics.window(a, b, "traffic", "traffic")
    finished = sum(w.success_by_reason.values()) if w.success_by_reason else None
    tpot_name = next((n for n in metrics.TPOT if n + "_bucket" in b.series), metrics.TPOT[0])
    problems = list(w.inconsistent)
    if w.counter_reset:
        problems.append("counters went backwards: the server restarted in the window")
    reset = w.counter_reset

    def q(name: str, p: float) -> float | None:
        return None if reset else metrics.histogram_quantile(a, b, name, p)

    return Traffic(
        host=host,
        seconds=round(b.t - a.t, 3),
        finished=None if reset else finished,
        errors=None if reset or finished is None else w.success_by_reason.get("error", 0.0),
        ttft_p50=q(metrics.TTFT, 0.5),
        ttft_p95=q(metrics.TTFT, 0.95),
        tpot_p50=q(tpot_name, 0.5),
        tpot_p95=q(tpot_name, 0.95),
        acceptance=w.acceptance_rate,
        drafted=None if reset else w.draft_tokens,
        preemptions=None if reset else w.preemptions,
        problems=tuple(problems),
    )


@dataclass(frozen=True)
class Limits:
    """How far a new version's host may be from the old ones (or, with none left, from absolute
    bounds)."""

    #: Finished requests a host needs in the window before its figures are judged.
    min_requests: int = 5
    #: Error rate allowed above the old hosts' pooled rate (absolute: 0.01 = one point), and errors
    #: a host may have whatever its rate (one unlucky request is not a trend).
    error_rate_margin: float = 0.01
    min_errors: int = 2
    #: With no old host to compare with: the error rate allowed.
    max_error_rate: float = 0.01
    #: TTFT p95 / TPOT p50 allowed above the old hosts' median (ratio), plus a floor in seconds so
    #: that a few ms of noise on a fast server is no breach.
    latency_ratio: float = 1.5
    latency_slack: float = 0.05
    #: Acceptance kept relative to the old hosts' median.
    acceptance_ratio: float = 0.8
    #: Draft tokens a host needs in the window before its acceptance is judged (as the watch's
    #: blocks: a few requests' drafts are noise, seen 1.2 % against 2.2 % on two healthy lab hosts
    #: in 10 s).
    min_draft_tokens: int = 2000
    failure_limit: int = 0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None, where: str) -> Limits:
        """Limits from a recipe's or inventory's ``bake:`` mapping (unknown keys refused, naming
        ``where``)."""
        from fleetctl.soak.config import SoakConfigError

        if not raw:
            return cls()
        known = {f for f in cls.__dataclass_fields__}
        bad = sorted(set(raw) - known)
        if bad:
            raise SoakConfigError(f"{where}: unknown bake setting(s) {', '.join(bad)}",
                                  fix=f"use: {', '.join(sorted(known))}")
        out: dict[str, Any] = {}
        for k, v in raw.items():
            kind = type(getattr(cls(), k))
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise SoakConfigError(f"{where}: bake {k} must be a number >= 0, not {v!r}")
            out[k] = kind(v)
        return cls(**out)


@dataclass(frozen=True)
class Comparison:
    """The checks of one bake: each new host against the old ones."""

    checks: tuple[CheckResult, ...]
    new: tuple[Traffic, ...]
    old: tuple[Traffic, ...]
    #: The old hosts' pooled / median figures the new ones were held to.
    reference: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def outcome(self) -> Outcome:
        """fail if any check failed, else inconclusive if any was, else pass (skipped checks do not
        count)."""
        counted = [c.outcome for c in self.checks if not c.observe_only]
        for o in (F, Outcome.ERROR, INC):
            if o in counted:
                return o
        return P

    def summary(self) -> str:
        """One line: the outcome and the deciding checks' messages."""
        o = self.outcome
        if o is P:
            n = sum(int(t.finished or 0) for t in self.new)
            return f"pass: {n} live request(s) on {len(self.new)} host(s), within limits of " + (
                f"{len(self.old)} host(s) on the old version"
                if self.old
                else "absolute bounds (no old host left)"
            )
        return (
            f"{o.value}: "
            + "; ".join(f"{c.name}: {c.message}" for c in self.checks if c.outcome is o)[:1500]
        )


def _median(vals: Sequence[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return statistics.median(v) if v else None


def compare(
    new: Sequence[Traffic], old: Sequence[Traffic], limits: Limits = Limits()
) -> Comparison:
    """Each host of ``new`` against the hosts of ``old`` (still on the previous version) under the
    same traffic.

    Error rate: above the old hosts' pooled rate + margin, with at least ``min_errors`` errors,
    fails. TTFT p95 and TPOT p50: above the old median x ratio + slack fails. Acceptance: below the
    old median x ratio fails. A host with fewer than ``min_requests`` finished requests, or whose
    figures are missing (a restart, impossible counters), is inconclusive for that check; with no
    old host, errors are judged against ``max_error_rate`` and the other checks are skipped.
    """
    old_ok = [
        t for t in old if t.finished and t.finished >= limits.min_requests and t.errors is not None
    ]
    pooled_err = (
        (sum(t.errors or 0.0 for t in old_ok) / sum(t.finished or 0.0 for t in old_ok))
        if old_ok
        else None
    )
    ref: dict[str, float | None] = {
        "error_rate": pooled_err,
        "ttft_p95": _median([t.ttft_p95 for t in old_ok]),
        "tpot_p50": _median([t.tpot_p50 for t in old_ok]),
        "acceptance": _median([t.acceptance for t in old_ok]),
    }
    spec = {
        n: CheckSpec(n, failure_limit=limits.failure_limit)
        for n in ("bake_errors", "bake_latency", "bake_acceptance")
    }
    err_ms: list[Measurement] = []
    lat_ms: list[Measurement] = []
    acc_ms: list[Measurement] = []
    thin_acc: list[str] = []  # hosts whose drafts are too few to judge acceptance
    for t in new:
        judged = _errors_of(t, pooled_err, limits)
        err_ms.append(judged)
        # Without request counts, or with too little traffic, nothing else of the host is judged.
        if judged.outcome is INC or not old_ok:
            continue
        lat_ms += _latency_of(t, ref, limits)
        if ref["acceptance"] is not None:
            acc = _acceptance_of(t, ref["acceptance"], limits)
            if isinstance(acc, str):
                thin_acc.append(acc)
            else:
                acc_ms.append(acc)
    checks = [
        decide(
            spec["bake_errors"],
            err_ms,
            ok_message="; ".join(m.message for m in err_ms[:3]),
            no_data="no new host to judge",
        )
    ]
    no_old = "no host on the old version took traffic to compare with"
    checks.append(
        decide(spec["bake_latency"], lat_ms, ok_message="; ".join(m.message for m in lat_ms[:2]))
        if lat_ms
        else skipped(spec["bake_latency"], no_old if not old_ok else "no latency histogram")
    )
    checks.append(
        decide(spec["bake_acceptance"], acc_ms, ok_message="; ".join(m.message for m in acc_ms[:2]))
        if acc_ms
        else skipped(
            spec["bake_acceptance"],
            no_old
            if not old_ok
            else f"not judged: fewer than {limits.min_draft_tokens} drafted tokens "
            f"({', '.join(thin_acc[:3])})"
            if thin_acc
            else "no speculative decoding on the old hosts",
        )
    )
    return Comparison(tuple(checks), tuple(new), tuple(old), ref)


def _errors_of(t: Traffic, pooled_err: float | None, limits: Limits) -> Measurement:
    """A new host's error rate against the old hosts' pooled rate + margin (or the bound without
    old hosts); inconclusive without request counts or with too little traffic."""
    why = "; ".join(t.problems)
    if t.finished is None or t.errors is None:
        return Measurement(t.host, INC, f"{t.host}: no request counts "
                           f"({why or 'no vllm:request_success_total'})")
    if not t.finished or t.finished < limits.min_requests:
        return Measurement(
            t.host,
            INC,
            f"{t.host}: {t.finished:.0f} request(s) finished in "
            f"{t.seconds:.0f}s, fewer than {limits.min_requests}: too little traffic "
            "to judge",
            t.finished,
            limits.min_requests,
        )
    rate = t.error_rate or 0.0
    if pooled_err is not None:
        bound = pooled_err + limits.error_rate_margin
        against = f"old hosts {pct(pooled_err)} + {pct(limits.error_rate_margin)}"
    else:
        bound = limits.max_error_rate
        against = "bound (no old host to compare with)"
    bad = rate > bound and (t.errors or 0) >= limits.min_errors
    return Measurement(
        t.host,
        F if bad else P,
        f"{t.host}: {t.errors:.0f} of {t.finished:.0f} requests failed ({pct(rate)}) "
        f"{'>' if bad else '<='} {pct(bound)} ({against})",
        round(rate, 4),
        round(bound, 4),
    )


def _latency_of(t: Traffic, ref: Mapping[str, float | None], limits: Limits) -> list[Measurement]:
    """A new host's TTFT p95 and TPOT p50 against the old hosts' medians x ratio + slack."""
    why = "; ".join(t.problems)
    out: list[Measurement] = []
    for label, got, base in (("TTFT p95", t.ttft_p95, ref["ttft_p95"]),
                             ("TPOT p50", t.tpot_p50, ref["tpot_p50"])):
        if base is None:
            continue
        lim = base * limits.latency_ratio + limits.latency_slack
        if got is None:
            out.append(
                Measurement(
                    f"{t.host} {label}",
                    INC,
                    f"{t.host}: no {label} (histogram missing or reset{': ' + why if why else ''})",
                    None,
                    round(lim * 1000, 1),
                )
            )
            continue
        out.append(
            Measurement(
                f"{t.host} {label}",
                F if got > lim else P,
                f"{t.host}: {label} {ms(got)} {'>' if got > lim else '<='} {ms(lim)} "
                f"(old hosts' median {ms(base)} x {limits.latency_ratio:g} + "
                f"{ms(limits.latency_slack)})",
                round(got * 1000, 1),
                round(lim * 1000, 1),
            )
        )
    return out


def _acceptance_of(t: Traffic, base: float, limits: Limits) -> Measurement | str:
    """A new host's acceptance against the old hosts' median x ratio; a str when its drafts are
    too few to judge (the host and its count)."""
    lim = base * limits.acceptance_ratio
    if t.drafted is not None and t.drafted < limits.min_draft_tokens:
        return f"{t.host}: {t.drafted:.0f} drafted tokens"
    if t.acceptance is None:
        why = "; ".join(t.problems)
        return Measurement(
            t.host,
            INC,
            f"{t.host}: no acceptance figure"
            + (f" ({why})" if why else " (no spec-decode counters)"),
            None,
            round(lim, 4),
        )
    low = t.acceptance < lim
    return Measurement(
        t.host,
        F if low else P,
        f"{t.host}: acceptance {pct(t.acceptance)} {'<' if low else '>='} {pct(lim)} "
        f"(old hosts' median {pct(base)} x {limits.acceptance_ratio:g})",
        round(t.acceptance, 4),
        round(lim, 4),
    )


def fetch(base_url: str, t: float, timeout: float = 10.0) -> metrics.Scrape | str:
    """One /metrics scrape of ``base_url`` at ``t`` (the caller's clock), or why there is none."""
    import urllib.request

    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as r:
            # A /metrics of a few hundred series is ~100 KB; a server sending more is not read past
            # 8 MB.
            text = r.read(8 << 20).decode(errors="replace")
    except (OSError, ValueError) as e:
        return f"/metrics: {e}"
    try:
        return metrics.parse(text, t)
    except metrics.MetricsError as e:
        return str(e)


def fetch_all(
    urls: Mapping[str, str], t: float, parallel: int = 32
) -> dict[str, metrics.Scrape | str]:
    """:func:`fetch` of every host's URL (host -> base URL), ``parallel`` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    if not urls:
        return {}
    with ThreadPoolExecutor(
        max_workers=max(1, min(parallel, len(urls))), thread_name_prefix="scrape"
    ) as pool:
        futures = {h: pool.submit(fetch, u, t) for h, u in urls.items()}
        return {h: f.result() for h, f in futures.items()}


#: The Prometheus queries a bake reads instead of scraping each host (``{range}``: the bake's
#: length, e.g.
#: ``600s``; ``{selector}``: the label matcher of the hosts, e.g.
#: ``instance=~"10.0.0.11:8000|..."``). Each is an instant query at the bake's end, one series per
#: host (``by (<label>)``).
PROM_QUERIES: dict[str, str] = {
    "finished": "sum by ({label}) (increase(vllm:request_success_total{{{selector}}}[{range}]))",
    "errors": 'sum by ({label}) '
              '(increase(vllm:request_success_total{{{selector},finished_reason="error"}}[{range}]))',
    "ttft_p95": "histogram_quantile(0.95, sum by ({label}, le) "
    "(rate(vllm:time_to_first_token_seconds_bucket{{{selector}}}[{range}])))",
    "tpot_p50": "histogram_quantile(0.5, sum by ({label}, le) "
    "(rate(vllm:request_time_per_output_token_seconds_bucket{{{selector}}}[{range}])))",
    "acceptance": "sum by ({label}) "
                  "(increase(vllm:spec_decode_num_accepted_tokens_total{{{selector}}}[{range}])) / "
    "sum by ({label}) (increase(vllm:spec_decode_num_draft_tokens_total{{{selector}}}[{range}]))",
}


def from_prometheus(
    url: str,
    hosts: Mapping[str, str],
    seconds: float,
    at: float,
    label: str = "instance",
    timeout: float = 10.0,
) -> dict[str, Traffic]:
    """Each host's :class:`Traffic` over the ``seconds`` before ``at`` (Unix time) from a
    Prometheus-compatible API (``GET <url>/api/v1/query``): host -> its value of ``label`` (e.g.
    ``10.0.0.11:8000``).

    A query that fails names itself in every host's ``problems`` (the figures it gives are then
    missing: inconclusive, never a pass). Values that are not finite numbers are missing too.
    """
    import json
    import math
    import re
    import urllib.parse
    import urllib.request

    selector = f'{label}=~"{"|".join(re.escape(v) for v in hosts.values())}"'
    rng = f"{max(1, round(seconds))}s"
    got: dict[str, dict[str, float]] = {h: {} for h in hosts}
    problems: list[str] = []
    by_value = {v: h for h, v in hosts.items()}
    for name, template in PROM_QUERIES.items():
        q = template.format(label=label, selector=selector, range=rng)
        full = (
            url.rstrip("/")
            + "/api/v1/query?"
            + urllib.parse.urlencode({"query": q, "time": f"{at:.3f}"})
        )
        try:
            with urllib.request.urlopen(full, timeout=timeout) as r:
                body = json.loads(r.read(4 << 20))
            if (
                body.get("status") != "success"
                or body.get("data", {}).get("resultType") != "vector"
            ):
                raise ValueError(
                    f"status {body.get('status')!r}: {str(body.get('error', ''))[:200]}"
                )
            for series in body["data"]["result"]:
                host = by_value.get(str(series.get("metric", {}).get(label, "")))
                v = float(series["value"][1])
                if host is not None and math.isfinite(v):
                    got[host][name] = v
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            problems.append(f"Prometheus query {name} failed: {e}")
    return {
        h: Traffic(
            h,
            seconds,
            finished=g.get("finished"),
            errors=g.get("errors", 0.0) if "finished" in g else None,
            ttft_p95=g.get("ttft_p95"),
            tpot_p50=g.get("tpot_p50"),
            acceptance=g.get("acceptance"),
            problems=tuple(problems),
        )
        for h, g in got.items()
    }
