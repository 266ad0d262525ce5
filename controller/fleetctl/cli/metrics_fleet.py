"""The fleet's metrics from the ledger and the inventory, read at a scrape (kept
:data:`~fleetctl.cli.metrics.LEDGER_TTL` seconds): what each host serves, its known-good and its
last gate, whether it is in rotation at the door or parked, each recipe's hosts in rotation against
its capacity floor (watch.floor) and breaker, and the latest rollout's status and failure budget
(docs/observability.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetctl.cli.metrics import LEDGER_TTL, ROLLOUT_STATES, RunMetrics
from fleetctl.errors import FleetError, RecipeError
from fleetctl.inventory import Inventory
from fleetctl.recipes import configured_recipe, load_recipes
from fleetctl.remediate import policy
from fleetctl.rollout.unit import count_failed
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state.records import ACTIVE, RolloutRecord

#: Rollouts read back for the latest of each kind.
HISTORY = 20


def recipes_of(inv: Inventory) -> dict[str, str]:
    """Each host's configured recipe ("" when it has none the inventory can name)."""
    out = {}
    for name, h in inv.hosts.items():
        try:
            out[name] = configured_recipe(inv, h)
        except RecipeError:
            out[name] = ""
    return out


class FleetMetrics(Collector):
    """The ledger's and the inventory's figures; ``hosts`` gives each host's latest run (``fleetctl
    ui``'s ``Fleet.hosts``), ``run`` the command's own events (breaker counts), when there is
    one."""

    def __init__(self, inv: Inventory, state_dir: Path, run: RunMetrics | None,
                 hosts: Callable[[], list[dict[str, Any]]]) -> None:
        self.inv = inv
        self.state_dir = state_dir
        self.run = run
        self.hosts = hosts
        self.lock = threading.Lock()
        self._cached: tuple[float, list[Metric]] | None = None
        try:
            self.policies = {n: policy.from_mapping(r.watch, n)
                             for n, r in load_recipes(inv).items()}
        except FleetError:  # no recipes, or one refused: the commands that use them say why
            self.policies = {}
        self.recipe_of = recipes_of(inv)

    def collect(self) -> Iterable[Metric]:
        with self.lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > LEDGER_TTL:
                self._cached = (now, list(self._read()))
            cached = self._cached[1]
        yield from cached
        yield from self._breakers()

    def _read(self) -> Iterator[Metric]:
        with fleet_ledger.open_for(self.inv, self.state_dir) as led:
            out = led.out_of_rotation()
            known = {h: led.known_good(h) for h in self.inv.hosts}
            history = led.history(HISTORY)
        last = {str(x["host"]): x.get("last") or {} for x in self.hosts()}
        info = GaugeMetricFamily("fleetctl_host_info", "What the host serves (its latest run's "
                                 "tag and digest), its recipe and unit; always 1.",
                                 labels=["host", "recipe", "tag", "digest", "unit"])
        kg = GaugeMetricFamily("fleetctl_host_known_good_info", "The host's newest known-good "
                               "version; always 1.", labels=["host", "tag", "digest", "source"])
        gate = GaugeMetricFamily("fleetctl_host_last_gate_timestamp_seconds",
                                 "When the host last passed a full gate (a known-good from a "
                                 "gate), epoch seconds.", labels=["host"])
        rot = GaugeMetricFamily("fleetctl_host_in_rotation", "1 when the front door may route to "
                                "the host (fleetctl has not drained it).", labels=["host"])
        parked = GaugeMetricFamily("fleetctl_host_parked", "1 when a watch parked the host: left "
                                   "out of rotation for a person to look at.", labels=["host"])
        for name, h in self.inv.hosts.items():
            lr = last.get(name, {})
            info.add_metric([name, self.recipe_of.get(name, ""), str(lr.get("tag") or ""),
                             str(lr.get("digest") or ""), h.unit or ""], 1.0)
            if known[name]:
                k = known[name][0]
                kg.add_metric([name, k.tag or "", k.digest, k.source], 1.0)
            gates = [k.at for k in known[name] if k.source == "gate"]
            if gates:
                gate.add_metric([name], max(gates))
            o = out.get(name)
            rot.add_metric([name], 0.0 if o is not None else 1.0)
            is_parked = o is not None and (o.reason or "").startswith("parked")
            parked.add_metric([name], 1.0 if is_parked else 0.0)
        yield from (info, kg, gate, rot, parked)
        yield from self._recipes(out)
        yield from self._rollouts(history)

    def _recipes(self, out: dict[str, Any]) -> Iterator[Metric]:
        hosts = GaugeMetricFamily("fleetctl_recipe_hosts", "The recipe's hosts in the inventory.",
                                  labels=["recipe"])
        inrot = GaugeMetricFamily("fleetctl_recipe_hosts_in_rotation",
                                  "The recipe's hosts in rotation at the front door.",
                                  labels=["recipe"])
        floor = GaugeMetricFamily("fleetctl_recipe_capacity_floor_hosts", "Hosts of the recipe "
                                  "that must stay in rotation (its watch.floor).",
                                  labels=["recipe"])
        for recipe, p in sorted(self.policies.items()):
            pool = [n for n, r in self.recipe_of.items() if r == recipe]
            hosts.add_metric([recipe], float(len(pool)))
            inrot.add_metric([recipe], float(sum(1 for n in pool if n not in out)))
            floor.add_metric([recipe], float(p.floor_of(len(pool))))
        yield from (hosts, inrot, floor)

    def _rollouts(self, history: list[RolloutRecord]) -> Iterator[Metric]:
        status = GaugeMetricFamily("fleetctl_rollout_status", "The latest rollout's (and "
                                   "rollback's) status in the ledger: 1 for the current one.",
                                   labels=["kind", "status"])
        started = GaugeMetricFamily("fleetctl_rollout_started_timestamp_seconds",
                                    "When the latest rollout (rollback) started, epoch seconds.",
                                    labels=["kind"])
        budget = GaugeMetricFamily("fleetctl_rollout_failure_budget_left", "Host failures the "
                                   "running rollout may still take, per recipe (a unit counts "
                                   "once).", labels=["recipe"])
        latest: dict[str, RolloutRecord] = {}
        for rec in history:
            latest.setdefault(rec.kind, rec)
        for kind, rec in sorted(latest.items()):
            for s in ROLLOUT_STATES:
                status.add_metric([kind, s], 1.0 if rec.status == s else 0.0)
            started.add_metric([kind], rec.started_at)
            if rec.status in ACTIVE:
                for g in rec.options.get("groups") or ():
                    if not isinstance(g, dict) or "failure_budget" not in g:
                        continue
                    mine = [r for r in rec.hosts if r.recipe == g.get("recipe")]
                    left = int(g["failure_budget"]) - count_failed(self.inv, mine)
                    budget.add_metric([str(g.get("recipe") or "")], float(max(0, left)))
        yield from (status, started, budget)

    def _breakers(self) -> Iterator[Metric]:
        limit = GaugeMetricFamily("fleetctl_breaker_limit", "Remediations of a host in the "
                                  "recipe's window before the next is a rollback (watch.breaker).",
                                  labels=["recipe"])
        window = GaugeMetricFamily("fleetctl_breaker_window_seconds", "The breaker's window "
                                   "(watch.window).", labels=["recipe"])
        for recipe, p in sorted(self.policies.items()):
            limit.add_metric([recipe], float(p.breaker))
            window.add_metric([recipe], p.window)
        yield from (limit, window)
        if self.run is None:
            return
        count = GaugeMetricFamily("fleetctl_breaker_remediations", "The host's restarts and "
                                  "rollbacks by this watch within its recipe's window.",
                                  labels=["host"])
        now = time.time()
        for host in sorted(self.run.remedied_at):
            hp = self.policies.get(self.recipe_of.get(host, ""))
            if hp is not None:
                count.add_metric([host], float(self.run.remediated_since(host, now - hp.window)))
        yield count
