"""``fleetctl rollout``, ``rollout abort``, ``rollback`` and ``history``: parsing and rendering only."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from fleetctl import inventory, paths
from fleetctl.cli.output import Col, Ctx, fit_table, json_option, pass_ctx, when
from fleetctl.durations import parse_duration
from fleetctl.errors import ExitCode, FleetError
from fleetctl.rollout.api import Engine
from fleetctl.rollout.plan import Plan
from fleetctl.rollout.results import Options, RolloutResult
from fleetctl.state import ledger as fleet_ledger

COLUMNS = ("wave", "phase", "tag", "health", "tok/s", "acceptance", "message")


def _short(digest: str | None) -> str:
    return digest.split(":", 1)[-1][:12] if digest else "-"


def render_plan(p: Plan, con: Console) -> None:
    """The dry-run plan: hosts per wave, the pinned tag and digest, what each host runs now."""
    con.print(f"[bold]plan[/]: recipe {p.recipe}, {p.image}:{p.tag} ({p.digest})")
    con.print(f"  requested {p.requested!r}; pulled as {p.pull_ref}")
    con.print(f"  {len(p.waves)} wave(s), at most {p.max_unavailable} host(s) out of service at once, "
              f"failure budget {p.failure_budget}")
    rows = [[h.host, str(h.wave + 1) if h.wave >= 0 else "-", str(h.step + 1) if h.step >= 0 else "-",
             h.current_tag or "(nothing)", _short(h.current_digest), h.action] for h in p.hosts]
    con.print(fit_table(con.width, ["host", "wave", Col("step", drop=1), "serves now", Col("digest now", drop=2),
                                    "action"], rows))


def render_result(r: RolloutResult, con: Console) -> None:
    """Per-host outcome table and the one-line conclusion."""
    if r.status == "planned" and r.plan is not None:
        render_plan(r.plan, con)
        return
    rows = [[h.host, str(h.wave + 1) if h.wave >= 0 else "-", h.status, h.phase, h.before_tag or "-",
             h.after_tag or "-", Text(h.error or h.verdict or "")] for h in r.hosts]
    # At 80 columns the phase (the status says as much), the wave and the previous tag give way;
    # the error is cut, and printed whole below with each failed check.
    con.print(fit_table(con.width, ["host", Col("wave", drop=2), "status", Col("phase", drop=3),
                                    Col("before", drop=1), "after", Col("verdict / error", flex=True, min=16)],
                        rows, title=f"{r.kind} {r.id}: {r.status}"))
    colour = {fleet_ledger.COMPLETED: "green", fleet_ledger.PAUSED: "yellow", fleet_ledger.COMPLETED_WITH_FAILURES: "yellow"}.get(r.status, "red")
    con.print(f"[{colour}]{r.kind} {r.status}[/] {r.tag or ''} {_short(r.digest)} in {r.seconds:.0f}s"
              + (f": {escape(r.error)}" if r.error else ""), highlight=False)
    for h in r.hosts:
        for c in h.failed_checks:
            con.print(f"  {h.host}: {c}", highlight=False, markup=False)
    # Skip reasons are cut in the table at 80 columns; they are why a host was left alone.
    for h in r.hosts:
        if h.status == fleet_ledger.SKIPPED and h.verdict:
            con.print(f"  {h.host}: {h.verdict}", highlight=False, markup=False)
    failed = [h.host for h in r.hosts if h.status in (fleet_ledger.HOST_FAILED, fleet_ledger.ROLLED_BACK)]
    if r.status == fleet_ledger.PAUSED:
        con.print("  continue with `fleetctl rollout --resume`, undo with `fleetctl rollout abort`")
    elif r.status == fleet_ledger.COMPLETED_WITH_FAILURES:
        con.print(f"  every wave went through; {len(failed)} host(s) failed within the failure budget "
                  f"(rolled back, or down as said above): {', '.join(failed)}", highlight=False, markup=False)
        if r.tag:
            con.print(f"  once fixed: `fleetctl rollout --tag {r.tag} --limit {':'.join(failed)}`",
                      highlight=False, markup=False)
    elif r.status == fleet_ledger.FAILED and r.kind == "rollout":
        con.print("  hosts that passed keep the new version; `fleetctl rollback` returns them too")


def _engine(ctx: Ctx, prog: Any, take_over: bool = False) -> Engine:
    return Engine(inventory.load(ctx.inventory), prog, take_over=take_over)


def _confirm(ctx: Ctx, yes: bool, what: str) -> None:
    """Ask before changing hosts; without a terminal, refuse unless --yes (a CI job must say so)."""
    if yes:
        return
    if not ctx.err.is_terminal:
        raise FleetError(f"refusing to {what} without confirmation", fix="pass --yes")
    click.confirm(f"{what}?", abort=True, err=True)


take_over_option = click.option(
    "--take-over", is_flag=True,
    help="Take over hosts locked by a controller whose heartbeat is stale (it died or was lost).")


def _finish(ctx: Ctx, r: RolloutResult) -> None:
    ctx.emit(r, lambda con: render_result(r, con))
    if r.exit_code != ExitCode.OK:
        raise click.exceptions.Exit(int(r.exit_code))


@click.group("rollout", invoke_without_command=True)
@click.option("--tag", "-t", help="Version or full tag to roll out (v0.24.0 -> 2026-07-01-v0.24.0).")
@click.option("--recipe", "-r", help="Recipe to serve (default: fleetctl_recipe).")
@click.option("--limit", "-l", help="Ansible-style host pattern.")
@click.option("--waves", help="Wave sizes like Ansible's serial: 1,25%,100% (default: canary, then all).")
@click.option("--max-unavailable", help="Hosts out of service at once, count or % (default 1).")
@click.option("--failure-budget", help="Hosts that may fail (and be rolled back) after the canary (default 0).")
@click.option("--soak", "soak", help="Sustained soak length per host (90s, 10m); default: the recipe's.")
@click.option("--on-inconclusive", type=click.Choice(["pause", "fail"]), default="pause", show_default=True,
              help="What an inconclusive gate does.")
@click.option("--ready-timeout", type=float, help="Seconds a server may take to become ready.")
@click.option("--webhook", help="https URL receiving JSON events (default: $FLEETCTL_WEBHOOK_URL / fleetctl_webhook_url).")
@click.option("--dry-run", is_flag=True, help="Print the plan and exit; change nothing.")
@click.option("--resume", is_flag=True, help="Continue the paused or interrupted rollout from each host's real state.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@take_over_option
@json_option
@pass_ctx
@click.pass_context
def rollout(cctx: click.Context, ctx: Ctx, tag: str | None, recipe: str | None, limit: str | None,
            waves: str | None, max_unavailable: str | None, failure_budget: str | None, soak: str | None,
            on_inconclusive: str, ready_timeout: float | None, webhook: str | None, dry_run: bool, resume: bool,
            yes: bool, take_over: bool) -> None:
    """Roll a tag across the fleet: canary, then waves, each host gated by a soak."""
    if cctx.invoked_subcommand is not None:
        return
    if not tag and not resume:
        raise click.UsageError("give --tag TAG (or --resume)")
    opts = Options(tag=tag, recipe=recipe, limit=limit, waves=waves, max_unavailable=max_unavailable,
                   failure_budget=failure_budget, soak=parse_duration(soak, "--soak") if soak else None,
                   on_inconclusive=on_inconclusive, ready_timeout=ready_timeout, webhook=webhook, dry_run=dry_run)
    with ctx.progress("rollout", COLUMNS) as prog:
        eng = _engine(ctx, prog, take_over)
        try:
            if resume:
                r = eng.resume(opts)
            elif dry_run:
                r = eng.rollout(opts)
            else:
                if not yes:
                    p, *_ = eng.plan(opts)
                    render_plan(p, ctx.err)
                _confirm(ctx, yes, "roll out")
                r = eng.rollout(opts)
        finally:
            eng.close()
    _finish(ctx, r)


@rollout.command("abort")
@click.option("--force", is_flag=True, help="Also drop a lock held by a controller on another machine "
              "(implies --take-over).")
@click.option("--webhook", help="https URL receiving JSON events.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@take_over_option
@json_option
@pass_ctx
def abort(ctx: Ctx, force: bool, webhook: str | None, yes: bool, take_over: bool) -> None:
    """Undo the paused or interrupted rollout: every host it touched back to its previous version."""
    _confirm(ctx, yes, "abort the rollout and return its hosts")
    with ctx.progress("abort", COLUMNS) as prog:
        eng = _engine(ctx, prog, take_over)
        try:
            r = eng.abort(webhook=webhook, force=force)
        finally:
            eng.close()
    _finish(ctx, r)


@click.command("rollback")
@click.option("--to", "to", help="Tag to go to (default: what each host served before the last rollout).")
@click.option("--limit", "-l", help="Ansible-style host pattern.")
@click.option("--recipe", "-r", help="Recipe (default: the last rollout's).")
@click.option("--max-unavailable", help="Hosts restarted at once, count or % (default 1).")
@click.option("--webhook", help="https URL receiving JSON events.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@take_over_option
@json_option
@pass_ctx
def rollback(ctx: Ctx, to: str | None, limit: str | None, recipe: str | None, max_unavailable: str | None,
             webhook: str | None, yes: bool, take_over: bool) -> None:
    """Return hosts to their previous version (readiness + smoke, no full soak)."""
    _confirm(ctx, yes, f"roll back to {to}" if to else "roll back")
    with ctx.progress("rollback", COLUMNS) as prog:
        eng = _engine(ctx, prog, take_over)
        try:
            r = eng.rollback(to=to, limit=limit, recipe_name=recipe, max_unavailable=max_unavailable,
                             webhook=webhook)
        finally:
            eng.close()
    _finish(ctx, r)


def _history_json(rec: fleet_ledger.RolloutRecord, units: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``units``: host -> its unit's name today (the inventory's; a host of no unit is left out)."""
    units = units or {}
    return {
        "id": rec.id, "kind": rec.kind, "status": rec.status, "recipe": rec.recipe, "requested": rec.requested,
        "tag": rec.tag, "digest": rec.digest, "image": rec.image, "parent": rec.parent,
        "started_by": rec.started_by, "command": rec.command,
        "started_at": _iso(rec.started_at), "finished_at": _iso(rec.finished_at), "error": rec.error,
        "options": rec.options,
        "waves": [{"wave": w.idx + 1, "hosts": list(w.hosts), "status": w.status} for w in rec.waves],
        "hosts": [{"host": h.host, "unit": units.get(h.host), "wave": h.wave + 1 if h.wave >= 0 else None,
                   "status": h.status,
                   "phase": h.phase, "before": {"tag": h.before_tag, "digest": h.before_digest},
                   "after": {"tag": h.after_tag, "digest": h.after_digest}, "error": h.error,
                   "verdict": h.verdict, "artifacts": h.artifacts,
                   "started_at": _iso(h.started_at), "finished_at": _iso(h.finished_at)} for h in rec.hosts],
    }


