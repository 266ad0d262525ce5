"""``fleetctl lab``: bring the simulated Spark fleet up or down, show it, set node faults, add
image tags."""

from __future__ import annotations

import shlex
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from fleetctl import lab
from fleetctl.cli.output import Col, Ctx, Duration, fit_table, json_option, pass_ctx
from fleetctl.errors import ExitCode, FleetError
from fleetctl.lab import nodes as nodes_mod


@click.group("lab")
def lab_group() -> None:
    """A simulated fleet of DGX Sparks on this machine ($FLEETCTL_LAB_DIR, $FLEETCTL_LAB_SUBNET)."""


def _render_status(st: lab.LabStatus) -> Any:
    def render(out: Console) -> None:
        word = (
            "[green]up[/]" if st.up else "[red]down[/]" if not st.nodes else "[yellow]degraded[/]"
        )
        out.print(f"lab {st.directory}  {word}  subnet {st.subnet}")
        if not st.nodes and not any(st.services.values()):
            out.print("nothing running: `fleetctl lab up` builds it")
            return
        rows = []
        for n in st.nodes:
            colour = {"running": "green", "paused": "yellow", "disconnected": "yellow"}.get(
                n.state, "red"
            )
            # gpu and driver have their own columns; highlight them when they are faults.
            faults = (
                ", ".join(f"{k}={v}" for k, v in n.faults.items() if k not in ("gpu", "driver"))
                or "-"
            )
            gpu = f"[yellow]{n.gpu}[/]" if "gpu" in n.faults else n.gpu
            driver = f"[yellow]{n.driver}[/]" if "driver" in n.faults else n.driver
            containers = (
                ", ".join(f"{c.name} ({c.image.rsplit('/', 1)[-1]})" for c in n.containers) or "-"
            )
            rows.append(
                [
                    n.name,
                    n.address,
                    f"[{colour}]{n.state}[/]",
                    gpu,
                    driver,
                    Text(faults),
                    Text(containers),
                ]
            )
        out.print(
            fit_table(
                out.width,
                [
                    "node",
                    "address",
                    "state",
                    Col("gpu", drop=1),
                    Col("driver", drop=2),
                    Col("faults", flex=True, min=8),
                    Col("containers", flex=True),
                ],
                rows,
            )
        )
        svc = "  ".join(
            f"{k}: {'[green]ok[/]' if v else '[red]down[/]'}" for k, v in st.services.items()
        )
        out.print(svc)
        out.print(f"registry    {st.registry}")
        out.print(f"apt         {st.apt_url}  (key {st.apt_key_url})")
        out.print(f"weights     {st.weights_url}")
        for unit, members in st.units.items():
            out.print(f"unit        {unit}: {', '.join(members)} (fabric MTU 9000)")
        by_recipe: dict[str, list[str]] = {}
        for node, recipe in st.recipes.items():
            by_recipe.setdefault(recipe, []).append(node)
        for recipe, names in by_recipe.items():
            out.print(Text(f"recipe      {recipe}: {', '.join(names)} (host_vars; the other "
                           "nodes the inventory's default)"))
        out.print(f"inventory   {st.inventory}")
        user = st.bastion.partition("@")[0]
        out.print(
            f"ssh         -F {st.ssh_config} -J bastion {user}@<address>   (bastion {st.bastion})"
        )
        out.print(f"vault       {st.vault_password_file} (named by the ansible.cfg beside the "
                  "inventory: no export needed)")
        out.print(f"docker      DOCKER_HOST={st.docker_host}")
    return render


