"""What Ansible's SSH masters cost the controller over a rollout's steps: kept vs closed per run.

fleetctl runs each playbook with ``ControlMaster=auto`` and ``ControlPersist=60s``: one ``ssh``
master process per host carries all of a run's tasks (plus, through a bastion, the master's own
ProxyJump ``ssh``). Before, the masters of every run lived on for 60 s in one shared directory,
so a rollout's successive steps (and provision, then stage) piled them up to one per host of the
fleet; now each run keeps its masters in a directory of its own and closes them when it ends
(``fleetctl/ansible/config.py``). Both are measured in one run, on the same hosts:

- **kept**: the old behaviour (one shared directory, nothing closed);
- **closed per run**: this checkout's.

The fleet is ``--hosts`` local sshd "hosts" (ports of one sshd on 127.0.0.2) behind a local bastion
(127.0.0.1, ProxyJump), as root (tests/sshd.py). Each mode runs a rollout's default plan shape:
a canary of 1, then steps of a quarter of the fleet, each a playbook of three tasks on its hosts
through ``fleetctl.ansible.run_playbook``, followed by ``--gap`` seconds (the soak, in which no
playbook runs). A sampler reads every ssh process the runs started, 5 times a second: masters
(``ssh: <socket> [mux]``) and their children, with their resident memory (RSS) and their
proportional share of it (PSS, shared library pages split between processes: the memory they
really add). Reported per mode: the peak count and memory, and what is left 1 s after the last
step::

    .venv/bin/python bench/control_persist.py [--hosts 64] [--gap 2] [--direct]
        [--json bench/results/control_persist.json]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from rich.console import Console
from rich.table import Table

from _figures import write_figures  # bench/ is on sys.path when a bench runs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.sshd: the local servers

from tests import sshd  # noqa: E402

from fleetctl import ansible, inventory  # noqa: E402
from fleetctl.ansible import config as ansible_config  # noqa: E402
from fleetctl.ansible import runner as ansible_runner  # noqa: E402

PLAY = textwrap.dedent("""\
    - hosts: all
      gather_facts: false
      tasks:
        - {name: facts, ansible.builtin.raw: "uname -r"}
        - {name: stop, ansible.builtin.raw: "true"}
        - {name: start, ansible.builtin.raw: "true"}
