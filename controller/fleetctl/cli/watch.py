"""``fleetctl watch``: a cheap continuous probe of promoted hosts for hours, judged and reported
like a soak.

Hosts are chosen as ``fleetctl soak`` chooses them (``--limit`` or ``--endpoint``, with the same
recipe, profile and key); ``soak/watch.py`` does the probing. Exit codes as ``soak``'s: 0 every host
passed, 1 one failed, 2 inconclusive or could not run. With ``--remediate`` a host whose every
breach was healed (restarted or rolled back, re-gated, re-admitted) passes, shown as ``healed``; one
left parked or with a breach not healed fails.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.text import Text

from fleetctl import paths, ssh
from fleetctl.cli import live
from fleetctl.cli.output import Col, Ctx, Duration, fit_table, json_option, pass_ctx
from fleetctl.cli.output import stream_options as stream_options
from fleetctl.cli.soak import _STYLE, _endpoint_jobs, _host_jobs, finish
from fleetctl.errors import FleetError
from fleetctl.progress import Event, Progress, Tee
from fleetctl.runids import new_run_id
from fleetctl.soak import report
from fleetctl.soak.checks.judge import ms
from fleetctl.soak.checks.watching import WatchSettings
from fleetctl.soak.profiles import PROFILES
from fleetctl.soak.verdict import Outcome, Remedied, Verdict
from fleetctl.soak.watch import Remedy, WatchTarget, run_watch

if TYPE_CHECKING:
    from fleetctl.rollout.webhook import Webhook


def _summary(verdicts: list[Verdict]) -> Callable[[Console], None]:
    def render(out: Console) -> None:
        rows = []
        for v in verdicts:
            lv = v.levels[0] if v.levels else None
            why = "; ".join(
                f"{c.name}: {c.message}"
                for c in v.checks
                if c.outcome in (Outcome.FAIL, Outcome.ERROR, Outcome.INCONCLUSIVE)
                and not c.observe_only
            )
            rows.append(
                [
                    v.target,
                    "[cyan]healed[/]" if v.healed else
                    f"[{_STYLE[v.outcome.value]}]{v.outcome.value}[/]",
                    v.tag or "-",
                    str(lv.requests if lv else 0),
                    str(lv.errors if lv else 0),
                    ms(lv.ttft_p95) if lv and lv.ttft_p95 is not None else "-",
                    Text(why or v.summary),
                ]
            )
        out.print(
            fit_table(
                out.width,
                [
                    "host",
                    "outcome",
                    Col("tag", drop=2),
                    Col("probes", drop=3),
                    Col("failed", drop=4),
                    Col("TTFT p95", drop=1),
                    Col("why", flex=True),
                ],
                rows,
                title="watch",
            )
        )
        for v in verdicts:
            if v.artifacts_dir:
                out.print(f"[dim]{v.target}: artifacts in {v.artifacts_dir}[/]")

    return render


@click.command("watch")
@click.option(
    "--limit", "-l", metavar="HOSTS", help="Hosts to watch (Ansible pattern); default: every host."
)
@click.option("--endpoint", "endpoints", multiple=True, metavar="URL",
              help="Watch this OpenAI-compatible endpoint instead of inventory hosts (repeatable).")
@click.option("--duration", "-d", type=Duration(), metavar="D", default="1h", show_default=True,
              help="How long to watch (30m, 8h; a bare number is seconds).")
@click.option(
    "--interval",
    type=Duration(),
    metavar="D",
    default="60s",
    show_default=True,
    help="Time between one host's probes (a canary, a short stream and a /metrics scrape; 30s, 5m; "
    "a bare number is seconds). No -i: that is the inventory, before the command.",
)
@click.option("--parallel", type=click.IntRange(1, 512), default=64, show_default=True,
              help="Hosts probed at once (the rest wait their turn).")
@click.option(
    "--recipe",
    metavar="NAME",
    help="Recipe whose settings apply (default: each host's fleetctl_recipe).",
)
@click.option(
    "--profile",
    type=click.Choice(PROFILES),
    help="Gate profile: the latency bounds and liveness bound.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME",
    help="With --endpoint: the model name to ask for.",
)
@click.option(
    "--max-error-rate",
    type=click.FloatRange(0, 1),
    default=0.01,
    show_default=True,
    help="Share of the requests a server finishes with reason error per interval (all clients).",
)
@click.option("--failure-limit", type=click.IntRange(0), default=0, show_default=True,
              help="Failing intervals a check tolerates before it fails (and pages).")
@click.option(
    "--webhook",
    help="https URL paged on a breach (default: $FLEETCTL_WEBHOOK_URL / fleetctl_webhook_url).",
)
@json_option
@stream_options
@click.option(
    "--json-report", "json_file", metavar="F", help="Also write the verdicts as JSON to the file F."
)
@click.option(
    "--junit",
    "junit_file",
    metavar="F",
    help="Write JUnit XML (a test case per host and check) to F.",
)
@click.option("--html", "html_file", metavar="F", help="Write a self-contained HTML report to F.")
@click.option("--remediate", is_flag=True,
              help="Heal a breach: drain, restart, re-gate, re-admit; after --breaker of them in "
              "--window roll back to the known-good, else park (docs/watch.md).")
@click.option("--dry-run", is_flag=True,
              help="With --remediate: say what it would do, touch nothing.")
@click.option("--breaker", type=click.IntRange(1, 100), metavar="N", default=None,
              help="Remediations of a host in --window before a rollback (default: the recipe's "
              "watch.breaker, 3).")
@click.option("--window", type=Duration(), metavar="D", default=None,
              help="The breaker's window (default: the recipe's watch.window, 1h; a bare number is "
              "seconds).")
@click.option("--gate", "gate_seconds", type=Duration(0, 600), metavar="D", default=None,
              help="A remediation's re-gate: after smoke, D of concurrent greedy requests and the "
              "canaries (default: the recipe's watch.gate, 5s; 0: smoke only; a bare number is "
              "seconds).")
@pass_ctx
def watch(
    ctx: Ctx,
    limit: str | None,
    endpoints: tuple[str, ...],
    duration: float,
    interval: float,
    parallel: int,
    recipe: str | None,
    profile: str | None,
    models: tuple[str, ...],
    max_error_rate: float,
    failure_limit: int,
    webhook: str | None,
    json_file: str | None,
    junit_file: str | None,
    html_file: str | None,
    remediate: bool,
    dry_run: bool,
    breaker: int | None,
    window: float | None,
    gate_seconds: float | None,
) -> None:
    """Probe promoted hosts (or endpoints) every interval for hours; page the webhook on a breach.

    Each interval: one greedy canary compared with its first answer, one short streamed request,
    and the /metrics delta (errors, preemptions, acceptance, TTFT/TPOT). Writes the soak's verdicts
    and reports. Exit 0 when every host passed, 1 when one failed, 2 when inconclusive. With
    --remediate, a host whose every breach was healed passes (shown as healed); a parked host, or a
    breach not healed, fails.
    """
    if endpoints and limit:
        raise click.UsageError("--limit and --endpoint are exclusive")
    if endpoints and remediate:
        raise click.UsageError("--remediate acts on inventory hosts, not on --endpoint URLs")
    if interval <= 0 or duration < interval:
        raise click.UsageError(
            f"--interval {interval:g}s must be > 0 and at most --duration {duration:g}s"
        )
    # Before hours of probing: a report that cannot be written would end it as an internal error.
    report.check_report_paths(json_file, junit_file, html_file)
    from fleetctl import inventory as inv_mod
    from fleetctl.rollout.webhook import Webhook

    with contextlib.ExitStack() as stack:
        if endpoints:
            jobs = _endpoint_jobs(ctx, endpoints, profile, None, False, None, models, recipe)
        else:
            jobs = _host_jobs(
                ctx,
                inv_mod.load(ctx.inventory),
                limit,
                recipe,
                profile,
                None,
                False,
                None,
                None,
                stack,
            )
        try:
            # The webhook's settings are the inventory's, as for a rollout (an --endpoint watch may
            # have none).
            hook_vars = inv_mod.load(ctx.inventory).vars
        except FleetError:
            if not endpoints:
                raise
            hook_vars = {}
        url = (
            webhook
            or os.environ.get("FLEETCTL_WEBHOOK_URL")
            or hook_vars.get("fleetctl_webhook_url")
        )
        allow_http = hook_vars.get("fleetctl_webhook_allow_http") is True
        run = new_run_id("watch", "fleet")
        targets = []
        for j in jobs:
            rid = new_run_id("watch", j.target.name)
            targets.append(WatchTarget(j.target, j.config, j.state_dir / "runs" / rid, rid))
        settings = WatchSettings(duration=duration, interval=interval, parallel=parallel,
                                 max_server_error_rate=max_error_rate, failure_limit=failure_limit)
        try:
            state = paths.state_dir(inv_mod.default_inventory_path(ctx.inventory))
            with live.streams(ctx, "watch", state) as sink, \
                    ctx.progress("watch", ("phase", "interval", "errors", "message")) as shown:
                progress: Progress = Tee(sink, shown)
                hook = Webhook(str(url) if url else None, run, str(ctx.inventory or "-"), progress,
                               allow_http=allow_http)

                def page(host: str, check: str, message: str) -> None:
                    progress(Event("breach", f"{check}: {message}", host=host))
                    hook.send("breach", host=host, check=check, message=message)

                heal = (None if endpoints else _remedy(
                    ctx, stack, [j.target.name for j in jobs], progress, page, hook,
                    dict(remediate=remediate, breaker=breaker, window=window, gate=gate_seconds),
                    dry_run))
                try:
                    verdicts = run_watch(targets, settings, progress, page, heal)
                finally:
                    for d in hook.close():
                        if d.error:
                            progress(Event("webhook", f"{d.event}: {d.error}"))
        finally:
            ssh.close_all()
    finish(ctx, verdicts, _summary(verdicts), json_file, junit_file, html_file)


def _remedy(ctx: Ctx, stack: contextlib.ExitStack, hosts: list[str], progress: Progress,
            page: Callable[[str, str, str], None], hook: Webhook, overrides: dict[str, Any],
            dry_run: bool) -> Remedy | None:
    """The watch's remedy when --remediate or a recipe's watch.remediate asks for one (None:
    page only). Every recipe's policy is read here, before the first probe."""
    from fleetctl import inventory as inv_mod
    from fleetctl.recipes import Recipe, load_recipes
    from fleetctl.remediate import heal, policy
    from fleetctl.rollout.api import Engine

    inv = inv_mod.load(ctx.inventory)
    policies = {n: policy.with_overrides(policy.from_mapping(r.watch, n), **overrides)
                for n, r in load_recipes(inv).items()}
    if not any(p.remediate for p in policies.values()):
        return None
    eng = Engine(inv, progress)
    stack.callback(eng.close)

    def policy_of(r: Recipe) -> policy.Policy:
        return policies[r.name]

    fixer = heal.Remediator(eng, hosts, policy_of, progress=progress, page=page, dry_run=dry_run,
                            notify=lambda r: hook.send("remediation", **r))

    if not dry_run:
        fixer.recover()  # what a watch killed mid-remediation left drained or stopped

    def remedy(host: str, check: str, message: str) -> tuple[Remedied, bool]:
        try:
            r = fixer.remediate(host, check, message)
        except FleetError as e:
            progress(Event("remediation", f"failed: {e.cause}", host=host))
            hook.send("remediation", host=host, check=check, result="error", detail=e.cause)
            return Remedied(check, message, heal.NONE, "error", False, e.cause), True
        return r.remedied()

    return remedy


commands: list[click.Command] = [watch]
