"""The one exception root of fleetctl and the process exit codes.

The core raises :class:`FleetError` (or a subclass); ``fleetctl.cli`` is the only
place that turns it into a message and an exit code.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes of every fleetctl command (documented in README.md)."""

    OK = 0
    #: The operation ran and some host or check failed (a soak verdict of fail,
    #: a provision with failed hosts, a rollout stopped by a gate).
    FAILED = 1
    #: Could not run or could not decide: bad input, unreachable fleet, an
    #: inconclusive soak, a paused rollout.
    INCONCLUSIVE = 2
    #: Bad usage (click's own code for wrong flags).
    USAGE = 3
    #: Another operation holds the fleet's lock.
    LOCKED = 4
    #: A rollout went through every wave, but some hosts failed within its
    #: --failure-budget (they were rolled back or are reported down).
    COMPLETED_WITH_FAILURES = 5
    #: A bug in fleetctl: the traceback is saved and its path printed.
    INTERNAL = 70


class FleetError(Exception):
    """An error the operator can act on: what failed, where, and how to fix it.

    ``host`` names the host (or None when the error is not about one host),
    ``cause`` says what is wrong and ``fix`` says what to do about it.
    """

    exit_code: ExitCode = ExitCode.INCONCLUSIVE

    def __init__(
        self,
        cause: str,
        *,
        host: str | None = None,
        fix: str | None = None,
        exit_code: ExitCode | None = None,
    ) -> None:
        self.cause = cause
        self.host = host
        self.fix = fix
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(self.message())

    def message(self) -> str:
        """The one-line message: ``host: cause (fix: ...)``."""
        text = f"{self.host}: {self.cause}" if self.host else self.cause
        if self.fix:
            text += f" (fix: {self.fix})"
        return text


class InventoryError(FleetError):
    """The inventory (hosts, groups, recipes) is malformed or names something unknown."""


class RecipeError(FleetError):
    """A serving recipe breaks its schema or one of the rules in docs/domain.md#recipes."""


class HostUnreachable(FleetError):
    """A host did not answer over SSH within its timeout."""


class LockedError(FleetError):
    """Another operation holds the fleet's lock."""

    exit_code = ExitCode.LOCKED
