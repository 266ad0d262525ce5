"""The circuit breaker: remediations counted per host and per recipe in a sliding window.

Pure and bounded: each host keeps at most ``limit`` times (older ones fall out of its deque), each
recipe at most its own limit; a host's times older than the window are dropped at every look. So a
watch running for days keeps O(hosts x breaker) numbers, however many remediations it made.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


@dataclass
class Breaker:
    """Remediation times per host and per recipe, within ``window`` seconds."""

    host_limit: int
    recipe_limit: int
    window: float
    _hosts: dict[str, collections.deque[float]] = field(default_factory=dict)
    _recipes: dict[str, collections.deque[float]] = field(default_factory=dict)

    def _recent(self, d: collections.deque[float], now: float) -> int:
        while d and d[0] <= now - self.window:
            d.popleft()
        return len(d)

    def host_count(self, host: str, now: float) -> int:
        """Remediations of ``host`` within the window ending at ``now``."""
        d = self._hosts.get(host)
        return self._recent(d, now) if d is not None else 0

    def recipe_count(self, recipe: str, now: float) -> int:
        """Remediations of the recipe's hosts within the window ending at ``now``."""
        d = self._recipes.get(recipe)
        return self._recent(d, now) if d is not None else 0

    def host_open(self, host: str, now: float) -> bool:
        """The host had its ``host_limit`` remediations in the window: the next is a rollback."""
        return self.host_count(host, now) >= self.host_limit

    def recipe_open(self, recipe: str, now: float) -> bool:
        """The recipe's hosts had ``recipe_limit`` remediations in the window: no more for now."""
        return self.recipe_count(recipe, now) >= self.recipe_limit

    def record(self, host: str, recipe: str, now: float) -> None:
        """One remediation of ``host`` (of ``recipe``) at ``now``."""
        self._hosts.setdefault(host, collections.deque(maxlen=self.host_limit)).append(now)
        self._recipes.setdefault(recipe, collections.deque(maxlen=self.recipe_limit)).append(now)

    def reset(self, host: str) -> None:
        """Forget ``host``'s count (it was rolled back to a known-good, a fresh start)."""
        self._hosts.pop(host, None)

    def size(self) -> int:
        """Times held in all (what a test of bounded memory reads)."""
        return sum(len(d) for d in self._hosts.values()) + sum(
            len(d) for d in self._recipes.values())