def _iso(ts: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else None


@click.command("history")
@click.argument("rollout_id", required=False)
@click.option("--limit", "-n", "count", type=click.IntRange(min=1), default=20, show_default=True, help="How many to list.")
@json_option
@pass_ctx
def history(ctx: Ctx, rollout_id: str | None, count: int) -> None:
    """Every rollout and rollback with its per-host outcome (like `kubectl rollout history`)."""
    inv = inventory.load(ctx.inventory)
    with fleet_ledger.open_for(inv, paths.state_dir(inv.path)) as led:
        recs = [led.get(rollout_id)] if rollout_id else led.history(count)
    units = {m: u.name for u in inv.units.values() for m in u.members}
    data = [_history_json(r, units) for r in recs]

    def render(con: Console) -> None:
        if rollout_id:
            r = recs[0]
            con.print(f"[bold]{r.kind} {r.id}[/] {r.status}: {r.requested or ''} -> {r.tag} ({r.digest})")
            con.print(f"  by {r.started_by}: {r.command}\n  {when(r.started_at)} .. {when(r.finished_at)}"
                      + (f"\n  error: {r.error}" if r.error else ""), highlight=False, markup=False)
            rows = [[h.host + (f" ({units[h.host]})" if h.host in units else ""), str(h.wave + 1) if h.wave >= 0 else "-",
                     h.status, h.before_tag or "-",
                     h.after_tag or "-", Text(h.error or (h.verdict or {}).get("summary", "")),
                     " > ".join(p.phase for p in r.phases if p.host == h.host)] for h in r.hosts]
            con.print(fit_table(con.width, ["host", Col("wave", drop=2), "status", Col("before", drop=1), "after",
                                            Col("verdict / error", flex=True, min=16),
                                            Col("phases", drop=3, flex=True)], rows))
            return
        rows = []
        for r in recs:
            counts: dict[str, int] = {}
            for h in r.hosts:
                counts[h.status] = counts.get(h.status, 0) + 1
            rows.append([r.kind, r.status, r.tag or r.requested or "-", when(r.started_at), r.started_by,
                         ", ".join(f"{n} {s}" for s, n in counts.items()), r.id])
        # The id is whole (an operator copies it into `history ID`) and holds the start time and the kind
        # (ro-/rb-), so at 80 columns those columns give way first.
        con.print(fit_table(con.width, [Col("kind", drop=1), "status", "tag", Col("started", drop=2),
                                         Col("by", drop=3), Col("hosts", flex=True, min=12), "id"], rows))

    ctx.emit(data, render)


commands: list[click.Command] = [rollout, rollback, history]
