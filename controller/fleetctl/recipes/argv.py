"""Reading vLLM's command line: a flag's value and whether it is given (as vLLM's parser reads it).

vLLM's parser reads ``_`` in a long flag's name as ``-`` (``--api_key`` is ``--api-key``, up to
the first ``.``: ``--speculative_config.model`` is one key of ``--speculative-config``), and
argparse takes any unambiguous abbreviation (``--trust-remote`` is ``--trust-remote-code``).
Every check of a recipe's flags reads them through :func:`flag_name`, so a spelling vLLM accepts
is never one the checks miss.
"""

from __future__ import annotations

from collections.abc import Sequence


def flag_name(arg: str) -> str:
    """The flag ``arg`` names as vLLM's parser reads it: the part before ``=``, for a ``--`` flag
    with ``_`` as ``-`` up to the first ``.`` (``--api_key=x`` -> ``--api-key``)."""
    key = arg.split("=", 1)[0]
    if not key.startswith("--"):
        return key
    head, dot, tail = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def flag_value(args: Sequence[str], name: str) -> str | None:
    """The value given to ``name`` in an argv (last one wins, as in argparse)."""
    value: str | None = None
    for i, a in enumerate(args):
        if a.startswith("-") and flag_name(a) == name:
            following = args[i + 1] if i + 1 < len(args) else ""
            value = a.split("=", 1)[1] if "=" in a else following
    return value


def has_flag(args: Sequence[str], name: str) -> bool:
    """True when ``name`` appears in an argv, with or without ``=value``, in any spelling vLLM
    reads as it."""
    return any(a.startswith("-") and flag_name(a) == name for a in args)


def shorthand(arg: str, names: Sequence[str]) -> tuple[str, str] | None:
    """(the flag of ``names``, how) when ``arg`` reaches it in a form other than its full name:
    an abbreviation argparse would expand (``--trust-remote``), or one key of a JSON flag
    (``--speculative-config.model``); None otherwise."""
    if not arg.startswith("--"):
        return None
    key = flag_name(arg)
    base = key.split(".", 1)[0]
    if "." in key and base in names:
        return base, f"sets one key of {base}"
    if key in names or len(key) <= 2:
        return None
    for n in names:
        if n.startswith(key):
            return n, f"abbreviates {n}"
    return None
