"""``fleetctl rollout``, ``rollout abort``, ``rollback`` and ``history``: parsing and rendering
only."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from fleetctl import inventory, paths
from fleetctl.cli import live
from fleetctl.cli.history import history_json, remediation_cell, what
from fleetctl.cli.output import (
    Col,
    Ctx,
    Duration,
    fit_table,
    json_option,
    pass_ctx,
    short_digest,
    short_tag,
    stream_options,
    when,
)
from fleetctl.errors import ExitCode, FleetError
from fleetctl.rollout.api import Engine
from fleetctl.rollout.groups import FleetPlan, Switch
from fleetctl.rollout.plan import Plan
from fleetctl.rollout.rejected import from_records
from fleetctl.rollout.results import Options, RolloutResult
from fleetctl.state import ledger as fleet_ledger
from fleetctl.state import records as fleet_records

#: What ``rollout`` prints (and returns with --json) when its plan changes no host.
NOTHING_TO_DO = "nothing-to-do"

_short = short_digest


def _span(seconds: float) -> str:
    """``4h 05m``, ``14m 30s``, ``45s``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{s}s"


def step_sizes(steps: list[list[str]] | tuple[tuple[str, ...], ...]) -> str:
    """``1, 4 x 4, 3``: the size of each step, runs of one size folded."""
    runs: list[tuple[int, int]] = []
    for st in steps:
        if runs and runs[-1][0] == len(st):
            runs[-1] = (len(st), runs[-1][1] + 1)
        else:
            runs.append((len(st), 1))
    return ", ".join(f"{n} x {size}" if n > 1 else str(size) for size, n in runs)


def render_fleet_plan(fp: FleetPlan, con: Console) -> None:
    """Every recipe group's plan (:func:`render_plan`), then the hosts left out and why; a model
    switch is shown in its group's table and named under it (``switch: A → B``)."""
    switches = {sw.host: sw for sw in fp.switches}
    for p in fp.plans:
        render_plan(p, con, switches)
    for lf in fp.left:
        con.print(f"  recipe {lf.recipe}: skipped {', '.join(lf.hosts)} ({lf.why})",
                  highlight=False, markup=False)


def render_plan(p: Plan, con: Console, switches: Mapping[str, Switch] | None = None) -> None:
    """The plan (dry run, and before confirmation): the pinned tag and digest, how many hosts go at
    once and why, the steps and the expected wall time, then what each host runs now and its wave
    and step (``switch`` for a host the plan moves to another model, named under the table)."""
    switches = switches or {}
    con.print(f"[bold]plan[/]: recipe {p.recipe}, {p.image}:{p.tag} ({p.digest})")
    con.print(f"  requested {p.requested!r}; pulled as {p.pull_ref}")
    con.print(f"  {len(p.waves)} wave(s), failure budget {p.failure_budget}", highlight=False)
    con.print(
        f"  {p.capacity.describe() if p.capacity else f'{p.max_unavailable} at a time'}",
        highlight=False,
    )
    steps = p.steps()
    con.print(f"  steps: {step_sizes(steps) or '-'} host(s)", highlight=False)
    if p.estimate is not None:
        e = p.estimate
        con.print(
            f"  expected {_span(e.seconds)}: {len(steps)} step(s) x ({_span(e.load_seconds)} load "
            "+ "
            f"{_span(e.soak_seconds)} soak), after the pulls",
            highlight=False,
        )
        con.print(f"    ({e.basis})", highlight=False)
    rows = [
        [
            h.host,
            str(h.wave + 1) if h.wave >= 0 else "-",
            str(h.step + 1) if h.step >= 0 else "-",
            short_tag(h.current_tag) if h.current_tag else "(nothing)",
            _short(h.current_digest),
            "switch" if h.host in switches else h.action,
        ]
        for h in p.hosts
    ]
    con.print(
        fit_table(
            con.width,
            [
                "host",
                "wave",
                Col("step", drop=1),
                "serves now",
                Col("digest now", drop=2),
                "action",
            ],
            rows,
        )
    )
    for h in p.hosts:
        if h.host in switches:
            con.print(f"  {h.host}: {switches[h.host].describe()}", highlight=False, markup=False)


