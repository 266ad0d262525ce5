"""``fleetctl soak``: judge the serving containers of some hosts (or any endpoint) with real load.

Exit codes: 0 every soak passed; 1 some soak failed; 2 inconclusive, an
endpoint that is down, or the soak could not run (bad options, no hosts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
from rich.console import Console
from rich.text import Text

from fleetctl import inventory, paths, secretenv, ssh
from fleetctl.cli import live
from fleetctl.cli.output import Col, Ctx, Duration, fit_table, json_option, pass_ctx, stream_options
from fleetctl.cli.soak_baseline import (
    known_good_option,
    refs_of,
    render_refs,
    render_windows,
    window_json,
)
from fleetctl.errors import ExitCode, FleetError
from fleetctl.inventory import Host, Inventory
from fleetctl.progress import Event, Progress, Tee
from fleetctl.runids import new_run_id
from fleetctl.serving import container_name
from fleetctl.soak import baselines, fleet, references, report, secrets
from fleetctl.soak.checks.judge import pct
from fleetctl.soak.config import SoakConfig
from fleetctl.soak.container import DockerOverSSH
from fleetctl.soak.profiles import PROFILES
from fleetctl.soak.recipe_soak import from_recipe, load_config
from fleetctl.soak.run import Against, run_soak
from fleetctl.soak.verdict import ContainerAccess, Outcome, SoakTarget, Verdict

_STYLE = {
    "pass": "green",
    "fail": "red",
    "inconclusive": "yellow",
    "error": "magenta",
    "skipped": "dim",
}

#: Hosts soaked at once (a thread and an event loop each, with up to the largest level + 8
#: connections): as many as the rollout's gates run together (rollout.session.MAX_WORKERS).
MAX_PARALLEL_SOAKS = 32


@dataclasses.dataclass(frozen=True)
class _Job:
    target: SoakTarget
    config: SoakConfig
    baseline: Verdict | None
    state_dir: Path
    run_id: str
    #: Where its baseline is kept (the fleet's ledger); None for an --endpoint (no baseline).
    store: baselines.Store | None = None
    #: The key its baseline is kept under: the host's name, or a unit's own (``unit:NAME``) for a
    #: unit.
    baseline_key: str = ""
    #: The recipe's known-good reference set's key (soak/references.py), empty for an --endpoint.
    ref_key: str = ""
    recipe: str = ""


def _exit_code(outcome: Outcome) -> ExitCode:
    return {Outcome.PASS: ExitCode.OK, Outcome.FAIL: ExitCode.FAILED}.get(
        outcome, ExitCode.INCONCLUSIVE
    )


def _tag_of(container: ContainerAccess | None) -> tuple[str, str]:
    """The (tag, digest) the container serves, as ``fleetctl status`` names them: a digest-pinned
    container's tag is its ``fleetctl.tag`` label, never the digest's hex (baselines are keyed by
    it)."""
    if container is None:
        return "", ""
    try:
        st = container.state()
    except FleetError:
        return "", ""
    return st.tag or "", st.digest or ""


def _host_jobs(
    ctx: Ctx,
    inv: Inventory,
    limit: str | None,
    recipe_name: str | None,
    profile: str | None,
    duration: float | None,
    smoke_only: bool,
    ready_timeout: float | None,
    baseline_tag: str | None,
    stack: contextlib.ExitStack,
) -> list[_Job]:
    from fleetctl.recipes import load_recipes

    hosts = inv.select(limit)
    if not hosts:
        raise FleetError(f"no hosts selected in {inv.path}", fix="check --limit and the inventory")
    recipes = load_recipes(inv)
    state = paths.state_dir(inv.path)
    store = stack.enter_context(baselines.open_for(inv, state))
    jobs: list[_Job] = []
    for h in unit_heads(inv, hosts):
        name = recipe_name or h.vars.get("fleetctl_recipe")
        key = baseline_key(inv, h.name, name)
        if not name:
            raise FleetError("no recipe to soak with", host=h.name,
                             fix="set fleetctl_recipe for the host or pass --recipe NAME")
        if name not in recipes:
            raise FleetError(
                f"unknown recipe {name!r}", host=h.name, fix=f"use one of: {', '.join(recipes)}"
            )
        recipe = recipes[name]
        cfg = _adjust(fleet.host_config(recipe, h, profile), duration, smoke_only, ready_timeout)
        container = DockerOverSSH(h, container_name(h))
        tag, digest = _tag_of(container)
        target = dataclasses.replace(
            fleet.host_target(
                h, recipe, tag, secretenv.api_key(recipe.secret_env, recipe=recipe.name)
            ),
            digest=digest,
        )
        tag = target.tag
        base = baselines.load(store, key, baseline_tag or tag) if not smoke_only else None
        jobs.append(_Job(target, cfg, base, state, new_run_id("soak", h.name), store, key,
                         references.host_key(recipe.name, h.vars), recipe.name))
    return jobs


def unit_heads(inv: Inventory, hosts: Sequence[Host]) -> list[Host]:
    """``hosts`` with each unit's members replaced by its head, once: a unit serves its API on its
    head only
    (its workers are headless), and its throughput is the whole unit's."""
    out: list[Host] = []
    for h in hosts:
        unit = inv.unit_of(h.name)
        head = h if unit is None else inv.host(unit.head)
        if all(o.name != head.name for o in out):
            out.append(head)
    return out


