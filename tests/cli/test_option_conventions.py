"""One convention per thing on the command line, checked over the whole click tree (every command
and subcommand, as ``fleetctl --help`` reaches them):

- no subcommand has an option that a global one (``fleetctl -i PATH ...``) already spells: ``-i``
is the
  inventory everywhere, so no command may read ``watch -i 60s`` as something else;
- every option that takes a length of time (a duration, an interval, a timeout) takes it with units
  (``180s``, ``3m``, ``1h``) through the one parser, and a bare number as seconds, and says so in
  its help.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
import pytest

from fleetctl.cli.main import cli

#: An option takes a length of time when its name or its help says so.
TIME_NAME = re.compile(
    r"duration|interval|timeout|deadline|delay|period|grace|ttl|^soak$|^bake$|_s$|seconds"
)
TIME_HELP = re.compile(r"\bseconds\b|\bhow long\b|\btime between\b|\blength of\b", re.I)


def commands(
    cmd: click.Command = cli, path: str = "fleetctl"
) -> Iterator[tuple[str, click.Command]]:
    """Every command under ``cmd`` (itself first), with the words that call it."""
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from commands(sub, f"{path} {name}")


def options(cmd: click.Command) -> list[click.Option]:
    return [p for p in cmd.params if isinstance(p, click.Option)]


def names(opt: click.Option) -> set[str]:
    return set(opt.opts) | set(opt.secondary_opts)


def shadowed(root: click.Group) -> list[str]:
    """``<command>: <option> (global: <its global>)`` for each subcommand option spelled like a
    global one."""
    globals_ = {n: "/".join(o.opts) for o in options(root) for n in names(o)}
    return [
        f"{path}: {', '.join(sorted(names(o) & globals_.keys()))} "
        f"(global: {', '.join(sorted({globals_[n] for n in names(o) & globals_.keys()}))})"
        for path, cmd in commands(root)
        if cmd is not root
        for o in options(cmd)
        if names(o) & globals_.keys()
    ]


def time_options(root: click.Command = cli) -> list[tuple[str, click.Option]]:
    return [
        (f"{path} {max(o.opts, key=len)}", o)
        for path, cmd in commands(root)
        for o in options(cmd)
        if not o.is_flag and (TIME_NAME.search(o.name or "") or TIME_HELP.search(o.help or ""))
    ]


def test_no_subcommand_option_shadows_a_global_one() -> None:
    wrong = shadowed(cli)
    assert not wrong, (
        "subcommand options spelled like a global option of `fleetctl` (rename the subcommand's, "
        "e.g. --interval without -i):\n" + "\n".join(wrong)
    )


def test_the_shadow_check_sees_one() -> None:
    @click.group()
    @click.option("-i", "--inventory")
    def root(inventory: str | None) -> None: ...

    @root.command()
    @click.option("--interval", "-i")
    def watch(interval: str | None) -> None: ...

    assert shadowed(root) == ["fleetctl watch: -i (global: -i/--inventory)"]


def test_the_time_options_are_found() -> None:
    found = {where for where, _ in time_options()}
    assert {
        "fleetctl lab traffic --duration",
        "fleetctl watch --interval",
        "fleetctl watch --duration",
        "fleetctl soak --duration",
        "fleetctl soak --ready-timeout",
        "fleetctl rollout --soak",
        "fleetctl rollout --bake",
        "fleetctl rollout --ready-timeout",
        "fleetctl status --timeout",
    } <= found


@pytest.mark.parametrize("where, opt", time_options(), ids=[w for w, _ in time_options()])
def test_each_time_option_takes_units_and_bare_seconds(where: str, opt: click.Option) -> None:
    ctx = click.Context(cli)
    got = {}
    for text in ("180s", "3m", "180"):
        try:
            got[text] = opt.type.convert(text, opt, ctx)
        except click.BadParameter as e:
            got[text] = f"refused: {e.message}"
    assert got == {"180s": 180.0, "3m": 180.0, "180": 180.0}, (
        f"{where} reads 180s / 3m / 180 as {got}"
    )
    assert "a bare number is seconds" in (opt.help or ""), (
        f"{where}: its help should say 'a bare number is seconds'"
    )
    with pytest.raises(click.BadParameter, match="not a duration"):
        opt.type.convert("soon", opt, ctx)
