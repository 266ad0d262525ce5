"""The fleet's front door: the load balancer or proxy that sends users' requests to the hosts.

A rollout takes a host out of rotation before it stops the host's server (``drain``), waits until
the requests the door already sent there are answered (``in_flight``), and puts the host back
(``readmit``) only after its gate, then checks that the door sees it healthy (``state``).

Backends (chosen per fleet by the inventory variable ``fleetctl_front_door``, see
:func:`from_inventory` and docs/frontdoor.md):

- ``haproxy``: HAProxy's runtime API (``frontdoor/haproxy.py``);
- ``litellm``: a LiteLLM proxy's management API (``frontdoor/litellm.py``);
- ``command``: a shell command given the host, its address and the action
(``frontdoor/command.py``).

No ``fleetctl_front_door``: :func:`from_inventory` returns None and a rollout behaves as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetctl.errors import FleetError
from fleetctl.inventory import Host, Inventory

#: The inventory variable that configures the front door (a mapping with ``type`` and its settings).
VARIABLE = "fleetctl_front_door"

#: What the door does with a host: in rotation, no new requests, or out entirely.
READY, DRAIN, MAINT = "ready", "drain", "maint"


class FrontDoorError(FleetError):
    """The front door refused or did not answer a request, or its configuration is wrong."""


@dataclass(frozen=True)
class DoorState:
    """A host as the front door sees it.

    ``admin``: ``ready`` (in rotation), ``drain`` (no new requests), ``maint`` (out) or ``absent``
    (the door does not know the host); ``healthy``: the door's own health check passes (None: the
    door has no check); ``in_flight``: requests the door has open to the host (None: it cannot
    tell); ``detail``: the door's own words (HAProxy's status column, LiteLLM's health entry).
    """

    host: str
    admin: str
    healthy: bool | None
    in_flight: int | None
    detail: str = ""

    @property
    def in_rotation(self) -> bool:
        return self.admin == READY and self.healthy is not False

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "admin": self.admin,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Drained:
    """What ``drain`` took away, enough for ``readmit`` to put it back (kept in the ledger as
    JSON)."""

    host: str
    memo: Mapping[str, Any] = field(default_factory=dict)


class FrontDoor(Protocol):
    """One fleet's front door. Every call is bounded by the backend's own timeout."""

    #: ``haproxy``, ``litellm`` or ``command``.
    kind: str

    def drain(self, host: Host) -> Drained:
        """Stop sending new requests to ``host``; requests in flight go on."""
        ...

    def in_flight(self, host: Host) -> int | None:
        """Requests the door has open to ``host`` now (None: this door cannot tell)."""
        ...

    def readmit(self, host: Host, drained: Drained | None = None) -> None:
        """Put ``host`` back in rotation (``drained``: what :meth:`drain` returned, if known)."""
        ...

    def state(self, host: Host) -> DoorState:
        """``host`` as the door sees it now."""
        ...


def states_of(door: FrontDoor, hosts: Sequence[Host]) -> dict[str, DoorState]:
    """Every host of ``hosts`` as the door sees it now: one read of the whole pool when the backend
    has one (HAProxy: ``states``), else one ``state`` per host. A host the door does not answer
    about is ``admin="?"`` with the door's words in ``detail`` (the caller decides what an unknown
    host
    means)."""
    bulk = getattr(door, "states", None)
    if callable(bulk):
        return dict(bulk(hosts))
    out: dict[str, DoorState] = {}
    for h in hosts:
        try:
            out[h.name] = door.state(h)
        except FrontDoorError as e:
            out[h.name] = DoorState(h.name, "?", None, None, e.cause)
    return out


def settings_of(inventory: Inventory) -> Mapping[str, Any] | None:
    """The ``fleetctl_front_door`` mapping of the inventory (group ``all``), or None."""
    raw = inventory.vars.get(VARIABLE)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise FrontDoorError(
            f"{VARIABLE} in {inventory.path} is a {type(raw).__name__}, not a mapping",
            fix=f"write it as {VARIABLE}: {{type: haproxy, socket: /run/haproxy/admin.sock, "
            "backend: vllm}} (see docs/frontdoor.md)",
        )
    return raw


def from_inventory(inventory: Inventory) -> FrontDoor | None:
    """The fleet's front door as its inventory configures it, or None when it configures none.

    The settings are checked here, before any host is touched: an unknown type, a missing or
    mistyped field is one :class:`FrontDoorError` naming the variable, the field and the fix.
    """
    raw = settings_of(inventory)
    if raw is None:
        return None
    return build(raw, where=f"{VARIABLE} in {inventory.path}")


def build(raw: Mapping[str, Any], where: str = VARIABLE) -> FrontDoor:
    """A front door from its settings mapping (``type`` plus the backend's fields)."""
    from fleetctl.frontdoor import command, haproxy, litellm

    kinds: dict[str, Callable[[Settings], FrontDoor]] = {
        "haproxy": haproxy.from_settings,
        "litellm": litellm.from_settings,
        "command": command.from_settings,
    }
    kind = raw.get("type")
    if kind not in kinds:
        raise FrontDoorError(
            f"{where}: type is {kind!r}, not one of {', '.join(sorted(kinds))}",
            fix=f"set {VARIABLE}.type to haproxy, litellm or command (see docs/frontdoor.md)",
        )
    settings = Settings(dict(raw), where, str(kind))
    door = kinds[str(kind)](settings)
    settings.refuse_unknown()
    return door


class Settings:
    """A backend's settings, read field by field; each mistake is one message naming the field."""

    def __init__(self, raw: dict[str, Any], where: str, kind: str) -> None:
        self.raw, self.where, self.kind = raw, where, kind
        self.seen = {"type"}

    def _bad(self, name: str, what: str, example: str) -> FrontDoorError:
        return FrontDoorError(
            f"{self.where}: {name} {what}", fix=f"set {VARIABLE}.{name}, e.g. {name}: {example}"
        )

    def text(
        self, name: str, example: str, default: str | None = None, required: bool = True
    ) -> str | None:
        self.seen.add(name)
        value = self.raw.get(name, default)
        if value is None:
            if required:
                raise self._bad(name, f"is missing (the {self.kind} front door needs it)", example)
            return None
        if not isinstance(value, str) or not value.strip():
            raise self._bad(name, f"is {value!r}, not a non-empty string", example)
        return value

    def number(self, name: str, default: float, example: str) -> float:
        self.seen.add(name)
        value = self.raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise self._bad(name, f"is {value!r}, not a number of seconds above 0", example)
        return float(value)

    def mapping(self, name: str, example: str) -> dict[str, str]:
        self.seen.add(name)
        value = self.raw.get(name) or {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in value.items()):
            raise self._bad(name, f"is {value!r}, not a mapping of host name to name", example)
        return dict(value)

    def refuse_unknown(self) -> None:
        unknown = sorted(set(self.raw) - self.seen)
        if unknown:
            raise FrontDoorError(
                f"{self.where}: unknown field(s) {', '.join(unknown)} for the {self.kind} front "
                "door",
                fix=f"remove them; the {self.kind} front door reads {', '.join(sorted(self.seen))}",
            )