def baseline_key(inv: Inventory, host: str, recipe: str | None = None) -> str:
    """The key ``host``'s soaks are judged and kept under: its unit's (``unit:NAME``), else its
    recipe's on it (``recipe``, else its own; :func:`baselines.host_key`)."""
    if (unit := inv.unit_of(host)) is not None:
        return baselines.unit_key(unit.name)
    own = recipe or inv.host(host).vars.get("fleetctl_recipe")
    return baselines.host_key(host, str(own or "") or None, inv.vars.get("fleetctl_recipe"))


def baseline_keys(inv: Inventory, limit: str | None) -> list[str]:
    """The baselines' keys of the selected hosts (:func:`baseline_key`), a unit's once."""
    return list(dict.fromkeys(baseline_key(inv, h.name) for h in inv.select(limit)))


def _endpoint_jobs(
    ctx: Ctx,
    endpoints: tuple[str, ...],
    profile: str | None,
    duration: float | None,
    smoke_only: bool,
    ready_timeout: float | None,
    models: tuple[str, ...],
    recipe_name: str | None = None,
) -> list[_Job]:
    from fleetctl import inventory as inv_mod

    state = paths.state_dir(inv_mod.default_inventory_path(ctx.inventory))
    base = load_config({}, profile=profile, served_model_names=models)
    if recipe_name:
        # --recipe with --endpoint applies the recipe's gate (its soak: settings, names, speculative
        # flag): an option is honoured or refused, never ignored.
        from fleetctl.recipes import load_recipes

        recipes = load_recipes(inv_mod.load(ctx.inventory))
        if recipe_name not in recipes:
            raise FleetError(f"--recipe {recipe_name!r} is not a recipe of the inventory",
                             fix=f"use one of: {', '.join(recipes)} (or leave --recipe out)")
        base = from_recipe(recipes[recipe_name], profile=profile)
        if models:
            # --model names the served names to expect: they are the ones each asked once.
            plan = tuple(dataclasses.replace(c, params={"names": list(models)},
                                             source=f"--model {', '.join(models)}")
                         if c.name == "served_names" else c for c in base.plan)
            base = dataclasses.replace(base, served_model_names=models, plan=plan)
    jobs = []
    for url in endpoints:
        secrets.validate_endpoint(url)
        _refuse_query(url)
        cfg = _adjust(base, duration, smoke_only, ready_timeout)
        name = url.split("://", 1)[1].rstrip("/")
        # Any vLLM behind --endpoint may require a key: $VLLM_API_KEY (or its _FILE) when set.
        target = SoakTarget(
            name, url.rstrip("/"), api_key=secretenv.lookup(secretenv.API_KEY_ENV, os.environ)
        )
        jobs.append(_Job(target, cfg, None, state, new_run_id("soak", name)))
    return jobs


