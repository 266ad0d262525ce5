"""``fleetctl``: the entry point. Registers the commands and translates errors into exit codes."""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

import click
from rich.markup import escape

from fleetctl import __version__, paths
from fleetctl.cli.output import Ctx
from fleetctl.errors import ExitCode, FleetError

#: Each name is a module ``fleetctl.cli.<name>`` exposing ``commands``: a list of click commands.
COMMAND_MODULES = (
    "lab",
    "provision",
    "status",
    "stage",
    "soak",
    "watch",
    "rollout",
    "rollback",
    "ledger",
    "ui",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "-i", "--inventory", metavar="PATH", envvar="FLEETCTL_INVENTORY",
    help="Inventory file (default: $FLEETCTL_INVENTORY, else the lab's).",
)
@click.option(
    "--vault-password-file", metavar="PATH", envvar="ANSIBLE_VAULT_PASSWORD_FILE",
    type=click.Path(exists=True, dir_okay=False),
    help="Ansible Vault password file for vaulted inventory values such as ansible_become_password "
         "(default: $ANSIBLE_VAULT_PASSWORD_FILE).",
)
@click.version_option(__version__, prog_name="fleetctl")
@click.pass_context
def cli(ctx: click.Context, inventory: str | None, vault_password_file: str | None) -> None:
    """Roll vLLM forward and back across a fleet of DGX Sparks, with soak gates."""
    obj = ctx.ensure_object(Ctx)
    obj.inventory = inventory
    if vault_password_file:
        # one place for both readers: fleetctl's inventory load and the ansible-playbook runs
        # (which inherit ANSIBLE_*) decrypt with the same file, as `ansible-playbook
        # --vault-password-file` would
        os.environ["ANSIBLE_VAULT_PASSWORD_FILE"] = str(Path(vault_password_file).resolve())


def _register() -> None:
    for name in COMMAND_MODULES:
        mod = importlib.import_module(f"fleetctl.cli.{name}")
        for command in mod.commands:
            cli.add_command(command)


_register()


def _save_traceback() -> Path:
    # A traceback can quote local values: 0600 in a 0700 directory, or an O_EXCL mkstemp file in
    # /tmp (never a predictable name there, which a planted symlink could redirect).
    try:
        d = paths.private_dir(paths.cache_dir() / "crash")
    except OSError:
        d = Path(tempfile.gettempdir())
    fd, name = tempfile.mkstemp(
        prefix=f"fleetctl-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt", dir=d
    )
    with os.fdopen(fd, "w") as f:
        f.write(traceback.format_exc())
    return Path(name)


#: Open files the controller asks for (its soft limit is raised up to the hard one). Debian's
#: default soft limit, 1024, is below what a rollout of a large fleet holds at once: up to 32
#: concurrent soak gates (rollout.session.MAX_WORKERS) with the largest sweep level + 8 connections
#: each (72 on the spark profile: 2304), the SSH pool (ssh.MAX_POOLED, 64) and Ansible's forks'
#: pipes (MAX_FORKS, 64).
FD_WANTED = 65536


def raise_fd_limit(wanted: int = FD_WANTED) -> int:
    """Raise this process's soft limit of open files to ``wanted`` (at most the hard limit); the
    new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # the limit stays; a fan-out that needs more fails with EMFILE naming the host
    return soft


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return (and exit with) a documented :class:`ExitCode`."""
    raise_fd_limit()
    err = Ctx().err
    returned: object = None
    try:
        # With standalone_mode=False, click returns (not raises) a command's Exit code.
        returned = cli.main(args=argv, prog_name="fleetctl", standalone_mode=False)
    except FleetError as e:
        err.print(f"[bold red]error:[/] {escape(e.message())}", highlight=False)
        code = int(e.exit_code)
        if "--json" in (sys.argv[1:] if argv is None else argv):
            # A script that asked for JSON gets JSON on stdout, also when the command failed.
            print(
                json.dumps(
                    {"error": {"cause": e.cause, "host": e.host, "fix": e.fix, "exit_code": code}}
                )
            )
    except click.exceptions.Exit as e:
        code = int(e.exit_code)
    except click.exceptions.Abort:
        err.print("aborted")
        code = int(ExitCode.INCONCLUSIVE)
    except click.ClickException as e:
        e.show()
        code = int(ExitCode.USAGE)
    except KeyboardInterrupt:
        err.print("interrupted")
        code = 130
    except Exception as e:  # the one place that catches everything
        where = _save_traceback()
        err.print(
            "[bold red]internal error:[/] "
            f"{escape(f'{type(e).__name__}: {e} (traceback saved to {where})')}",
            highlight=False,
        )
        code = int(ExitCode.INTERNAL)
    else:
        code = (
            returned
            if isinstance(returned, int) and not isinstance(returned, bool)
            else int(ExitCode.OK)
        )
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
