"""``fleetctl rollback``: parsing and rendering only (the engine puts each host back on its own
last known-good, in its own recipe)."""

from __future__ import annotations

from collections.abc import Mapping

import click

from fleetctl.cli.output import Ctx, json_option, pass_ctx, stream_options
from fleetctl.cli.rollout import (
    _finish,
    _need_terminal,
    _rollback_question,
    _watched,
    take_over_option,
)
from fleetctl.rollout.results import RollbackOptions


@click.command("rollback")
@click.option(
    "--to", "to", help="Tag to go to, in each host's own recipe (default: each host's last "
    "known-good: the newest that passed a full gate there, or served before fleetctl came, other "
    "than what it serves now).",
)
@click.option("--limit", "-l", help="Ansible-style host pattern.")
@click.option("--recipe", "-r", help="Recipe to go back in (default: the one each host served that "
              "version with, which undoes a model switch, else its own).")
@click.option(
    "--max-unavailable", help="Hosts restarted at once, count or % (default: from --min-available)."
)
@click.option("--min-available", help="Hosts kept serving, count or % of the selected hosts "
              "(default: fleetctl_min_available, else 75%).")
@click.option("--webhook", help="https URL receiving JSON events.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@take_over_option
@stream_options
@json_option
@pass_ctx
def rollback(
    ctx: Ctx,
    to: str | None,
    limit: str | None,
    recipe: str | None,
    max_unavailable: str | None,
    min_available: str | None,
    webhook: str | None,
    yes: bool,
    take_over: bool,
) -> None:
    """Return hosts to their previous version (readiness + smoke, no full soak).

    Every host of the last rollout or rollback (or --limit) goes back, as many at once as the
    capacity floor allows (each recipe its own); a host whose target fails is put back on what it
    served; skipped hosts are listed with why. A host this ledger never touched goes back to the
    last known-good recorded on the host. A paused or interrupted rollout is aborted by it.
    """
    _need_terminal(ctx, yes, f"roll back to {to}" if to else "roll back")

    def confirm(targets: Mapping[str, str | None]) -> None:
        if not yes:
            ctx.ask(_rollback_question(targets, to))

    with _watched(ctx, "rollback", take_over) as eng:
        r = eng.rollback(RollbackOptions(to=to, limit=limit, recipe_name=recipe,
                                         max_unavailable=max_unavailable,
                                         min_available=min_available, webhook=webhook),
                         confirm=confirm)
    _finish(ctx, r)


commands: list[click.Command] = [rollback]
