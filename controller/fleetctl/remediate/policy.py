"""A recipe's ``watch:`` policy: what ``fleetctl watch --remediate`` may do to its hosts, and how
often.

```yaml
watch:
  remediate: true        # act on a breach (false: page only); --remediate turns it on too
  breaker: 3             # N remediations of one host in the window: roll it back instead
  window: 1h             # ... the window W (90s, 10m, 1h)
  recipe_breaker: 10     # remediations of the recipe's hosts in the window: stop acting, page
  floor: 1               # hosts of the recipe kept in rotation (a count, or "50%" of its hosts)
  gate: 5s               # the re-gate's load after smoke: concurrent greedy requests and the
                         # canaries for this long (0: smoke only)
  ready_timeout: 10m     # the wait for readiness after the restart
```

Every field is checked before any host is touched; a mistake is one FleetError naming the recipe,
the field and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fleetctl.durations import DurationError, parse_duration
from fleetctl.errors import FleetError

#: The watch's checks whose failure a remediation may heal: no tokens (a wedge), failed requests
#: or a server that does not answer, a canary that changed its answer, server-side errors.
REMEDIABLE = ("liveness", "probes", "canary", "server_errors")

#: The re-gate's burst of load, in seconds, when the recipe does not say (watch.gate).
DEFAULT_GATE = 5.0
#: The most a re-gate's burst may last (a re-gate is a check, not a soak).
MAX_GATE = 600.0

_FIELDS = ("remediate", "breaker", "window", "recipe_breaker", "floor", "gate", "ready_timeout")


@dataclass(frozen=True)
class Policy:
    """How remediation is bounded for one recipe's hosts."""

    remediate: bool = False
    breaker: int = 3
    window: float = 3600.0
    recipe_breaker: int = 10
    #: Hosts of the recipe that stay in rotation: a count, or a fraction of its hosts (0.5).
    floor: float = 1.0
    floor_is_fraction: bool = False
    #: Seconds of the re-gate's burst of load after the smoke (concurrent greedy requests and the
    #: canaries, ``fleetctl.soak.burst``); 0: the smoke only (readiness, identity, canaries,
    #: prompts).
    gate: float = DEFAULT_GATE
    ready_timeout: float = 600.0

    def floor_of(self, hosts: int) -> int:
        """The floor in hosts, for a recipe of ``hosts`` hosts."""
        if self.floor_is_fraction:
            return min(hosts, math.ceil(self.floor * hosts))
        return min(hosts, int(self.floor))

    def to_dict(self) -> dict[str, Any]:
        """The policy as JSON (what the ledger records with each remediation)."""
        return {"breaker": self.breaker, "window": self.window,
                "recipe_breaker": self.recipe_breaker,
                "floor": f"{self.floor:.0%}" if self.floor_is_fraction else int(self.floor),
                "gate": self.gate, "ready_timeout": self.ready_timeout}


def _bad(recipe: str, name: str, value: object, want: str, example: str) -> FleetError:
    return FleetError(f"recipe {recipe}: watch.{name} is {value!r}, not {want}",
                      fix=f"set watch.{name}, e.g. {name}: {example} (see docs/watch.md)")


def _count(raw: Mapping[str, Any], recipe: str, name: str, default: int) -> int:
    v = raw.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _bad(recipe, name, v, "a whole number of 1 or more", "3")
    return v


def _seconds(raw: Mapping[str, Any], recipe: str, name: str, default: float,
             zero: bool = False) -> float:
    v = raw.get(name, default)
    try:
        s = parse_duration(v, f"watch.{name}")
    except DurationError:
        raise _bad(recipe, name, v, "a duration", "90s, 10m or 1h") from None
    if s <= 0 and not zero:
        raise _bad(recipe, name, v, "a duration above 0", "10m")
    return s


def _gate(raw: Mapping[str, Any], recipe: str) -> float:
    s = _seconds(raw, recipe, "gate", DEFAULT_GATE, zero=True)
    if s > MAX_GATE:
        raise _bad(recipe, "gate", raw.get("gate"), f"at most {MAX_GATE:.0f}s (a few seconds of "
                   "load)", "5s")
    return s


def _floor(raw: Mapping[str, Any], recipe: str) -> tuple[float, bool]:
    v = raw.get("floor", 1)
    if isinstance(v, str) and v.strip().endswith("%"):
        try:
            pct = float(v.strip()[:-1])
        except ValueError:
            pct = -1.0
        if 0 <= pct <= 100:
            return pct / 100.0, True
    elif not isinstance(v, bool) and isinstance(v, int) and v >= 0:
        return float(v), False
    raise _bad(recipe, "floor", v, "a count of hosts or a percentage", "1 or 50%")


def from_mapping(raw: object, recipe: str) -> Policy:
    """The policy of recipe ``recipe`` from its ``watch:`` mapping (None or empty: the defaults)."""
    if raw is None:
        return Policy()
    if not isinstance(raw, Mapping):
        raise FleetError(f"recipe {recipe}: watch is a {type(raw).__name__}, not a mapping",
                         fix="write it as watch: {breaker: 3, window: 1h} (see docs/watch.md)")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise FleetError(f"recipe {recipe}: unknown watch field(s) {', '.join(unknown)}",
                         fix=f"remove them; watch reads {', '.join(_FIELDS)}")
    on = raw.get("remediate", False)
    if not isinstance(on, bool):
        raise _bad(recipe, "remediate", on, "true or false", "true")
    floor, fraction = _floor(raw, recipe)
    return Policy(remediate=on, breaker=_count(raw, recipe, "breaker", 3),
                  window=_seconds(raw, recipe, "window", 3600.0),
                  recipe_breaker=_count(raw, recipe, "recipe_breaker", 10),
                  floor=floor, floor_is_fraction=fraction,
                  gate=_gate(raw, recipe),
                  ready_timeout=_seconds(raw, recipe, "ready_timeout", 600.0))


def with_overrides(p: Policy, *, remediate: bool = False, breaker: int | None = None,
                   window: float | None = None, gate: float | None = None) -> Policy:
    """The command line's options over the recipe's policy (``--remediate`` turns it on)."""
    return replace(p, remediate=p.remediate or remediate,
                   breaker=breaker if breaker is not None else p.breaker,
                   window=window if window is not None else p.window,
                   gate=gate if gate is not None else p.gate)
