"""Prometheus metrics of a run (``--metrics-port`` on the long commands and ``watch``) and of the
fleet (``fleetctl ui --metrics-port``), served by prometheus_client (docs/observability.md).

:class:`RunMetrics` is one more sink of the run's event stream (docs/events.md): it folds the same
events the terminal, the event log and the web page get, through the live view's own model
(:class:`~fleetctl.cli.livemodel.LiveModel`) for the run's hosts and phases, and adds what a watch
reports (each check's latest verdict, breaches, remediations). :class:`FleetMetrics` reads the
ledger and the inventory at each scrape (what each host serves, its known-good and last gate, who
is out of rotation or parked, the capacity floors, the latest rollout and its failure budget).
Both are prometheus_client collectors on a registry of their own; :func:`serve` starts its HTTP
server. Every label comes from a fixed set (checks, phases, actions, results, statuses) or names a
host, a recipe, a unit, a tag or a digest: no request text, no error message, no secret.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetctl.cli.livemodel import STEP, LiveModel
from fleetctl.errors import FleetError
from fleetctl.progress import Event, event_from_json
from fleetctl.soak.watch import watched_checks
from fleetctl.urls import http_url

#: A check's status (``error``, a probe that could not measure, counts as inconclusive).
CHECK_STATES = ("pass", "fail", "inconclusive")
#: A run's phase.
RUN_PHASES = ("running", "paused", "failed", "done")
#: A host's phases in a run (any other is ``other``: the set stays bounded whatever the core adds).
HOST_PHASES = ("planned", "skip", "pull", "pulled", "stopping", "deploying", "starting", "loading",
               "soak", "done", "failed", "rolling-back", "rolled-back", "paused", "restored",
               "undoing", "watch", "breach", "drained", "restarted", "page", "remediation")
#: Remediations' actions and results (fleetctl.remediate.heal; ``error``: the remedy raised).
ACTIONS = ("restart", "rollback", "park", "none")
RESULTS = ("healed", "rolled-back", "parked", "waiting", "excluded", "paged", "dry-run", "error")
#: Results after which the host serves again: its breach is healed.
HEALING = ("healed", "rolled-back")
#: Rollout statuses in the ledger.
ROLLOUT_STATES = ("running", "paused", "completed", "completed-with-failures", "failed",
                  "aborted")
#: Remediation times kept per host (for the breaker's count in its window).
KEEP_TIMES = 100
#: Seconds the ledger's figures are kept between scrapes (a scrape every second reads it once).
LEDGER_TTL = 5.0


def _one_of(value: object, known: tuple[str, ...]) -> str:
    return str(value) if value in known else "other"


class RunMetrics(Collector):
    """The run's events folded into metrics; a thread-safe progress sink and a collector."""

    def __init__(self, title: str, recipe_of: Mapping[str, str] | None = None) -> None:
        self.command = title.split(" ", 1)[0] or "run"
        self.model = LiveModel(title)
        self.recipe_of = dict(recipe_of or {})
        self.lock = threading.Lock()
        self.checks: dict[tuple[str, str], str] = {}
        self.breaches: collections.Counter[tuple[str, str]] = collections.Counter()
        self.unhealed: dict[str, bool] = {}
        self.remediations: collections.Counter[tuple[str, str, str]] = collections.Counter()
        #: Epoch times of each host's restarts and rollbacks (the breaker counts them).
        self.remedied_at: dict[str, collections.deque[float]] = {}
        self.soak: dict[str, dict[str, float]] = {}
        self.ended = False

    def __call__(self, event: Event) -> None:
        self.model(event)
        self.fold(event)

    def fold(self, event: Event) -> None:
        """Fold the event into the watch's figures (the live model has its own fold)."""
        host, d = event.host, event.data
        if host is None:
            return
        with self.lock:
            if event.phase == "watch" and isinstance(d.get("checks"), dict):
                for check, status in d["checks"].items():
                    if check in watched_checks():
                        self.checks[(host, check)] = (
                            status if status in ("pass", "fail") else "inconclusive")
            elif event.phase == "breach":
                check = event.message.split(":", 1)[0]
                self.breaches[(host, _one_of(check, watched_checks()))] += 1
                self.unhealed[host] = True
            elif event.phase == "remediation":
                action = _one_of(d.get("action") or "none", ACTIONS)
                result = _one_of(d.get("result") or "error", RESULTS)
                self.remediations[(host, action, result)] += 1
                if result in HEALING:
                    self.unhealed[host] = False
                if action in ("restart", "rollback") and result != "dry-run":
                    self.remedied_at.setdefault(
                        host, collections.deque(maxlen=KEEP_TIMES)).append(time.time())
            elif event.phase == "soak":
                figs = {k: float(d[k]) for k in ("tok_s", "baseline", "acceptance_rate",
                                                 "requests", "errors", "concurrency")
                        if isinstance(d.get(k), int | float)}
                self.soak.setdefault(host, {}).update(figs)

    def remediated_since(self, host: str, since: float) -> int:
        """The host's restarts and rollbacks at or after epoch time ``since``."""
        with self.lock:
            return sum(1 for t in self.remedied_at.get(host, ()) if t >= since)

    def collect(self) -> Iterable[Metric]:
        snap = self.model.snapshot()
        cmd = self.command
        ended = self.ended or snap["ended"]
        rows = snap["hosts"]
        paused = any(r["phase"] == "paused" for r in rows)
        phase = "paused" if paused else (
            ("failed" if snap["hosts_failed"] else "done") if ended else "running")
        g = GaugeMetricFamily("fleetctl_run_phase", "The run's phase: 1 for the current one.",
                              labels=["command", "phase"])
        for p in RUN_PHASES:
            g.add_metric([cmd, p], 1.0 if p == phase else 0.0)
        yield g
        g = GaugeMetricFamily("fleetctl_run_hosts", "The run's planned hosts by state.",
                              labels=["command", "state"])
        pending = snap["hosts_planned"] - snap["hosts_done"] - snap["hosts_failed"]
        for state, n in (("done", snap["hosts_done"]), ("failed", snap["hosts_failed"]),
                         ("pending", pending)):
            g.add_metric([cmd, state], float(n))
        yield g
        g = GaugeMetricFamily("fleetctl_run_elapsed_seconds", "Seconds since the run started.",
                              labels=["command"])
        g.add_metric([cmd], float(snap["elapsed"]))
        yield g
        g = GaugeMetricFamily("fleetctl_run_left_seconds", "The run's estimate of the seconds "
                              "it still needs (absent before a step has been measured).",
                              labels=["command"])
        if snap["left"] is not None:
            g.add_metric([cmd], float(snap["left"]))
        yield g
        yield from self._hosts(rows, snap["elapsed"])
        yield from self._watch()

    def _hosts(self, rows: list[dict[str, Any]], now: float) -> Iterator[Metric]:
        phase = GaugeMetricFamily("fleetctl_host_phase", "The host's phase in the run: 1 for "
                                  "the current one.", labels=["host", "phase"])
        age = GaugeMetricFamily("fleetctl_host_phase_age_seconds",
                                "Seconds the host has been in its current phase.", labels=["host"])
        step = GaugeMetricFamily("fleetctl_host_step_age_seconds",
                                 "Seconds since the host's current step began (only while one "
                                 "runs).", labels=["host"])
        held = GaugeMetricFamily("fleetctl_host_held", "1 while the run holds the host in a step "
                                 "(stopped, deploying, loading, gated, rolling back).",
                                 labels=["host"])
        for r in rows:
            host = r["host"]
            phase.add_metric([host, _one_of(r["phase"], HOST_PHASES)], 1.0)
            age.add_metric([host], max(0.0, now - float(r["since"])))
            busy = r["started"] is not None and r["finished"] is None
            held.add_metric([host], 1.0 if busy and r["phase"] in STEP else 0.0)
            if busy:
                step.add_metric([host], max(0.0, now - float(r["started"])))
        yield from (phase, age, step, held)
        figures = (("tok_s", "fleetctl_soak_tokens_per_second", "The gate's running tok/s."),
                   ("baseline", "fleetctl_soak_baseline_tokens_per_second",
                    "The baseline's tok/s at the running level."),
                   ("acceptance_rate", "fleetctl_soak_acceptance_ratio",
                    "Speculative decoding's acceptance in the running level (0..1)."),
                   ("requests", "fleetctl_soak_level_requests", "Requests of the running level."),
                   ("errors", "fleetctl_soak_level_errors",
                    "Failed requests of the running level."),
                   ("concurrency", "fleetctl_soak_concurrency", "The running level's clients."))
        with self.lock:
            soak = {h: dict(f) for h, f in self.soak.items()}
        for key, name, doc in figures:
            fam = GaugeMetricFamily(name, doc, labels=["host", "recipe"])
            for host, f in soak.items():
                if key in f:
                    fam.add_metric([host, self.recipe_of.get(host, "")], f[key])
            yield fam

    def _watch(self) -> Iterator[Metric]:
        with self.lock:
            checks = dict(self.checks)
            breaches = dict(self.breaches)
            unhealed = dict(self.unhealed)
            remediations = dict(self.remediations)
        status = GaugeMetricFamily("fleetctl_check_status", "The watch's latest verdict of the "
                                   "host's check: 1 for its status.",
                                   labels=["host", "check", "status"])
        for (host, check), s in sorted(checks.items()):
            for state in CHECK_STATES:
                status.add_metric([host, check, state], 1.0 if state == s else 0.0)
        yield status
        c = CounterMetricFamily("fleetctl_breaches", "Breaches the watch paged or handed to its "
                                "remedy, by host and check.", labels=["host", "check"])
        for (host, check), n in sorted(breaches.items()):
            c.add_metric([host, check], float(n))
        yield c
        g = GaugeMetricFamily("fleetctl_breach_unhealed", "1 while the host's latest breach has "
                              "no remediation that healed it (restarted or rolled back).",
                              labels=["host"])
        for host, open_ in sorted(unhealed.items()):
            g.add_metric([host], 1.0 if open_ else 0.0)
        yield g
        c = CounterMetricFamily("fleetctl_remediations", "Remediations by host, action and result.",
                                labels=["host", "action", "result"])
        for (host, action, result), n in sorted(remediations.items()):
            c.add_metric([host, action, result], float(n))
        yield c


