"""``fleetctl status``: one line per host, probed in parallel over SSH."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from fleetctl import inventory as inv
from fleetctl import ssh
from fleetctl.cli.output import Col, Ctx, Duration, fit_table, json_option, pass_ctx, to_jsonable
from fleetctl.container import Container
from fleetctl.errors import ExitCode
from fleetctl.status import DEFAULT_TIMEOUT, HostStatus, front_door_view, probe_fleet


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m = s // 60
    return f"{d}d{h:02d}h" if d else f"{h}h{m:02d}m" if h else f"{m}m"


def _health(st: HostStatus) -> str:
    if st.health == 200:
        return "[green]200[/]"
    if st.health is not None:
        return f"[red]{st.health}[/]"
    return "[dim]-[/]" if st.container is None else "[red]refused[/]"


def _door(st: HostStatus) -> str:
    d = st.front_door
    if d is None:
        return ""
    admin = str(d.get("admin"))
    text = {"ready": "[green]in[/]", "drain": "[yellow]drain[/]", "maint": "[yellow]out[/]"}.get(
        admin, f"[red]{escape(admin)}[/]"
    )
    if d.get("healthy") is False:
        text += " [red]down[/]"
    if d.get("held_by"):
        text += "*"
    return text


def _serving(st: HostStatus, c: Container) -> str:
    """The serving cell: its tag, after the recipe it serves when that is not the configured one
    (``DRIFT`` first when the host serves another recipe: the line below the table says why)."""
    state = "" if c.running else f" [red]({escape(c.status or 'stopped')})[/]"
    tag = c.tag or c.image
    if st.drift:
        return f"[red]DRIFT {escape(f'{st.served_recipe or c.name}:{tag}')}[/]{state}"
    if st.served_recipe and st.served_recipe == st.recipe:
        return escape(tag) + state
    return escape(f"{st.served_recipe or c.name}:{tag}") + state


def bandwidth_line(bw: Mapping[str, Any] | None) -> str:
    """A unit's last measured bus bandwidth against its floor, and when: one line."""
    if not bw:
        return "bandwidth: never measured (a rollout's preflight measures it)"
    at = str(bw.get("at") or "?")[:16].replace("T", " ")
    if bw.get("ok"):
        return (f"bandwidth {bw.get('busbw_gbs')} GB/s ({bw.get('method')}) >= floor "
                f"{bw.get('floor_gbs')}: ok, {at}Z")
    return (f"bandwidth {bw.get('busbw_gbs')} GB/s ({bw.get('method')}) BELOW floor "
            f"{bw.get('floor_gbs')}, {at}Z")