@lab_group.command("up")
@click.option(
    "--nodes",
    "-n",
    default=4,
    show_default=True,
    type=click.IntRange(1, 40),
    help="Number of Sparks.",
)
@click.option(
    "--units",
    "-u",
    default=0,
    show_default=True,
    type=click.IntRange(0, 20),
    help="Two-node units made of the last 2*M nodes, joined by a fabric network with MTU 9000.",
)
@click.option(
    "--recipe",
    "recipes",
    metavar="NODE=RECIPE",
    multiple=True,
    help="Give NODE (or NODE,NODE...) a recipe of its own (host_vars/NODE/recipe.yml); repeat for "
         "more. Each up rewrites them: nodes not named serve the inventory's default.",
)
@json_option
@pass_ctx
def up_cmd(ctx: Ctx, nodes: int, units: int, recipes: tuple[str, ...]) -> None:
    """Build and start the lab (idempotent; a second run reuses everything it can)."""
    assigned = lab.parse_recipe_options(recipes)
    with ctx.progress("lab up", ("phase", "message")) as progress:
        st = lab.up(nodes=nodes, units=units, progress=progress, recipes=assigned)
    ctx.emit(st, _render_status(st))


@lab_group.command("down")
@json_option
@pass_ctx
def down_cmd(ctx: Ctx) -> None:
    """Remove everything the lab created (the shared cache of rootfs builds is kept)."""
    with ctx.progress("lab down") as progress:
        left = lab.down(progress=progress)
    result = {"removed": not left, "leftovers": left}

    def render(out: Console) -> None:
        if left:
            out.print("[red]left behind:[/]\n  " + "\n  ".join(left))
        else:
            out.print("lab removed")

    ctx.emit(result, render)
    if left:
        raise click.exceptions.Exit(int(ExitCode.FAILED))


@lab_group.command("status")
@json_option
@pass_ctx
def status_cmd(ctx: Ctx) -> None:
    """Show the lab's nodes (address, state, faults, running containers) and services."""
    st = lab.status()
    ctx.emit(st, _render_status(st))
    if st.nodes and not st.up:
        raise click.exceptions.Exit(int(ExitCode.FAILED))


@lab_group.command("env")
@json_option
@pass_ctx
def env_cmd(ctx: Ctx) -> None:
    """Print the shell exports for using the lab: `eval "$(fleetctl lab env)"`.

    ANSIBLE_VAULT_PASSWORD_FILE decrypts the admin user's sudo password in the lab's inventory
    (as an operator's vault password file would); DOCKER_HOST reaches the lab's own engine.
    """
    st = lab.status()
    env = {
        "ANSIBLE_VAULT_PASSWORD_FILE": str(st.vault_password_file),
        "DOCKER_HOST": st.docker_host,
    }

    def render(out: Console) -> None:
        for k, v in env.items():
            out.print(f"export {k}={shlex.quote(v)}", markup=False, highlight=False, soft_wrap=True)

    ctx.emit(env, render)


@lab_group.command("node")
@click.argument("name")
@click.option(
    "--gpu", metavar="MODEL", help='GPU model nvidia-smi reports, e.g. "NVIDIA H100 80GB HBM3".'
)
@click.option("--driver", metavar="VERSION", help="Driver version, e.g. 535.183.01.")
@click.option(
    "--disk-gb", type=click.IntRange(1, nodes_mod.OPT_SIZE_GB),
    help="Size of /opt in GB (a tmpfs, remounted).",
)
@click.option(
    "--pause/--resume",
    "paused",
    default=None,
    help="Freeze the node (it stops answering) or thaw it.",
)
@click.option(
    "--disconnect/--connect",
    "disconnected",
    default=None,
    help="Take the node off the network or back.",
)
@click.option(
    "--next-kernel-without-nvidia/--no-next-kernel-without-nvidia",
    "next_kernel",
    default=None,
    help="Install a newer kernel with no NVIDIA module built for it.",
)
@click.option(
    "--revoke-access/--restore-access",
    "revoked",
    default=None,
    help="Take sudo and the docker group from the admin user, or give back the node's default.",
)
@click.option(
    "--fabric-mtu",
    type=int,
    metavar="MTU",
    help="A unit member's first fabric netdev MTU (1500: the fault; 9000).",
)
@click.option("--fabric-down/--fabric-up", "fabric_down", default=None,
              help="Take a unit member's second fabric half (netdev and its HCA) down, or up.")
