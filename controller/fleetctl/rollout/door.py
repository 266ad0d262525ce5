"""The rollout's use of the fleet's front door: a host leaves rotation before its stop and comes back only
after its gate (or after its rollback passed readiness and smoke).

The ledger's ``out_of_rotation`` table holds every host fleetctl drained and has not re-admitted: it
is written before the door is asked and cleared only after the door sees the host healthy, so a
controller killed anywhere leaves the drained hosts recorded, and the next command (``--resume``,
``abort``, ``rollback``, the next rollout) re-admits each one it leaves serving. No
``fleetctl_front_door`` in the inventory: every method here does nothing (the behaviour before the
front door existed). See docs/frontdoor.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.frontdoor import Drained, FrontDoorError
from fleetctl.frontdoor.drain import vllm_in_flight, wait_drained, wait_in_rotation
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.rollout import gate
from fleetctl.rollout.preflight import Planning
from fleetctl.state import ledger as fleet_ledger

#: Host statuses after which a host that is still out of rotation serves a good version and goes back in.
SERVING_STATUSES = (fleet_ledger.DONE, fleet_ledger.ROLLED_BACK, fleet_ledger.SKIPPED, fleet_ledger.PENDING)


class DoorSteps(Planning):
    """Drain before the stop, re-admit after the gate, and re-admit what a killed controller left out."""

    def _vllm_in_flight(self, h: Host, recipe: Recipe) -> int | None:
        """Requests vLLM holds on ``h`` (running + waiting, from its /metrics); None when it does not answer."""
        return vllm_in_flight(gate.target(h, recipe, "").base_url)

    def _door_out(self, rid: str, h: Host, recipe: Recipe, show: Mapping[str, Any], t: dict[str, float],
                  reason: str = "rollout") -> None:
        """Take ``h`` out of rotation and wait (bounded) for its requests in flight; record both."""
        if self.door is None:
            return
        self._check_cancel()
        t0 = time.monotonic()
        # Recorded before the door is asked: a kill in between leaves a host to re-admit, never a forgotten one.
        self.ledger.mark_out(h.name, rid, reason, {})
        self._phase(rid, h, "draining", f"out of {self.door.kind} rotation; waiting for requests in flight",
                    {**show, "health": "draining"})
        try:
            drained = self.door.drain(h)
        except FleetError as e:
            # Nothing was changed on the host: put it back as it was and stop its step.
            undo = self._door_in_or_record(rid, h)
            if undo is not None and self._door_never_took_it_out(h):
                self.ledger.mark_in(h.name)
                undo = None
            raise FleetError(f"the {self.door.kind} front door could not drain it: {e.cause}; the host was left "
                             "serving, untouched" + (f" ({undo})" if undo else ""), host=h.name, fix=e.fix) from None
        if drained.memo:
            self.ledger.mark_out(h.name, rid, reason, drained.memo)
        w = wait_drained(self.door, h, lambda: self._vllm_in_flight(h, recipe), self.drain_timeout)
        t["drain"] = time.monotonic() - t0
        if w.timed_out:
            t["drain_left"] = float(w.leftover)
            self._emit("drained", f"{w.leftover} request(s) still in flight after drain_timeout "
                                  f"{self.drain_timeout:.0f}s (door {w.door_left}, vLLM {w.vllm_left}): the stop cuts "
                                  "them", h.name, **show, health="drained")
        else:
            self._emit("drained", f"no request in flight after {w.seconds:.1f}s", h.name, **show, health="drained")

    def _door_never_took_it_out(self, h: Host) -> bool:
        """After a refused drain: the door has the host in rotation still, or does not know it at all."""
        assert self.door is not None
        try:
            return self.door.state(h).admin in ("ready", "absent")
        except FleetError:
            return False

    def _door_in(self, rid: str, h: Host, t: dict[str, float] | None = None) -> None:
        """Put ``h`` back in rotation if fleetctl took it out, and wait until the door sees it healthy.

        Raises FrontDoorError when the door refuses or does not see it healthy in time (the host then
        stays recorded as out of rotation, and ``status`` shows it)."""
        if self.door is None:
            return
        out = self.ledger.out_of_rotation().get(h.name)
        if out is None:
            return
        t0 = time.monotonic()
        self.door.readmit(h, Drained(h.name, out.memo))
        st = wait_in_rotation(self.door, h, self.readmit_timeout)
        self.ledger.mark_in(h.name)
        if t is not None:
            t["readmit"] = time.monotonic() - t0
        self._emit("in-rotation", f"back in {self.door.kind} rotation ({st.detail})", h.name)

    def _door_in_or_record(self, rid: str, h: Host, t: dict[str, float] | None = None) -> str | None:
        """:meth:`_door_in`; its failure as text (the host stays out and recorded) instead of an exception."""
        try:
            self._door_in(rid, h, t)
        except FleetError as e:
            self.ledger.note(rid, "front-door", e.message())
            self._emit("front-door", e.message(), h.name)
            return e.message()
        return None

    def _door_reconcile(self, rid: str, recipe: Recipe, names: Iterable[str]) -> list[str]:
        """Re-admit every host of ``names`` still out of rotation that this run left serving a good version.

        A host drained by a killed controller and then left as it was (``already there``), or one
        whose re-admission was interrupted, is checked for readiness first. Returns the problems."""
        if self.door is None:
            return []
        out = self.ledger.out_of_rotation()
        rec = self.ledger.get(rid)
        problems = []
        for n in names:
            hr = rec.host(n)
            if n not in out or hr is None or hr.status not in SERVING_STATUSES:
                continue
            if hr.status == fleet_ledger.PENDING and hr.phase not in ("planned", "restored", "skipped"):
                continue
            h = self.inv.host(n)
            cfg = gate.config(recipe, None, h)
            ready = self.gates.wait(h, recipe, hr.after_tag or hr.before_tag or "", cfg, self.readmit_timeout,
                                    self._forward(h, {}, "loading", cancellable=False))
            if not ready.ready:
                problems.append(f"{n}: kept out of rotation: not ready ({ready.message})")
                continue
            err = self._door_in_or_record(rid, h)
            if err:
                problems.append(err)
        return problems

    def door_states(self, hosts: Iterable[Host]) -> list[dict[str, Any]]:
        """Each host as the front door sees it, and whether fleetctl holds it out (for ``status``)."""
        if self.door is None:
            return []
        out = self.ledger.out_of_rotation()
        rows = []
        for h in hosts:
            try:
                row = self.door.state(h).to_dict()
            except FrontDoorError as e:
                row = {"host": h.name, "admin": "?", "healthy": None, "in_flight": None, "detail": e.cause}
            held = out.get(h.name)
            row["held_by"] = held.rollout_id if held is not None else None
            rows.append(row)
        return rows