def render_status(statuses: Mapping[str, HostStatus]) -> Any:
    """Draw the fleet table."""
    doors = any(st.front_door is not None for st in statuses.values())

    def render(out: Console) -> None:
        rows = []
        for name, st in statuses.items():
            if not st.reachable:
                # The cause goes in "serving": the one free-text column kept at any width.
                rows.append(
                    [
                        name,
                        f"[red]no[/] ({st.seconds:.1f}s)",
                        "",
                        "",
                        "",
                        "",
                        escape(st.recipe or "-"),
                        f"[red]{escape(st.error or '')}[/]",
                        "",
                        "",
                        "",
                    ]
                    + ([_door(st)] if doors else [])
                )
                continue
            c = st.container
            if c is None:
                serving = "[dim]none[/]"
                digest = ""
            else:
                serving = _serving(st, c)
                digest = escape((c.digest or "?").replace("sha256:", "")[:12])
            gpu_ok = st.gpu == "NVIDIA GB10"
            gpu = escape(st.gpu or st.problems.get("gpu", "?"))
            rows.append([
                name, f"[green]yes[/] ({st.seconds:.1f}s)", gpu if gpu_ok else f"[yellow]{gpu}[/]",
                escape(st.driver or "?"), escape(st.toolkit or "-"), escape(st.docker or "?"),
                escape(st.recipe or "-"), serving, digest, _health(st), _uptime(st.uptime_s),
            ] + ([_door(st)] if doors else []))
        # At 80 columns the software versions give way first (`--json` has them all), then GPU and
        # digest.
        cols: list[Col | str] = ["host", "reachable", Col("GPU", drop=3), Col("driver", drop=6),
                                 Col("toolkit", drop=5), Col("docker", drop=4),
                                 "recipe",
                                 Col("serving", flex=True, min=16), Col("digest", drop=2), "health",
                                 Col("uptime", drop=1)]
        if doors:
            cols.append(Col("door"))
        out.print(fit_table(out.width, cols, rows, title="fleet status"))
        held = [n for n, st in statuses.items() if st.front_door and st.front_door.get("held_by")]
        for n in held:
            d = statuses[n].front_door or {}
            out.print(
                f"[yellow]out of rotation[/] {n}: drained by {escape(str(d.get('held_by')))} and "
                "not "
                f"re-admitted yet ({escape(str(d.get('detail') or ''))}); `fleetctl rollout "
                "--resume`, "
                "`rollout abort` or `rollback` puts it back",
                highlight=False,
            )
        warn = [
            n for n, st in statuses.items() if st.reachable and st.next_kernel_has_nvidia is False
        ]
        for n in warn:
            st = statuses[n]
            out.print(
                f"[yellow]warning[/] {n}: the next kernel {st.next_kernel} has no nvidia module "
                f"(running {st.kernel})"
            )
        units: dict[str, list[HostStatus]] = {}
        for st in statuses.values():
            if st.unit is not None:
                units.setdefault(st.unit, []).append(st)
        for unit, members in units.items():
            listed = ", ".join(f"{m.name}{' (head)' if m.unit_rank == 0 else ''}"
                               for m in sorted(members, key=lambda m: m.unit_rank or 0))
            findings = [f for m in members if m.fabric for f in m.fabric.findings]
            if any(m.fabric is None for m in members):
                state = "[yellow]fabric unknown[/] (a member did not answer)"
            elif findings or any(m.fabric and m.fabric.error for m in members):
                count = len(findings) + sum(1 for m in members if m.fabric and m.fabric.error)
                state = f"[red]{count} fabric/parity problem(s)[/]"
            else:
                state = "[green]fabric ok[/]"
            out.print(f"unit {escape(unit)}: {escape(listed)}: {state}", highlight=False)
            bw = next(
                (m.fabric.bandwidth for m in members if m.fabric and m.fabric.bandwidth), None
            )
            out.print(f"  {escape(bandwidth_line(bw))}", highlight=False)
            for m in members:
                if m.fabric and m.fabric.error:
                    out.print(
                        f"  [red]{escape(m.name)}: the fabric probe failed: "
                        f"{escape(m.fabric.error)}[/]",
                        highlight=False,
                    )
            for f in findings:
                out.print(f"  [red]{escape(f.message())}[/]", highlight=False)
        for n, st in statuses.items():
            if st.drift:
                tag = (st.container.tag if st.container else None) or "TAG"
                out.print(f"[red]drift[/] {escape(n)}: {escape(st.drift)}; roll it onto "
                          f"{escape(st.recipe or '?')} (a model switch: `fleetctl rollout --tag "
                          f"{escape(tag)} --recipe {escape(st.recipe or '?')} --limit "
                          f"{escape(n)}`) or set its fleetctl_recipe to what it serves",
                          highlight=False)
        for n, st in statuses.items():
            if st.lock:
                out.print(f"[yellow]locked[/] {n}: by {escape(st.lock)}", highlight=False)
        down = [n for n, st in statuses.items() if not st.reachable]
        if down:
            out.print(
                f"[red]{len(down)} of {len(statuses)} host(s) unreachable:[/] {', '.join(down)}"
            )

    return render


def status_json(statuses: Mapping[str, HostStatus]) -> dict[str, Any]:
    """``--json``: host name -> its status; a container also keeps the keys ``state`` (its
    ``status``) and ``restarts`` (its ``restart_count``) that scripts read before the one model."""
    out: dict[str, Any] = to_jsonable(dict(statuses))
    for st in out.values():
        c = st.get("container")
        if isinstance(c, dict):
            c.setdefault("state", c.get("status"))
            c.setdefault("restarts", c.get("restart_count"))
    return out


@click.command("status")
@click.option("--limit", "-l", metavar="PATTERN", help="Only these hosts (Ansible pattern).")
@click.option(
    "--timeout",
    type=Duration(1, 300),
    metavar="D",
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="How long a host gets to answer before it is shown as unreachable (10s, 1m; a bare number "
         "is "
    "seconds).",
)
@json_option
@pass_ctx
def status_cmd(ctx: Ctx, limit: str | None, timeout: float) -> None:
    """Show each host: reachable, GPU, driver, toolkit, Docker, serving image and digest, /health,
    uptime.

    Each host's configured recipe (fleetctl_recipe) beside what it serves: a host whose
    container's recipe label, or whose /v1/models, says another recipe is flagged DRIFT.
    For a unit's members: the unit, the fabric checks and parity (docs/units.md). With a front door
    (fleetctl_front_door, docs/frontdoor.md): each host as the door sees it. Exits 1 when some host
    is unreachable.
    """
    inventory = inv.load(ctx.inventory)
    hosts = inventory.select(limit)
    try:
        with ctx.progress("status", ("phase", "message")) as progress:
            statuses = probe_fleet(inventory, hosts, timeout=timeout, progress=progress)
        doors = front_door_view(inventory, hosts)
        if doors is not None:
            statuses = {
                n: dataclasses.replace(st, front_door=doors.get(n)) for n, st in statuses.items()
            }
    finally:
        ssh.close_all()
    ctx.emit(status_json(statuses), render_status(statuses))
    if any(not st.reachable for st in statuses.values()):
        raise click.exceptions.Exit(int(ExitCode.FAILED))


commands: list[click.Command] = [status_cmd]