def render_result(r: RolloutResult, con: Console) -> None:
    """Per-host outcome table and the one-line conclusion."""
    if r.status == "planned" and r.groups is not None:
        render_fleet_plan(r.groups, con)
        return
    if r.status == "planned" and r.plan is not None:
        render_plan(r.plan, con)
        return
    rows = [
        [
            h.host,
            str(h.wave + 1) if h.wave >= 0 else "-",
            h.status,
            h.phase,
            h.before_tag or "-",
            h.after_tag or "-",
            Text(h.error or h.verdict or ""),
        ]
        for h in r.hosts
    ]
    # At 80 columns the phase (the status says as much), the wave and the previous tag give way;
    # the error is cut, and printed whole below with each failed check.
    con.print(
        fit_table(
            con.width,
            [
                "host",
                Col("wave", drop=2),
                "status",
                Col("phase", drop=3),
                Col("before", drop=1),
                "after",
                Col("verdict / error", flex=True, min=16),
            ],
            rows,
            title=f"{r.kind} {r.id}: {r.status}",
        )
    )
    colour = {
        fleet_records.COMPLETED: "green",
        fleet_records.PAUSED: "yellow",
        fleet_records.COMPLETED_WITH_FAILURES: "yellow",
    }.get(r.status, "red")
    if (
        r.status == fleet_records.COMPLETED
        and r.hosts
        and all(h.status == fleet_records.SKIPPED for h in r.hosts)
    ):
        con.print(
            f"{r.kind}: nothing to do ({count_hosts(len(r.hosts))} skipped, why below)",
            highlight=False,
            markup=False,
        )
    else:
        con.print(
            f"[{colour}]{r.kind} {r.status}[/] {r.tag or ''} {_short(r.digest)} in {r.seconds:.0f}s"
            + (f": {escape(r.error)}" if r.error else ""),
            highlight=False,
        )
    for h in r.hosts:
        for c in h.failed_checks:
            con.print(f"  {h.host}: {c}", highlight=False, markup=False)
        if h.recipe and h.before_recipe and h.recipe != h.before_recipe:
            con.print(f"  {h.host}: switch: {h.before_recipe} → {h.recipe}", highlight=False,
                      markup=False)
    # Skip reasons are cut in the table at 80 columns; they are why a host was left alone.
    for h in r.hosts:
        if h.status == fleet_records.SKIPPED and h.verdict:
            con.print(f"  {h.host}: {h.verdict}", highlight=False, markup=False)
    failed = [h.host for h in r.hosts
              if h.status in (fleet_records.HOST_FAILED, fleet_records.ROLLED_BACK)]
    if r.status == fleet_records.PAUSED:
        con.print("  continue with `fleetctl rollout --resume`, undo with `fleetctl rollout abort`")
    elif r.status == fleet_records.COMPLETED_WITH_FAILURES:
        con.print(
            f"  every wave went through; {len(failed)} host(s) failed within the failure budget "
            f"(rolled back, or down as said above): {', '.join(failed)}",
            highlight=False,
            markup=False,
        )
        if r.tag:
            con.print(f"  once fixed: `fleetctl rollout --tag {r.tag} --limit {':'.join(failed)}`",
                      highlight=False, markup=False)
    elif r.status == fleet_records.FAILED and r.kind == "rollout":
        con.print("  hosts that passed keep the new version; `fleetctl rollback` returns them too")


class _NothingToDo(Exception):
    """Raised by the rollout's confirmation when its plan changes no host: the CLI says so,
    nothing is recorded."""

    def __init__(self, plan: FleetPlan) -> None:
        super().__init__("nothing to do")
        self.plan = plan


@contextmanager
def _watched(ctx: Ctx, title: str, take_over: bool) -> Iterator[Engine]:
    """The engine of the command, reporting to its event log and to the live view (or plain
    lines)."""
    inv = inventory.load(ctx.inventory)
    with live.watch(ctx, title, paths.state_dir(inv.path), inv) as prog:
        eng = Engine(inv, prog, take_over=take_over)
        try:
            yield eng
        finally:
            eng.close()


def _need_terminal(ctx: Ctx, yes: bool, what: str) -> None:
    """Without a terminal, refuse unless --yes (a CI job must say so): checked before anything is
    opened."""
    if not yes and not ctx.err.is_terminal:
        raise FleetError(f"refusing to {what} without confirmation", fix="pass --yes")


