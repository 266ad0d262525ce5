"""What is wrong with a recipe, one problem a line, and the error that reports them all at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fleetctl.errors import RecipeError

#: How a check reports a problem of a recipe: ``bad(field, problem, fix)``.
Bad = Callable[[str, str, str], None]


@dataclass(frozen=True)
class RecipeProblem:
    """One thing wrong with one recipe: where, what, and how to fix it."""

    recipe: str
    field: str
    problem: str
    fix: str

    def line(self) -> str:
        """``recipe 'x', field 'y': problem (fix: ...)``."""
        return f"recipe {self.recipe!r}, {self.field}: {self.problem} (fix: {self.fix})"


class RecipeValidationError(RecipeError):
    """One or more recipes are invalid; ``problems`` lists every one."""

    def __init__(self, problems: Sequence[RecipeProblem], where: str) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p.line()}" for p in self.problems)
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in the recipes of {where}:\n{lines}")