def _refuse_query(url: str) -> None:
    """An endpoint with a query or fragment is refused: a token there (``?api_key=``) would reach
    progress, the event log and the run directory's name, and every path asked would follow it."""
    u = urllib.parse.urlsplit(url)
    if u.query or u.fragment or url.rstrip().endswith(("?", "#")):
        shown = urllib.parse.urlunsplit((u.scheme, u.netloc, u.path, "", ""))
        raise FleetError(
            f"--endpoint {shown}?<redacted> carries a query or fragment: a token there would be "
            "shown in progress, the event log and the run directory's name, and the soak would ask "
            "for /?...health",
            fix="give the server's root (e.g. http://10.0.0.11:8000) and the key in $VLLM_API_KEY "
                "(or $VLLM_API_KEY_FILE), sent as Authorization: Bearer")


def _adjust(
    cfg: SoakConfig, duration: float | None, smoke_only: bool, ready_timeout: float | None
) -> SoakConfig:
    if duration is not None:
        cfg = cfg.with_duration(duration)
    if ready_timeout is not None:
        cfg = dataclasses.replace(cfg, readiness_timeout=ready_timeout)
    return dataclasses.replace(cfg, smoke_only=smoke_only)


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise click.UsageError(
            f"--concurrency {text!r} is not a list of whole numbers (e.g. 1,4,16)"
        ) from None
    if not levels or any(c < 1 for c in levels) or list(levels) != sorted(set(levels)):
        raise click.UsageError(f"--concurrency {text!r} must list rising levels >= 1 (e.g. 1,4,16)")
    return levels


def _run(job: _Job, progress: Progress) -> Verdict:
    artifacts = job.state_dir / "runs" / job.run_id
    try:
        return run_soak(
            job.target,
            job.config,
            Against(job.baseline, reference=references.load(job.store, job.ref_key)
                    if job.store and job.ref_key else None),
            progress,
            artifacts_dir=artifacts,
            run_id=job.run_id,
        )
    except FleetError as e:  # e.g. the artifacts dir cannot be written: the soak could not run
        progress(Event("error", e.message(), host=job.target.name))
        raise


def _summary(verdicts: list[Verdict]) -> Callable[[Console], None]:
    def render(out: Console) -> None:
        rows = []
        for v in verdicts:
            sweep = [lv for lv in v.levels if lv.tok_s]
            peak = max(sweep, key=lambda lv: lv.tok_s or 0.0) if sweep else None
            acc = [w.accepted_tokens or 0.0 for w in v.windows]
            dt = [w.draft_tokens or 0.0 for w in v.windows]
            why = "; ".join(f"{c.name}: {c.message}" for c in v.checks
                            if c.outcome in (Outcome.FAIL, Outcome.ERROR, Outcome.INCONCLUSIVE)
                            and not c.observe_only)
            rows.append(
                [
                    v.target,
                    f"[{_STYLE[v.outcome.value]}]{v.outcome.value}[/]",
                    v.tag or "-",
                    f"{peak.tok_s:.0f} ({peak.label})" if peak and peak.tok_s else "-",
                    str(sum(lv.requests for lv in v.levels)),
                    str(sum(lv.errors for lv in v.levels)),
                    pct(sum(acc) / sum(dt)) if sum(dt) else "-",
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
                    Col("peak tok/s", drop=1),
                    Col("requests", drop=4),
                    Col("errors", drop=3),
                    "acceptance",
                    Col("why", flex=True),
                ],
                rows,
                title="soak",
            )
        )
        for v in verdicts:
            if v.artifacts_dir:
                out.print(f"[dim]{v.target}: artifacts in {v.artifacts_dir}[/]")

    return render


