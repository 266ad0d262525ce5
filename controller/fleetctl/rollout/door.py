"""The rollout's use of the fleet's front door: a host leaves rotation before its stop and comes
back only after its gate (or after its rollback passed readiness and smoke).

The ledger's ``out_of_rotation`` table holds every host fleetctl drained and has not re-admitted: it
is written before the door is asked and cleared only after the door sees the host healthy, so a
controller killed anywhere leaves the drained hosts recorded, and the next command (``--resume``,
``abort``, ``rollback``, the next rollout) re-admits each one it leaves serving. No
``fleetctl_front_door`` in the inventory: every method here does nothing (the behaviour before the
front door existed). See docs/frontdoor.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.frontdoor import DoorState, Drained, FrontDoorError, states_of
from fleetctl.frontdoor.drain import vllm_in_flight, wait_drained, wait_in_rotation
from fleetctl.inventory import Host
from fleetctl.recipes import Recipe
from fleetctl.rollout import gate
from fleetctl.rollout.run import Run, Step, live
from fleetctl.rollout.session import Session, StopRollout
from fleetctl.state import records as fleet_records

#: Host statuses after which a host that is still out of rotation serves a good version and goes
#: back in.
SERVING_STATUSES = (fleet_records.DONE, fleet_records.ROLLED_BACK, fleet_records.SKIPPED,
                    fleet_records.PENDING)


def vllm_requests(h: Host, recipe: Recipe) -> int | None:
    """Requests vLLM holds on ``h`` (running + waiting, from its /metrics); None when it does not
    answer."""
    return vllm_in_flight(gate.target(h, recipe, "").base_url)


class DoorSteps:
    """Drain before the stop, re-admit after the gate, and re-admit what a killed controller left
    out."""

    def __init__(self, session: Session) -> None:
        self.s = session
        #: The fleet's front door (None: none, and every step here does nothing).
        self.door = session.door
        #: Requests vLLM holds on a host (running + waiting); the harness stands in its own.
        self.in_flight: Callable[[Host, Recipe], int | None] = vllm_requests

    def out(self, step: Step, reason: str = "rollout") -> None:
        """Take the step's host out of rotation and wait (bounded) for its requests in flight;
        record both (the wait in the step's timings)."""
        if self.door is None:
            return
        run, h, t = step.run, step.host, step.timings
        self.s.check_cancel()
        t0 = time.monotonic()
        # Recorded before the door is asked: a kill in between leaves a host to re-admit, never a
        # forgotten one.
        self.s.ledger.mark_out(h.name, run.id, reason, {})
        step.phase("draining", f"out of {self.door.kind} rotation; waiting for requests in flight",
                   step.row.at("draining"))
        try:
            drained = self.door.drain(h)
        except FleetError as e:
            # Nothing was changed on the host: put it back as it was and stop its step.
            undo = self.back_in_or_record(run, h)
            if undo is not None and self._never_took_it_out(h):
                self.s.ledger.mark_in(h.name)
                undo = None
            raise FleetError(f"the {self.door.kind} front door could not drain it: {e.cause}; "
                             "the host was left serving, untouched"
                             + (f" ({undo})" if undo else ""), host=h.name, fix=e.fix) from None
        if drained.memo:
            self.s.ledger.mark_out(h.name, run.id, reason, drained.memo)
        w = wait_drained(self.door, h, lambda: self.in_flight(h, step.recipe),
                         self.s.drain_timeout)
        t["drain"] = time.monotonic() - t0
        shown = step.row.at("drained").data()
        if w.timed_out:
            t["drain_left"] = float(w.leftover)
            self.s.emit("drained", f"{w.leftover} request(s) still in flight after drain_timeout "
                                  f"{self.s.drain_timeout:.0f}s (door {w.door_left}, vLLM "
                                  f"{w.vllm_left}): the stop cuts "
                                  "them", h.name, **shown)
        else:
            self.s.emit("drained", f"no request in flight after {w.seconds:.1f}s", h.name, **shown)

    def _never_took_it_out(self, h: Host) -> bool:
        """After a refused drain: the door has the host in rotation still, or does not know it at
        all."""
        assert self.door is not None
        try:
            return self.door.state(h).admin in ("ready", "absent")
        except FleetError:
            return False

    def back_in(self, h: Host, t: dict[str, float] | None = None) -> None:
        """Put ``h`` back in rotation if fleetctl took it out, and wait until the door sees it
        healthy.

        Raises FrontDoorError when the door refuses or does not see it healthy in time (the host
        then stays recorded as out of rotation, and ``status`` shows it)."""
        if self.door is None:
            return
        out = self.s.ledger.out_of_rotation().get(h.name)
        if out is None:
            return
        t0 = time.monotonic()
        st = self._readmit_with_retries(h, Drained(h.name, out.memo))
        self.s.ledger.mark_in(h.name)
        if t is not None:
            t["readmit"] = time.monotonic() - t0
        self.s.emit("in-rotation", f"back in {self.door.kind} rotation ({st.detail})", h.name)

    def _readmit_with_retries(self, h: Host, drained: Drained) -> DoorState:
        """Re-admit ``h`` and wait until the door sees it in rotation and healthy; a refusal or a
        host the door still sees down is tried again, ``readmit_attempts`` times in all, 1 s then 2
        s, 4 s ... (at most 15 s) apart. Each attempt waits ``readmit_timeout / readmit_attempts``
        (at least 1 s) for the door's health check, so the whole is bounded by about
        ``readmit_timeout`` plus the pauses.

        Raises FrontDoorError naming the host, what the door said last and the fix."""
        assert self.door is not None
        attempts = self.s.readmit_attempts
        window = max(1.0, self.s.readmit_timeout / attempts)
        delay = 1.0
        t0 = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                self.door.readmit(h, drained)
                return wait_in_rotation(self.door, h, window)
            except FrontDoorError as e:
                last = e
            if attempt < attempts:
                self.s.emit("readmit-retry",
                            f"re-admission {attempt} of {attempts} failed: {last.cause}; "
                                            f"trying again in {delay:.0f}s", h.name)
                time.sleep(delay)
                delay = min(delay * 2, 15.0)
        raise FrontDoorError(f"still out of {self.door.kind} rotation after {attempts} "
                             f"re-admission(s) in {time.monotonic() - t0:.0f}s: {last.cause}",
                             host=h.name,
                             fix=f"{last.fix}; once the door can take it, `fleetctl rollout "
                                 f"--resume` re-admits {h.name} (it serves a version that passed "
                                 "its gate; `fleetctl status` shows it held out)")

    def wait_capacity(self, pool: Sequence[Host], step: Sequence[str], floor: int,
                      poll: float = 1.0) -> None:
        """Before a step takes ``step`` out: wait until the door keeps at least ``floor`` hosts of
        ``pool`` in rotation without them (the plan's floor, :meth:`Plan.floor`).

        Hosts out already (drained or failed at the door, by fleetctl or by someone else) count
        against the floor: the step waits for them, saying who is out and why, every time that
        changes. After ``capacity_timeout`` it refuses: :class:`StopRollout` (paused) before any
        host of the step is touched, so ``--resume`` can go on once the hosts are back."""
        if self.door is None or not step:
            return
        t0 = time.monotonic()
        last = ""
        while True:
            self.s.check_cancel()
            in_rot, why_out = self.pool(pool)
            staying = [n for n in in_rot if n not in step]
            if len(staying) >= floor:
                if last:
                    self.s.emit("capacity", f"{len(in_rot)} of {len(pool)} in rotation, floor "
                                            f"{floor}: going on after {time.monotonic() - t0:.0f}s")
                return
            waiting = (f"{len(in_rot)} of {len(pool)} in rotation, floor {floor}"
                       + (f", {len(in_rot) - len(staying)} of them in this step"
                          if len(staying) < len(in_rot) else "")
                       + "; " + "; ".join(f"{n} {w}" for n, w in why_out.items()))
            if time.monotonic() - t0 >= self.s.capacity_timeout:
                hosts = ", ".join(step)
                raise StopRollout(fleet_records.PAUSED, FrontDoorError(
                    f"{hosts} not taken out: after {self.s.capacity_timeout:.0f}s {waiting}",
                    fix="bring the hosts out of rotation back in (or fix their health check), then "
                        "`fleetctl rollout --resume`; or lower the floor (--min-available, "
                        "fleetctl_min_available) in a new rollout; fleetctl_capacity_timeout sets "
                        "the wait").message())
            if waiting != last:
                self.s.emit("capacity-wait", f"waiting: {waiting}")
                last = waiting
            time.sleep(poll)

    def pool(self, pool: Sequence[Host]) -> tuple[list[str], dict[str, str]]:
        """The hosts of ``pool`` the door has in rotation, and why each other one is out."""
        assert self.door is not None
        try:
            seen = states_of(self.door, pool)
        except FrontDoorError as e:
            return [], {"(all)": f"unknown: the {self.door.kind} front door does not answer "
                                 f"({e.cause})"}
        held = self.s.ledger.out_of_rotation()
        in_rot, why = [], {}
        for h in pool:
            st = seen.get(h.name)
            by = held.get(h.name)
            if st is not None and st.in_rotation:
                in_rot.append(h.name)
                continue
            if st is not None and st.admin == "unknown" and by is None and st.healthy is not False:
                # a door that does not tell: in rotation unless fleetctl holds it out
                in_rot.append(h.name)
                continue
            if st is None or st.admin == "?":
                why[h.name] = f"unknown to the door ({st.detail if st else 'no answer'})"
            elif st.admin == "absent":
                why[h.name] = "not in the door's pool"
            elif st.admin != "ready":
                how = "drained" if st.admin == "drain" else "in maintenance"
                why[h.name] = (f"{how} by fleetctl ({by.rollout_id}, {by.reason})" if by is not None
                               else f"{how} outside fleetctl")
            else:
                why[h.name] = f"failing the door's health check ({st.detail})"
        return in_rot, why

    def back_in_or_record(self, run: Run, h: Host, t: dict[str, float] | None = None) -> str | None:
        """:meth:`back_in`; its failure as text (the host stays out and recorded) instead of an
        exception."""
        try:
            self.back_in(h, t)
        except FleetError as e:
            run.ledger.note(run.id, "front-door", e.message())
            run.emit("front-door", e.message(), h.name)
            return e.message()
        return None

    def reconcile(self, run: Run, recipe: Recipe, names: Iterable[str]) -> list[str]:
        """Re-admit every host of ``names`` still out of rotation that this run left serving a good
        version.

        A host drained by a killed controller and then left as it was (``already there``), or one
        whose re-admission was interrupted, is checked for readiness first. Returns the problems."""
        if self.door is None:
            return []
        out = self.s.ledger.out_of_rotation()
        rec = run.ledger.get(run.id)
        problems = []
        for n in names:
            hr = rec.host(n)
            if n not in out or hr is None or hr.status not in SERVING_STATUSES:
                continue
            if hr.status == fleet_records.PENDING and hr.phase not in ("planned", "restored",
                                                                      "skipped"):
                continue
            h = self.s.inv.host(n)
            cfg = gate.config(recipe, None, h)
            ready = self.s.gates.wait(h, recipe, hr.after_tag or hr.before_tag or "", cfg,
                                      self.s.readmit_timeout,
                                      live(self.s, h, None, "loading", cancellable=False))
            if not ready.ready:
                problems.append(f"{n}: kept out of rotation: not ready ({ready.message})")
                continue
            err = self.back_in_or_record(run, h)
            if err:
                problems.append(err)
        return problems

    def states(self, hosts: Iterable[Host]) -> list[dict[str, Any]]:
        """Each host as the front door sees it, and whether fleetctl holds it out (for
        ``status``)."""
        if self.door is None:
            return []
        out = self.s.ledger.out_of_rotation()
        rows = []
        for h in hosts:
            try:
                row = self.door.state(h).to_dict()
            except FrontDoorError as e:
                row = {"host": h.name, "admin": "?", "healthy": None, "in_flight": None,
                       "detail": e.cause}
            held = out.get(h.name)
            row["held_by"] = held.rollout_id if held is not None else None
            rows.append(row)
        return rows
