"""The bake (``rollout --bake D``): a wave back in rotation is watched under live traffic before the
next one.

For ``D`` seconds after a wave's hosts passed their gates and went back into the front door's
rotation, their /metrics are compared with those of hosts still on the old version (the plan's
pending hosts) under the same users' traffic: error rate, TTFT p95 / TPOT p50 and spec-decode
acceptance from each host's counter and histogram deltas (``soak/traffic.py``). A breach drains the
wave, rolls each host back (restore, readiness, smoke), re-admits it and stops the rollout, with the
figures in the ledger's verdict and in ``runs/<rollout>/bake-wave<N>/``. Inconclusive (too little
traffic, no counters) is treated as an inconclusive gate: ``--on-inconclusive pause`` pauses,
``fail`` rolls back.

Crash safety: each baked host's ledger phase is ``baking`` for the whole bake (its status stays
done), and a wave is marked done only after its bake; ``--resume`` finds a wave whose hosts are all
done but still ``baking`` (or ``bake-paused``) and bakes it again, whole. See docs/watch.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from fleetctl.durations import parse_duration
from fleetctl.errors import FleetError
from fleetctl.inventory import Host
from fleetctl.rollout import gate
from fleetctl.rollout import plan as wave_plan
from fleetctl.rollout import unit as unit_plan
from fleetctl.rollout.results import Options
from fleetctl.rollout.run import Failure, Group, Row, Run, Step
from fleetctl.rollout.session import Session, StopRollout
from fleetctl.rollout.step import Steps
from fleetctl.rollout.unit import unit_recipe
from fleetctl.soak import metrics
from fleetctl.soak.traffic import (
    Comparison,
    Limits,
    Traffic,
    compare,
    fetch_all,
    from_prometheus,
    traffic,
)
from fleetctl.soak.verdict import Outcome, Verdict, to_dict
from fleetctl.state import records as fleet_records
from fleetctl.urls import url_host

#: Hosts on the old version scraped for the comparison at most (a sample: the fleet's rest is
#: alike).
MAX_OLD = 32
#: Seconds between the bake's progress lines.
TICK = 5.0
#: Ledger phases of a wave's hosts whose bake has not finished (``--resume`` bakes the wave again).
BAKE_PHASES = ("baking", "bake-paused")


@dataclass(frozen=True)
class Baked:
    """A wave under its bake: the run, its group, the wave's index, the slots done in it (each
    host of a unit) and the row they show."""

    run: Run
    group: Group
    w: int
    done: Sequence[Host]
    row: Row


class Bake:
    """The post-promotion bake of a wave, between its last step and the next wave; a breach undoes
    the wave through the host's and the unit's steps (:meth:`HostStep.fail`,
    :meth:`UnitStep.fail`)."""

    def __init__(self, session: Session, steps: Steps) -> None:
        self.s = session
        self.door, self.hosts, self.units = steps.door, steps.hosts, steps.units
        #: Every host's /metrics (host -> base URL), bounded in parallel; a host's failure as
        #: text. The harness stands in scrapes of its own.
        self.scrape: Callable[[Mapping[str, str], float],
                              Mapping[str, metrics.Scrape | str]] = fetch_all

    def seconds(self, opts: Options) -> float:
        """``--bake``, else the inventory's ``fleetctl_bake`` (a duration), else 0 (off)."""
        if opts.bake is not None:
            return opts.bake
        raw = self.s.inv.vars.get("fleetctl_bake")
        return parse_duration(raw, f"fleetctl_bake in {self.s.inv.path}") if raw not in (None, "",
                                                                                         0) else 0.0

    def limits(self) -> Limits:
        """The inventory's ``fleetctl_bake_limits`` (see soak.traffic.Limits), checked before any
        host is touched."""
        return Limits.from_mapping(self.s.inv.vars.get("fleetctl_bake_limits"),
                                   f"fleetctl_bake_limits in {self.s.inv.path}")

    def prometheus(self) -> dict[str, str] | None:
        """The inventory's ``fleetctl_bake_prometheus`` (``url``, ``label``, ``instance``), checked;
        None: scrape hosts."""
        raw = self.s.inv.vars.get("fleetctl_bake_prometheus")
        if not raw:
            return None
        where = f"fleetctl_bake_prometheus in {self.s.inv.path}"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("url"), str) or \
                not str(raw["url"]).startswith(("http://", "https://")):
            raise FleetError(f"{where} needs url: http(s)://HOST:PORT of a Prometheus-compatible "
                             f"API",
                             fix="e.g. {url: http://prometheus:9090, label: instance, instance: "
                                 "'{address}:{port}'}")
        unknown = sorted(set(raw) - {"url", "label", "instance"})
        if unknown:
            raise FleetError(f"{where}: unknown key(s) {', '.join(unknown)}",
                             fix="use url, label, instance")
        return {"url": str(raw["url"]), "label": str(raw.get("label", "instance")),
                "instance": str(raw.get("instance", "{address}:{port}"))}

    def due(self, run: Run, members: Sequence[str]) -> bool:
        """A wave whose hosts are done but whose bake did not finish (a killed controller, or a
        paused bake)."""
        rec = run.ledger.get(run.id)
        return any((r := rec.host(h)) is not None and r.status == fleet_records.DONE
                   and r.phase in BAKE_PHASES
                   for h in members)

    def bake(self, run: Run, group: Group, w: int, members: Sequence[str], seconds: float) -> None:
        """Bake wave ``w``; raises StopRollout on a breach (after rolling the wave back) or a paused
        bake."""
        p, hosts = group.p, group.hosts
        rec = run.ledger.get(run.id)
        done = [hosts[h] for h in members
                if (r := rec.host(h)) is not None and r.status == fleet_records.DONE]
        new = unit_plan.slots(self.s.inv, done)
        if not new or seconds <= 0:
            return
        pending = [hosts[hp.host] for hp in p.hosts if hp.action == "deploy" and hp.host in hosts
                   and (r := rec.host(hp.host)) is not None and r.status == fleet_records.PENDING]
        old = unit_plan.slots(self.s.inv, pending)[:MAX_OLD]
        wave = Baked(run, group, w, done, Row(w + 1, p.tag, p.digest))
        against = (f"{len(old)} host(s) on the old version" if old
                   else "absolute bounds (no host on the old version left)")
        for h in done:
            run.phase(h, "baking", f"{seconds:.0f}s under live traffic, against {against}",
                      wave.row.at("baking", bake_s=round(seconds)).data())
        run.send("bake", wave=w + 1, hosts=[h.name for h in new], seconds=seconds,
                 against=[h.name for h in old])
        t0 = time.monotonic()
        started = datetime.now(UTC)
        cmp = self._watch(wave, new, old, seconds, against)
        verdict = self._verdict(run, p, w, cmp, started, time.monotonic() - t0)
        summary = gate.summarise(verdict, {"bake": round(time.monotonic() - t0, 1)})
        summary["traffic"] = {"new": [to_dict(t) for t in cmp.new],
                              "old": [to_dict(t) for t in cmp.old],
                              "reference": dict(cmp.reference)}
        self._conclude(wave, cmp, verdict, summary)

    def _watch(self, wave: Baked, new: Sequence[Host], old: Sequence[Host], seconds: float,
               against: str) -> Comparison:
        """``seconds`` under live traffic, then the wave's figures compared with the old version's
        (or with absolute bounds): from each host's /metrics, or from the fleet's Prometheus."""
        recipe, w = wave.group.recipe, wave.w
        urls = {h.name: gate.target(h, recipe, "").base_url for h in (*new, *old)}
        t0 = time.monotonic()
        first = self.scrape(urls, 0.0)
        end = t0 + seconds
        while (left := end - time.monotonic()) > 0:
            # Each baked host's row shows a bar (waited/timeout), the line under the table what is
            # left.
            bar = wave.row.at("baking", waited=round(seconds - left), timeout=round(seconds))
            for h in wave.done:
                self.s.emit("baking", f"under live traffic, against {against}", h.name,
                            **bar.data())
            self.s.emit("baking",
                        f"wave {w + 1}: {left:.0f}s left under live traffic, against {against}")
            time.sleep(min(left, TICK))
        last = self.scrape(urls, time.monotonic() - t0)

        def figures(names: Sequence[Host]) -> list[Traffic]:
            out = []
            for h in names:
                a, b = first[h.name], last[h.name]
                if isinstance(a, str) or isinstance(b, str):
                    out.append(Traffic(h.name, seconds,
                                       problems=(a if isinstance(a, str) else str(b),)))
                else:
                    out.append(traffic(h.name, a, b))
            return out

        prom = self.prometheus()
        if prom is None:
            return compare(figures(new), figures(old), self.limits())
        # The same figures from the fleet's Prometheus (docs/watch.md), over the bake's window.
        values = {h.name: prom["instance"].format(address=url_host(h.address), port=recipe.port,
                                           host=h.name)
                  for h in (*new, *old)}
        got = from_prometheus(prom["url"], values, time.monotonic() - t0, time.time(),
                              prom["label"])
        return compare([got[h.name] for h in new], [got[h.name] for h in old], self.limits())

    def _conclude(self, wave: Baked, cmp: Comparison, verdict: Verdict,
                  summary: Mapping[str, object]) -> None:
        """A pass marks the wave's hosts baked; an inconclusive bake pauses (``--on-inconclusive
        pause``); anything else rolls the wave back. Raises StopRollout unless it passed."""
        run, w, done = wave.run, wave.w, wave.done
        outcome = cmp.outcome
        if outcome is Outcome.PASS:
            for h in done:
                r = run.ledger.get(run.id).host(h.name)
                run.phase(h, "done", f"baked: {cmp.summary()}", wave.row.at("ok").data(),
                          verdict={**((r.verdict if r is not None else None) or {}),
                                   "bake": summary})
            run.send("bake", wave=w + 1, outcome="pass", summary=cmp.summary())
            return
        why = f"bake {cmp.summary()}"
        run.send("bake", wave=w + 1, outcome=outcome.value, summary=cmp.summary())
        if outcome is Outcome.INCONCLUSIVE and run.opts.on_inconclusive == "pause":
            for h in done:
                run.phase(h, "bake-paused", why, wave.row.at("?").data())
            raise StopRollout(fleet_records.PAUSED,
                              f"inconclusive bake of wave {w + 1}: {cmp.summary()}")
        self._unbake(wave, Failure(why, verdict))
        run.ledger.set_wave(run.id, w, fleet_records.FAILED)
        rolled = [h.name for h in done if (r := run.ledger.get(run.id).host(h.name)) is not None
                  and r.status == fleet_records.ROLLED_BACK]
        run.send("rollback", hosts=rolled, error=why)
        raise StopRollout(fleet_records.FAILED,
                          f"wave {w + 1} rolled back after its bake: {cmp.summary()}")

    def _unbake(self, wave: Baked, failure: Failure) -> None:
        """Drain the baked wave, roll each slot back (restore, readiness, smoke), re-admit it: as a
        failed gate."""
        run, recipe, p = wave.run, wave.group.recipe, wave.group.p

        def undo(h: Host) -> None:
            step = Step(run, recipe, h, wave.row, p)
            unit = self.s.inv.unit_of(h.name)
            if unit is None:
                self.door.out(step, reason="bake")
                self.hosts.fail(step, failure)
            else:
                members = unit_plan.members(self.s.inv, unit)
                for m in members:
                    self.door.out(step.on(m), reason="bake")
                self.units.fail(Step(run, unit_recipe(self.s.inv, unit, recipe), members[0],
                                     wave.row, p, step.timings), unit, failure)

        outs = self.s.parallel(unit_plan.slots(self.s.inv, list(wave.done)), undo)
        for name, err in outs.items():
            if err is not None:
                run.ledger.host_phase(run.id, name, "error", detail=err.message(),
                                      status=fleet_records.HOST_FAILED,
                                       error=err.message())

    def _verdict(self, run: Run, p: wave_plan.Plan, w: int, cmp: Comparison, started: datetime,
                      seconds: float) -> Verdict:
        """The bake as a soak verdict (its checks, the outcome, the summary), written under the
        run's artifacts."""
        from fleetctl import paths
        from fleetctl.soak.artifacts import Artifacts

        root = self.s.state_dir / "runs" / run.id / f"bake-wave{w + 1}"
        paths.private_dir(root.parent)
        v = Verdict(run_id=f"{run.id}/bake-wave{w + 1}", target=f"wave {w + 1}", base_url="",
                    outcome=cmp.outcome,
                    summary=cmp.summary(), started=started.isoformat(timespec="seconds"),
                    finished=datetime.now(UTC).isoformat(timespec="seconds"),
                    seconds=round(seconds, 2),
                    tag=p.tag, digest=p.digest, profile="bake", artifacts_dir=str(root),
                    checks=cmp.checks)
        art = Artifacts(root)
        try:
            art.write_json("verdict.json", to_dict(v))
            art.write_json("traffic.json",
                           {"new": [to_dict(t) for t in cmp.new],
                            "old": [to_dict(t) for t in cmp.old],
                                            "reference": dict(cmp.reference)})
        finally:
            art.close()
        return v