@click.option(
    "--fabric-via-mgmt/--fabric-direct",
    "fabric_via_mgmt",
    default=None,
    help="Route a unit member's peers over the management network (slow), or back over the fabric.",
)
@click.option(
    "--kill-worker",
    is_flag=True,
    help="SIGKILL the vLLM container on a unit member (a worker dying mid-soak).",
)
@click.option(
    "--reset", is_flag=True, help="Make the node healthy first (then apply the other options)."
)
@click.option("--wedge/--unwedge", "wedged", default=None,
              help="Its serving engine stops producing tokens while /health and /metrics answer "
              "(a restart heals it), or produces them again (and --wedge-after-start is cleared).")
@click.option("--wedge-after-start", type=Duration(), metavar="D", default=None,
              help="Its serving container wedges D after this and after every later start (10s; a "
              "bare number is seconds).")
@json_option
@pass_ctx
def node_cmd(
    ctx: Ctx,
    name: str,
    gpu: str | None,
    driver: str | None,
    disk_gb: int | None,
    paused: bool | None,
    disconnected: bool | None,
    next_kernel: bool | None,
    revoked: bool | None,
    fabric_mtu: int | None,
    fabric_down: bool | None,
    fabric_via_mgmt: bool | None,
    kill_worker: bool,
    reset: bool,
    wedged: bool | None,
    wedge_after_start: float | None,
) -> None:
    """Set faults on one node: wrong GPU, old driver, small disk, paused, disconnected, bad next
    kernel, no rights; on a unit member, its fabric's faults, or its worker killed; its serving
    engine wedged (now, or after every start)."""
    from fleetctl.lab import wedge

    wedge_only = (wedged is not None or wedge_after_start is not None) and not reset and all(
        v is None for v in (gpu, driver, disk_gb, paused, disconnected, next_kernel, revoked,
                            fabric_mtu, fabric_down, fabric_via_mgmt)) and not kill_worker
    if wedged is not None:
        wedge.apply(name, wedge.WEDGE if wedged else wedge.UNWEDGE)
    if wedge_after_start is not None:
        wedge.apply(name, wedge.AFTER_START, wedge_after_start)
    if wedge_only:
        node = lab.status().node(name)
    else:
        node = lab.set_node(
            name,
            gpu=gpu,
            driver=driver,
            disk_gb=disk_gb,
            paused=paused,
            disconnected=disconnected,
            next_kernel_without_nvidia=next_kernel,
            revoked_access=revoked,
            reset=reset,
            fabric_mtu=fabric_mtu,
            fabric_down=fabric_down,
            fabric_via_mgmt=fabric_via_mgmt,
            kill_worker=kill_worker,
        )
    acts = (["wedged" if wedged else "unwedged"] if wedged is not None else []) + (
        [f"wedges {wedge_after_start:g}s after every start"] if wedge_after_start is not None
        else [])

    def render(out: Console) -> None:
        faults = ", ".join(f"{k}={v}" for k, v in node.faults.items()) or "healthy"
        out.print(f"{node.name} ({node.address}): {node.state}; {faults}"
                  + (f"; serving engine {', '.join(acts)}" if acts else ""))

    ctx.emit(node, render)