def count_hosts(n: int) -> str:
    return f"{n} host(s)"


def _rollback_question(targets: Mapping[str, str | None], to: str | None) -> str:
    """``Roll back 3 host(s) to v0.23.0?``, or ``to their last known-good`` when the targets
    differ."""
    tags = {short_tag(t) for t in targets.values()}
    where = (
        f"to {short_tag(to)}"
        if to
        else (f"to {tags.pop()}" if len(tags) == 1 else "to their last known-good")
    )
    return f"Roll back {count_hosts(len(targets))} ({', '.join(targets)}) {where}?"


take_over_option = click.option(
    "--take-over", is_flag=True,
    help="Take over hosts locked by a controller whose heartbeat is stale (it died or was lost).")


def _finish(ctx: Ctx, r: RolloutResult) -> None:
    ctx.emit(r, lambda con: render_result(r, con))
    if r.exit_code != ExitCode.OK:
        raise click.exceptions.Exit(int(r.exit_code))


@click.group("rollout", invoke_without_command=True)
@click.option(
    "--tag", "-t", help="Version or full tag to roll out (v0.24.0 -> 2026-07-01-v0.24.0)."
)
@click.option("--recipe", "-r", help="Recipe to serve (default: fleetctl_recipe).")
@click.option("--limit", "-l", help="Ansible-style host pattern.")
@click.option(
    "--waves", help="Wave sizes like Ansible's serial: 1,25%,100% (default: canary, then all)."
)
@click.option(
    "--max-unavailable",
    help="Hosts out of service at once, count or % (default: from --min-available).",
)
@click.option(
    "--min-available",
    help="Hosts kept serving, count or % of the selected hosts; each step moves as "
    "many as it allows (default: fleetctl_min_available, else 75%).",
)
@click.option(
    "--failure-budget",
    help="Hosts that may fail (and be rolled back) after the canary (default 0).",
)
@click.option(
    "--soak",
    "soak",
    type=Duration(),
    metavar="D",
    help="Sustained soak length per host (90s, 10m; a bare number is seconds); default: the "
         "recipe's.",
)
@click.option(
    "--on-inconclusive",
    type=click.Choice(["pause", "fail"]),
    default="pause",
    show_default=True,
    help="What an inconclusive gate does.",
)
@click.option(
    "--bake",
    "bake",
    type=Duration(),
    metavar="D",
    help="Watch each wave under live traffic for D once back in rotation, against hosts still on "
         "the old "
    "version (10m; 0: off; a bare number is seconds); default: fleetctl_bake, else off.",
)
@click.option(
    "--ready-timeout",
    type=Duration(),
    metavar="D",
    help="How long a server may take to become ready (90s, 10m; a bare number is seconds).",
)
@click.option(
    "--webhook",
    help="https URL receiving JSON events (default: $FLEETCTL_WEBHOOK_URL / fleetctl_webhook_url).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and exit; change nothing.")
@click.option("--skip-missing", is_flag=True,
              help="Go on without the hosts of a recipe whose image has no such tag.")
@click.option("--switch-model", is_flag=True,
              help="Let the rollout move hosts to another model than they serve (--recipe).")