@click.group("soak", invoke_without_command=True)
@click.option(
    "--limit", "-l", metavar="HOSTS", help="Hosts to soak (Ansible pattern); default: every host."
)
@click.option("--endpoint", "endpoints", multiple=True, metavar="URL",
              help="Soak this OpenAI-compatible endpoint instead of inventory hosts (repeatable).")
@click.option("--duration", "-d", type=Duration(), metavar="D",
              help="Length of the sustained phase (90s, 10m, 1h; a bare number is seconds).")
@click.option(
    "--recipe",
    metavar="NAME",
    help="Recipe whose gate to apply (default: each host's fleetctl_recipe).",
)
@click.option(
    "--profile",
    type=click.Choice(PROFILES),
    help="Gate profile (default: the recipe's, else spark).",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME",
    help="With --endpoint: served model names to expect (the first is used for requests).",
)
@click.option(
    "--concurrency", metavar="LIST", help="Sweep levels, e.g. 1,4,16 (default: the recipe's)."
)
@click.option("--smoke-only", is_flag=True, help="Readiness, identity and smoke only (no load).")
@click.option(
    "--ready-timeout",
    type=Duration(),
    metavar="D",
    help="How long to wait for /health 200 (90s, 10m; a bare number is seconds; default: the "
         "profile's).",
)
@click.option(
    "--baseline-tag",
    metavar="TAG",
    help="Compare with this tag's baseline (default: the serving tag).",
)
@click.option(
    "--no-save-baseline",
    is_flag=True,
    help="Do not keep a passing soak as the host's new baseline.",
)
@stream_options
@click.option(
    "--watch", "watch_flag", is_flag=True, help="Refused: the continuous probe is `fleetctl watch`."
)
@json_option
@click.option(
    "--json-report", "json_file", metavar="F", help="Also write the verdicts as JSON to the file F."
)
@click.option(
    "--junit",
    "junit_file",
    metavar="F",
    help="Write JUnit XML (a test case per host and check) to F.",
)
@click.option(
    "--html", "html_file", metavar="F", help="Write a self-contained HTML report with charts to F."
)
@pass_ctx
@click.pass_context
def soak(
    cctx: click.Context,
    ctx: Ctx,
    limit: str | None,
    endpoints: tuple[str, ...],
    duration: float | None,
    recipe: str | None,
    profile: str | None,
    models: tuple[str, ...],
    concurrency: str | None,
    smoke_only: bool,
    ready_timeout: float | None,
    baseline_tag: str | None,
    no_save_baseline: bool,
    watch_flag: bool,
    json_file: str | None,
    junit_file: str | None,
    html_file: str | None,
) -> None:
    """Soak serving hosts (or endpoints) in parallel and gate on the verdict.

    Exit 0 when every soak passed, 1 when one failed, 2 when one was
    inconclusive or could not run (an endpoint that is down is an error, not
    a failure).
    """
    if cctx.invoked_subcommand is not None:
        return
    if watch_flag:
        # --duration here is the sustained phase and there is no interval: the watch's options mean
        # other things, so it is its own command rather than a soak mode.
        raise click.UsageError(
            "soak --watch is `fleetctl watch` (e.g. `fleetctl watch --limit HOSTS --duration 8h "
            "--interval 60s`): a watch's --duration is the whole watch and it takes --interval"
        )
    if endpoints and limit:
        raise click.UsageError("--limit and --endpoint are exclusive")
    # Before any traffic: a report that cannot be written would end a finished soak as an internal
    # error.
    report.check_report_paths(json_file, junit_file, html_file)
    with contextlib.ExitStack() as stack:
        _soak(
            ctx,
            stack,
            limit,
            endpoints,
            duration,
            recipe,
            profile,
            models,
            concurrency,
            smoke_only,
            ready_timeout,
            baseline_tag,
            no_save_baseline,
            json_file,
            junit_file,
            html_file,
        )


