"""``fleetctl stage`` (weights into /opt) and ``fleetctl recipes`` (list and validate the
recipes)."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from fleetctl import inventory as inv
from fleetctl import paths
from fleetctl import recipes as rec
from fleetctl.cli import live
from fleetctl.cli.output import (
    Col,
    Ctx,
    fit_table,
    json_option,
    pass_ctx,
    stream_options,
    to_jsonable,
)
from fleetctl.errors import ExitCode, FleetError
from fleetctl.progress import Tee
from fleetctl.stage import StageResult, human_bytes, stage
from fleetctl.stage_fleet import FleetStage, stage_each

_STATE_COLOUR = {"staged": "green", "current": "green", "refused": "red", "not staged": "yellow"}


def _render_stage(r: StageResult) -> Any:
    def render(out: Console) -> None:
        out.print(f"recipe {r.recipe}  source {r.source}  run {r.run_id}  {r.elapsed:.1f}s")
        rows = []
        for h in r.hosts.values():
            colour = "green" if h.ok else "red"
            sets = (
                ", ".join(
                    f"{s.role} [{_STATE_COLOUR.get(s.state, 'white')}]{s.state}[/]" for s in h.sets
                )
                or "-"
            )
            who = f"{h.name} (seed)" if h.seed else h.name
            copied = human_bytes(h.bytes_copied) if h.bytes_copied else "-"
            if h.copied_from:
                copied += f" from {h.copied_from}" + (" (fabric)" if h.via == "fabric" else "")
            if h.mb_per_s:
                copied += f" ({h.mb_per_s} MB/s)"
            rows.append([who, f"[{colour}]{h.status}[/]", sets, copied, Text(h.message or "")])
        out.print(
            fit_table(
                out.width,
                [
                    "host",
                    "status",
                    Col("sets", flex=True, min=14),
                    Col("copied", drop=1),
                    Col("message", flex=True),
                ],
                rows,
            )
        )
        for h in r.hosts.values():
            for s in h.sets:
                if s.problems:
                    out.print(
                        f"[red]{h.name} {s.role}[/] {escape(f'{s.repo}@{s.revision}')} refused:"
                    )
                    for p in s.problems:
                        out.print(f"  - {p}", highlight=False, markup=False)
                    bad = [f for f in s.files if f.status != "ok"]
                    if bad:
                        out.print(
                            "    files: " + ", ".join(f"{f.path} ({f.size} B)" for f in bad),
                            highlight=False,
                        )
        if r.seed and r.fetch_seconds > 0:
            out.print(
                f"fetched {human_bytes(r.fetched_bytes)} once on {r.seed} in "
                f"{r.fetch_seconds:.1f}s "
                f"({r.fetched_bytes / 1e6 / r.fetch_seconds:.1f} MB/s)"
            )
        if r.rounds:
            ups = r.uploads()
            out.print(
                f"copied in a tree: {r.rounds} round(s), the seed served "
                f"{ups.get(r.seed or '', 0)} host(s), "
                f"{len(ups)} host(s) served others"
            )
        out.print(f"artifacts {r.artifacts_dir}")
    return render


@click.command("stage")
@click.option(
    "--recipe",
    "-r",
    metavar="NAME",
    help="Recipe to stage on every selected host (default: each host's own fleetctl_recipe, "
         "each recipe's weights on its hosts).",
)
@click.option("--limit", "-l", metavar="PATTERN", help="Only these hosts (Ansible pattern).")
@click.option(
    "--source",
    type=click.Choice(["mirror", "hub", "local"]),
    help="Where the bytes come from (default: the recipe's, else the mirror if the inventory has "
         "one).",
)
@click.option("--local-dir", type=click.Path(file_okay=False, exists=True),
              help="With --source local: a directory holding <repo>/<revision>/ per weight set.")
@click.option(
    "--headroom-gb",
    type=click.FloatRange(0),
    help="Free disk to keep beyond the weights (default 5).",
)
@click.option("--checksums", is_flag=True, help="Re-hash every received file against the manifest.")
@stream_options
@json_option
@pass_ctx
def stage_cmd(
    ctx: Ctx,
    recipe: str | None,
    limit: str | None,
    source: str | None,
    local_dir: str | None,
    headroom_gb: float | None,
    checksums: bool,
) -> None:
    """Stage model weights into /opt: fetched once, verified, swapped in atomically.

    Without --recipe each host gets the weights of the recipe it is configured to serve
    (fleetctl_recipe in its host_vars or group_vars): one tree of copies per recipe.

    Recipe by recipe, one seed host fetches from the mirror or the HF hub ($HF_TOKEN); every host
    that verified its copy serves 2 more per round (O(log N) rounds, over the fabric between a
    unit's members), a failed copy retried from another source. Each copy is verified (LFS
    pointers, symlinks, shards, headers, bad layouts, drafter date) then swapped in atomically;
    sets already staged are not copied again. Exits 1 when some host failed.
    """
    inventory = inv.load(ctx.inventory)
    result: StageResult | FleetStage
    with live.streams(ctx, "stage", paths.state_dir(inventory.path), inventory) as sink, \
            ctx.progress("stage", ("phase", "message")) as shown:
        kw: dict[str, Any] = dict(limit=limit, source=source, local_dir=local_dir,
                                  headroom_gb=headroom_gb, checksums=checksums,
                                  progress=Tee(sink, shown))
        result = stage(inventory, recipe, **kw) if recipe else stage_each(inventory, **kw)
    if isinstance(result, FleetStage):
        ctx.emit(fleet_stage_json(result), _render_fleet_stage(result))
    else:
        ctx.emit(result, _render_stage(result))
    if not result.ok:
        raise click.exceptions.Exit(int(ExitCode.FAILED))


def fleet_stage_json(r: FleetStage) -> dict[str, Any]:
    """``stage --json`` without --recipe: the run, and each recipe's stage as ``--recipe`` gives
    it (its hosts, seed, source, tree)."""
    return {"run_id": r.run_id, "ok": r.ok, "elapsed": r.elapsed,
            "failed_hosts": r.failed_hosts, "recipes": to_jsonable(dict(r.recipes))}


def _render_fleet_stage(r: FleetStage) -> Any:
    def render(out: Console) -> None:
        for i, one in enumerate(r.recipes.values()):
            if i:
                out.print()
            _render_stage(one)(out)
        if len(r.recipes) > 1:
            word = "[green]ok[/]" if r.ok else f"[red]{len(r.failed_hosts)} host(s) failed[/]"
            out.print(f"{len(r.recipes)} recipes on {len(r.hosts)} host(s) in {r.elapsed:.1f}s: "
                      f"{word}")
    return render


@click.command("recipes")
@json_option
@pass_ctx
def recipes_cmd(ctx: Ctx) -> None:
    """List the inventory's recipes and serving units, validated (every problem listed, exit 2).

    Each problem is named with its recipe, field and fix, among them a recipe whose node count
    differs from the unit it is placed on (docs/units.md).
    """
    inventory = inv.load(ctx.inventory)
    recipes = rec.load_recipes(inventory)
    default = inventory.vars.get("fleetctl_recipe")
    # Every host's recipe (the fleet's default or its own fleetctl_recipe) must exist: a typo here
    # is otherwise found only when a rollout reaches that host.
    unknown = sorted(
        {
            (h.name, str(h.vars.get("fleetctl_recipe")))
            for h in inventory.hosts.values()
            if h.vars.get("fleetctl_recipe") and str(h.vars.get("fleetctl_recipe")) not in recipes
        }
    )
    if unknown:
        names = ", ".join(f"{host} ({name!r})" for host, name in unknown[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        raise FleetError(f"fleetctl_recipe names no recipe of {inventory.path} on {names}{more}",
                         fix=f"use one of: {', '.join(recipes)}")

    placement = rec.placement_problems(inventory, recipes)
    if len(placement) == 1:
        raise placement[0]
    if placement:
        raise FleetError(
            f"{len(placement)} recipes are placed on units (or hosts) of another size:\n"
            + "\n".join(f"  - {p.message()}" for p in placement),
            fix="match each recipe's topology.nodes to the hosts it is placed on",
        )
    units: dict[str, dict[str, Any]] = {}
    for u in inventory.units.values():
        name = inventory.hosts[u.head].vars.get("fleetctl_recipe", default)
        r = recipes.get(str(name)) if name else None
        units[u.name] = {
            "members": list(u.members),
            "head": u.head,
            "recipe": name,
            "fabric": {m: to_jsonable(f) for m, f in u.fabric.items()},
            "busbw_floor_gbs": u.busbw_floor_gbs,
            # what each member runs, in the order they start: the rendered command and env
            "launch": [to_jsonable(r.launch(u, m)) for m in r.topology.start_order(u)] if r else [],
        }

    def render(out: Console) -> None:
        rows = []
        for r in recipes.values():
            name = f"{r.name} (default)" if r.name == default else r.name
            weights = "; ".join(f"{w.role}: {w.repo}@{w.revision}" for w in r.weights)
            t = r.topology
            nodes = str(t.nodes) if t.nodes == 1 else f"{t.nodes} {t.launch}"
            rows.append([name, Text(r.image), Text(" ".join(r.served_model_names)), Text(weights),
                         str(len(r.vllm_args)), nodes])
        # One line per recipe: `--json` has every weight set's path and the full flags.
        out.print(
            fit_table(
                out.width,
                [
                    "recipe",
                    Col("image", flex=True, min=16, drop=1),
                    Col("served names", flex=True, drop=2),
                    Col("weights", flex=True, min=20),
                    "flags",
                    Col("nodes", drop=3),
                ],
                rows,
            )
        )
        for name, u in units.items():
            out.print(
                Text(
                    f"unit {name}: {', '.join(u['members'])} (head {u['head']}), recipe "
                    f"{u['recipe']}"
                )
            )

    ctx.emit({"default": default, "recipes": recipes, "units": units}, render)


commands: list[click.Command] = [stage_cmd, recipes_cmd]