@click.option(
    "--retry-rejected",
    is_flag=True,
    help="Gate a build again that a full gate of the recipe rejected before (refused otherwise).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the paused or interrupted rollout from each host's real state.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@take_over_option
@stream_options
@json_option
@pass_ctx
@click.pass_context
def rollout(
    cctx: click.Context,
    ctx: Ctx,
    tag: str | None,
    recipe: str | None,
    limit: str | None,
    waves: str | None,
    max_unavailable: str | None,
    min_available: str | None,
    failure_budget: str | None,
    soak: float | None,
    on_inconclusive: str,
    bake: float | None,
    ready_timeout: float | None,
    webhook: str | None,
    dry_run: bool,
    retry_rejected: bool,
    skip_missing: bool,
    switch_model: bool,
    resume: bool,
    yes: bool,
    take_over: bool,
) -> None:
    """Roll a tag across the fleet: canary, then waves, each host gated by a soak.

    TAG is resolved to a tag and digest through the registry; every host is preflighted, then the
    image pulled on all of them in parallel (4 or more hosts needing an image of 512 MB or more:
    the registry is read once and hosts relay it, fleetctl_image_tree); then canary and waves:
    stop, start by digest, readiness, soak gate. A host needs a step when its image digest or its
    container settings (the recipe's fingerprint) differ. Each step restarts as many hosts as the
    capacity floor allows; the plan shown before confirmation gives the steps and the expected
    wall time. Any failure after a host's stop restores its previous container first.

    On a fleet serving several models, each host rolls forward on its own recipe (fleetctl_recipe),
    each recipe's hosts with their own canary, gate, baselines, capacity floor and failure budget;
    a recipe whose image has no such tag leaves its hosts as they are (asked on a terminal, refused
    under --yes unless --skip-missing), and a host moved to another model by --recipe is shown as
    a switch (asked apart, refused under --yes unless --switch-model). With a front door
    (docs/frontdoor.md), hosts are drained and re-admitted; --bake: docs/watch.md.

    Exits 0 completed; 1 a gate failed (the host rolled back, the rollout stopped); 5 every wave
    done but some hosts failed within --failure-budget (completed-with-failures); 2 paused (an
    inconclusive gate, or Ctrl-C, which restores the host being changed first: go on with
    --resume) or could not run; 4 another operation holds the fleet's lock.
    """
    if cctx.invoked_subcommand is not None:
        return
    if not tag and not resume:
        raise click.UsageError("give --tag TAG (or --resume)")
    opts = Options(
        tag=tag,
        recipe=recipe,
        limit=limit,
        waves=waves,
        max_unavailable=max_unavailable,
        min_available=min_available,
        failure_budget=failure_budget,
        soak=soak,
        on_inconclusive=on_inconclusive,
        ready_timeout=ready_timeout,
        webhook=webhook,
        dry_run=dry_run,
        bake=bake,
        retry_rejected=retry_rejected,
        skip_missing=skip_missing,
        switch_model=switch_model,
    )
    if not resume and not dry_run:
        _need_terminal(ctx, yes, "roll out")
    nothing: dict[str, Any] | None = None

    def confirm(fp: FleetPlan) -> None:
        # The engine's one plan (one preflight), shown under the locks before anything is recorded.
        render_fleet_plan(fp, ctx.err)
        changing = fp.changing()
        p = fp.first
        if not changing:
            ctx.drop_live()
            ctx.err.print(f"nothing to do: {count_hosts(len(fp.hosts))} already serve "
                          f"{short_tag(p.tag)} ({_short(p.digest)}) with the recipe's settings",
                          highlight=False, markup=False)
            raise _NothingToDo(fp)
        # Hosts left out and model switches are asked about apart from the rollout itself.
        if fp.left and not skip_missing:
            ctx.ask(f"Leave {count_hosts(sum(len(lf.hosts) for lf in fp.left))} of recipe(s) "
                    f"{', '.join(lf.recipe for lf in fp.left)} as they are (no {p.requested} in "
                    "their image)?")
        if fp.switches and not switch_model:
            ctx.ask(f"Switch the model of {count_hosts(len(fp.switches))} ("
                    + "; ".join(f"{sw.host}: {sw.before} → {sw.after}" for sw in fp.switches)
                    + ")?")
        ctx.ask(f"Roll out {count_hosts(len(changing))} to {short_tag(p.tag)}?")

    with _watched(ctx, "rollout", take_over) as eng:
        if resume:
            r = eng.resume(opts)
        else:
            try:
                r = eng.rollout(opts, confirm=None if yes or dry_run else confirm)
            except _NothingToDo as e:
                nothing = {"status": NOTHING_TO_DO, "plan": e.plan.first}
                if len(e.plan.plans) > 1:
                    nothing["plans"] = list(e.plan.plans)
    # The result after the event stream's end (with --events -, stdout's last line).
    if nothing is not None:
        ctx.emit(nothing, lambda con: None)
        return
    _finish(ctx, r)


@rollout.command("abort")
@click.option(
    "--force",
    is_flag=True,
    help="Also drop a lock held by a controller on another machine (implies --take-over).",
)
@click.option("--webhook", help="https URL receiving JSON events.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@take_over_option
@stream_options
@json_option
@pass_ctx
def abort(ctx: Ctx, force: bool, webhook: str | None, yes: bool, take_over: bool) -> None:
    """Undo the paused or interrupted rollout: every host it touched back to its previous
    version."""
    what = "abort the rollout and return its hosts"
    _need_terminal(ctx, yes, what)
    if force and not yes:
        # --force drops another controller's lock before the hosts can be looked at: ask first.
        ctx.ask("Abort the rollout (dropping its controller's lock) and return its hosts?")

    def confirm(targets: Mapping[str, str | None]) -> None:
        if not yes and not force:
            ctx.ask(
                _rollback_question(targets, None).replace(
                    "Roll back", "Abort the rollout: return", 1
                )
            )

    with _watched(ctx, "abort", take_over) as eng:
        r = eng.abort(webhook=webhook, force=force, confirm=confirm)
    _finish(ctx, r)


@click.command("history")
@click.argument("rollout_id", required=False)
@click.option(
    "--limit",
    "-n",
    "count",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="How many to list.",
)
@json_option
@pass_ctx
def history(ctx: Ctx, rollout_id: str | None, count: int) -> None:
    """Every rollout, rollback, abort and remediation with its per-host outcome (like `kubectl
    rollout history`); with ROLLOUT_ID, each host's phases.

    The kind column says what each record is; rejected digests are listed below the table.
    """
    inv = inventory.load(ctx.inventory)
    with fleet_ledger.open_for(inv, paths.state_dir(inv.path)) as led:
        recs = [led.get(rollout_id)] if rollout_id else led.history(count)
    units = {m: u.name for u in inv.units.values() for m in u.members}
    data = [history_json(r, units) for r in recs]

    def render(con: Console) -> None:
        if rollout_id:
            r = recs[0]
            con.print(
                f"[bold]{what(r)} {r.id}[/] {r.status}: {r.requested or ''} -> {r.tag} ({r.digest})"
            )
            con.print(
                f"  by {r.started_by}: {r.command}\n  {when(r.started_at)} .. {when(r.finished_at)}"
                + (f"\n  error: {r.error}" if r.error else ""),
                highlight=False,
                markup=False,
            )
            rows = [
                [
                    h.host + (f" ({units[h.host]})" if h.host in units else ""),
                    str(h.wave + 1) if h.wave >= 0 else "-",
                    h.status,
                    h.before_tag or "-",
                    h.after_tag or "-",
                    Text(h.error or (h.verdict or {}).get("summary", "")),
                    " > ".join(p.phase for p in r.phases if p.host == h.host),
                ]
                for h in r.hosts
            ]
            con.print(
                fit_table(
                    con.width,
                    [
                        "host",
                        Col("wave", drop=2),
                        "status",
                        Col("before", drop=1),
                        "after",
                        Col("verdict / error", flex=True, min=16),
                        Col("phases", drop=3, flex=True),
                    ],
                    rows,
                )
            )
            for h in r.hosts:
                if h.switch:
                    con.print(f"  {h.host}: switch: {h.before_recipe} → {h.recipe}",
                              highlight=False, markup=False)
            return
        rows = []
        for r in recs:
            counts: dict[str, int] = {}
            for h in r.hosts:
                counts[h.status] = counts.get(h.status, 0) + 1
            rows.append(
                [
                    what(r),
                    r.status,
                    r.tag or r.requested or "-",
                    when(r.started_at),
                    r.started_by,
                    remediation_cell(r) if r.kind == "remediate"
                    else ", ".join(f"{n} {s}" for s, n in counts.items()),
                    r.id,
                ]
            )
        # The id is whole (an operator copies it into `history ID`) and holds the start time, so
        # at 80 columns who started it, the start and then the tag give way, and the status is
        # cut; the kind stays (an id's rb- is a rollback or an abort, and a remediation's cells
        # read like a rollout's).
        con.print(
            fit_table(
                con.width,
                [
                    "kind",
                    Col("status", flex=True, min=9),
                    Col("tag", drop=1, flex=True, min=8),
                    Col("started", drop=2),
                    Col("by", drop=3),
                    Col("hosts", flex=True, min=12),
                    "id",
                ],
                rows,
            )
        )
        for rj in from_records(recs):
            con.print(f"rejected: {rj.describe()}", highlight=False, markup=False)

    ctx.emit(data, render)


commands: list[click.Command] = [rollout, history]
