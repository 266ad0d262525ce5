"""One host's remediation: drain at the front door, restart the serving container (a unit: every
member, in launch order), wait for readiness, re-gate (smoke, then ``watch.gate`` seconds of
concurrent greedy requests and the canaries: ``fleetctl.soak.burst``), re-admit.

The circuit breaker (``breaker.py``) turns the ``breaker``-th remediation of a host within the
window into a rollback to its last known-good (``Engine.rollback``: the ledger's choice, readiness
and smoke, its own door steps); a failed rollback, or none to go back to, parks the host: left out
of rotation with the reason, and paged. The recipe's breaker stops remediating its hosts at all
for the rest of the window (a fleet-wide problem is a person's call).

Bounds: one remediation of a host at a time (in this process, and across controllers: the host
locks, which a rollout or rollback on the host holds too: such a host is left alone and paged);
never below the recipe's floor of hosts in rotation (the remediation waits for the next breach and
pages). Every action is a progress event, a ``remediation`` webhook event and a ledger record of
kind ``remediate`` (``fleetctl history`` lists it: host, cause, action, result).

The engine's hosts are reached only through its seams (``HostOps``, the gates, the door, the
ledger), so the simulated fleet runs all of this (tests/remediate/).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import FleetError, LockedError, RecipeError
from fleetctl.frontdoor.drain import wait_drained
from fleetctl.inventory import Host, Inventory
from fleetctl.progress import NULL, Event, Progress
from fleetctl.recipes import Recipe, configured_recipe
from fleetctl.remediate.breaker import Breaker
from fleetctl.remediate.policy import REMEDIABLE, Policy
from fleetctl.remediate.record import KIND, REMEDIATING, Record
from fleetctl.rollout import gate
from fleetctl.rollout.api import Engine
from fleetctl.rollout.door import vllm_requests
from fleetctl.rollout.results import RollbackOptions
from fleetctl.rollout.run import live
from fleetctl.serving import container_name
from fleetctl.soak.verdict import Remedied
from fleetctl.state import records as fleet_records

#: Actions and results (``fleetctl history`` and the events name them).
RESTART, ROLLBACK, PARK, NONE = "restart", "rollback", "park", "none"
HEALED, ROLLED_BACK, PARKED, WAITING, EXCLUDED, PAGED, DRY_RUN = (
    "healed", "rolled-back", "parked", "waiting", "excluded", "paged", "dry-run")
#: Results after which the host serves again, re-gated and re-admitted: its breach is healed.
SERVING = (HEALED, ROLLED_BACK)
#: The reason a parked host's out-of-rotation record starts with (read back by the next watch).
PARKED_REASON = "parked"

#: ``page(host, kind, message)``: a person should look (the CLI sends the webhook).
Page = Callable[[str, str, str], None]


@dataclass(frozen=True)
class Remediation:
    """What one breach led to."""

    host: str
    check: str
    cause: str
    action: str
    result: str
    detail: str = ""
    id: str | None = None
    seconds: float = 0.0
    members: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The remediation as JSON (events, the webhook, ``--json``)."""
        return {"host": self.host, "check": self.check, "cause": self.cause,
                "action": self.action, "result": self.result, "detail": self.detail,
                "id": self.id, "seconds": round(self.seconds, 2), "members": list(self.members)}

    def remedied(self) -> tuple[Remedied, bool]:
        """What the watch keeps of it (its verdict: healed or not), and whether the host's checks
        start afresh (not after a park or a page: those stay breached)."""
        return (Remedied(self.check, self.cause, self.action, self.result,
                         self.result in SERVING, self.detail, self.id or ""),
                self.result not in (PARKED, PAGED))


@dataclass
class _State:
    """What the remediator keeps between breaches: bounded by the watched hosts."""

    busy: set[str] = field(default_factory=set)
    parked: dict[str, str] = field(default_factory=dict)
    #: The last page per host (a page repeats only when what it says changes).
    paged: dict[str, str] = field(default_factory=dict)