def _settings(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise FleetError(
                f"--set {v!r} is not KEY=VALUE", fix="e.g. --set EMU_CRASH_AT_CONCURRENCY=32"
            )
        out[key] = val
    return out


@lab_group.command("image")
@click.option("--tag", required=True, help="Tag to push (in --repository).")
@click.option("--repository", default=lab.images.VLLM_REPOSITORY, show_default=True)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Environment baked into the image (EMU_* knobs).",
)
@click.option(
    "--from-dir",
    type=click.Path(exists=True, file_okay=False),
    help="Build from this directory instead of the emulator.",
)
@click.option(
    "--cmd",
    help="Entrypoint command line (with --from-dir, or to replace `vllm`), split like a shell.",
)
@json_option
@pass_ctx
def image_cmd(ctx: Ctx, tag: str, repository: str, settings: tuple[str, ...], from_dir: str | None,
              cmd: str | None) -> None:
    """Add an image tag to the lab registry: the emulator with knobs, or any directory and
    command."""
    import shlex

    with ctx.progress("lab image") as progress:
        ref = lab.add_image(tag, _settings(settings), repository=repository, from_dir=from_dir,
                            cmd=shlex.split(cmd) if cmd else None, progress=progress)
    ctx.emit({"ref": ref}, lambda out: out.print(ref))


@lab_group.command("traffic")
@click.option(
    "--rate", type=click.FloatRange(0.1, 200), required=True, help="Requests started per second."
)
@click.option("--duration", type=Duration(1, 3600), required=True, metavar="D",
              help="How long to send (90s, 3m, at most 1h; a bare number is seconds).")
@click.option("--url", help="Send to this server instead of the lab's front door (http://HOST:PORT).")
@click.option(
    "--model", help="Model name to ask for (default: the lab recipe's first served name)."
)
@click.option("--max-tokens", type=click.IntRange(1, 4096), default=16, show_default=True)
@json_option
@pass_ctx
def traffic_cmd(
    ctx: Ctx, rate: float, duration: float, url: str | None, model: str | None, max_tokens: int
) -> None:
    """Send users' traffic through the lab's front door: streaming chat requests at a steady rate.

    Reports sent / ok / failed / p50 / p95 (--json: an object with those keys). Exits 1 when a
    request failed. SIGTERM or Ctrl-C stops the sending early; the requests already sent are waited
    for and reported.
    """
    import signal
    import threading

    from fleetctl.lab import traffic

    door_url, default_model, key = (
        traffic.lab_target() if url is None or model is None else (url, model, None)
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with ctx.progress("lab traffic") as progress:
        rep = traffic.run(url or door_url, model or default_model, rate, duration, api_key=key,
                          max_tokens=max_tokens, progress=progress, stop=stop)

    def render(out: Console) -> None:
        def secs(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"

        out.print(
            fit_table(
                out.width,
                ["sent", "ok", "failed", "p50 s", "p95 s", "max s"],
                [
                    [
                        str(rep.sent),
                        str(rep.ok),
                        f"[red]{rep.failed}[/]" if rep.failed else "0",
                        secs(rep.p50_s),
                        secs(rep.p95_s),
                        secs(rep.max_s),
                    ]
                ],
                title=f"{rep.rate:g}/s for {rep.duration:g}s to {rep.url}",
            )
        )
        for cause, n in sorted(rep.causes.items(), key=lambda kv: -kv[1]):
            out.print(f"[red]{n} failed[/]: {cause}")

    ctx.emit(rep.to_dict(), render)
    if rep.failed:
        raise click.exceptions.Exit(int(ExitCode.FAILED))


@lab_group.command("door")
@click.argument("state", type=click.Choice(["on", "off"]))
@json_option
@pass_ctx
def door_cmd(ctx: Ctx, state: str) -> None:
    """Make rollouts on the lab drain and re-admit hosts at the lab's HAProxy (on), or leave it
    alone (off)."""
    from fleetctl.lab.frontdoor import LabFrontDoor
    from fleetctl.lab.layout import current

    door = LabFrontDoor(current())
    f = door.use_in_inventory(state == "on")
    result = {"front_door": state, "vars_file": str(f), "url": door.url, "running": door.running()}
    ctx.emit(
        result,
        lambda out: out.print(f"front door {state}: {f if state == 'on' else 'removed ' + str(f)}"),
    )


commands: list[click.Command] = [lab_group]
