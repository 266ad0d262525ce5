"""``fleetctl ledger``: which ledger this fleet uses (local SQLite or a shared PostgreSQL) and who
holds its lock."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from fleetctl import inventory, paths
from fleetctl.cli.output import Ctx, json_option, pass_ctx, when
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records


def info_json(info: fleet_records.LedgerInfo) -> dict[str, Any]:
    """The ``--json`` form (the holder with its liveness, times in UTC)."""
    h = info.holder
    return {
        "backend": info.backend,
        "where": info.where,
        "fleet": info.fleet,
        "schema_version": info.schema_version,
        "rollouts": info.rollouts,
        "lock": None
        if h is None
        else {
            "rollout_id": h.rollout_id,
            "pid": h.pid,
            "hostname": h.hostname,
            "since": when(h.acquired_at, utc=True),
            "alive": h.alive,
        },
    }


@click.command("ledger")
@json_option
@pass_ctx
def ledger_cmd(ctx: Ctx) -> None:
    """Where this fleet's history is kept and who holds the fleet's lock (see docs/ledger.md)."""
    inv = inventory.load(ctx.inventory)
    with fleet_ledger.open_for(inv, paths.state_dir(inv.path)) as led:
        info = led.info()

    def render(con: Console) -> None:
        con.print(f"ledger: {info.backend} {info.where}", highlight=False, markup=False)
        con.print(
            f"fleet: {info.fleet}; schema {info.schema_version}; {info.rollouts} rollout(s) "
            "recorded",
            highlight=False,
            markup=False,
        )
        h = info.holder
        if h is None:
            con.print("lock: free", highlight=False, markup=False)
            return
        state = "held" if h.alive else "left by a dead controller (the next rollout takes it over)"
        con.print(
            f"lock: {state}: rollout {h.rollout_id}, controller pid {h.pid} on {h.hostname}, since "
            f"{when(h.acquired_at, utc=True)}",
            highlight=False,
            markup=False,
        )

    ctx.emit(info_json(info), render)


commands: list[click.Command] = [ledger_cmd]