def _soak(
    ctx: Ctx,
    stack: contextlib.ExitStack,
    limit: str | None,
    endpoints: tuple[str, ...],
    dur: float | None,
    recipe: str | None,
    profile: str | None,
    models: tuple[str, ...],
    concurrency: str | None,
    smoke_only: bool,
    ready: float | None,
    baseline_tag: str | None,
    no_save_baseline: bool,
    json_file: str | None,
    junit_file: str | None,
    html_file: str | None,
) -> None:
    inv: Inventory | None = None
    if endpoints:
        if baseline_tag:
            raise click.UsageError(
                "--baseline-tag needs inventory hosts: an --endpoint soak keeps no baseline"
            )
        jobs = _endpoint_jobs(ctx, endpoints, profile, dur, smoke_only, ready, models, recipe)
    else:
        inv = inventory.load(ctx.inventory)
        jobs = _host_jobs(
            ctx, inv, limit, recipe, profile, dur, smoke_only, ready, baseline_tag, stack
        )
    if concurrency:
        levels = _levels(concurrency)
        jobs = [
            dataclasses.replace(j, config=dataclasses.replace(j.config, concurrency=levels))
            for j in jobs
        ]

    verdicts: list[Verdict] = []
    try:
        # An endpoint soak keeps its event log where it keeps its artifacts (the default
        # inventory's state).
        state = paths.state_dir(
            inv.path if inv is not None else inventory.default_inventory_path(ctx.inventory)
        )
        with (
            live.streams(ctx, "soak", state, inv) as sink,
            ctx.progress(
                "soak", ("phase", "concurrency", "tok_s", "acceptance", "errors", "message")
            ) as shown,
            ThreadPoolExecutor(
                max_workers=min(len(jobs), MAX_PARALLEL_SOAKS), thread_name_prefix="soak"
            ) as pool,
        ):
            progress = Tee(sink, shown)
            futures = [pool.submit(_run, j, progress) for j in jobs]
            verdicts = [f.result() for f in futures]
    finally:
        ssh.close_all()

    for job, v in zip(jobs, verdicts, strict=True):
        if (
            not no_save_baseline
            and job.store is not None
            and job.target.container is not None
            and not smoke_only
        ):
            baselines.save(job.store, job.baseline_key or job.target.name, job.target.tag, v)
            if job.ref_key:
                references.save(job.store, job.ref_key, v, job.recipe)
    base_map = {j.target.name: j.baseline for j in jobs if j.baseline is not None}
    finish(ctx, verdicts, _summary(verdicts), json_file, junit_file, html_file, base_map)


def finish(
    ctx: Ctx,
    verdicts: list[Verdict],
    summary: Callable[[Console], None],
    json_file: str | None,
    junit_file: str | None,
    html_file: str | None,
    base_map: dict[str, Verdict] | None = None,
) -> None:
    """Write the requested reports, print the verdicts (JSON or ``summary``) and exit as the worst
    one says."""
    if json_file:
        report.write_json(Path(json_file), verdicts)
    if junit_file:
        report.write_junit(Path(junit_file), verdicts)
    if html_file:
        report.write_html(Path(html_file), verdicts, base_map)
    if ctx.json:
        if ctx.events == "-":  # stdout is JSON lines: the result is the last one
            ctx.emit(json.loads(report.to_json(verdicts)), lambda con: None)
        else:
            click.echo(report.to_json(verdicts))
    else:
        summary(ctx.out)
    code = _exit_code(report.worst(verdicts))
    if code != ExitCode.OK:
        raise click.exceptions.Exit(int(code))


@soak.group("baseline")
def baseline() -> None:
    """Show, pin or reset the hosts' baselines (the last passing soaks a soak is compared with)."""