def metrics_server(registry: CollectorRegistry, bind: str, port: int) -> Any:
    """prometheus_client's HTTP server of ``registry`` on ``bind:port`` (0: any free port), in a
    daemon thread; returns the server (``server_port``, ``shutdown()``)."""
    if not bind.strip():
        raise FleetError("--metrics-bind '' would listen on every interface without saying so",
                         fix="give an address: 127.0.0.1 (the default), this machine's LAN "
                             "address, or 0.0.0.0 / :: for every interface")
    try:
        server, _thread = start_http_server(port, bind, registry)
    except OSError as e:
        raise FleetError(f"cannot serve metrics on {bind}:{port}: {e.strerror or e}",
                         fix="pick another --metrics-port (0: any free one) or --metrics-bind "
                             "address, or stop what listens there") from e
    return server


def url_of(server: Any) -> str:
    """``http://host:port/metrics`` of a metrics server (its real port when asked for 0)."""
    host, port = server.server_address[:2]
    return http_url(str(host), int(port), "/metrics")


def registry_of(*collectors: Collector) -> CollectorRegistry:
    """A registry of its own (not prometheus_client's global one) holding ``collectors``."""
    reg = CollectorRegistry(auto_describe=False)
    for c in collectors:
        reg.register(c)
    return reg



class ReplayMetrics(Collector):
    """``fleetctl ui``'s run metrics: the newest run's event log (``log()``: its title and lines,
    or None) folded afresh at each scrape, as the page's live view is (its counters start again
    with each run)."""

    def __init__(self, log: Callable[[], tuple[str, list[str]] | None],
                 recipe_of: Mapping[str, str] | None = None) -> None:
        self.log = log
        self.recipe_of = recipe_of

    def collect(self) -> Iterable[Metric]:
        got = self.log()
        if got is None:
            return
        title, lines = got
        run = RunMetrics(title, self.recipe_of)
        for line in lines:
            try:
                raw = json.loads(line)
            except ValueError:
                continue  # a line still being written
            if isinstance(raw, dict) and raw.get("ended"):
                run.ended = True
            elif isinstance(raw, dict) and "phase" in raw:
                t, event = event_from_json(raw)
                run.model.fold(event, t)
                run.fold(event)
        run.model.clock = lambda: run.model.last_t
        yield from run.collect()