""")


def steps(n: int) -> list[int]:
    """A canary of 1, then steps of a quarter of the fleet (the default plan's 75 % floor)."""
    out, left = [1], n - 1
    step = max(1, n // 4)
    while left > 0:
        out.append(min(step, left))
        left -= out[-1]
    return out


def _pss_kb(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def _rss_kb(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


#: In the command line of the ProxyJump ``ssh -W`` processes of the bench's hosts (its ssh_config's
#: path).
JUMP_MARKER: list[str] = []


def ssh_processes(controls: set[Path]) -> tuple[int, int, int, int]:
    """(masters, ssh processes, RSS kB, PSS kB): masters with sockets in ``controls``, plus their
    children and the jump processes carrying their connections (a master's ProxyJump ``ssh -W``,
    which leaves
    the master's process tree when ssh detaches it)."""
    masters: set[int] = set()
    jumps: set[int] = set()
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            args = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (d / "stat").read_text()
            parents[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            if (
                args.startswith("ssh: ")
                and "[mux]" in args
                and Path(args[5:].split()[0]).parent in controls
            ):
                masters.add(int(d.name))
            elif args.startswith("ssh ") and " -W " in args and any(m in args for m in JUMP_MARKER):
                jumps.add(int(d.name))
    procs = masters | jumps | {p for p, pp in parents.items() if pp in masters}
    return (
        len(masters),
        len(procs),
        sum(_rss_kb(p) for p in procs),
        sum(_pss_kb(p) for p in procs),
    )


class Sampler:
    """Samples :func:`ssh_processes` 5 times a second in a thread; keeps the peaks."""

    def __init__(self, controls: set[Path]) -> None:
        self.controls = controls
        self.peak = [0, 0, 0, 0]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            now = ssh_processes(self.controls)
            self.peak = [max(a, b) for a, b in zip(self.peak, now, strict=True)]

    def __enter__(self) -> Sampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


@contextlib.contextmanager
def local_fleet(n: int, direct: bool) -> Iterator[tuple[inventory.Inventory, Path]]:
    """An inventory of ``n`` local sshd hosts behind a local bastion, and the play to run."""
    if not sshd.available():
        raise SystemExit("needs root and openssh-server (scripts/bootstrap.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="fleetctl-bench-cp-") as d:
        tmp = Path(d)
        with sshd.root_fleet(tmp, n) as (bastion, targets):
            common: dict[str, Any] = {
                "ansible_user": "root", "ansible_ssh_private_key_file": str(tmp / "id"),
                "fleetctl_known_hosts": str(tmp / "known_hosts")}
            if (
                not direct
            ):  # as the lab does: the jump's own ssh reads the bastion's settings from -F
                cfg = sshd.jump_config(
                    tmp / "ssh_config",
                    "bench-bastion",
                    bastion,
                    "root",
                    tmp / "id",
                    tmp / "known_hosts",
                )
                common["ansible_ssh_common_args"] = f"-F {cfg} -o ProxyJump=bench-bastion"
                JUMP_MARKER.append(str(cfg))
            hosts = {f"h-{i + 1:03d}": {"ansible_host": "127.0.0.2", "ansible_port": p}
                     for i, p in enumerate(p for t in targets for p in t.ports)}
            (tmp / "hosts.yml").write_text(
                yaml.safe_dump({"all": {"vars": common, "hosts": hosts}})
            )
            (tmp / "play.yml").write_text(PLAY)
            os.environ["FLEETCTL_STATE_DIR"] = str(tmp / "state")
            yield inventory.load(tmp / "hosts.yml"), tmp / "play.yml"


def rollout_shape(
    inv: inventory.Inventory, play: Path, gap: float, controls: set[Path]
) -> dict[str, Any]:
    """Run the plan's steps one after the other; the peak and leftover ssh processes of
    ``controls``."""
    names = [h.name for h in inv.select(None)]
    t0 = time.monotonic()
    failed = 0
    with Sampler(controls) as s:
        i = 0
        for size in steps(len(names)):
            r = ansible.run_playbook(str(play), inv, limit=",".join(names[i:i + size]))
            failed += len(r.failed_hosts) + len(set(names[i:i + size]) - set(r.hosts))
            i += size
            time.sleep(gap)
    wall = time.monotonic() - t0
    time.sleep(1.0)
    left = ssh_processes(controls)
    masters, procs, rss, pss = s.peak
    return {
        "steps": steps(len(names)),
        "failed_hosts": failed,
        "wall_s": round(wall, 1),
        "peak_masters": masters,
        "peak_processes": procs,
        "peak_rss_mb": round(rss / 1024, 1),
        "peak_pss_mb": round(pss / 1024, 1),
        "masters_left": left[0],
        "rss_left_mb": round(left[2] / 1024, 1),
    }


def kept(inv: inventory.Inventory, play: Path, gap: float) -> dict[str, Any]:
    """The old behaviour: one shared control directory, masters left to their 60 s persist."""
    shared = ansible_config.control_path_dir() / "bench-kept"
    shared.mkdir(mode=0o700, exist_ok=True)
    with mock.patch.object(ansible_runner, "run_control_dir", lambda: shared), \
            mock.patch.object(ansible_runner, "close_masters", lambda d: 0):
        out = rollout_shape(inv, play, gap, {shared})
    ansible_config.close_masters(shared)
    return out


def closed(inv: inventory.Inventory, play: Path, gap: float) -> dict[str, Any]:
    """This checkout: a directory per run, its masters closed when it ends."""
    mine: set[Path] = set()  # this bench's runs' directories only (not another fleetctl's)

    def recorded() -> Path:
        d = ansible_config.run_control_dir()
        mine.add(d)
        return d

    with mock.patch.object(ansible_runner, "run_control_dir", recorded):
        return rollout_shape(inv, play, gap, mine)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--gap", type=float, default=2.0, help="seconds between steps (the soak)")
    ap.add_argument(
        "--direct", action="store_true", help="no bastion: the hosts are reached directly"
    )
    ap.add_argument("--json", default="bench/results/control_persist.json")
    a = ap.parse_args()
    with local_fleet(a.hosts, a.direct) as (inv, play):
        runs = {"closed per run": closed(inv, play, a.gap), "kept (before)": kept(inv, play, a.gap)}
    con = Console(width=80)
    via = "directly" if a.direct else "through a bastion"
    con.print(f"{a.hosts} hosts {via}; steps {runs['kept (before)']['steps']}, {a.gap:g} s apart")
    t = Table("SSH masters", *runs)
    for key, label in (("peak_masters", "peak masters"), ("peak_processes", "peak ssh processes"),
                       ("peak_rss_mb", "peak RSS MB"), ("peak_pss_mb", "peak PSS MB"),
                       ("masters_left", "masters left after 1 s"), ("rss_left_mb", "RSS left MB"),
                       ("failed_hosts", "hosts failed"), ("wall_s", "wall s")):
        t.add_row(label, *(str(r[key]) for r in runs.values()))
    con.print(t)
    k, c = runs["kept (before)"], runs["closed per run"]
    ratio = c["peak_pss_mb"] / k["peak_pss_mb"] if k["peak_pss_mb"] else float("nan")
    con.print(
        f"peak PSS closed/kept: {ratio:.2f}; wall closed/kept: {c['wall_s'] / k['wall_s']:.2f}"
    )
    write_figures(con, a.json, {"hosts": a.hosts, "gap_s": a.gap, "via": via, "runs": runs,
                                "pss_ratio": ratio, "cpu_count": os.cpu_count()})


if __name__ == "__main__":
    main()
