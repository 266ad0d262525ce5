"""Benchmark of the rollout on the lab: 1 node vs all nodes, critical path, controller overhead,
rollback.

Run (lab up, provisioned and staged; FLEETCTL_LAB_DIR etc. set)::

    .venv/bin/python bench/rollout.py [--soak 5] [--json bench/results/rollout.json]
    [--rollback-only]

In one run:
1. every node back on v0.23.0 (smoke-gated ``rollback --to``, not measured);
   the v0.24.0 image is removed from every node so that each rollout pulls;
2. rollout of v0.24.0 to ONE node (``--limit spark-01``) with the given soak;
3. the same to ALL nodes with waves [1, 100%] and max-unavailable = the wave;
4. a rollout of a boot-failure tag to one node: rollback time from the failed
   gate to the previous version healthy, minus that version's load time (its
   image's ``EMU_LOAD_SECONDS`` plus the compile its restarted container's log
   reports, cold or warm: the lab's tags take 3 s + 3 s or 0.3 s, not the
   emulator's 1 s default, which earlier runs of this bench subtracted).

Critical path = the slowest host's prefetch pull + per wave the slowest
host's (ready + soak). Overhead = total - critical path: ledger, SSH round
trips, tag resolution, preflight, and the hosts' own ``docker stop`` +
``docker run`` (reported apart, since they are host work the issue's critical
path leaves out). The total is timed from the start of ``rollout()``. Goals
(issue 5): overhead <= 5% of the critical path; all nodes <= 2.1x one node;
(issue 9) rollback overhead <= 5 s, (issue 19) <= 2 s. Ratios are computed within the run.
``--rollback-only`` runs step 4 alone (one node on v0.24.0 first, not measured).

``--default-plan`` (issue 19) times a rollout of v0.24.0 to one node and then to every node with no
wave or step flags (the default plan: the canary, then steps as large as the 75 % capacity floor
allows), same soak, each after every node is back on v0.23.0 without v0.24.0's image. Figures: all /
one (goals: <= 5x at 16 nodes, <= 5.5x at 8), the plan's steps, and all / (one x steps): how much a
step of several hosts costs over a step of one (1.0 when hosts in a step never slow each other; on
the lab they share the machine's cores).

``--deploy-compare [--repeat 3]`` (issue 12) compares the deploy step through the vllm_serve role
(``fleetctl_deploy_via: ansible``, one ansible-runner run per step) with the controller's own docker
commands over SSH (``ssh``), in the same run, alternating: each repeat puts every node back on
v0.23.0 (not measured), rolls v0.24.0 out with waves [1, 100%] and max-unavailable = the wave (so
wave 2 is one step: one role run for all its nodes), and then rolls a boot-failure tag onto the
first node, whose rollback (restore over SSH either way) is timed against the previous version's
load. Per-wave deploy cost = the slowest host's retire + start in the wave. Medians and the
ansible/ssh ratios; goal: the rollback overhead stays <= 2 s (issue 19).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from _figures import write_figures  # bench/ is on sys.path when a bench runs
from fleetctl import inventory, registry, serving, ssh
from fleetctl import lab as fleetlab
from fleetctl.lab.emulator.knobs import from_env
from fleetctl.rollout.api import Engine
from fleetctl.rollout.results import Options, RollbackOptions, RolloutResult

NEW, OLD = "v0.24.0", "v0.23.0"
BOOT_FAIL_TAG = "2026-07-09-bench-bootfail"


def _engine(via: str = "ansible") -> Engine:
    eng = Engine(inventory.load(None))
    if via == "ssh":
        eng.deployer = None  # as fleetctl_deploy_via: ssh on every host
    return eng


def _serve_old() -> None:
    eng = _engine()
    try:
        eng.rollback(RollbackOptions(to=OLD, max_unavailable="100%"))
    finally:
        eng.close()


def _drop_new_image() -> None:
    """Remove v0.24.0 from every node, so that the next rollout really pulls it."""
    eng = _engine()
    try:
        img = registry.resolve(eng.recipe().image, NEW, eng.mirrors)
        ref = registry.pull_ref(img.image, img.digest, eng.mirrors)
        for h in eng.inv.hosts.values():
            ssh.run(h, f"docker rmi -f {ref} >/dev/null 2>&1; true", timeout=60)
    finally:
        eng.close()


def _rollout(tag: str, soak: float, via: str = "ansible", **kw: Any) -> RolloutResult:
    eng = _engine(via)
    try:
        return eng.rollout(Options(tag=tag, soak=soak, **kw))
    finally:
        eng.close()


def _deploy_seconds(t: Mapping[str, float]) -> float:
    """One host's retire + start: the role's run ("deploy") or the controller's "stop" and
    "start"."""
    return t["deploy"] if "deploy" in t else t.get("stop", 0.0) + t.get("start", 0.0)


def critical_path(r: RolloutResult) -> dict[str, float]:
    """The slowest pull plus, per wave, the slowest host's ready + soak; and the overhead above
    it."""
    pull = max(r.pull_seconds.values(), default=0.0)
    waves: dict[int, float] = {}
    restart: dict[int, float] = {}
    for h in r.hosts:
        if h.wave < 0:
            continue
        t = h.timings
        waves[h.wave] = max(waves.get(h.wave, 0.0), t.get("ready", 0.0) + t.get("soak", 0.0))
        # docker stop + docker run on the host (a role run's "deploy" when it went through Ansible):
        # host-side work, but outside the critical path
        restart[h.wave] = max(restart.get(h.wave, 0.0), _deploy_seconds(t))
    crit = pull + sum(waves.values())
    over = r.seconds - crit
    ctl = over - sum(restart.values())
    return {"total": r.seconds, "critical_path": crit, "pull": pull, "overhead": over,
            "overhead_pct": 100.0 * over / crit if crit else 0.0,
            "docker_stop_start": sum(restart.values()), "controller_only": ctl,
            "controller_only_pct": 100.0 * ctl / crit if crit else 0.0,
            **{f"wave{w + 1}_ready_soak": v for w, v in sorted(waves.items())}}


def _restored_load_seconds(node: str) -> float:
    """The load time of the container now serving on ``node``: its image's ``EMU_LOAD_SECONDS``
    plus the compile its log says this start took (cold or warm, when the recipe mounts a compile
    cache).

    What a rollback cannot go below; the emulator's default (1 s) is not it: the lab's tags load in
    3 s and compile for 3 s cold or 0.3 s warm.
    """
    host = inventory.load(None).host(node)
    name = serving.container_name(host)
    env = json.loads(
        ssh.docker(
            host, ["docker", "inspect", "-f", "{{json .Config.Env}}", name], timeout=30
        ).stdout
    )
    knobs = from_env(dict(e.split("=", 1) for e in env if "=" in e))
    log = serving.logs(host, name, 200)
    compiled = re.findall(r"compile cache (?:hit|miss) .*compiling takes ([0-9.]+) s", log)
    return knobs.load_seconds + (float(compiled[-1]) if compiled else 0.0)


def _rollback_after_boot_failure(node: str, soak: float, via: str = "ansible") -> dict[str, Any]:
    """A tag that never boots, on ``node``: seconds from the failed gate to the previous version
    healthy."""
    fleetlab.add_image(BOOT_FAIL_TAG, {"EMU_BOOT_FAIL": "RuntimeError: bench boot failure"})
    failed = _rollout(BOOT_FAIL_TAG, soak, via, limit=node)
    canary = failed.hosts[0]
    load = _restored_load_seconds(node)
    rb_healthy = canary.timings.get("rollback_healthy", float("nan"))
    return {"status": canary.status, "healthy_after_s": rb_healthy, "load_seconds": load,
            "overhead_s": rb_healthy - load, "with_smoke_s": canary.timings.get("rollback")}


def _rollback_only(con: Console, nodes: list[str], a: argparse.Namespace) -> int:
    """Step 4 alone, three times on the first node: median overhead over the previous version's
    load."""
    eng = _engine()
    try:
        eng.rollback(RollbackOptions(to=NEW, limit=nodes[0]))
    finally:
        eng.close()
    runs = [_rollback_after_boot_failure(nodes[0], a.soak) for _ in range(3)]
    over = sorted(r["overhead_s"] for r in runs)
    figures = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rollback_runs": runs,
        "rollback_overhead_median_s": over[len(over) // 2],
        "goal_s": 2.0,
        "cpu_count": os.cpu_count(),
    }
    t = Table("run", "status", "healthy", "load", "overhead", "+smoke",
              title="rollback after a failed gate (lab; seconds)")
    for i, r in enumerate(runs, 1):
        t.add_row(str(i), r["status"], f"{r['healthy_after_s']:.1f}", f"{r['load_seconds']:.1f}",
                  f"{r['overhead_s']:.1f}", f"{r['with_smoke_s'] or 0:.1f}")
    con.print(t)
    con.print(
        "median rollback overhead over the previous version's load: "
        f"{figures['rollback_overhead_median_s']:.1f}s"
        " (goal <= 2s)"
    )
    write_figures(con, a.json, figures)
    ssh.close_all()
    return 0


def _deploy_compare(con: Console, nodes: list[str], a: argparse.Namespace) -> int:
    """The deploy step via the role and via SSH, alternating, ``--repeat`` times; medians and
    ratios."""
    runs: dict[str, list[dict[str, Any]]] = {"ansible": [], "ssh": []}
    for i in range(a.repeat):
        for via in ("ansible", "ssh") if i % 2 == 0 else ("ssh", "ansible"):
            _serve_old()
            r = _rollout(
                NEW, a.soak, via, waves="1,100%", max_unavailable=str(max(1, len(nodes) - 1))
            )
            if r.status != "completed":
                con.print(f"[red]{via} rollout {r.status}: {r.error}")
                return 1
            waves: dict[int, float] = {}
            for h in r.hosts:
                if h.wave >= 0:
                    waves[h.wave] = max(waves.get(h.wave, 0.0), _deploy_seconds(h.timings))
            rb = _rollback_after_boot_failure(nodes[0], a.soak, via)
            runs[via].append(
                {
                    "wave_deploy_s": [waves[w] for w in sorted(waves)],
                    "total_s": r.seconds,
                    "rollback": rb,
                }
            )
            con.print(f"{i + 1}/{a.repeat} {via}: deploy per wave "
                      f"{', '.join(f'{v:.1f}s' for v in runs[via][-1]['wave_deploy_s'])}; "
                      f"rollback overhead {rb['overhead_s']:.1f}s ({rb['status']})")

    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    summary: dict[str, dict[str, float]] = {}
    for via, rs in runs.items():
        nw = min(len(x["wave_deploy_s"]) for x in rs)
        summary[via] = {
            **{
                f"wave{w + 1}_deploy_s": med([x["wave_deploy_s"][w] for x in rs]) for w in range(nw)
            },
            "total_s": med([x["total_s"] for x in rs]),
            "rollback_overhead_s": med([x["rollback"]["overhead_s"] for x in rs]),
        }
    ratios = {
        k: summary["ansible"][k] / summary["ssh"][k] for k in summary["ssh"] if summary["ssh"][k]
    }
    figures = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "nodes": len(nodes),
               "soak_seconds": a.soak, "repeat": a.repeat, "runs": runs, "medians": summary,
               "ansible_over_ssh": ratios, "goals": {"rollback_overhead_s_max": 2.0},
               "cpu_count": os.cpu_count(), "load_average": os.getloadavg()}
    t = Table(
        "median",
        "ansible",
        "ssh",
        "ratio",
        title=f"deploy step: vllm_serve role vs SSH ({a.repeat} runs)",
    )
    for k in summary["ssh"]:
        t.add_row(k, f"{summary['ansible'][k]:.1f}", f"{summary['ssh'][k]:.1f}",
                  f"{ratios[k]:.2f}x" if k in ratios else "-")
    con.print(t)
    worst = max(summary["ansible"]["rollback_overhead_s"], summary["ssh"]["rollback_overhead_s"])
    con.print(
        f"rollback overhead over the previous version's load: {worst:.1f}s at most (goal <= 2s)"
    )
    write_figures(con, a.json, figures)
    _serve_old()
    ssh.close_all()
    return 0


def _default_plan(con: Console, nodes: list[str], a: argparse.Namespace) -> int:
    """One node, then every node on the default plan; the ratio, the steps and the cost of a wide
    step."""
    _serve_old()
    _drop_new_image()
    one = _rollout(NEW, a.soak, limit=nodes[0])
    _serve_old()
    _drop_new_image()
    many = _rollout(NEW, a.soak)
    for name, r in (("1-node", one), ("default-plan", many)):
        if r.status != "completed":
            con.print(f"[red]{name} rollout {r.status}: {r.error}")
            return 1
    assert many.plan is not None
    steps = len(many.plan.steps())
    ratio = many.seconds / one.seconds
    goal = 5.0 if len(nodes) >= 16 else 5.5 if len(nodes) >= 8 else float(steps)
    figures = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nodes": len(nodes),
        "soak_seconds": a.soak,
        "one_node_s": one.seconds,
        "default_plan_s": many.seconds,
        "steps": steps,
        "max_unavailable": many.plan.max_unavailable,
        "all_over_one": round(ratio, 2),
        "step_cost_over_one": round(ratio / steps, 2),
        "goal_all_over_one": goal,
        "pull_via": dict(many.pull_via),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    t = Table(
        "run",
        "seconds",
        "steps",
        title=f"default plan vs one node (lab, {len(nodes)} nodes, soak {a.soak:.0f}s)",
    )
    t.add_row("1 node", f"{one.seconds:.1f}", "1")
    t.add_row(f"{len(nodes)} nodes", f"{many.seconds:.1f}", str(steps))
    con.print(t)
    con.print(
        f"all / one: {ratio:.2f}x (goal <= {goal}x); per step: {ratio / steps:.2f}x one node's"
    )
    write_figures(con, a.json, figures)
    _serve_old()
    ssh.close_all()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a table, write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--soak", type=float, default=5.0, help="sustained soak seconds per host")
    ap.add_argument(
        "--json", default="bench/results/rollout.json", help="where to write the figures"
    )
    ap.add_argument(
        "--rollback-only", action="store_true", help="only the rollback after a failed gate"
    )
    ap.add_argument(
        "--deploy-compare",
        action="store_true",
        help="the deploy step through the vllm_serve role vs over SSH, and the rollback after each",
    )
    ap.add_argument("--repeat", type=int, default=3, help="repeats of --deploy-compare (medians)")
    ap.add_argument(
        "--default-plan",
        action="store_true",
        help="one node vs every node on the default plan (the capacity floor), same soak",
    )
    a = ap.parse_args(argv)
    con = Console()
    nodes = list(inventory.load(None).hosts)
    if a.rollback_only:
        return _rollback_only(con, nodes, a)
    if a.deploy_compare:
        return _deploy_compare(con, nodes, a)
    if a.default_plan:
        return _default_plan(con, nodes, a)
    con.print(
        f"lab: {len(nodes)} nodes ({', '.join(nodes)}); soak {a.soak:.0f}s; preparing (not "
        "measured)"
    )
    _serve_old()
    _drop_new_image()
    one = _rollout(NEW, a.soak, limit=nodes[0])
    if one.status != "completed":
        con.print(f"[red]1-node rollout {one.status}: {one.error}")
        return 1
    _serve_old()
    _drop_new_image()
    many = _rollout(NEW, a.soak, waves="1,100%", max_unavailable=str(max(1, len(nodes) - 1)))
    if many.status != "completed":
        con.print(f"[red]all-node rollout {many.status}: {many.error}")
        return 1
    # Rollback: a tag that never boots, on one node serving v0.24.0.
    rb = _rollback_after_boot_failure(nodes[0], a.soak)
    rb_healthy, load = rb["healthy_after_s"], rb["load_seconds"]
    r1, rn = critical_path(one), critical_path(many)
    figures = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nodes": len(nodes),
        "soak_seconds": a.soak,
        "one_node": r1,
        "all_nodes": rn,
        "all_over_one": rn["total"] / r1["total"],
        "rollback": rb,
        "goals": {"overhead_pct_max": 5.0, "all_over_one_max": 2.1, "rollback_overhead_s_max": 2.0},
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    # Short headers, explained below the table: it must stay readable at 80 columns (a CI log).
    t = Table("run", "total", "critical", "pull", "overhead", "ovh %", "stop+run", "ctl %",
              title="rollout benchmark (lab; seconds)")
    for name, r in (("1 node", r1), (f"{len(nodes)} nodes", rn)):
        t.add_row(
            name,
            f"{r['total']:.1f}",
            f"{r['critical_path']:.1f}",
            f"{r['pull']:.1f}",
            f"{r['overhead']:.1f}",
            f"{r['overhead_pct']:.1f}",
            f"{r['docker_stop_start']:.1f}",
            f"{r['controller_only_pct']:.1f}",
        )
    con.print(t)
    con.print(
        f"{len(nodes)} nodes ran waves 1,100%. critical: slowest pull + each wave's slowest ready "
        "+ soak; "
        "overhead: total - critical (ovh %: of critical); stop+run: docker stop + run within the "
        "overhead; "
        "ctl %: overhead - stop+run, of critical",
        highlight=False,
    )
    con.print(f"all nodes / one node: {figures['all_over_one']:.2f}x (goal <= 2.1x)")
    con.print(
        f"rollback from failed gate to previous healthy: {rb_healthy:.1f}s, minus load {load:.1f}s "
        "= "
        f"{rb_healthy - load:.1f}s overhead (goal <= 2s); with smoke {rb['with_smoke_s'] or 0:.1f}s"
    )
    write_figures(con, a.json, figures)
    _serve_old()
    ssh.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
