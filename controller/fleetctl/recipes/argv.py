"""Reading vLLM's command line: a flag's value and whether it is given (as argparse reads it)."""

from __future__ import annotations

from collections.abc import Sequence


def flag_value(args: Sequence[str], name: str) -> str | None:
    """The value given to ``name`` in an argv (last one wins, as in argparse)."""
    value: str | None = None
    for i, a in enumerate(args):
        if a == name:
            value = args[i + 1] if i + 1 < len(args) else ""
        elif a.startswith(name + "="):
            value = a[len(name) + 1 :]
    return value


def has_flag(args: Sequence[str], name: str) -> bool:
    """True when ``name`` appears in an argv, with or without ``=value``."""
    return any(a == name or a.startswith(name + "=") for a in args)
