"""``fleetctl provision``: run the provision playbook with live per-host progress, then a table per
host."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from fleetctl import inventory as inv
from fleetctl.ansible import PlaybookResult
from fleetctl.cli.output import Col, Ctx, fit_table, json_option, pass_ctx, to_jsonable
from fleetctl.errors import ExitCode
from fleetctl.provision import host_facts, provision


def result_json(r: PlaybookResult) -> dict[str, Any]:
    """The result for ``--json``: the run plus each host's counts, status, message and facts."""
    return {
        "run_id": r.run_id, "playbook": r.playbook, "artifacts_dir": str(r.artifacts_dir),
        "status": r.status, "ok": r.ok, "check": r.check, "elapsed": round(r.elapsed, 2),
        "failed_hosts": r.failed_hosts,
        "hosts": {
            name: {
                "status": h.status, "ok": h.ok, "changed": h.changed, "failed": h.failed,
                "unreachable": h.unreachable, "skipped": h.skipped, "message": h.message,
                "failures": [{"task": f.task, "message": f.message} for f in h.failures],
                "warnings": list(h.warnings),
                "facts": to_jsonable(host_facts(h)),
                "diffs": [{"task": d.task, "diff": d.diff} for d in h.diffs],
            }
            for name, h in r.hosts.items()
        },
    }


def render_result(r: PlaybookResult, show_diff: bool) -> Any:
    """Draw the per-host table (and diffs, warnings) of a provision run."""

    def render(out: Console) -> None:
        if show_diff:
            for name, h in r.hosts.items():
                for d in h.diffs:
                    out.print(f"[bold]{escape(name)}[/]: {escape(d.task)}")
                    for line in d.diff.splitlines():
                        style = (
                            "green"
                            if line.startswith("+")
                            else "red"
                            if line.startswith("-")
                            else "dim"
                        )
                        out.print(f"  [{style}]{escape(line)}[/]", highlight=False)
        title = "provision (check mode: nothing was changed)" if r.check else "provision"
        rows = []
        for name, h in r.hosts.items():
            colour = {"ok": "green", "failed": "red", "unreachable": "yellow"}[h.status]
            f = host_facts(h)
            gpu = f"{f.gpu or '?'} / {f.driver or '?'}" if f.gpu or f.driver else "-"
            changed = f"[yellow]{h.changed}[/]" if h.changed else "0"
            msg = h.message or ("; ".join(f"warning: {w}" for w in h.warnings))
            rows.append(
                [
                    name,
                    f"[{colour}]{h.status}[/]",
                    str(h.ok),
                    changed,
                    str(h.failed),
                    str(h.unreachable),
                    escape(gpu),
                    escape(msg),
                ]
            )
        out.print(
            fit_table(
                out.width,
                [
                    "host",
                    "result",
                    "ok",
                    "changed",
                    "failed",
                    Col("unreachable", drop=1),
                    Col("GPU / driver", drop=2),
                    Col("message", flex=True),
                ],
                rows,
                title=title,
                caption=f"run {r.run_id}  {r.elapsed:.1f}s  artifacts {r.artifacts_dir}",
            )
        )
        failed = r.failed_hosts
        if failed:
            out.print(
                f"[red]{len(failed)} of {len(r.hosts)} host(s) failed:[/] {', '.join(failed)}; "
                f"the others finished. Fix them and re-run with --limit {','.join(failed)}"
            )
        for name, h in r.hosts.items():
            if h.message:
                for w in h.warnings:
                    out.print(f"[yellow]warning[/] {escape(name)}: {escape(w)}")

    return render


@click.command("provision")
@click.option(
    "--limit",
    "-l",
    metavar="PATTERN",
    help="Only these hosts (Ansible pattern: host, group, glob, !exclude).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Dry run (Ansible --check): report what would change, change nothing.",
)
@click.option("--diff", is_flag=True, help="Show what changed in files (Ansible --diff).")
@click.option("--strict", is_flag=True,
              help="Fail a host whose next kernel has no nvidia module (a warning otherwise).")
@json_option
@pass_ctx
def provision_cmd(ctx: Ctx, limit: str | None, check: bool, diff: bool, strict: bool) -> None:
    """Make hosts ready to serve: preflight checks, Docker, NVIDIA Container Toolkit (idempotent).

    Exits 1 when some host failed (the others still finish), 0 when all succeeded.
    """
    inventory = inv.load(ctx.inventory)
    with ctx.progress("provision", ("phase", "task", "ok", "changed", "failed")) as progress:
        result = provision(
            inventory, limit=limit, check=check, diff=diff, strict=strict, progress=progress
        )
    ctx.emit(result_json(result), render_result(result, diff))
    if not result.ok:
        raise click.exceptions.Exit(int(ExitCode.FAILED))


commands: list[click.Command] = [provision_cmd]