class Remediator:
    """Heals the watched hosts of one inventory through an :class:`Engine`."""

    def __init__(self, engine: Engine, hosts: Sequence[str], policy_of: Callable[[Recipe], Policy],
                 *, progress: Progress = NULL, page: Page | None = None, dry_run: bool = False,
                 clock: Callable[[], float] = time.monotonic,
                 notify: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        """``hosts``: the watched hosts (the floor counts those of the same recipe);
        ``policy_of``: each recipe's policy; ``notify``: each remediation's record, as it ends
        (the CLI's webhook)."""
        self.eng = engine
        self.s = engine.session
        self.inv = engine.inv
        self.watched = [h for h in hosts if h in self.inv.hosts]
        self.policy_of = policy_of
        self.progress = progress
        self.page_out = page or (lambda _h, _k, _m: None)
        self.notify = notify or (lambda _r: None)
        self.dry_run = dry_run
        self.clock = clock
        self.record = Record(engine.ledger)
        #: Requests vLLM holds on a host (running + waiting); a harness stands in its own.
        self.in_flight: Callable[[Host, Recipe], int | None] = vllm_requests
        self._mu = threading.Lock()
        self._rollback_mu = threading.Lock()
        self.st = _State()
        self.breakers: dict[str, Breaker] = {}
        self._recipes: dict[str | None, Recipe] = {}
        # Hosts a watch before this one parked stay parked (until a person re-admits them).
        for name, out in self.eng.ledger.out_of_rotation().items():
            if (out.reason or "").startswith(PARKED_REASON):
                self.st.parked[name] = out.reason or PARKED_REASON

    # -- what the watch calls ------------------------------------------------------------------

    def remediate(self, host: str, check: str, cause: str) -> Remediation:
        """Act on ``host``'s breach of ``check`` (``cause``: the breach's message)."""
        h = self.inv.hosts.get(host)
        if h is None or check not in REMEDIABLE:
            return Remediation(host, check, cause, NONE, PAGED, f"{check} is paged, not healed")
        recipe = self._recipe(h)
        policy = self.policy_of(recipe)
        members = self._members(h)
        with self._mu:
            if host in self.st.parked:
                return Remediation(host, check, cause, NONE, PARKED, self.st.parked[host])
            if any(m in self.st.busy for m in members):
                return Remediation(host, check, cause, NONE, WAITING, "a remediation runs there")
            why = self._held_back(recipe, policy, members)
            if why is None:
                self.st.busy.update(members)
        if why is not None:
            return self._page(Remediation(host, check, cause, NONE, WAITING, why,
                                          members=members))
        try:
            return self._act(h, members, recipe, policy, check, cause)
        finally:
            with self._mu:
                self.st.busy.difference_update(members)

    def recover(self) -> list[Remediation]:
        """Finish the remediations a killed watch left (``remediating`` in the ledger): each
        member's container started if it is not running, readiness and smoke, then re-admitted;
        else rolled back or parked as a failed remediation is. Call before the first probe."""
        out = []
        for rid in self.eng.ledger.ids(kind=KIND, statuses=(REMEDIATING,), limit=100):
            rec = self.eng.ledger.get(rid)
            host = str((rec.options or {}).get("host") or "")
            h = self.inv.hosts.get(host)
            if h is None:
                self.record.finish(rid, "interrupted", "its host is no longer in the inventory",
                                   False)
                continue
            self.eng.ledger.note(rid, "resumed", "the watch that ran it stopped mid-way")
            out.append(self._resume(rid, h, str((rec.options or {}).get("check") or ""),
                                    str((rec.options or {}).get("cause") or "")))
        return out

    def _resume(self, rid: str, h: Host, check: str, cause: str) -> Remediation:
        recipe, members, t0 = self._recipe(h), self._members(h), time.monotonic()
        policy = self.policy_of(recipe)
        try:
            locks = self.s.hold(rid, "remediate", [self.inv.hosts[m] for m in members])
        except LockedError as e:
            self.record.finish(rid, EXCLUDED, f"interrupted, then left alone: {e.cause}", False)
            return self._page(Remediation(h.name, check, cause, NONE, EXCLUDED,
                                          f"left alone: {e.cause}", rid, members=members))
        name = container_name(h)
        try:
            for m in members:
                c = self.s.ops(self.inv.hosts[m]).inspect(name)
                if c is not None and not c.running:
                    self.s.ops(self.inv.hosts[m]).start_again(name)
            self.record.step(rid, members, "started", f"{name} running")
            ok, why = self._gate(rid, h, recipe, policy, self._serving(h)[0])
            if ok:
                self.eng.door.back_in(h)
                self.record.step(rid, members, "in-rotation", "re-admitted")
                return self._end(rid, Remediation(h.name, check, cause, RESTART, HEALED,
                                                  f"resumed: {why}", rid,
                                                  time.monotonic() - t0, members))
        except FleetError as e:
            why = e.cause
        finally:
            locks.release()
        return self._escalate(rid, h, members, check, cause, f"resumed: {why}", t0)

    def _recipe(self, h: Host) -> Recipe:
        """The recipe the host is configured to serve (a unit member: its unit's), read once per
        recipe: the watch may run for days."""
        name = _configured(self.inv, h)
        r = self._recipes.get(name)
        if r is None:
            r = self._recipes[name] = self.eng.recipe(name)
        return r

    def parked(self) -> dict[str, str]:
        """Parked hosts and why."""
        return dict(self.st.parked)

    def size(self) -> int:
        """Numbers kept in all (a test of bounded memory reads it)."""
        return (sum(b.size() for b in self.breakers.values()) + len(self.st.parked)
                + len(self.st.paged) + len(self.st.busy))

    # -- the decision --------------------------------------------------------------------------

    def _breaker(self, recipe: Recipe, policy: Policy) -> Breaker:
        b = self.breakers.get(recipe.name)
        if b is None:
            b = self.breakers[recipe.name] = Breaker(policy.breaker, policy.recipe_breaker,
                                                     policy.window)
        return b

    def _held_back(self, recipe: Recipe, policy: Policy, members: Sequence[str]) -> str | None:
        """Why no remediation may start now (None: it may). Called under the lock."""
        if not policy.remediate:
            return "remediation is off for this recipe (watch.remediate, --remediate)"
        b = self._breaker(recipe, policy)
        now = self.clock()
        if b.recipe_open(recipe.name, now):
            return (f"recipe {recipe.name}'s breaker is open: {b.recipe_count(recipe.name, now)} "
                    f"remediations in {policy.window:.0f}s (watch.recipe_breaker "
                    f"{policy.recipe_breaker}); a person should look at the fleet")
        # Every host of the recipe counts, watched or not (an unwatched one serves too).
        mine = _configured(self.inv, self.inv.hosts[members[0]])
        pool = [n for n, x in self.inv.hosts.items() if _configured(self.inv, x) == mine]
        out = set(self.eng.ledger.out_of_rotation()) | set(self.st.parked) | self.st.busy
        left = [n for n in pool if n not in out and n not in members]
        floor = policy.floor_of(len(pool))
        if len(left) < floor:
            return (f"{len(left)} other host(s) of recipe {recipe.name} in rotation, "
                    f"floor {floor} (watch.floor)")
        return None

    def _members(self, h: Host) -> tuple[str, ...]:
        """The hosts restarted together: the host's unit's members in launch order, or itself."""
        unit = self.inv.units.get(h.unit) if h.unit else None
        return tuple(unit.members) if unit is not None else (h.name,)

    def _act(self, h: Host, members: tuple[str, ...], recipe: Recipe, policy: Policy,
             check: str, cause: str) -> Remediation:
        b = self._breaker(recipe, policy)
        escalate = b.host_open(h.name, self.clock())
        action = ROLLBACK if escalate else RESTART
        if self.dry_run:
            n = b.host_count(h.name, self.clock())
            b.record(h.name, recipe.name, self.clock())
            what = (f"would roll {h.name} back to its last known-good ({n} remediations in "
                    f"{policy.window:.0f}s)" if escalate else
                    f"would drain {h.name}, restart {', '.join(members)}, re-gate and re-admit")
            return self._done(Remediation(h.name, check, cause, action, DRY_RUN, what,
                                          members=members))
        t0 = time.monotonic()
        rid = self.record.new_id(h.name)
        try:
            locks = self.s.hold(rid, "remediate", [self.inv.hosts[m] for m in members])
        except LockedError as e:
            return self._page(Remediation(h.name, check, cause, NONE, EXCLUDED,
                                          f"left alone: {e.cause}", members=members))
        tag, digest = self._serving(h)
        self.record.start(rid, h, members, recipe, tag, digest, check, cause, action, policy)
        b.record(h.name, recipe.name, self.clock())
        try:
            if not escalate:
                ok, why = self._restart(rid, h, members, recipe, policy, tag, check)
                if ok:
                    self.eng.door.back_in(h)
                    self.record.step(rid, members, "in-rotation", "re-admitted")
                    return self._end(rid, Remediation(h.name, check, cause, RESTART, HEALED,
                                                      why, rid, time.monotonic() - t0, members))
                self._emit(h.name, "remediate", f"the restart did not heal it: {why}; rolling back")
                action = ROLLBACK
            else:
                self._drain(rid, h, recipe, check)
        except FleetError as e:
            why = f"{e.cause}"
        finally:
            # The rollback takes the host locks itself.
            locks.release()
        return self._escalate(rid, h, members, check, cause, why if not escalate else
                              f"{b.host_count(h.name, self.clock())} remediations in "
                              f"{policy.window:.0f}s (watch.breaker {policy.breaker})", t0)

    # -- the steps -----------------------------------------------------------------------------

    def _serving(self, h: Host) -> tuple[str, str]:
        c = self.s.ops(h).inspect(container_name(h))
        return (c.tag or "", c.digest or "") if c is not None else ("", "")

    def _drain(self, rid: str, h: Host, recipe: Recipe, check: str = "") -> None:
        """Out of rotation (recorded before the door is asked), then the requests in flight: a
        wedged engine (liveness) or one that does not answer (probes) finishes none of them, so
        those are not waited for (the restart cuts them)."""
        door = self.s.door
        if door is None:
            return
        self.eng.ledger.mark_out(h.name, rid, "remediate", {})
        drained = door.drain(h)
        if drained.memo:
            self.eng.ledger.mark_out(h.name, rid, "remediate", drained.memo)
        stuck = check in ("liveness", "probes")
        w = wait_drained(door, h, lambda: self.in_flight(h, recipe),
                         0.0 if stuck else self.s.drain_timeout)
        msg = (f"{w.leftover} request(s) in flight after {w.seconds:.0f}s: the restart cuts "
               "them" if w.timed_out else f"no request in flight after {w.seconds:.1f}s")
        self.record.step(rid, [h.name], "drained", msg)
        self._emit(h.name, "drained", msg)

    def _restart(self, rid: str, h: Host, members: Sequence[str], recipe: Recipe,
                 policy: Policy, tag: str, check: str) -> tuple[bool, str]:
        """Drain, restart every member (all stopped, then started in launch order), readiness,
        smoke and a few seconds of load. (ok, what happened)."""
        self._drain(rid, h, recipe, check)
        name = container_name(h)
        for m in members:
            self.s.ops(self.inv.hosts[m]).stop(name)
        self.record.step(rid, members, "stopped", f"{name} stopped")
        for m in members:
            self.s.ops(self.inv.hosts[m]).start_again(name)
        self.record.step(rid, members, "started", f"{name} started again")
        self._emit(h.name, "restarted", f"{', '.join(members)}: {name} started again")
        return self._gate(rid, h, recipe, policy, tag)

    def _gate(self, rid: str, h: Host, recipe: Recipe, policy: Policy,
              tag: str) -> tuple[bool, str]:
        """Readiness, smoke and a few seconds of load on the restarted container."""
        cfg = gate.config(recipe, None, h)
        ready = self.s.gates.wait(h, recipe, tag, cfg, policy.ready_timeout,
                                  live(self.s, h, None, "readiness", cancellable=False))
        if ready.outcome.value != "pass":
            return False, f"readiness {ready.outcome.value}: {ready.message}"
        art = self.s.state_dir / "runs" / rid
        v = self.s.gates.smoke(h, recipe, tag, cfg, art)
        if v.outcome.value == "pass" and policy.gate > 0:
            # A burst of its own (concurrent greedy requests, the canaries), not the recipe's soak:
            # no ramp, no baseline, bounded by watch.gate and the liveness bound.
            v = self.s.gates.load(h, recipe, tag, cfg, policy.gate, art / "load")
        self.record.step(rid, [h.name], "gated", v.summary)
        if v.outcome.value != "pass":
            return False, f"re-gate {v.outcome.value}: {gate.failed_checks_text(v)}"
        return True, f"restarted and re-gated ({v.summary})"

    def _escalate(self, rid: str, h: Host, members: tuple[str, ...], check: str, cause: str,
                  why: str, t0: float) -> Remediation:
        """Roll back to the last known-good (the engine's rollback: readiness, smoke, re-admit);
        park when it fails or there is none."""
        self._emit(h.name, "remediate", f"rolling back to its last known-good: {why}")
        self.record.step(rid, [h.name], "rolling-back", why)
        # One rollback at a time (one engine, one fleet lock); a wedged engine's requests never
        # finish, so its rollback does not wait for them at the door either.
        try:
            with self._rollback_mu:
                kept = self.s.drain_timeout
                if check in ("liveness", "probes"):
                    self.s.drain_timeout = 0.0
                try:
                    r = self.eng.rollback(RollbackOptions(limit=",".join(members),
                                                          max_unavailable="100%"))
                finally:
                    self.s.drain_timeout = kept
        except FleetError as e:
            return self._park(rid, h, members, check, cause, f"{why}; the rollback could not "
                              f"run: {e.cause}", t0)
        back = [o for o in r.hosts if o.host == h.name]
        if r.status == fleet_records.COMPLETED and back and back[0].status == fleet_records.DONE:
            self._breaker_reset(h)
            self.record.step(rid, [h.name], "rolled-back", f"{r.id}: {back[0].after_tag}")
            return self._end(rid, Remediation(h.name, check, cause, ROLLBACK, ROLLED_BACK,
                                              f"{why}; rolled back to {back[0].after_tag} "
                                              f"({r.id})", rid, time.monotonic() - t0, members))
        if not back or back[0].status == fleet_records.SKIPPED:
            skip = (back[0].error if back else None) or r.error or "nothing to roll back to"
            return self._park(rid, h, members, check, cause, f"{why}; no rollback: no other "
                              f"known-good version recorded for it ({skip})", t0)
        return self._park(rid, h, members, check, cause, f"{why}; the rollback failed: "
                          f"{back[0].error or r.error or r.status}", t0)

    def _breaker_reset(self, h: Host) -> None:
        for b in self.breakers.values():
            b.reset(h.name)

    def _park(self, rid: str, h: Host, members: tuple[str, ...], check: str, cause: str,
              why: str, t0: float) -> Remediation:
        """Leave the host out of rotation with the reason; page."""
        door = self.s.door
        if door is not None:
            self.eng.ledger.mark_out(h.name, rid, f"{PARKED_REASON}: {why}"[:500], {})
            try:
                door.drain(h)
            except FleetError as e:
                why += f" (the door did not drain it: {e.cause})"
        # The ledger's reason says "parked: ..." (how a later watch knows it); the result says it.
        with self._mu:
            self.st.parked[h.name] = f"{PARKED_REASON}: {why}"
        self.record.step(rid, [h.name], "parked", f"{PARKED_REASON}: {why}")
        return self._page(self._end(rid, Remediation(h.name, check, cause, PARK, PARKED, why,
                                                     rid, time.monotonic() - t0, members)))

    # -- records and pages ---------------------------------------------------------------------

    def _end(self, rid: str, r: Remediation) -> Remediation:
        self.record.finish(rid, r.result, r.detail, r.result in SERVING)
        return self._done(r)

    def _done(self, r: Remediation) -> Remediation:
        self._emit(r.host, "remediation", f"{r.action}: {r.result}: {r.detail}", **r.to_dict())
        self.notify(r.to_dict())
        return r

    def _page(self, r: Remediation) -> Remediation:
        key = f"{r.result}: {r.detail}"
        with self._mu:
            repeat = self.st.paged.get(r.host) == key
            self.st.paged[r.host] = key
        if not repeat:
            self._emit(r.host, "page", key)
            self.page_out(r.host, r.result, f"{r.cause}: {key}")
        return r if r.result == PARKED else self._done(r)

    def _emit(self, where: str, phase: str, message: str, **data: Any) -> None:
        self.progress(Event(phase, message, host=where, data=data))


def _configured(inv: Inventory, h: Host) -> str | None:
    """The recipe ``h`` is configured to serve (None: no fleetctl_recipe anywhere, the engine's
    default then)."""
    try:
        return configured_recipe(inv, h)
    except RecipeError:
        return None
