"""Benchmark: one host's deploy and rollback through the vllm_serve role vs the controller's
paramiko path.

Run (lab up, provisioned and staged; FLEETCTL_LAB_DIR etc. set)::

    .venv/bin/python bench/ansible_serve.py [--repeat 3] [--json bench/results/ansible_serve.json]

On one lab node, both images already pulled (so neither path measures the registry), each
step timed ``--repeat`` times and reported as the median:

- **deploy**: v0.23.0 -> v0.24.0 until ``/health`` answers 200. Ansible: ``ansible-playbook
  playbooks/deploy.yml`` (a fresh process, pipelining on as fleetctl's ansible.cfg sets it).
  Paramiko: what the engine does per host before the soak - ``host.facts``, ``host.pull``,
  ``host.retire``, ``host.start`` and ``gate.wait`` (the readiness the rollout uses), over the
  controller's pooled connection.
- **rollback**: ``playbooks/rollback.yml`` vs ``host.restore`` + ``gate.wait``.
- **no-op**: the same deploy again (Ansible: a run that changes nothing; paramiko: ``host.facts``,
  which is how the engine finds a host already serving the target).

Both paths poll ``/health`` at the recipe's readiness poll interval; the emulator's load time
(``EMU_LOAD_SECONDS``) is inside both deploy and rollback figures. Ratios are within the run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from _figures import write_figures  # bench/ is on sys.path when a bench runs
from fleetctl import inventory, paths, registry, ssh
from fleetctl.inventory import Host
from fleetctl.progress import NULL
from fleetctl.recipes import Recipe, recipe_for
from fleetctl.rollout import gate
from fleetctl.rollout import host as remote

OLD, NEW = "v0.23.0", "v0.24.0"


class Lab:
    """One lab node, its recipe and the two digests."""

    def __init__(self, node: str | None) -> None:
        self.inv = inventory.load(None)
        self.host: Host = self.inv.hosts[node or next(iter(self.inv.hosts))]
        self.recipe: Recipe = recipe_for(self.inv, host=self.host)
        self.mirrors = {
            str(k): str(v)
            for k, v in (self.inv.vars.get("fleetctl_registry_mirrors") or {}).items()
        }
        self.digest = {
            t: registry.resolve(self.recipe.image, t, self.mirrors).digest for t in (OLD, NEW)
        }
        self.cfg = gate.config(self.recipe, None, self.host)
        self.name = remote.container_name(self.host)

    def ref(self, tag: str) -> str:
        return registry.pull_ref(self.recipe.image, self.digest[tag], self.mirrors)

    # ---- ansible ---------------------------------------------------------------------------------

    def playbook(self, name: str, *extra: str) -> float:
        env = {
            **os.environ,
            "ANSIBLE_ROLES_PATH": str(paths.roles_dir()),
            "ANSIBLE_PIPELINING": "True",
        }
        t0 = time.monotonic()
        p = subprocess.run(
            [
                "ansible-playbook",
                "-i",
                str(self.inv.path),
                str(paths.playbooks_dir() / f"{name}.yml"),
                "--limit",
                self.host.name,
                "-e",
                f"vllm_serve_ready_delay={self.cfg.readiness_poll}",
                *extra,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        seconds = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"{name}.yml failed on {self.host.name}:\n{p.stdout[-2000:]}")
        return seconds

    def ansible_deploy(self, tag: str) -> float:
        return self.playbook(
            "deploy", "-e", f"vllm_serve_tag={tag}", "-e", f"vllm_serve_digest={self.digest[tag]}"
        )

    # ---- paramiko (the controller's host operations)
    # -----------------------------------------------

    def _ready(self, tag: str) -> None:
        r = gate.wait(gate.target(self.host, self.recipe, tag), self.cfg, None, NULL)
        if not r.ready:
            raise SystemExit(f"{tag} did not become ready on {self.host.name}: {r.message}")

    def paramiko_deploy(self, tag: str) -> float:
        t0 = time.monotonic()
        ref = self.ref(tag)
        remote.facts(self.host, self.recipe, ref)
        remote.pull(self.host, ref)
        remote.retire(self.host, self.name, "bench", self.digest[tag])
        remote.start(
            self.host,
            self.recipe,
            ref,
            tag=tag,
            digest=self.digest[tag],
            rollout_id="bench",
            secrets={},
        )
        self._ready(tag)
        return time.monotonic() - t0

    def paramiko_rollback(self, tag: str) -> float:
        t0 = time.monotonic()
        remote.restore(self.host, self.name)
        self._ready(tag)
        return time.monotonic() - t0

    def paramiko_noop(self, tag: str) -> float:
        t0 = time.monotonic()
        f = remote.facts(self.host, self.recipe, self.ref(tag))
        assert f.serving is not None and f.serving.digest == self.digest[tag]
        return time.monotonic() - t0


def _median(
    fn: Callable[[], float], before: Callable[[], object], n: int
) -> tuple[float, list[float]]:
    runs = []
    for _ in range(n):
        before()
        runs.append(fn())
    return statistics.median(runs), runs


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per step (the median is reported)")
    ap.add_argument("--node", help="lab node (default: the first)")
    ap.add_argument(
        "--json", default="bench/results/ansible_serve.json", help="where to write the figures"
    )
    a = ap.parse_args(argv)
    con = Console()
    lab = Lab(a.node)
    con.print(
        f"node {lab.host.name}; readiness poll {lab.cfg.readiness_poll}s; preparing (not measured)"
    )
    for t in (OLD, NEW):  # both images on the host: neither path measures the registry
        remote.pull(lab.host, lab.ref(t))
    lab.ansible_deploy(OLD)

    def on_old() -> None:
        lab.ansible_deploy(OLD)

    def on_new_from_old() -> None:
        lab.ansible_deploy(OLD)
        lab.ansible_deploy(NEW)

    steps: dict[str, dict[str, Any]] = {}
    for label, fn, before in (
        ("deploy", lambda: lab.ansible_deploy(NEW), on_old),
        ("rollback", lambda: lab.playbook("rollback"), on_new_from_old),
        ("no-op", lambda: lab.ansible_deploy(NEW), lambda: lab.ansible_deploy(NEW)),
    ):
        med, runs = _median(fn, before, a.repeat)
        steps.setdefault(label, {})["ansible"] = {"median_s": med, "runs_s": runs}
    for label, fn, before in (
        ("deploy", lambda: lab.paramiko_deploy(NEW), on_old),
        ("rollback", lambda: lab.paramiko_rollback(OLD), on_new_from_old),
        ("no-op", lambda: lab.paramiko_noop(OLD), on_old),
    ):
        med, runs = _median(fn, before, a.repeat)
        steps[label]["paramiko"] = {"median_s": med, "runs_s": runs}
    lab.ansible_deploy(OLD)
    ssh.close_all()

    t = Table("step (1 host)", "ansible s", "paramiko s", "ansible - paramiko s", "ratio",
              title="vllm_serve role vs controller (lab, medians)")
    for label, s in steps.items():
        an, pm = s["ansible"]["median_s"], s["paramiko"]["median_s"]
        s["difference_s"], s["ratio"] = an - pm, an / pm if pm else float("nan")
        t.add_row(label, f"{an:.2f}", f"{pm:.2f}", f"{an - pm:+.2f}", f"{s['ratio']:.1f}x")
    con.print(t)
    figures = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "node": lab.host.name,
               "repeat": a.repeat, "readiness_poll_s": lab.cfg.readiness_poll, "steps": steps,
               "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}
    write_figures(con, a.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