def _windows(
    ctx: Ctx, limit: str | None, tag: str | None, stack: contextlib.ExitStack
) -> tuple[baselines.Store, list[str], list[baselines.Window]]:
    """The fleet's baseline store (its ledger, either backend), the selected hosts and their
    windows."""
    from fleetctl import inventory as inv_mod

    inv = inv_mod.load(ctx.inventory)
    hosts = baseline_keys(inv, limit)
    store = stack.enter_context(baselines.open_for(inv, paths.state_dir(inv.path)))
    found = [w for h in hosts for w in baselines.windows(store, h) if tag is None or w.tag == tag]
    return store, hosts, found


@baseline.command("show")
@click.option(
    "--limit", "-l", metavar="HOSTS", help="Hosts (Ansible pattern); default: every host."
)
@click.option("--tag", metavar="TAG", help="Only this tag's baselines.")
@known_good_option
@json_option
@pass_ctx
def baseline_show(ctx: Ctx, limit: str | None, tag: str | None, known_good: str | None) -> None:
    """Each host's baseline per tag: how many passing runs it combines, pinned or not, its
    figures (--known-good all|RECIPE: the recipes' known-good reference sets)."""
    with contextlib.ExitStack() as stack:
        store, _hosts, ws = _windows(ctx, limit, tag, stack)
        if known_good:
            refs = refs_of(store, known_good)
            ctx.emit(refs, render_refs(refs))
            return
    ctx.emit([window_json(w) for w in ws], render_windows(ws))


@baseline.command("pin")
@click.option("--limit", "-l", metavar="HOSTS", help="Hosts (Ansible pattern).")
@click.option("--tag", metavar="TAG", help="The tag whose baseline to pin.")
@click.option("--unpin", is_flag=True, help="Let passing soaks move the baseline again.")
@known_good_option
@json_option
@pass_ctx
def baseline_pin(ctx: Ctx, limit: str | None, tag: str | None, unpin: bool,
                 known_good: str | None) -> None:
    """Freeze a baseline: later passing soaks no longer move it (a known-good reference)."""
    with contextlib.ExitStack() as stack:
        store, hosts, _ws = _windows(ctx, limit, tag, stack)
        if known_good:
            references.pin(store, references.key(known_good), pinned=not unpin)
            refs = refs_of(store, known_good)
            ctx.emit(refs, render_refs(refs))
            return
        if not limit or not tag:
            raise click.UsageError("give --limit HOSTS and --tag TAG (or --known-good RECIPE)")
        done = [baselines.pin(store, h, tag, pinned=not unpin) for h in hosts]
    ctx.emit([window_json(w) for w in done], render_windows(done))


@baseline.command("reset")
@click.option("--limit", "-l", metavar="HOSTS", help="Hosts (Ansible pattern).")
@click.option("--tag", metavar="TAG", help="The tag whose baseline to forget.")
@known_good_option
@json_option
@pass_ctx
def baseline_reset(ctx: Ctx, limit: str | None, tag: str | None, known_good: str | None) -> None:
    """Forget a baseline (after a hardware change, or a lucky run): the next passing soak starts a
    new one (--known-good RECIPE: the recipe's reference sets; its next soak is a first deploy)."""
    with contextlib.ExitStack() as stack:
        store, hosts, _ws = _windows(ctx, limit, tag, stack)
        if known_good:
            key = references.key(known_good)
            ctx.emit({key: references.reset(store, key)}, lambda out: out.print(
                f"{key}: reference sets removed", highlight=False, markup=False))
            return
        if not limit or not tag:
            raise click.UsageError("give --limit HOSTS and --tag TAG (or --known-good RECIPE)")
        gone = {h: baselines.reset(store, h, tag) for h in hosts}

    def render(out: Console) -> None:
        for h, g in gone.items():
            out.print(f"{h}: {'baseline of ' + tag + ' removed' if g else 'no baseline of ' + tag}",
                      highlight=False, markup=False)

    ctx.emit(gone, render)


commands: list[click.Command] = [soak]
